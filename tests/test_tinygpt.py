"""tinygpt: real training runs (torchrun, gloo on CPU) checked against the Megatron-LM log format.

The slow tests start real processes: the 2-rank, 14-step baseline (with profiling), and short
5-step runs comparing loss curves. Legitimate levers must reproduce the reference losses up to float
noise (observed ~3e-8 relative); objective-changing flags and injected faults must move them by
far more (observed >= 2e-5).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from examples.tinygpt import megatron_log as mlog
from examples.tinygpt.config import FAULT_ENV
from examples.tinygpt.data import DEFAULT_DATA_PATH, DataError, PackedRows
from examples.tinygpt.trainer import main as tinygpt_main

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
SHORT = 5  # steps of the loss-comparison runs
EQUAL_RTOL = 2e-6  # legitimate levers: max relative loss difference allowed
CHANGED_MIN = 1e-5  # objective changes and faults: min of the max relative difference

ITER_RE = re.compile(
    r"^ \[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\] iteration +(?P<it>\d+)/ +(?P<total>\d+) \|"
    r" consumed samples: +(?P<consumed>\d+) \|"
    r" elapsed time per iteration \(ms\): (?P<ms>\d+\.\d) \|"
    r"(?: throughput per GPU \(TFLOP/s/GPU\): (?P<tflops>\d+\.\d) \|)?"
    r" learning rate: (?P<lr>\d\.\d{6}E[+-]\d\d) \|"
    r" global batch size: +(?P<gbs>\d+) \|"
    r"(?: lm loss: (?P<loss>\d\.\d{6}E[+-]\d\d) \|)?"
    r"(?: load_balancing_loss: (?P<lb>\d\.\d{6}E[+-]\d\d) \|)?"
    r" loss scale: (?P<scale>\d+\.\d) \|"
    r"(?: grad norm: (?P<gn>\d+\.\d{3}) \|)?"
    r" number of skipped iterations: +(?P<skipped>\d+) \|"
    r" number of nan iterations: +(?P<nan>\d+) \|$"
)
MEM_RE = re.compile(
    r"^\[Rank (?P<rank>\d+)\] \(after (?P<it>\d+) iterations\) memory \(MB\)"
    r" \| allocated: (?P<a>[\d.]+) \| max allocated: (?P<ma>[\d.]+)"
    r" \| reserved: (?P<r>[\d.]+) \| max reserved: (?P<mr>[\d.]+)$"
)


def run_tinygpt(tmp: Path, name: str, nproc: int, *args: str, fault: str | None = None,
                iters: int = SHORT, env_extra: dict[str, str] | None = None) -> tuple[str, dict]:
    """Run tinygpt for real; return its stdout and the --metrics-out JSON."""
    metrics = tmp / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env[FAULT_ENV] = fault
    env.update(env_extra or {})
    launch = [sys.executable, str(TRAIN)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(TRAIN)]
    cmd = [*launch, "--train-iters", str(iters), "--metrics-out", str(metrics), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, f"{name} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout, json.loads(metrics.read_text())


def losses(m: dict, key: str = "lm_loss") -> list[float]:
    return [r[key] for r in m["iterations"]]


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def args_block(out: str) -> list[str]:
    lines = out.splitlines()
    i = lines.index(mlog.ARGS_HEADER)
    j = lines.index(mlog.ARGS_FOOTER)
    return lines[i + 1:j]


def arg_values(out: str) -> dict[str, str]:
    vals = {}
    for line in args_block(out):
        m = re.match(r"^  (\S+) \.+ (.*)$", line)
        assert m, f"bad argument line {line!r}"
        vals[m.group(1)] = m.group(2)
    return vals


def _args_sans_paths(out: str) -> list[str]:
    return [ln for ln in args_block(out) if not ln.startswith("  metrics_out ")]


# ------------------------------------------------------------------------------------ fast tests


def test_iteration_line_shape_and_nan_loss_omitted():
    from datetime import datetime

    kw = dict(iteration=12, train_iters=14, consumed_samples=24576, elapsed_ms=5312.44, learning_rate=1e-5,
              global_batch_size=2048, loss_scale=1.0, grad_norm=0.8123, skipped_iterations=0, nan_iterations=0,
              now=datetime(2026, 10, 2, 11, 4, 17, 123456))
    line = mlog.iteration_line(losses={"lm loss": 2.134567, "load_balancing_loss": 1.02}, tflops_per_gpu=402.74, **kw)
    assert line == (
        " [2026-10-02 11:04:17.123456] iteration       12/      14 | consumed samples:        24576 |"
        " elapsed time per iteration (ms): 5312.4 | throughput per GPU (TFLOP/s/GPU): 402.7 |"
        " learning rate: 1.000000E-05 | global batch size:  2048 | lm loss: 2.134567E+00 |"
        " load_balancing_loss: 1.020000E+00 | loss scale: 1.0 | grad norm: 0.812 |"
        " number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    assert ITER_RE.match(line)
    nan_line = mlog.iteration_line(losses={"lm loss": float("nan"), "load_balancing_loss": 0.0}, **kw)
    assert "lm loss" not in nan_line and "load_balancing_loss" not in nan_line
    assert ITER_RE.match(nan_line).group("loss") is None


def test_arguments_block_is_sorted_and_dotted():
    block = mlog.arguments_block({"world_size": 2, "accumulate_allreduce_grads_in_fp32": False, "Lr": 0.1})
    lines = block.splitlines()
    assert lines[0] == mlog.ARGS_HEADER and lines[-1] == mlog.ARGS_FOOTER
    assert lines[1] == "  accumulate_allreduce_grads_in_fp32 .............. False"
    assert [ln.split()[0] for ln in lines[1:-1]] == ["accumulate_allreduce_grads_in_fp32", "Lr", "world_size"]
    for ln in lines[1:-1]:
        name, dots = re.match(r"^  (\S+) (\.+) \S+$", ln).groups()
        assert len(name) + len(dots) == 48


def test_data_rows_are_fixed_and_hash_checked(tmp_path):
    d = PackedRows(DEFAULT_DATA_PATH, 128)
    manifest = json.loads((DEFAULT_DATA_PATH / "manifest.json").read_text())
    assert d.info.tokens_sha256 == manifest["tokens_sha256"]
    assert d.info.num_tokens == sum(doc["clean_bytes"] + 1 for doc in manifest["documents"])
    r0 = d.row(0)
    assert r0.shape == (129,) and r0.max() <= 256
    assert (d.row(len(d)) == r0).all()  # wraps around after one epoch
    # Consecutive packed windows share one token (Megatron's sample layout).
    starts = sorted(manifest["packings"]["128"]["row_start"])
    assert starts[:3] == [0, 128, 256]
    # Documents are the plays, separated by end-of-text.
    first = manifest["documents"][1]
    assert d.tokens[first["token_offset"] - 1] == 256
    text = bytes(d.tokens[first["token_offset"]:first["token_offset"] + 7].astype("uint8")).decode()
    assert text == "MACBETH"

    bad = tmp_path / "data"
    shutil.copytree(DEFAULT_DATA_PATH, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["packings"]["128"]["row_hash"][3] = "0" * 16
    (bad / "manifest.json").write_text(json.dumps(m))
    rows = PackedRows(bad, 128)
    rows.row(2)
    with pytest.raises(DataError, match="data row hash mismatch: sample 3 "):
        rows.row(3)
    with pytest.raises(DataError, match="seq_length 100 has no packed rows"):
        PackedRows(bad, 100)
    raw = bytearray((bad / "tokens.u16").read_bytes())
    raw[1000] ^= 1
    (bad / "tokens.u16").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="token file .* has sha256"):
        PackedRows(bad, 128)


def test_trainer_refuses_bad_data_and_bad_flags(tmp_path, capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", FAULT_ENV):
        monkeypatch.delenv(k, raising=False)
    bad = tmp_path / "data"
    shutil.copytree(DEFAULT_DATA_PATH, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["packings"]["128"]["row_hash"][20] = "f" * 16
    (bad / "manifest.json").write_text(json.dumps(m))
    assert tinygpt_main(["--data-path", str(bad), "--train-iters", "2"]) == 2
    assert "data row hash mismatch: sample 20" in capsys.readouterr().err
    cases = [
        (["--global-batch-size", "10", "--micro-batch-size", "4"], "--global-batch-size (10) must be divisible"),
        (["--hidden-size", "130"], "--hidden-size (130) must be divisible by --num-attention-heads"),
        (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size must be 1"),
        (["--num-experts", "2", "--moe-router-topk", "3"], "--moe-router-topk (3) must be between 1 and"),
        (["--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"], "contradict"),
        (["--profile"], "--profile needs --run-dir or --trace-dir"),
        (["--seq-length", "100"], "seq_length 100 has no packed rows"),
    ]
    for argv, msg in cases:
        assert tinygpt_main(argv) == 2, argv
        assert msg in capsys.readouterr().err, argv
    monkeypatch.setenv(FAULT_ENV, "no-such-fault")
    assert tinygpt_main([]) == 2
    assert "TINYGPT_FAULT must be one of" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Cache of real runs shared by the tests below: name -> (stdout, metrics)."""
    tmp = tmp_path_factory.mktemp("tinygpt-runs")
    cache: dict[str, tuple[str, dict]] = {}

    def get(name: str, nproc: int, *args: str, fault: str | None = None) -> tuple[str, dict]:
        if name not in cache:
            cache[name] = run_tinygpt(tmp, name, nproc, *args, fault=fault)
        return cache[name]

    return get


@pytest.mark.slow
def test_baseline_two_ranks_14_steps_log_metrics_and_traces(tmp_path):
    run_dir = tmp_path / "run"
    out, m = run_tinygpt(tmp_path, "baseline", 2, "--run-dir", str(run_dir), "--profile", "--profile-steps", "2",
                         "--log-throughput", iters=14)
    lines = out.splitlines()
    # Arguments block: every resolved argument, sorted, derived ones included.
    block = args_block(out)
    names = [ln.split()[0] for ln in block]
    assert names == sorted(names, key=str.lower)
    vals = arg_values(out)
    assert vals["world_size"] == "2" and vals["data_parallel_size"] == "2"
    assert vals["num_micro_batches"] == "8" and vals["micro_batch_size"] == "1"
    assert vals["accumulate_allreduce_grads_in_fp32"] == "True" and vals["params_dtype"] == "torch.float32"
    assert vals["num_threads"] == "1" and vals["distributed_backend"] == "gloo"
    assert set(m["args"]) == set(vals)
    # Iteration lines: exactly iterations 1..14, printed once (by the last rank).
    its = [ITER_RE.match(ln) for ln in lines if " iteration " in ln and "|" in ln]
    assert all(its), [ln for ln in lines if " iteration " in ln][:3]
    assert [int(x["it"]) for x in its] == list(range(1, 15))
    assert all(int(x["total"]) == 14 and int(x["gbs"]) == 16 for x in its)
    assert [int(x["consumed"]) for x in its] == [16 * k for k in range(1, 15)]
    assert all(x["tflops"] is not None and x["lb"] is None for x in its)
    # The log agrees with what the trainer measured.
    recs = m["iterations"]
    assert len(recs) == 14
    for x, r in zip(its, recs, strict=True):
        assert float(x["ms"]) == pytest.approx(r["step_time_ms"], abs=0.051)
        assert float(x["loss"]) == pytest.approx(r["lm_loss"], rel=1e-6)
        assert r["tokens"] == 16 * 128 and r["step_time_ms"] > 0
    assert sum(r["step_time_ms"] for r in recs) <= m["train_wall_s"] * 1000.0 + 1.0
    # It trains: byte-level loss starts near ln(384) and falls.
    assert recs[0]["lm_loss"] == pytest.approx(5.95, abs=0.1)
    assert recs[-1]["lm_loss"] < recs[0]["lm_loss"] - 1.0
    # Memory: one line per rank after the first and the last iteration; peaks in the metrics.
    mem = [MEM_RE.match(ln) for ln in lines if ln.startswith("[Rank ")]
    assert all(mem)
    assert sorted((int(x["rank"]), int(x["it"])) for x in mem) == [(0, 1), (0, 14), (1, 1), (1, 14)]
    assert all(float(x["ma"]) >= float(x["a"]) > 50 for x in mem)
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    for r in m["ranks"]:
        assert r["memory_kind"] == "rss" and r["peak_memory_mib"] > 50 and len(r["step_time_ms"]) == 14
    # Profile: one Kineto trace per rank, with the step annotations and the gloo all-reduce.
    files = sorted(run_dir.glob("rank*.pt.trace.json"))
    assert [f.name.split(".")[0] for f in files] == ["rank0", "rank1"]
    assert sorted(m["profile"]["files"]) == [str(f) for f in files]
    trace = json.loads(files[1].read_text())
    assert trace["distributedInfo"]["rank"] == 1 and trace["distributedInfo"]["world_size"] == 2
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2", "gloo:all_reduce", "tinygpt.forward_backward"} <= names
    assert len(recs) == 14  # profiled steps are not measured iterations


@pytest.mark.slow
def test_legitimate_levers_keep_the_loss_curve(runs):
    _, ref = runs("dp1", 1)
    variants = {
        "dp2": (2,),
        "dp2-mb4-full-recompute-foreach": (2, "--micro-batch-size", "4", "--recompute-granularity", "full",
                                           "--optimizer-impl", "foreach"),
        "dp2-mb2-selective-fused-buckets-overlap-threads": (
            2, "--micro-batch-size", "2", "--recompute-granularity", "selective", "--optimizer-impl", "fused",
            "--ddp-bucket-size", "50000", "--overlap-grad-reduce", "--num-threads", "2"),
        "dp1-mb4-block-recompute": (1, "--micro-batch-size", "4", "--recompute-granularity", "full",
                                    "--recompute-method", "block", "--recompute-num-layers", "2"),
    }
    for name, (nproc, *args) in variants.items():
        out, m = runs(name, nproc, *args)
        diff = max_rel(losses(m), losses(ref))
        assert diff < EQUAL_RTOL, f"{name}: loss curve moved by {diff:.2e}"
        assert m["args"]["global_batch_size"] == 16


@pytest.mark.slow
def test_objective_changing_flags_change_the_loss_curve(runs):
    _, ref = runs("dp2", 2)
    changes = {
        "lr": ("--lr", "2e-3"),
        "global-batch": ("--global-batch-size", "32"),
        "seq-length": ("--seq-length", "64"),
        "bf16": ("--bf16",),
        "grad-reduce-in-bf16": ("--grad-reduce-in-bf16",),
    }
    for name, args in changes.items():
        out, m = runs(name, 2, *args)
        diff = max_rel(losses(m), losses(ref))
        assert diff > CHANGED_MIN, f"{name}: loss curve moved only {diff:.2e}"
        vals = arg_values(out)
        if name == "bf16":
            assert vals["params_dtype"] == "torch.bfloat16"
        if name == "grad-reduce-in-bf16":
            # The silent side effect is visible in the arguments block.
            assert vals["accumulate_allreduce_grads_in_fp32"] == "False"
            assert vals["main_grads_dtype"] == "torch.bfloat16"


@pytest.mark.slow
def test_moe_microbatch_size_changes_the_objective_but_dp_does_not(runs):
    out, mb1 = runs("moe-dp2-mb1", 2, "--num-experts", "4")
    _, dp1 = runs("moe-dp1-mb1", 1, "--num-experts", "4")
    _, mb4 = runs("moe-dp2-mb4", 2, "--num-experts", "4", "--micro-batch-size", "4")
    its = [ITER_RE.match(ln) for ln in out.splitlines() if " iteration " in ln and "|" in ln]
    assert all(x and x["lb"] is not None for x in its)
    assert [float(x["lb"]) for x in its] == pytest.approx(losses(mb1, "load_balancing_loss"), rel=1e-6)
    assert 0.9 < mb1["iterations"][0]["load_balancing_loss"] < 1.5
    assert max_rel(losses(dp1), losses(mb1)) < EQUAL_RTOL
    assert max_rel(losses(dp1, "load_balancing_loss"), losses(mb1, "load_balancing_loss")) < EQUAL_RTOL
    # Per-microbatch load balancing: a bigger microbatch changes the aux loss from the first step on.
    first = abs(mb4["iterations"][0]["load_balancing_loss"] / mb1["iterations"][0]["load_balancing_loss"] - 1)
    assert first > 1e-4
    assert max_rel(losses(mb4), losses(mb1)) > CHANGED_MIN


@pytest.mark.slow
def test_faults_change_the_loss_and_are_not_in_the_arguments(runs):
    base_out, base = runs("dp2", 2)
    moe_out, moe = runs("moe-dp2-mb1", 2, "--num-experts", "4")
    for fault in ("labels-offset", "loss-mask-shift", "skip-bucket-reduce", "stale-gradient", "scaled-loss",
                  "wrong-attention-mask", "wrong-position-ids"):
        out, m = runs(f"fault-{fault}", 2, fault=fault)
        diff = max_rel(losses(m), losses(base))
        assert diff > CHANGED_MIN, f"{fault}: loss curve moved only {diff:.2e}"
        assert _args_sans_paths(out) == _args_sans_paths(base_out), f"{fault} is visible in the arguments"
    out, m = runs("fault-zero-lb-loss", 2, "--num-experts", "4", fault="zero-lb-loss")
    assert all(r["load_balancing_loss"] == 0.0 for r in m["iterations"])
    assert "load_balancing_loss" not in out  # a zero loss is omitted, as Megatron does
    assert max_rel(losses(m), losses(moe)) > CHANGED_MIN


@pytest.mark.slow
def test_torch_compile_keeps_the_loss_curve(tmp_path):
    """torch.compile on a 1-layer model (a cold inductor compile of the default model takes longer)."""
    small = ("--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "64",
             "--global-batch-size", "4", "--micro-batch-size", "2")
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    _, eager = run_tinygpt(tmp_path, "eager", 1, *small, iters=3)
    out, compiled = run_tinygpt(tmp_path, "compiled", 1, *small, "--torch-compile", iters=3, env_extra=cache)
    assert arg_values(out)["torch_compile"] == "True"
    assert max_rel(losses(compiled), losses(eager)) < EQUAL_RTOL
