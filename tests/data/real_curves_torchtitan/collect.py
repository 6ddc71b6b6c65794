"""Collect torchtitan's CI loss goldens (tests/assets/losses/*.txt) across their git history into curves.json.

torchtitan's 8-GPU feature test trains a Llama 3 debug model and a Qwen3 MoE debug model for 100
steps in deterministic mode and compares the losses with a golden file (`step loss` per line), one
per platform (CUDA, ROCm MI350X). A commit that changes a golden says why in its message. Each pair
below is (the file before commit C, the file at C), classified from C's message and diff alone
(before looking at the curves):

- ``environment``: the software/hardware underneath changed (PyTorch/Triton/ROCm upgrade, BLAS
  backend, eager vs compiled kernel), or the same commit's CUDA and ROCm goldens;
- ``kernel``: a same-math code change (fused QKV projection, chunked cross-entropy, folding the batch
  dimension into the token dimension);
- ``layout``: a parallelism change (FSDP8 -> FSDP4 + TP2 + EP4);
- ``objective``: the loss, data, initialisation, masking or MoE balancing changed.

Usage (needs a local clone; tests read only curves.json):
    python tests/data/real_curves_torchtitan/collect.py /path/to/torchtitan
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = "tests/assets/losses"
# commit (short) -> (kind, why); decided from each commit's message and diff.
COMMITS: dict[str, tuple[str, str]] = {
    "77444f3d3": ("environment", "PyTorch's Triton upgrade 3.7.1 -> 3.8.0 changed numerics"),
    "b5eb9d92f": ("environment", "an upstream PyTorch change moved CUDA losses (golden updated)"),
    "f9f30e86e": ("environment", "PyTorch made cuBLASLt the default BLAS backend"),
    "96ab7487d": ("environment", "ROCm 7.1 -> 7.2 wheels"),
    "1c40dd26a": ("environment", "ROCm flex attention run eagerly instead of compiled"),
    "70ea1cee4": ("environment", "ROCm losses regenerated (torchdata pin removed)"),
    "bb349622b": ("environment", "ROCm MoE losses regenerated"),
    "3396a4b37": ("kernel", "fused QKV projection by default (same math, other GEMM shapes)"),
    "786e26f8e": ("kernel", "chunked cross-entropy loss and FSDP resharding changes (same math)"),
    "73aed7f6c": ("kernel", "batch dimension folded into the token dimension (same math, other shapes)"),
    "936ac8b9b": ("layout", "MoE test moved from FSDP8 to FSDP4 + TP2 + EP4"),
    "3f71477c8": ("objective", "loss masked at document boundaries (another loss)"),
    "031b84cf5": ("objective", "Qwen3 initialisation changed to normal(0.02)"),
    "1b04fc1c3": ("objective", "data pipeline replaced by Grain (other batches)"),
    "8e5554449": ("objective", "Qwen3 MoE expert-bias load balancing switched on (was never updated)"),
    "169545712": ("objective", "SDPA/causal mask deprecated: FlexAttention with document masking"),
}
PLATFORM_PAIRS = (("llama3_cuda", "llama3_rocm_mi350x"), ("qwen3_moe_cuda", "qwen3_moe_rocm_mi350x"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def curve(repo: Path, commit: str, name: str) -> dict[str, float] | None:
    try:
        text = git(repo, "show", f"{commit}:{ROOT}/{name}.txt")
    except subprocess.CalledProcessError:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[0]] = float(parts[1])
    return out if len(out) >= 5 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ns = ap.parse_args()
    cases: dict[str, dict] = {}
    pairs: list[dict] = []

    def add(name: str, commit: str) -> str | None:
        c = curve(ns.repo, commit, name)
        if c is None:
            return None
        full = git(ns.repo, "rev-parse", commit).strip()
        key = f"{name}@{full[:9]}"
        cases[key] = {"path": f"{ROOT}/{name}.txt", "commit": full, "lm_loss": c}
        return key

    for short, (kind, why) in COMMITS.items():
        for name in sorted({n for p in PLATFORM_PAIRS for n in p}):
            changed = git(ns.repo, "show", "--format=", "--name-only", short, "--", f"{ROOT}/{name}.txt").strip()
            if not changed:
                continue
            a, b = add(name, f"{short}^"), add(name, short)
            if a and b and cases[a]["lm_loss"] != cases[b]["lm_loss"]:
                pairs.append({"kind": kind, "baseline": a, "candidate": b, "why": why, "commit": short})
    for short in ("3396a4b37", "936ac8b9b"):  # the same commit's CUDA and ROCm goldens: another platform
        for cuda, rocm in PLATFORM_PAIRS:
            a, b = add(cuda, short), add(rocm, short)
            if a and b:
                pairs.append({"kind": "environment", "baseline": a, "candidate": b, "commit": short,
                              "why": "the same commit's golden on CUDA and on ROCm MI350X"})
    doc = {"source": {"repo": "pytorch/torchtitan", "root": ROOT, "what": "loss per step (100 steps), bf16 "
                      "deterministic CI runs; each case is one golden file at one commit"},
           "cases": dict(sorted(cases.items())), "pairs": pairs}
    (HERE / "curves.json").write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    lines = ["# Provenance of curves.json", "", "Repository: pytorch/torchtitan (https://github.com/pytorch/torchtitan), "
             "BSD-3-Clause. Made by `python tests/data/real_curves_torchtitan/collect.py <clone>`; each case is one "
             "loss-golden file at one commit; each pair is the file before and after a commit (or the CUDA and "
             "ROCm files of one commit), classified from the commit's message and diff (collect.py).", "",
             "| kind | baseline | candidate | commit | why |", "|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {p['kind']} | `{cases[p['baseline']]['path']}` @ `{cases[p['baseline']]['commit']}` | "
                     f"`{cases[p['candidate']]['path']}` @ `{cases[p['candidate']]['commit']}` | {p['commit']} | "
                     f"{p['why']} |")
    (HERE / "PROVENANCE.md").write_text("\n".join(lines) + "\n")
    print(f"{len(cases)} cases, {len(pairs)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
