"""Writers of training-log lines in the frameworks' own formats, for the metrics tests.

The format strings follow Megatron-LM's `training_log` / `report_memory`, Megatron-Bridge's
`training_log` and torchtitan's `MetricsProcessor.log` (read in their 2026 heads): the field
order, separators, widths and number formats are theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MEGATRON_ARGS = {
    "accumulate_allreduce_grads_in_fp32": "True",
    "bf16": "True",
    "context_parallel_size": "1",
    "global_batch_size": "16",
    "hidden_size": "1024",
    "log_interval": "1",
    "micro_batch_size": "2",
    "num_layers": "8",
    "pipeline_model_parallel_size": "2",
    "seq_length": "1024",
    "tensor_model_parallel_size": "1",
    "train_iters": "14",
    "world_size": "4",
    "data_path": "['/data/fineweb_text_document']",
}


def arguments_block(args: dict[str, str] = MEGATRON_ARGS, prefix: str = "") -> list[str]:
    lines = [prefix + "------------------------ arguments ------------------------"]
    for name in sorted(args):
        dots = "." * (48 - len(name))
        lines.append(f"{prefix}  {name} {dots} {args[name]}")
    lines.append(prefix + "-------------------- end of arguments ---------------------")
    return lines


def iteration_line(
    iteration: int,
    step_ms: float,
    loss: float | None,
    *,
    train_iters: int = 14,
    gbs: int = 16,
    timestamp: str | None = "2026-10-02 11:04:17.123456",
    skipped: int = 0,
    nan: int = 0,
    tflops: float | None = 402.7,
    extra_losses: dict[str, float] | None = None,
) -> str:
    """A Megatron-LM iteration line. loss=None drops the field, as Megatron does for a NaN loss."""
    s = f" [{timestamp}]" if timestamp else ""
    s += f" iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {iteration * gbs:12d} |"
    s += f" elapsed time per iteration (ms): {step_ms:.1f} |"
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {1e-5 * iteration:.6E} |"
    s += f" global batch size: {gbs:5d} |"
    if loss is not None:
        s += f" lm loss: {loss:.6E} |"
    for key, value in (extra_losses or {}).items():
        s += f" {key}: {value:.6E} |"
    s += " loss scale: 1.0 |"
    s += " grad norm: 0.812 |"
    s += f" number of skipped iterations: {skipped:3d} |"
    s += f" number of nan iterations: {nan:3d} |"
    return s


def memory_line_mb(rank: int, after: int, alloc: float, max_alloc: float, reserved: float, max_reserved: float) -> str:
    return (
        f"[Rank {rank}] (after {after} iterations) memory (MB) | allocated: {alloc} | "
        f"max allocated: {max_alloc} | reserved: {reserved} | max reserved: {max_reserved}"
    )


def memory_line_gb(rank: int, after: int, alloc: float, max_alloc: float, reserved: float, max_reserved: float) -> str:
    return (
        f"[Rank {rank}] (after {after} iterations) memory (GB) | mem-allocated-gigabytes: {alloc} | "
        f"mem-active-gigabytes: {alloc} | mem-inactive-gigabytes: 1.2 | mem-reserved-gigabytes: {reserved} | "
        f"mem-max-allocated-gigabytes: {max_alloc} | mem-max-active-gigabytes: {max_alloc} | "
        f"mem-max-inactive-gigabytes: 3.4 | mem-max-reserved-gigabytes: {max_reserved} | "
        f"mem-alloc-retires: 0 | mem-allocated-count: 507"
    )


NCCL_NOISE = [
    "node-07:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>",
    "node-07:1234:1234 [0] NCCL INFO cudaDriverVersion 12080",
    "node-07:1234:1290 [0] NCCL INFO Channel 00/32 :    0   1   2   3",
    "/usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
    "`torch.distributed._all_gather_base` is a private function and will be deprecated.",
]


def step_times(n: int = 14, base: float = 1000.0) -> list[float]:
    """Step times in ms: slow first steps (start-up), then a steady window with small jitter."""
    warm = [9000.0, 3000.0, 1500.0, 1100.0]
    jitter = [0.0, 4.0, -3.0, 2.0, -5.0, 1.0, 3.0, -2.0, 6.0, -4.0]
    out = warm[: min(n, 4)]
    for i in range(4, n):
        out.append(base + jitter[(i - 4) % len(jitter)])
    return out


def losses(n: int = 14) -> list[float]:
    return [10.5 - 0.35 * i for i in range(n)]


def megatron_lm_log(
    *,
    n: int = 14,
    times: Sequence[float] | None = None,
    loss_values: Sequence[float | None] | None = None,
    timestamp: bool = True,
    args: dict[str, str] | None = MEGATRON_ARGS,
    noise: bool = True,
    gbs: int = 16,
) -> list[str]:
    """A complete Megatron-LM run log: NCCL chatter, arguments, memory per stage, n iterations."""
    times = list(times) if times is not None else step_times(n)
    loss_values = list(loss_values) if loss_values is not None else losses(n)
    lines: list[str] = []
    if noise:
        lines += NCCL_NOISE
    if args is not None:
        lines += arguments_block(args)
    lines.append("> building GPT model ...")
    for it in range(1, n + 1):
        ts = f"2026-10-02 11:04:{10 + it:02d}.123456" if timestamp else None
        lines.append(iteration_line(it, times[it - 1], loss_values[it - 1], train_iters=n, timestamp=ts, gbs=gbs))
        if it in (1, 2):
            # data-parallel rank 0 of each pipeline stage (4 GPUs, PP 2: ranks 0 and 2)
            lines.append(memory_line_mb(0, it, 4000.5, 6100.25 + it, 7000.0, 7168.0))
            lines.append(memory_line_mb(2, it, 3000.5, 5200.75 + it, 6000.0, 6144.0))
        if noise and it % 5 == 0:
            lines += NCCL_NOISE[3:]
    lines.append("[after training is done] datetime: 2026-10-02 11:05:01")
    return lines


# The end of a Megatron-LM log where rank 1 ran out of memory and its peers timed out.
OOM_TAIL = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/workspace/megatron/pretrain_gpt.py", line 299, in <module>',
    "[rank1]:     pretrain(",
    '[rank1]:   File "/workspace/megatron/megatron/training/training.py", line 386, in pretrain',
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total "
    "capacity of 79.11 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB "
    "memory in use. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    "[rank0]:[E1002 11:14:17.123456 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600012 milliseconds before timing out.",
    "E1002 11:14:20.000000 123 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
    "local_rank: 1 (pid: 5678) of binary: /usr/bin/python",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
]


def write(path, lines: Iterable[str], *, trailing_newline: bool = True) -> str:
    text = "\n".join(lines) + ("\n" if trailing_newline else "")
    path.write_text(text)
    return str(path)


def torchtitan_step_line(step: int, loss: float, mem_gib: float, tps: int, *, rank: int | None = 0, color: bool = True) -> str:
    c = {k: (f"\x1b[{v}m" if color else "") for k, v in
         {"red": 31, "green": 32, "orange": 33, "turquoise": 36, "blue": 34, "cyan": 96, "magenta": 35, "reset": 39}.items()}
    prefix = f"[rank{rank}]:" if rank is not None else ""
    return (
        f"{prefix}[titan] 2026-03-01 10:00:{step:02d},123 - root - INFO - "
        f"{c['red']}step: {step:2}  "
        f"{c['green']}loss: {loss:7.4f}  "
        f"{c['orange']}grad_norm: {1.25:7.4f}  "
        f"{c['turquoise']}memory: {mem_gib:5.2f}GiB({mem_gib / 80 * 100:.2f}%)  "
        f"{c['blue']}tps: {round(tps):,}  "
        f"{c['cyan']}tflops: {tps * 6e9 / 1e12:,.2f}  "
        f"{c['magenta']}mfu: {tps * 6e9 / 1e12 / 989 * 100:.2f}%{c['reset']}"
    )
