"""The gate reads a run's losses and resolved arguments with the reader of the campaign's framework.

A torchtitan campaign's check run is read as torchtitan, not as Megatron (there is one log parser
per framework, in attune.readers.metrics; the gate has none of its own)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attune.control import shipper
from attune.control.plane import Control
from attune.core.campaign_paths import run_log
from attune.core.state import RunState
from attune.core.vocab import RunKind, RunOutcome
from attune.readers.metrics import MetricsInputError, read_losses, read_resolved_args
from tests._broker_helpers import make_campaign
from tests.gate_fixtures import megatron_log

STEPS = 20


def _loss(step: int, drift: float = 0.0) -> float:
    return 10.5 - 4.5 * (1 - math.exp(-3 * (step - 1) / (STEPS - 1))) + drift * step


def torchtitan_log(drift: float = 0.0) -> str:
    """A torchtitan log: its start line, then one metrics line per step (as its metrics rank prints)."""
    lines = ["[titan] 2026-10-02 11:04:17,123 - root - INFO - Trainer is initialized with local batch size 8, "
             f"global batch size 16, gradient accumulation steps 1, sequence length 128, total steps {STEPS} "
             "(warmup 2)"]
    for s in range(1, STEPS + 1):
        lines.append(f"[titan] 2026-10-02 11:04:{17 + s:02d},123 - root - INFO - step: {s:2d}  "
                     f"loss: {_loss(s, drift):7.4f}  grad_norm:  1.2345  memory:  1.23GiB(1.50%)  "
                     "tps: 12,345  tflops: 1.23  mfu: 0.99%")
    return "\n".join(lines) + "\n"


def test_torchtitan_losses_are_read_by_the_torchtitan_reader(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text(torchtitan_log())
    losses = read_losses(log, "torchtitan")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[7] == pytest.approx(_loss(7), abs=1e-4)
    assert read_losses(log, "megatron-lm") == {}  # the Megatron reader finds no iteration line in it
    with pytest.raises(ValueError, match="torchtitan logs print no resolved-arguments block"):
        read_resolved_args(log, "torchtitan")
    with pytest.raises(MetricsInputError, match="framework"):
        read_losses(log, "no-such-framework")


def test_megatron_resolved_arguments_need_a_complete_block(tmp_path: Path) -> None:
    whole = tmp_path / "whole.log"
    whole.write_text(megatron_log({"seed": 1234, "bf16": True}, {1: 10.0, 2: 9.5}, prefix="[rank0]: "))
    assert read_resolved_args(whole, "megatron-lm") == {"bf16": "True", "seed": "1234"}
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(whole.read_text().splitlines()[:3]) + "\n")
    with pytest.raises(ValueError, match="not terminated"):
        read_resolved_args(cut, "megatron-lm")
    none = tmp_path / "none.log"
    none.write_text("hello\n")
    with pytest.raises(ValueError, match="no resolved-arguments block"):
        read_resolved_args(none, "megatron-lm")


def test_shipping_reads_a_torchtitan_check_run_with_the_torchtitan_reader(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, framework="torchtitan")
    control = Control(d)
    state = control.state()
    assert state.framework == "torchtitan"
    for rid, drift in (("ref", 0.0), ("chk", 0.05)):
        run_log(d, rid).parent.mkdir(parents=True)
        run_log(d, rid).write_text(torchtitan_log(drift))
    ref = RunState("ref", RunKind.CHECK, status="finished", outcome=RunOutcome.OK, base_run_id="baseline")
    run = RunState("chk", RunKind.CHECK, status="finished", outcome=RunOutcome.OK, base_run_id="r002-step")
    out = shipper.evaluate_check(control, state, run, ref)
    conv = out["convergence"]
    # every step's torchtitan loss was read and paired by its step number: the drift is seen
    assert conv["n_steps"] == STEPS
    assert conv["deviation"]["steps"] == STEPS and conv["deviation"]["final_rel"] > 0.05
    assert not conv["passed"] and not out["passed"]
    # a torchtitan log prints no resolved-arguments block: layer 1's re-check says so, it does not crash
    assert not out["layer1"]["passed"] and "no resolved arguments block" in out["layer1"]["summary"]
