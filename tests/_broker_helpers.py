"""Campaigns for the broker tests (not a test module).

The jobs are real processes: `tests/fake_trainer.py`, a stand-in trainer that logs like
Megatron-LM in milliseconds and misbehaves on request (out of memory, hang, crash). The gate is
the real layer 1, with a correctness list for the stand-in's flags (`FAKE_LIST`).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from attune.control.campaign import start

ROOT = Path(__file__).resolve().parents[1]

FAKE_LIST = """\
schema_version: 1
model: fake
description: 'Correctness list for tests/fake_trainer.py.'
args:
  fake_step_ms: {class: structural, why: 'stand-in for a layout lever: changes only the step time'}
  fake_mode: {class: structural, why: 'makes the stand-in misbehave (out of memory, hang, crash)'}
  fake_fail_at: {class: structural, why: 'the step where it misbehaves'}
  fake_variant: {class: structural, why: 'does nothing: makes recipes distinct'}
  fake_echo: {class: structural, why: 'printed text only'}
  fake_loss_drift: {class: structural, why: 'listed as structural on purpose: a stand-in for a code fault only the convergence check sees'}
  fake_loss_jitter: {class: structural, why: 'a stand-in for a nondeterministic stack (run-to-run loss noise)'}
  lr: {class: numeric, why: 'the learning rate changes the objective'}
  seq_length: {class: numeric, why: 'the row length is the workload'}
  global_batch_size: {class: numeric, why: 'the batch is the workload'}
  train_iters: {class: structural, why: 'run length'}
  run_dir: {class: structural, why: 'bookkeeping'}
  profile: {class: structural, why: 'tracing after the window'}
"""

FAKE_SPEC: dict[str, Any] = {
    "name": "fake-a",
    "model": "fake",
    "framework": "megatron-lm",
    "cluster": {"backend": "local", "gpus": 2, "gpus_per_node": 2, "accelerator": "cpu", "settings": {"slots": 8}},
    "baseline": {
        "command": ["python", "tests/fake_trainer.py", "--world-size", "{gpus}"],
        "args": {"--seq-length": 128, "--global-batch-size": 16, "--train-iters": 14, "--fake-step-ms": 20},
    },
    "workload": {"seq_length": 128, "global_batch": 16, "precision": "fp32"},
    "budget": {"concurrency": 3},
    "gate": {"lists": "fake.yaml"},
    "control": {
        "hang_timeout_s": 2.0,
        "poll_interval_s": 0.1,
        "stack_fixes": {"args": {"--run-dir": "{run_dir}"}, "env": {"ATTUNE_FIX": "1"}},
        "image_roots": {"trainer": "tests"},
    },
}


def deep_update(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_update(out[k], v)
        else:
            out[k] = v
    return out


def make_campaign(parent: Path, name: str = "fake-a", replace: dict[str, Any] | None = None,
                  search_rules: str = "enforced", **over: Any) -> Path:
    """A started campaign directory running the stand-in trainer (`over` is merged, `replace` replaces;
    search_rules="off" for a test of something else that stops early, as a black-box tuner's campaign may)."""
    d = parent / name
    d.mkdir(parents=True)
    spec = deep_update(FAKE_SPEC, {"name": name, **over})
    spec.update(copy.deepcopy(replace or {}))
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (d / "fake.yaml").write_text(FAKE_LIST)
    start(d, search_rules=search_rules)
    return d


def wait_for(pred: Callable[[], bool], timeout_s: float = 30.0, step: Callable[[], Any] | None = None,
             interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if step is not None:
            step()
        if pred():
            return
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval_s)


def search(changes: dict[str, Any], lever: str = "step", **kw: Any) -> dict[str, Any]:
    """A well-formed search launch request."""
    body = {"kind": "search", "changes": {"args": changes}, "hypothesis": "the step is compute bound",
            "lever": lever, "expected_gain": 0.1, "code_locations": {k: "tests/fake_trainer.py:30" for k in changes}}
    body.update(kw)
    return body


def tune(d: Path, *extra: str, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`attune tune CAMPAIGN --tuner heuristic --json` as a user runs it, then the campaign's broker stopped
    whatever happened (the broker outlives `attune tune` by design)."""
    root = cwd or Path(__file__).resolve().parents[1]
    try:
        return subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner", "heuristic",
                               "--json", *extra], capture_output=True, text=True, timeout=timeout, cwd=root)
    finally:
        subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], capture_output=True, cwd=root,
                       timeout=60)
