"""Component tests for same-math swaps.

A swap (another path to the same function) may run on a model only after its component
test passed there: the default path, the candidate and a higher-precision reference run on
identical inputs; the swap passes if the candidate's error against the reference is at most
about twice the default's, and, where there is routing, if the experts chosen are the same.

The rule (:func:`judge`) is generic. The tests below run it on the example workload,
tinygpt (``examples/tinygpt``), at its shapes and on its real data rows. tinygpt trains in
float32, so its reference is float64 (the paper's models train in BF16 with an FP32
reference: one precision level up, in both cases).

- ``optimizer_impl`` (for-loop -> foreach / fused AdamW): a few optimizer steps from the same
  parameters with the same gradients; error of the parameter update; on the MoE model, the
  routing of a batch after the steps.
- ``torch_compile`` (eager -> compiled): loss and gradients of one forward/backward.
- control, ``grad_reduce_in_bf16`` (a numeric argument, not a swap): gradients accumulated over
  the microbatches in BF16 instead of FP32. It must fail: it shows the test can tell.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field

DEFAULT_FACTOR = 2.0
# A reference that the default path matches exactly would make any difference infinitely worse;
# errors below this are treated as this (float32 unit roundoff is 6e-8).
ERROR_FLOOR = 1e-12


class ComponentResult(BaseModel):
    model: str = Field(description="The correctness list the result is for (tinygpt, tinygpt-moe).")
    swap: str = Field(description="The argument (attribute name).")
    default: Any
    candidate: Any
    default_error: float = Field(description="Relative L2 error of the default path against the reference.")
    candidate_error: float = Field(description="Relative L2 error of the candidate against the reference.")
    ratio: float = Field(description="candidate_error / default_error (floored).")
    factor: float
    routing_identical: bool | None = Field(default=None, description="None where the model has no routing.")
    routing_mismatches: int | None = None
    routing_total: int | None = None
    passed: bool
    reason: str
    control: bool = Field(default=False, description="A negative control: expected to fail.")


def relative_error(values: Iterable[Any], reference: Iterable[Any]) -> float:
    """||x - ref|| / ||ref|| over all tensors together, computed in float64."""
    import torch

    num = 0.0
    den = 0.0
    for x, r in zip(values, reference, strict=True):
        x64 = x.detach().to(torch.float64)
        r64 = r.detach().to(torch.float64)
        num += float(torch.sum((x64 - r64) ** 2))
        den += float(torch.sum(r64**2))
    if den == 0.0:
        return math.sqrt(num)
    return math.sqrt(num / den)


def judge(default_error: float, candidate_error: float, factor: float = DEFAULT_FACTOR,
          routing_identical: bool | None = None) -> tuple[bool, float, str]:
    """(passed, ratio, reason) for one swap."""
    ratio = max(candidate_error, ERROR_FLOOR) / max(default_error, ERROR_FLOOR)
    if not math.isfinite(candidate_error):
        return False, math.inf, "the candidate's output is not finite"
    if routing_identical is False:
        return False, ratio, "routing differs from the default path"
    if ratio > factor:
        return False, ratio, (f"error against the reference {candidate_error:.3g} is {ratio:.2f}x the default's "
                              f"{default_error:.3g} (limit {factor}x)")
    return True, ratio, f"error {candidate_error:.3g} is {ratio:.2f}x the default's {default_error:.3g} (limit {factor}x)"


# ---------------------------------------------------------------- tinygpt


def _tinygpt():
    try:
        from examples.tinygpt import model as tg_model
        from examples.tinygpt.data import DEFAULT_DATA_PATH, PackedRows
        from examples.tinygpt.reducer import GradReducer
    except ImportError as exc:  # pragma: no cover - depends on the checkout
        raise RuntimeError("the tinygpt component tests need the examples/tinygpt workload (run from the "
                           f"repository root): {exc}") from exc
    return tg_model, PackedRows, DEFAULT_DATA_PATH, GradReducer


class TinyShapes(BaseModel):
    """tinygpt's baseline shapes (examples/tinygpt defaults)."""

    num_layers: int = 4
    hidden_size: int = 128
    num_attention_heads: int = 4
    seq_length: int = 128
    rows: int = 8
    microbatches: int = 4
    num_experts: int | None = None
    moe_router_topk: int = 2
    seed: int = 1234
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    optimizer_steps: int = 3


def _build(shapes: TinyShapes):
    import torch

    tg_model, packed_rows, data_path, _ = _tinygpt()
    data = packed_rows(data_path, shapes.seq_length)
    vocab = data.info.vocab_size
    padded = ((vocab + 127) // 128) * 128
    cfg = tg_model.ModelConfig(
        num_layers=shapes.num_layers, hidden_size=shapes.hidden_size, ffn_hidden_size=4 * shapes.hidden_size,
        num_attention_heads=shapes.num_attention_heads, max_position_embeddings=shapes.seq_length,
        padded_vocab_size=padded, num_experts=shapes.num_experts, moe_router_topk=shapes.moe_router_topk,
    )
    torch.manual_seed(shapes.seed)
    model = tg_model.GPT(cfg)
    return model, data


def _batch(data, first: int, rows: int):
    import torch

    arr = torch.from_numpy(data.rows(range(first, first + rows)).astype("int64"))
    return arr[:, :-1].contiguous(), arr[:, 1:].contiguous()


def _loss(model, tokens, labels, aux_coeff: float = 0.01):
    import torch.nn.functional as F

    logits, lb = model(tokens)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).to(logits.dtype), labels.reshape(-1))
    return ce + aux_coeff * lb if model.cfg.num_experts else ce


def _routing(model, tokens) -> list:
    """Top-k expert indices of every MoE layer for a batch (eager forward, no grad)."""
    import torch

    picks: list = []
    hooks = []
    for layer in model.layers:
        if getattr(layer, "moe", False):
            moe = layer.mlp

            def hook(_m, _inp, out, moe=moe):
                probs = torch.softmax(out.float(), dim=-1)
                picks.append(torch.topk(probs, moe.topk, dim=-1).indices.sort(dim=-1).values)

            hooks.append(moe.router.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return picks


def _routing_compare(a: list, b: list) -> tuple[bool, int, int]:
    import torch

    mismatches = sum(int(torch.any(x != y, dim=-1).sum()) for x, y in zip(a, b, strict=True))
    total = sum(int(x.shape[0]) for x in a)
    return mismatches == 0, mismatches, total


def optimizer_impl_test(candidate: str, shapes: TinyShapes | None = None,
                        factor: float = DEFAULT_FACTOR) -> ComponentResult:
    """AdamW for-loop (default) vs ``candidate`` (foreach | fused) vs a float64 for-loop reference."""
    import torch

    shapes = shapes or TinyShapes()
    model, data = _build(shapes)
    params0 = [p.detach().clone() for p in model.parameters()]
    grads: list[list] = []
    for k in range(shapes.optimizer_steps):
        model.zero_grad(set_to_none=True)
        tokens, labels = _batch(data, k * shapes.rows, shapes.rows)
        _loss(model, tokens, labels).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])

    def run(impl: str, dtype) -> list:
        ps = [torch.nn.Parameter(p.to(dtype).clone()) for p in params0]
        opt = torch.optim.AdamW(ps, lr=shapes.lr, betas=shapes.betas, eps=shapes.eps,
                                weight_decay=shapes.weight_decay, foreach=impl == "foreach", fused=impl == "fused")
        for gs in grads:
            for p, g in zip(ps, gs, strict=True):
                p.grad = g.to(dtype).clone()
            opt.step()
        return [p.detach() for p in ps]

    ref = run("for-loop", torch.float64)
    dflt = run("for-loop", torch.float32)
    cand = run(candidate, torch.float32)
    deltas = lambda ps: [p.to(torch.float64) - p0.to(torch.float64) for p, p0 in zip(ps, params0, strict=True)]  # noqa: E731
    d_err = relative_error(deltas(dflt), deltas(ref))
    c_err = relative_error(deltas(cand), deltas(ref))
    routing = (None, None, None)
    if shapes.num_experts:
        tokens, _ = _batch(data, 10_000, shapes.rows)
        m_d, m_c = copy.deepcopy(model), copy.deepcopy(model)
        with torch.no_grad():
            for p, v in zip(m_d.parameters(), dflt, strict=True):
                p.copy_(v)
            for p, v in zip(m_c.parameters(), cand, strict=True):
                p.copy_(v)
        routing = _routing_compare(_routing(m_d, tokens), _routing(m_c, tokens))
    passed, ratio, reason = judge(d_err, c_err, factor, routing[0])
    return ComponentResult(model="tinygpt-moe" if shapes.num_experts else "tinygpt", swap="optimizer_impl",
                           default="for-loop", candidate=candidate, default_error=d_err, candidate_error=c_err,
                           ratio=ratio, factor=factor, routing_identical=routing[0], routing_mismatches=routing[1],
                           routing_total=routing[2], passed=passed, reason=reason)


def _forward_backward(model, tokens, labels) -> list:
    model.zero_grad(set_to_none=True)
    loss = _loss(model, tokens, labels)
    loss.backward()
    return [loss.detach()] + [p.grad.detach().clone() for p in model.parameters()]


def torch_compile_test(shapes: TinyShapes | None = None, factor: float = DEFAULT_FACTOR) -> ComponentResult:
    """Eager (default) vs torch.compile (candidate) vs float64 eager reference: loss and gradients."""
    import torch

    shapes = shapes or TinyShapes()
    model, data = _build(shapes)
    tokens, labels = _batch(data, 0, shapes.rows)
    ref_model = copy.deepcopy(model).double()
    ref = _forward_backward(ref_model, tokens, labels)
    dflt = _forward_backward(model, tokens, labels)
    compiled = torch.compile(copy.deepcopy(model))
    cand = _forward_backward(compiled, tokens, labels)
    d_err, c_err = relative_error(dflt, ref), relative_error(cand, ref)
    passed, ratio, reason = judge(d_err, c_err, factor)
    return ComponentResult(model="tinygpt-moe" if shapes.num_experts else "tinygpt", swap="torch_compile",
                           default=False, candidate=True, default_error=d_err, candidate_error=c_err, ratio=ratio,
                           factor=factor, passed=passed, reason=reason)


def grad_reduce_bf16_control(shapes: TinyShapes | None = None, factor: float = DEFAULT_FACTOR) -> ComponentResult:
    """Negative control: gradients accumulated over microbatches in BF16 (candidate) vs FP32 (default)."""
    import torch

    shapes = shapes or TinyShapes()
    _, _, _, grad_reducer = _tinygpt()
    model, data = _build(shapes)
    tokens, labels = _batch(data, 0, shapes.rows * shapes.microbatches)

    def accumulate(m, dtype) -> list:
        red = grad_reducer(m, bucket_size=250_000, grad_dtype=dtype, world_size=1)
        red.start_step()
        n = shapes.microbatches
        for i in range(n):
            red.set_last_microbatch(i == n - 1)
            sl = slice(i * shapes.rows, (i + 1) * shapes.rows)
            (_loss(m, tokens[sl], labels[sl]) / n).backward()
        red.finish()
        return [p.grad.detach().clone() for p in m.parameters()]

    ref = accumulate(copy.deepcopy(model).double(), torch.float64)
    dflt = accumulate(copy.deepcopy(model), torch.float32)
    cand = accumulate(copy.deepcopy(model), torch.bfloat16)
    d_err, c_err = relative_error(dflt, ref), relative_error(cand, ref)
    passed, ratio, reason = judge(d_err, c_err, factor)
    return ComponentResult(model="tinygpt", swap="grad_reduce_in_bf16", default=False, candidate=True,
                           default_error=d_err, candidate_error=c_err, ratio=ratio, factor=factor, passed=passed,
                           reason=reason, control=True)


def tinygpt_suite(include_compile: bool = False) -> list[ComponentResult]:
    """Every tinygpt component test (compile is optional: it takes a while on CPU)."""
    tests: list[Callable[[], ComponentResult]] = [
        lambda: optimizer_impl_test("foreach"),
        lambda: optimizer_impl_test("fused"),
        lambda: optimizer_impl_test("foreach", TinyShapes(num_experts=4)),
        lambda: optimizer_impl_test("fused", TinyShapes(num_experts=4)),
        lambda: grad_reduce_bf16_control(),
    ]
    if include_compile:
        tests.append(lambda: torch_compile_test())
    return [t() for t in tests]
