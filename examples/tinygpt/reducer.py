"""Data-parallel gradient accumulation and bucketed all-reduce (tinygpt's own DDP).

Like Megatron's DDP, each parameter's gradient is accumulated into a contiguous "main grad"
buffer (fp32, or bf16 with ``--grad-reduce-in-bf16``), split into buckets of about
``--ddp-bucket-size`` elements in reverse parameter order (the order backward produces them). At the
end of the step every bucket is all-reduced with SUM: the per-rank losses are already divided by the
token count of the whole global batch, so the summed gradient is the gradient of the global
per-token mean loss whatever the data-parallel size or the microbatch size.

With ``--overlap-grad-reduce`` a bucket's all-reduce starts asynchronously during the backward of the
last microbatch, as soon as all of its gradients are accumulated.

Fault injection (``TINYGPT_FAULT=skip-bucket-reduce``, for validating the correctness gate): one
bucket (index ``TINYGPT_FAULT_BUCKET``, default 0, the first bucket backward fills) is never
reduced, so ranks step with their local share of that gradient. No effect when there is one rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Bucket:
    index: int
    params: list[nn.Parameter]
    buffer: torch.Tensor
    views: list[torch.Tensor]
    pending: int = 0
    work: object | None = None
    launched: bool = False
    names: list[str] = field(default_factory=list)


class GradReducer:
    def __init__(
        self,
        model: nn.Module,
        bucket_size: int,
        grad_dtype: torch.dtype,
        world_size: int,
        overlap: bool = False,
        skip_bucket: int | None = None,
    ):
        self.world_size = world_size
        self.overlap = overlap and world_size > 1
        self.skip_bucket = skip_bucket
        self.grad_dtype = grad_dtype
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        named.reverse()
        groups: list[list[tuple[str, nn.Parameter]]] = [[]]
        size = 0
        for n, p in named:
            if groups[-1] and size + p.numel() > bucket_size:
                groups.append([])
                size = 0
            groups[-1].append((n, p))
            size += p.numel()
        self.buckets: list[Bucket] = []
        self._where: dict[nn.Parameter, tuple[Bucket, torch.Tensor]] = {}
        device = named[0][1].device
        for i, g in enumerate(groups):
            total = sum(p.numel() for _, p in g)
            buf = torch.zeros(total, dtype=grad_dtype, device=device)
            views, off = [], 0
            for _, p in g:
                views.append(buf[off:off + p.numel()].view_as(p))
                off += p.numel()
            b = Bucket(i, [p for _, p in g], buf, views, names=[n for n, _ in g])
            self.buckets.append(b)
            for p, v in zip(b.params, views, strict=True):
                self._where[p] = (b, v)
                p.register_post_accumulate_grad_hook(self._on_grad)
        self._last_microbatch = False

    # -- per step -------------------------------------------------------------------------------
    def start_step(self) -> None:
        for b in self.buckets:
            for p in b.params:
                p.grad = None
            b.buffer.zero_()
            b.pending = len(b.params)
            b.work = None
            b.launched = False
        self._last_microbatch = False

    def set_last_microbatch(self, last: bool) -> None:
        self._last_microbatch = last

    def _on_grad(self, p: torch.Tensor) -> None:
        b, view = self._where[p]  # type: ignore[index]
        view.add_(p.grad)
        p.grad = None
        if self._last_microbatch:
            b.pending -= 1
            if self.overlap and b.pending == 0:
                self._launch(b, async_op=True)

    def _launch(self, b: Bucket, async_op: bool) -> None:
        b.launched = True
        if self.world_size == 1 or b.index == self.skip_bucket:
            return
        b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, async_op=async_op)

    def finish(self) -> None:
        """Reduce what is not reduced yet, wait for everything, hand fp32 grads to the optimizer."""
        for b in self.buckets:
            if not b.launched:
                self._launch(b, async_op=self.overlap)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()  # type: ignore[attr-defined]
            for p, v in zip(b.params, b.views, strict=True):
                p.grad = v if v.dtype == p.dtype else v.to(p.dtype)

    def describe(self) -> list[dict]:
        return [{"bucket": b.index, "numel": b.buffer.numel(), "params": len(b.params)} for b in self.buckets]
