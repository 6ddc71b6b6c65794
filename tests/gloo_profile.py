"""A real CPU-only profile: a two-stage pipeline over gloo, traced by torch.profiler.

usage: python tests/gloo_profile.py OUT_DIR [STEPS]

Rank 0 runs the first stage and sends its activations to rank 1; rank 1 runs the second stage
and the loss, and sends the activations' gradient back; both all-reduce the loss for logging
(a data-parallel style collective). Three steps are traced (after one wait and one warm-up
step); each rank writes ``rank<r>.pt.trace.json`` into OUT_DIR.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule


def _stage(rank: int, world: int, out_dir: str, port: int, steps: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    layer = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    batch = (32, 256)

    def trace_ready(prof: profile) -> None:
        prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.pt.trace.json"))

    sched = schedule(wait=1, warmup=1, active=steps)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=trace_ready) as prof:
        for _ in range(steps + 2):
            opt.zero_grad()
            if rank == 0:
                x = torch.randn(*batch)
                h = layer(x)
                dist.send(h.detach(), 1)
                grad = torch.empty(*batch)
                dist.recv(grad, 1)
                h.backward(grad)
                loss = torch.zeros(())
            else:
                h = torch.empty(*batch)
                dist.recv(h, 0)
                h.requires_grad_(True)
                loss = layer(h).pow(2).mean()
                loss.backward()
                dist.send(h.grad, 0)
            opt.step()
            dist.all_reduce(loss.detach())
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.makedirs(out_dir, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_stage, args=(2, out_dir, port, steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
