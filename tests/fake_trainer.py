"""A stand-in trainer for the broker tests (not a test module): a real process that logs like Megatron-LM.

It prints Megatron-LM's arguments block and one iteration line per step (sleeping the step time),
and can misbehave on request, as real jobs do:

    --fake-mode ok     train --train-iters steps and exit 0
    --fake-mode oom    raise an out-of-memory error at step --fake-fail-at (traceback, exit 1)
    --fake-mode hang   stop logging at step --fake-fail-at and sleep (until killed)
    --fake-mode crash  exit 3 at step --fake-fail-at without a word
    --fake-mode infra  report an NCCL system error (a network or host fault) at that step and exit 1
    --fake-echo TEXT   print TEXT in the arguments block, after every iteration and at the end (a job
                       whose own flags carry failure signatures)
    --fake-loss-drift  a stand-in for a code fault that the configuration check cannot see: the loss
                       curve drifts away from the baseline's (the convergence check should reject it)
    --fake-loss-jitter a stand-in for a nondeterministic stack: each logged loss is off by a relative
                       Gaussian error of this size, drawn from a seed of the run's directory (two runs of
                       the same recipe differ, one run is reproducible)

It imports only the standard library, so it starts in milliseconds (real PyTorch runs use tinygpt),
and it logs its nominal step time (it does sleep that long), so its throughput does not depend on
how busy the machine is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


class OutOfMemoryError(RuntimeError):
    """What torch raises as torch.OutOfMemoryError."""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2, help="ranks it claims (the campaign's GPU count)")
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--train-iters", type=int, default=14)
    p.add_argument("--fake-step-ms", type=float, default=20.0)
    p.add_argument("--fake-mode", choices=("ok", "oom", "hang", "crash", "infra"), default="ok")
    p.add_argument("--fake-fail-at", type=int, default=3)
    p.add_argument("--fake-variant", type=int, default=0, help="does nothing: makes recipes distinct")
    p.add_argument("--fake-loss-drift", type=float, default=0.0,
                   help="a stand-in for a code fault: the loss decays slower by this much per step")
    p.add_argument("--fake-loss-jitter", type=float, default=0.0,
                   help="relative Gaussian error on each logged loss, seeded by the run directory")
    p.add_argument("--fake-echo", nargs="+", default=None,
                   help="words printed as one line (arguments block, every step, the end)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--run-dir", default=None)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    if a.fake_echo is not None:
        a.fake_echo = " ".join(a.fake_echo)
    broken = os.environ.get("FAKE_FAIL_FILE")
    if broken and os.path.exists(broken):  # the machine broke after calibration: every run crashes at once
        print(f"fake trainer: {broken} exists; crashing", flush=True)
        sys.exit(3)

    args = {
        "global_batch_size": a.global_batch_size, "seq_length": a.seq_length, "train_iters": a.train_iters,
        "world_size": a.world_size, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
        "micro_batch_size": 1, "lr": a.lr, "log_interval": 1,
    }
    if a.fake_echo is not None:
        args["fake_echo"] = a.fake_echo
    print("------------------------ arguments ------------------------")
    for name in sorted(args):
        print(f"  {name} {'.' * (48 - len(name))} {args[name]}")
    print("-------------------- end of arguments ---------------------", flush=True)
    loss = 10.0
    import hashlib
    import random

    jitter = random.Random(hashlib.sha256(os.path.basename(str(a.run_dir)).encode()).hexdigest())
    for it in range(1, a.train_iters + 1):
        step = it - 1
        if a.fake_mode != "ok" and step == a.fake_fail_at:
            if a.fake_echo is not None:
                print(f"note: {a.fake_echo}", flush=True)
            if a.fake_mode == "oom":
                raise OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB"
                )
            if a.fake_mode == "hang":
                while True:
                    time.sleep(60)
            if a.fake_mode == "crash":
                sys.exit(3)
            if a.fake_mode == "infra":
                print("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                      "unhandled system error (run with NCCL_DEBUG=INFO for details)", flush=True)
                sys.exit(1)
        time.sleep(a.fake_step_ms / 1000.0)
        ms = a.fake_step_ms  # the nominal step time: scores are deterministic whatever the machine's load
        loss *= 0.97 + a.fake_loss_drift
        print(
            f" [2026-10-02 11:04:17.123456] iteration {it:8d}/{a.train_iters:8d} |"
            f" consumed samples: {it * a.global_batch_size:12d} |"
            f" elapsed time per iteration (ms): {ms:.1f} |"
            f" learning rate: {a.lr:.6E} | global batch size: {a.global_batch_size:5d} |"
            f" lm loss: {loss * (1.0 + a.fake_loss_jitter * jitter.gauss(0.0, 1.0)):.6E} | loss scale: 1.0 |"
            f" grad norm: 0.812 |"
            f" number of skipped iterations:   0 | number of nan iterations:   0 |",
            flush=True,
        )
        if a.fake_echo is not None:
            print(f"note: {a.fake_echo}", flush=True)
    if a.fake_echo is not None:
        print(f"done; note: {a.fake_echo}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
