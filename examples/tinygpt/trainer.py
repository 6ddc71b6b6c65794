"""tinygpt's training loop: data parallelism over torchrun ranks, Megatron-LM log lines.

Objective (what structural levers must leave unchanged): the mean over every loss-mask token of the
global batch of the next-token cross entropy, plus, with MoE, ``moe_aux_loss_coeff`` times the
load-balancing loss summed over layers and averaged over the global batch's microbatches. Each rank
divides its token-loss sums by the global batch's token count and the gradient buckets are
all-reduced with SUM, so data-parallel size and microbatch size change only the order of float sums.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import megatron_log as mlog
from .config import ConfigError, active_fault, build_parser, fault_bucket, printable, resolve
from .data import DataError, PackedRows
from .model import GPT, ModelConfig
from .reducer import GradReducer


def _rss_mib() -> tuple[float, float]:
    """Current and peak resident set size of this process, MiB (CPU runs report these)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    try:
        with open("/proc/self/statm") as f:
            cur = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        cur = peak
    return cur, max(cur, peak)


class Trainer:
    def __init__(self, a: argparse.Namespace, data: PackedRows, fault: str | None, skip_bucket: int | None = None):
        self.a = a
        self.data = data
        self.fault = fault
        self.rank = a.rank
        self.world = a.world_size
        self.device = torch.device(a.device if a.device == "cpu" else f"cuda:{torch.cuda.current_device()}")
        torch.manual_seed(a.seed)
        cfg = ModelConfig(
            num_layers=a.num_layers,
            hidden_size=a.hidden_size,
            ffn_hidden_size=a.ffn_hidden_size,
            num_attention_heads=a.num_attention_heads,
            max_position_embeddings=a.max_position_embeddings,
            padded_vocab_size=a.padded_vocab_size,
            init_method_std=a.init_method_std,
            untie_embeddings_and_output_weights=a.untie_embeddings_and_output_weights,
            num_experts=a.num_experts,
            moe_router_topk=a.moe_router_topk,
            moe_ffn_hidden_size=a.moe_ffn_hidden_size,
            recompute_granularity=a.recompute_granularity,
            recompute_method=a.recompute_method,
            recompute_num_layers=a.recompute_num_layers,
        )
        self.model = GPT(cfg).to(self.device)
        self.model.inject_fault(fault)
        self._stale: list[torch.Tensor] | None = None  # fault stale-gradient: the previous step's gradients
        if self.world > 1:
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.forward = torch.compile(self.model) if a.torch_compile else self.model
        self.reducer = GradReducer(
            self.model,
            bucket_size=a.ddp_bucket_size,
            grad_dtype=torch.float32 if a.accumulate_allreduce_grads_in_fp32 else torch.bfloat16,
            world_size=self.world,
            overlap=a.overlap_grad_reduce,
            skip_bucket=skip_bucket,
        )
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        impl = a.optimizer_impl
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=a.lr,
            betas=(a.adam_beta1, a.adam_beta2),
            eps=a.adam_eps,
            foreach=impl == "foreach",
            fused=impl == "fused",
        )
        self.rows_per_rank = a.global_batch_size // self.world
        self.moe_layers = self.model.num_moe_layers()
        self.skipped = 0
        self.nan_iters = 0
        self.rows_read = 0

    # -- schedule ---------------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        a = self.a
        if a.lr_warmup_iters > 0 and step < a.lr_warmup_iters:
            return a.lr * (step + 1) / a.lr_warmup_iters
        if a.lr_decay_style == "constant":
            return a.lr
        span = max(1, a.lr_decay_iters - a.lr_warmup_iters)
        progress = min(1.0, max(0.0, (step - a.lr_warmup_iters) / span))
        if a.lr_decay_style == "linear":
            return a.min_lr + (a.lr - a.min_lr) * (1.0 - progress)
        return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def flops_per_iteration(self) -> float:
        """Model FLOPs of one step (forward + backward = 3 x forward), recomputation not counted."""
        a = self.a
        h, s, L = a.hidden_size, a.seq_length, a.num_layers
        ffn = (a.moe_ffn_hidden_size * a.moe_router_topk + a.num_experts) if a.num_experts else a.ffn_hidden_size
        per_token = L * (2 * 4 * h * h + 2 * 2 * h * ffn + 2 * 2 * s * h) + 2 * h * a.padded_vocab_size
        return 3.0 * per_token * a.global_batch_size * s

    # -- one step -----------------------------------------------------------------------------------
    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.a
        first = step * a.global_batch_size + self.rank * self.rows_per_rank
        rows = torch.from_numpy(self.data.rows(range(first, first + self.rows_per_rank)))
        self.rows_read += self.rows_per_rank
        tokens, labels = rows[:, :-1], rows[:, 1:]
        mask = torch.ones(tokens.shape, dtype=torch.float32)
        if a.eod_mask_loss:
            mask[tokens == self.data.info.eot_id] = 0.0
        count = mask.sum()
        if self.fault == "labels-offset":
            labels = torch.roll(labels, shifts=-1, dims=1)
        elif self.fault == "loss-mask-shift":  # shifted by one token, token count kept
            mask = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], dim=1)
        dev = self.device
        return tokens.to(dev), labels.contiguous().to(dev), mask.to(dev), count.to(dev)

    def step(self, step: int) -> dict:
        a = self.a
        t0 = time.perf_counter()
        with torch.profiler.record_function("tinygpt.data"):
            tokens, labels, mask, count = self._batch(step)
            count = count.double().reshape(1)
            if self.world > 1:
                dist.all_reduce(count)
            global_tokens = count.item()
        lr = self.lr_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.reducer.start_step()
        lm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        lb_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        mb = a.micro_batch_size
        n_mb = a.num_micro_batches
        lb_scale = a.moe_aux_loss_coeff / (n_mb * self.world)
        autocast = (torch.autocast(device_type=self.device.type, dtype=torch.bfloat16) if a.bf16
                    else contextlib.nullcontext())
        with torch.profiler.record_function("tinygpt.forward_backward"):
            for m in range(n_mb):
                self.reducer.set_last_microbatch(m == n_mb - 1)
                sl = slice(m * mb, (m + 1) * mb)
                with autocast:
                    logits, lb = self.forward(tokens[sl])
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels[sl].reshape(-1),
                                     reduction="none")
                tok_loss = (ce * mask[sl].reshape(-1)).sum()
                loss = tok_loss / global_tokens
                if self.moe_layers:
                    if self.fault == "zero-lb-loss":
                        lb = lb * 0.0
                    loss = loss + lb_scale * lb
                    lb_sum += lb.detach().double() / self.moe_layers
                if self.fault == "scaled-loss":  # the gradient is scaled, the logged loss is not
                    loss = loss * 0.25
                loss.backward()
                lm_sum += tok_loss.detach().double()
        with torch.profiler.record_function("tinygpt.grad_reduce"):
            self.reducer.finish()
            stats = torch.stack([lm_sum, lb_sum])
            if self.world > 1:
                dist.all_reduce(stats)
        with torch.profiler.record_function("tinygpt.optimizer"):
            params = [p for p in self.model.parameters() if p.grad is not None]
            if self.fault == "stale-gradient":  # the optimizer steps with the previous step's gradients
                fresh = [p.grad.detach().clone() for p in params]  # type: ignore[union-attr]
                if self._stale is not None:
                    for p, g in zip(params, self._stale, strict=True):
                        p.grad = g
                self._stale = fresh
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, a.clip_grad if a.clip_grad > 0 else float("inf")))
            lm_loss = stats[0].item() / global_tokens if global_tokens > 0 else float("nan")
            lb_loss = stats[1].item() / (n_mb * self.world) if self.moe_layers else None
            skipped = not math.isfinite(grad_norm)
            if skipped:
                self.skipped += 1
            else:
                self.optimizer.step()
            if not math.isfinite(lm_loss):
                self.nan_iters += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        return {
            "iteration": step + 1,
            "step_time_ms": elapsed * 1000.0,
            "lm_loss": lm_loss,
            "load_balancing_loss": lb_loss,
            "tokens": a.global_batch_size * a.seq_length,
            "loss_tokens": int(global_tokens),
            "learning_rate": lr,
            "grad_norm": grad_norm,
            "consumed_samples": (step + 1) * a.global_batch_size,
            "skipped": skipped,
        }

    # -- memory -------------------------------------------------------------------------------------
    def memory(self) -> dict:
        if self.device.type == "cuda":
            mib = 2**20
            return {
                "kind": "cuda",
                "allocated_mib": torch.cuda.memory_allocated() / mib,
                "max_allocated_mib": torch.cuda.max_memory_allocated() / mib,
                "reserved_mib": torch.cuda.memory_reserved() / mib,
                "max_reserved_mib": torch.cuda.max_memory_reserved() / mib,
            }
        cur, peak = _rss_mib()
        return {"kind": "rss", "allocated_mib": cur, "max_allocated_mib": peak, "reserved_mib": cur,
                "max_reserved_mib": peak}

    def report_memory(self, iteration: int) -> dict:
        m = self.memory()
        mlog.emit(mlog.memory_line(self.rank, iteration, m["allocated_mib"], m["max_allocated_mib"],
                                   m["reserved_mib"], m["max_reserved_mib"]))
        return m


def _print0(rank: int, line: str) -> None:
    if rank == 0:
        mlog.emit(line)


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


def run(a: argparse.Namespace, data: PackedRows, fault: str | None, skip_bucket: int | None = None) -> int:
    rank, world = a.rank, a.world_size
    if a.num_threads is not None:
        torch.set_num_threads(a.num_threads)
    _print0(rank, f"using world size: {world}, data-parallel size: {a.data_parallel_size}, context-parallel size: "
                  f"1, tensor-model-parallel size: 1, pipeline-model-parallel size: 1")
    _print0(rank, mlog.arguments_block(printable(a)))
    _print0(rank, f"> building {a.tokenizer_type} tokenizer ...")
    _print0(rank, f" > padded vocab (size: {a.vocab_size}) with {a.padded_vocab_size - a.vocab_size} dummy tokens "
                  f"(new size: {a.padded_vocab_size})")
    tr = Trainer(a, data, fault, skip_bucket)
    _print0(rank, f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {tr.num_params}")
    _print0(rank, f"> data: {data.info.path} sha256 {data.info.tokens_sha256} rows {data.info.num_rows} "
                  f"(seq length {a.seq_length})")
    _print0(rank, f"[after model, optimizer, and learning rate scheduler are built] datetime: "
                  f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}")
    _print0(rank, "training ...")
    last = world - 1
    flops = tr.flops_per_iteration()
    records: list[dict] = []
    memory_reports: list[dict] = []
    interval = {"lm loss": 0.0, "load_balancing_loss": 0.0, "n": 0, "t": 0.0}
    t_start = time.perf_counter()
    for step in range(a.train_iters):
        rec = tr.step(step)
        records.append(rec)
        it = rec["iteration"]
        interval["n"] += 1
        interval["t"] += rec["step_time_ms"]
        interval["lm loss"] += rec["lm_loss"]
        if rec["load_balancing_loss"] is not None:
            interval["load_balancing_loss"] += rec["load_balancing_loss"]
        if it % a.log_interval == 0 or it == a.train_iters:
            n = interval["n"]
            if rank == last:
                losses = {"lm loss": interval["lm loss"] / n}
                if tr.moe_layers:
                    losses["load_balancing_loss"] = interval["load_balancing_loss"] / n
                elapsed_ms = interval["t"] / n
                tflops = flops / (elapsed_ms / 1000.0) / world / 1e12 if a.log_throughput else None
                mlog.emit(mlog.iteration_line(
                    iteration=it, train_iters=a.train_iters, consumed_samples=rec["consumed_samples"],
                    elapsed_ms=elapsed_ms, learning_rate=rec["learning_rate"],
                    global_batch_size=a.global_batch_size, losses=losses, loss_scale=1.0,
                    grad_norm=rec["grad_norm"], skipped_iterations=tr.skipped, nan_iterations=tr.nan_iters,
                    tflops_per_gpu=tflops))
            interval = {"lm loss": 0.0, "load_balancing_loss": 0.0, "n": 0, "t": 0.0}
            if it == a.log_interval or (it == a.train_iters and a.train_iters < a.log_interval):
                memory_reports.append({"iteration": it, **tr.report_memory(it)})
    train_wall = time.perf_counter() - t_start
    if not memory_reports or memory_reports[-1]["iteration"] != a.train_iters:
        memory_reports.append({"iteration": a.train_iters, **tr.report_memory(a.train_iters)})

    trace_files: list[str] = []
    if a.profile:
        trace_files = _profile(tr, a)

    local = {"rank": rank, "memory": memory_reports, "peak_memory_mib": max(m["max_allocated_mib"] for m in memory_reports),
             "memory_kind": memory_reports[-1]["kind"], "step_time_ms": [r["step_time_ms"] for r in records],
             "rows_verified": tr.rows_read, "trace_files": trace_files}
    gathered = _gather_json(local, world, tr.device)
    if rank == last and a.metrics_out is not None:
        _write_json(a.metrics_out, {
            "format": "tinygpt-metrics-v1",
            "args": printable(a),
            "world_size": world,
            "device": a.device,
            "num_parameters": tr.num_params,
            "flops_per_iteration": flops,
            "grad_buckets": tr.reducer.describe(),
            "data": {"path": data.info.path, "tokens_sha256": data.info.tokens_sha256,
                     "num_rows": data.info.num_rows, "seq_length": a.seq_length},
            "train_wall_s": train_wall,
            "iterations": records,
            "ranks": gathered,
            "profile": ({"trace_dir": str(a.trace_dir), "steps": a.profile_steps, "ranks": a.profile_ranks,
                         "files": [f for g in gathered for f in g["trace_files"]]} if a.profile else None),
        })
    _print0(rank, f"[after training is done] datetime: {datetime.now().strftime('%Y-%m-%d %H:%M:%S')}")
    return 0


def _gather_json(obj: dict, world: int, device: torch.device) -> list[dict]:
    """All-gather a JSON-able dict from every rank.

    Uses plain tensors built by copy: ``all_gather_object`` hands gloo tensors that borrow Python
    buffers, and a gloo thread dropping the last reference at interpreter exit aborts the process.
    """
    if world == 1:
        return [obj]
    raw = json.dumps(obj).encode()
    n = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    buf = torch.zeros(int(n.item()), dtype=torch.uint8, device=device)
    buf[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    out = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(out, buf)
    return [json.loads(bytes(t.cpu().tolist()).rstrip(b"\0").decode()) for t in out]


def _profile(tr: Trainer, a: argparse.Namespace) -> list[str]:
    """Trace ``profile_steps`` steps after the measured window (one untraced warm-up step first)."""
    traced = a.rank in a.profile_ranks
    trace_dir = Path(a.trace_dir)
    before = set(trace_dir.glob(f"rank{a.rank}.*.pt.trace.json")) if trace_dir.exists() else set()
    if traced:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if tr.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        ctx = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=a.profile_steps, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{a.rank}"),
        )
    else:
        ctx = contextlib.nullcontext()
    with ctx as prof:
        for j in range(1 + a.profile_steps):
            tr.step(a.train_iters + j)
            if prof is not None:
                prof.step()
    if not traced:
        return []
    return sorted(str(p) for p in set(trace_dir.glob(f"rank{a.rank}.*.pt.trace.json")) - before)


def _select_device(choice: str, local_rank: int) -> tuple[str, str]:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: CUDA is not available on this machine")
        torch.cuda.set_device(local_rank)
        return "cuda", "nccl"
    return "cpu", "gloo"


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        device, backend = _select_device(a.device, local_rank)
        if a.distributed_backend != "auto":
            backend = a.distributed_backend
        data = PackedRows(a.data_path, a.seq_length)
        resolve(a, world_size=world, rank=rank, device=device, backend=backend, vocab_size=data.info.vocab_size)
        fault = active_fault()
        skip_bucket = fault_bucket() if fault == "skip-bucket-reduce" else None
        steps = a.train_iters + (1 + a.profile_steps if a.profile else 0)
        data.verify(range(steps * a.global_batch_size))
        if a.num_threads is None:
            a.num_threads = torch.get_num_threads()
    except (ConfigError, DataError) as e:
        if rank == 0:
            print(f"tinygpt: error: {e}", file=sys.stderr, flush=True)
        return 2
    if world > 1:
        from datetime import timedelta

        kwargs = {"device_id": torch.device("cuda", local_rank)} if device == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=a.distributed_timeout_minutes), **kwargs)
    try:
        return run(a, data, fault, skip_bucket)
    except DataError as e:
        print(f"tinygpt: error on rank {rank}: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()  # gloo aborts if a peer tears down while it still reads
            dist.destroy_process_group()
