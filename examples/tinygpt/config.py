"""tinygpt's command line: Megatron-LM-style flags, validation, and derived (resolved) arguments.

Every resolved argument, derived ones included, is printed in the arguments block, so that a flag
which silently changes another (``--grad-reduce-in-bf16`` turning
``accumulate_allreduce_grads_in_fp32`` off, ``--bf16`` changing ``params_dtype``) is visible in the
log. See docs/tinygpt.md for each argument's objective class.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .data import DEFAULT_DATA_PATH

FAULTS = ("labels-offset", "loss-mask-shift", "skip-bucket-reduce", "zero-lb-loss", "stale-gradient", "scaled-loss",
          "wrong-attention-mask", "wrong-position-ids")
FAULT_ENV = "TINYGPT_FAULT"
FAULT_BUCKET_ENV = "TINYGPT_FAULT_BUCKET"


class ConfigError(ValueError):
    """An argument value or combination tinygpt cannot run."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="examples/tinygpt/train.py",
        description="tinygpt: a small GPT trained with data parallelism, logging like Megatron-LM.",
    )
    g = p.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--ffn-hidden-size", type=int, default=None, help="default: 4 x hidden size")
    g.add_argument("--num-attention-heads", type=int, default=4)
    g.add_argument("--seq-length", type=int, default=128)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: seq length")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g.add_argument("--num-experts", type=int, default=None, help="MoE MLP in every layer when set")
    g.add_argument("--moe-router-topk", type=int, default=2)
    g.add_argument("--moe-aux-loss-coeff", type=float, default=1e-2)
    g.add_argument("--moe-ffn-hidden-size", type=int, default=None, help="default: ffn hidden size")

    g = p.add_argument_group("batch and optimisation")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=16)
    g.add_argument("--train-iters", type=int, default=14)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine"), default="constant")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None, help="default: train iters")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--eod-mask-loss", action="store_true", help="no loss where the input token is end-of-text")
    g.add_argument("--optimizer-impl", choices=("for-loop", "foreach", "fused"), default="for-loop",
                   help="AdamW implementation (same math)")

    g = p.add_argument_group("precision")
    g.add_argument("--bf16", action="store_true", help="bf16 autocast compute (fp32 master weights)")
    g.add_argument("--grad-reduce-in-bf16", action="store_true",
                   help="accumulate and all-reduce gradients in bf16")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="(the default unless --grad-reduce-in-bf16)")

    g = p.add_argument_group("parallelism and performance")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--ddp-bucket-size", type=int, default=250_000, help="elements per gradient bucket")
    g.add_argument("--overlap-grad-reduce", action="store_true")
    g.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    g.add_argument("--recompute-method", choices=("uniform", "block"), default=None)
    g.add_argument("--recompute-num-layers", type=int, default=None)
    g.add_argument("--torch-compile", action="store_true")
    g.add_argument("--num-threads", type=int, default=None,
                   help="intra-op threads per rank (default: OMP_NUM_THREADS, else torch's default)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument("--distributed-backend", choices=("auto", "gloo", "nccl"), default="auto")
    g.add_argument("--distributed-timeout-minutes", type=int, default=10)

    g = p.add_argument_group("data")
    g.add_argument("--data-path", type=Path, default=DEFAULT_DATA_PATH)
    g.add_argument("--tokenizer-type", choices=("ByteLevel",), default="ByteLevel")

    g = p.add_argument_group("logging and profiling")
    g.add_argument("--log-interval", type=int, default=1)
    g.add_argument("--log-throughput", action="store_true")
    g.add_argument("--metrics-out", type=Path, default=None, help="JSON of what the trainer measured")
    g.add_argument("--run-dir", type=Path, default=None)
    g.add_argument("--trace-dir", type=Path, default=None, help="default: the run dir")
    g.add_argument("--profile", action="store_true",
                   help="after the measured window, trace --profile-steps more steps with torch.profiler")
    g.add_argument("--profile-steps", type=int, default=3)
    g.add_argument("--profile-ranks", type=int, nargs="+", default=None, help="default: all ranks")
    return p


def _positive(a: argparse.Namespace, *names: str) -> None:
    for n in names:
        v = getattr(a, n)
        if v is not None and v <= 0:
            raise ConfigError(f"--{n.replace('_', '-')} must be a positive integer, got {v}")


def resolve(a: argparse.Namespace, world_size: int, rank: int, device: str, backend: str,
            vocab_size: int) -> argparse.Namespace:
    """Validate and add the derived arguments, in place. Raises ConfigError naming the flag."""
    _positive(a, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
              "global_batch_size", "train_iters", "log_interval", "ddp_bucket_size", "num_threads",
              "profile_steps", "make_vocab_size_divisible_by", "ffn_hidden_size", "moe_ffn_hidden_size",
              "recompute_num_layers", "max_position_embeddings")
    for n in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        if getattr(a, n) != 1:
            raise ConfigError(f"--{n.replace('_', '-')} must be 1: tinygpt has data parallelism only")
    if a.hidden_size % a.num_attention_heads:
        raise ConfigError(f"--hidden-size ({a.hidden_size}) must be divisible by --num-attention-heads "
                          f"({a.num_attention_heads})")
    a.world_size = world_size
    a.rank = rank
    a.data_parallel_size = world_size
    per_step = a.micro_batch_size * a.data_parallel_size
    if a.global_batch_size % per_step:
        raise ConfigError(
            f"--global-batch-size ({a.global_batch_size}) must be divisible by --micro-batch-size x "
            f"data-parallel size ({a.micro_batch_size} x {a.data_parallel_size} = {per_step})")
    a.num_micro_batches = a.global_batch_size // per_step
    if a.num_experts is not None:
        if a.num_experts < 1:
            raise ConfigError(f"--num-experts must be >= 1, got {a.num_experts}")
        if not 1 <= a.moe_router_topk <= a.num_experts:
            raise ConfigError(f"--moe-router-topk ({a.moe_router_topk}) must be between 1 and --num-experts "
                              f"({a.num_experts})")
    if a.moe_aux_loss_coeff < 0:
        raise ConfigError(f"--moe-aux-loss-coeff must be >= 0, got {a.moe_aux_loss_coeff}")
    if a.lr <= 0 or a.min_lr < 0 or a.min_lr > a.lr:
        raise ConfigError(f"--lr must be > 0 and 0 <= --min-lr <= --lr (got {a.lr}, {a.min_lr})")
    if a.recompute_granularity != "full" and (a.recompute_method or a.recompute_num_layers):
        raise ConfigError("--recompute-method/--recompute-num-layers need --recompute-granularity full")
    if a.recompute_granularity == "full":
        a.recompute_method = a.recompute_method or "uniform"
        a.recompute_num_layers = a.recompute_num_layers or 1
    if a.grad_reduce_in_bf16 and a.accumulate_allreduce_grads_in_fp32:
        raise ConfigError("--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 contradict each other")
    # Megatron: bf16 training accumulates and reduces gradients in fp32 unless told to reduce in bf16.
    a.accumulate_allreduce_grads_in_fp32 = not a.grad_reduce_in_bf16
    a.main_grads_dtype = "torch.float32" if a.accumulate_allreduce_grads_in_fp32 else "torch.bfloat16"
    a.params_dtype = "torch.bfloat16" if a.bf16 else "torch.float32"
    a.fp16 = False
    a.ffn_hidden_size = a.ffn_hidden_size or 4 * a.hidden_size
    if a.num_experts:
        a.moe_ffn_hidden_size = a.moe_ffn_hidden_size or a.ffn_hidden_size
    a.kv_channels = a.hidden_size // a.num_attention_heads
    a.max_position_embeddings = a.max_position_embeddings or a.seq_length
    if a.max_position_embeddings < a.seq_length:
        raise ConfigError(f"--max-position-embeddings ({a.max_position_embeddings}) must be >= --seq-length "
                          f"({a.seq_length})")
    a.vocab_size = vocab_size
    d = a.make_vocab_size_divisible_by
    a.padded_vocab_size = ((vocab_size + d - 1) // d) * d
    a.lr_decay_iters = a.lr_decay_iters or a.train_iters
    a.optimizer = "adam"
    a.position_embedding_type = "learned_absolute"
    a.normalization = "LayerNorm"
    a.attention_dropout = 0.0
    a.hidden_dropout = 0.0
    a.tokens_per_iteration = a.global_batch_size * a.seq_length
    if a.num_threads is None:
        env = os.environ.get("OMP_NUM_THREADS")
        if env:
            try:
                a.num_threads = int(env)
            except ValueError as e:
                raise ConfigError(f"OMP_NUM_THREADS must be an integer, got {env!r}") from e
    a.device = device
    a.distributed_backend = backend
    if a.profile:
        if a.trace_dir is None and a.run_dir is None:
            raise ConfigError("--profile needs --run-dir or --trace-dir (where the traces go)")
        a.trace_dir = a.trace_dir or a.run_dir
        ranks = a.profile_ranks if a.profile_ranks is not None else list(range(world_size))
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad:
            raise ConfigError(f"--profile-ranks {bad} outside 0..{world_size - 1}")
        a.profile_ranks = ranks
    return a


def printable(a: argparse.Namespace) -> dict[str, object]:
    """The resolved arguments as printed in the arguments block and written to --metrics-out."""
    out: dict[str, object] = {}
    for k, v in sorted(vars(a).items()):
        if k == "rank":
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


def active_fault() -> str | None:
    """The injected fault, from the environment only (never shown in the arguments block)."""
    f = os.environ.get(FAULT_ENV, "").strip()
    if not f:
        return None
    if f not in FAULTS:
        raise ConfigError(f"{FAULT_ENV} must be one of {', '.join(FAULTS)}, got {f!r}")
    return f


def fault_bucket() -> int:
    """Index of the bucket the skip-bucket-reduce fault leaves unreduced (default 0)."""
    v = os.environ.get(FAULT_BUCKET_ENV, "0")
    try:
        return int(v)
    except ValueError as e:
        raise ConfigError(f"{FAULT_BUCKET_ENV} must be an integer bucket index, got {v!r}") from e
