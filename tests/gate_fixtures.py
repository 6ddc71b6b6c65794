"""Baseline recipes (command-line form) of the paper's evaluation models and tinygpt, for the gate's tests."""

from __future__ import annotations

LLAMA = {
    "--tensor-model-parallel-size": 4, "--pipeline-model-parallel-size": 8, "--context-parallel-size": 2,
    "--num-layers-per-virtual-pipeline-stage": 2, "--sequence-parallel": True, "--micro-batch-size": 1,
    "--global-batch-size": 64, "--seq-length": 8192, "--bf16": True, "--fp8-format": "hybrid",
    "--fp8-recipe": "tensorwise", "--tp-comm-overlap": True, "--calculate-per-token-loss": True,
    "--use-distributed-optimizer": True, "--overlap-grad-reduce": True, "--overlap-param-gather": True,
    "--num-layers": 126, "--hidden-size": 16384, "--num-attention-heads": 128, "--lr": 1e-5,
    "--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": "te", "--manual-gc": True,
    "--manual-gc-interval": 100,
}
MIXTRAL = {
    "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 8, "--expert-model-parallel-size": 8,
    "--expert-tensor-parallel-size": 1, "--sequence-parallel": True, "--micro-batch-size": 1,
    "--global-batch-size": 256, "--seq-length": 4096, "--bf16": True, "--num-experts": 8, "--moe-router-topk": 2,
    "--moe-aux-loss-coeff": 0.01, "--moe-token-dispatcher-type": "alltoall", "--moe-grouped-gemm": True,
    "--use-distributed-optimizer": True, "--num-layers": 56, "--hidden-size": 6144, "--lr": 1e-5,
}
GLM = {
    "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 8, "--expert-model-parallel-size": 16,
    "--expert-tensor-parallel-size": 1, "--sequence-parallel": True, "--micro-batch-size": 1,
    "--global-batch-size": 2048, "--seq-length": 4096, "--bf16": True, "--num-experts": 160, "--moe-router-topk": 8,
    "--moe-token-dispatcher-type": "alltoall", "--moe-shared-expert-overlap": True, "--moe-grouped-gemm": True,
    "--moe-permute-fusion": True, "--recompute-granularity": "selective", "--use-distributed-optimizer": True,
    "--decoder-first-pipeline-num-layers": 10, "--decoder-last-pipeline-num-layers": 10, "--num-layers": 92,
    "--hidden-size": 5120, "--lr": 1e-5,
}
MINIMAX = {
    "--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 2, "--expert-model-parallel-size": 8,
    "--expert-tensor-parallel-size": 1, "--micro-batch-size": 1, "--global-batch-size": 256, "--seq-length": 8192,
    "--bf16": True, "--num-experts": 256, "--moe-router-topk": 8, "--moe-router-load-balancing-type": "none",
    "--moe-router-enable-expert-bias": True, "--lr-decay-style": "constant", "--optimizer-cpu-offload": True,
    "--use-precision-aware-optimizer": True, "--use-distributed-optimizer": True,
    "--moe-token-dispatcher-type": "alltoall", "--num-layers": 62, "--hidden-size": 3072, "--lr": 1e-5,
}
TINYGPT = {
    "--num-layers": 4, "--hidden-size": 128, "--num-attention-heads": 4, "--seq-length": 128,
    "--micro-batch-size": 1, "--global-batch-size": 16, "--train-iters": 20, "--lr": 1e-3, "--seed": 1234,
}

BASELINES = {"llama31-405b": LLAMA, "mixtral-8x22b": MIXTRAL, "glm-4.5": GLM, "minimax-m2": MINIMAX,
             "tinygpt": TINYGPT}


def megatron_log(resolved: dict[str, object], losses: dict[int, float | None], train_iters: int | None = None,
                 prefix: str = "") -> str:
    """A log in Megatron-LM's shape: the arguments block, then one iteration line per step
    (a ``None`` loss prints the line without its ``lm loss`` field, as Megatron does for NaN)."""
    n = train_iters or max(losses)
    lines = [f"{prefix}using world size: 8", f"{prefix}------------------------ arguments ------------------------"]
    body = [f"{prefix}  {k} {'.' * max(1, 48 - len(k))} {v}" for k, v in resolved.items()]
    lines += sorted(body, key=str.lower)
    lines.append(f"{prefix}-------------------- end of arguments ---------------------")
    for it, loss in sorted(losses.items()):
        s = (f"{prefix} [2026-10-02 11:04:17.123456] iteration {it:8d}/{n:8d} | consumed samples: {it * 16:12d} | "
             f"elapsed time per iteration (ms): 5312.4 | learning rate: 1.000000E-05 | global batch size:    16 |")
        if loss is not None:
            s += f" lm loss: {loss:.6E} |"
        s += " loss scale: 1.0 | grad norm: 0.812 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        lines.append(s)
    return "\n".join(lines) + "\n"
