"""The metrics reader on Megatron-LM, Megatron-Bridge and torchtitan logs in their own formats."""

from __future__ import annotations

import math
import statistics

import pytest

from attune.readers.metrics import (
    FRAMEWORKS,
    MetricsInputError,
    analyze,
    get_parser,
    parse_window,
    read_metrics,
)
from attune.readers.metrics.failure import classify, signals_in_line
from attune.readers.metrics.records import MIB_PER_GB, Signal
from tests._metrics_logs import (
    MEGATRON_ARGS,
    OOM_TAIL,
    iteration_line,
    losses,
    megatron_lm_log,
    memory_line_gb,
    memory_line_mb,
    step_times,
    torchtitan_step_line,
    write,
)


def expected_throughput(times_ms, gbs, seq, gpus, first_it=5, last_it=14):
    window = times_ms[first_it - 1 : last_it]
    return gbs * seq * len(window) / (gpus * sum(window) / 1000.0)


# ---------------------------------------------------------------- Megatron-LM, the good path


@pytest.mark.parametrize("timestamp", [True, False], ids=["timestamp-prefix", "no-prefix"])
def test_megatron_lm_complete_run(tmp_path, timestamp):
    path = write(tmp_path / "log.txt", megatron_lm_log(timestamp=timestamp))
    m = read_metrics(path, framework="megatron-lm", gpus=4)
    times = step_times()
    assert m.valid, m.invalid_reasons
    assert m.failure_class == "ok"
    assert m.seq_length == 1024 and m.seq_length_source == "log"
    assert m.tokens_per_s_per_gpu == pytest.approx(expected_throughput(times, 16, 1024, 4))
    assert [r.iteration for r in m.steps] == list(range(1, 15))
    assert [r.loss for r in m.steps] == pytest.approx(losses())
    assert [r.step_time_ms for r in m.steps] == pytest.approx(times)
    assert m.window_spread == pytest.approx(
        math.sqrt(sum((t - 1000.2) ** 2 for t in times[4:]) / 10) / 1000.2
    )
    assert m.arguments["seq_length"] == "1024"
    assert m.arguments["data_path"] == "['/data/fineweb_text_document']"
    assert set(m.arguments) == set(MEGATRON_ARGS)
    assert m.arguments_complete
    assert m.last_iteration == m.train_iters == 14
    assert not m.warnings
    # Memory per rank (MiB) and per pipeline stage: world 4, PP 2 -> ranks 0-1 stage 0, 2-3 stage 1.
    mem = m.memory_dict()
    assert [(r["rank"], r["stage"]) for r in mem["per_rank"]] == [(0, 0), (2, 1)]
    assert mem["per_rank"][0]["max_allocated_mib"] == 6102.25  # the later, larger report wins
    assert [s["max_allocated_mib"] for s in mem["per_stage"]] == [6102.25, 5202.75]
    assert mem["peak_max_reserved_mib"] == 7168.0
    d = m.to_dict()
    assert d["steps"][4] | {} == d["steps"][4] and d["steps"][4]["in_window"] is True
    assert d["steps"][3]["in_window"] is False and d["steps"][3]["step"] == 3
    assert d["steps"][0]["tokens"] == 16 * 1024


def test_window_counts_steps_from_zero(tmp_path):
    path = write(tmp_path / "log.txt", megatron_lm_log())
    times = step_times()
    m = read_metrics(path, gpus=4, window=parse_window("0:3"), max_spread=10.0)
    assert list(m.window_iterations) == [1, 2, 3, 4]
    assert m.tokens_per_s_per_gpu == pytest.approx(expected_throughput(times, 16, 1024, 4, 1, 4))
    # The start-up steps vary far more than the default spread limit allows.
    m = read_metrics(path, gpus=4, window=(0, 3))
    assert not m.valid
    assert any("spread" in r for r in m.invalid_reasons)
    assert m.window_spread > 0.5


def test_spread_threshold_is_a_parameter(tmp_path):
    times = step_times()
    times[9] = 1400.0  # one slow step in the window
    path = write(tmp_path / "log.txt", megatron_lm_log(times=times))
    m = read_metrics(path, gpus=4)
    cv = statistics.pstdev(times[4:]) / statistics.fmean(times[4:])
    assert not m.valid and m.window_spread == pytest.approx(cv) and 0.11 < cv < 0.12
    assert m.invalid_reasons == [f"window step-time spread {cv:.3f} exceeds 0.100"]
    assert read_metrics(path, gpus=4, max_spread=0.2).valid


def test_reading_in_tiny_blocks_gives_the_same_answer(tmp_path):
    """Records, arguments, memory and line numbers do not depend on where the blocks split the file."""
    lines = megatron_lm_log()
    lines.insert(30, "[rank1]: Traceback (most recent call last):")
    path = write(tmp_path / "log.txt", lines)
    reference = get_parser("megatron-lm").read(path)
    for block_size in (7, 64, 333, 4096):
        parsed = get_parser("megatron-lm").read(path, block_size=block_size)
        assert parsed.steps == reference.steps
        assert parsed.arguments == reference.arguments and parsed.arguments_complete
        assert parsed.memory == reference.memory
        assert [(s.pattern, s.line) for s in parsed.signals] == [(s.pattern, s.line) for s in reference.signals]
        assert parsed.lines == reference.lines == len(lines)
    assert reference.signals[0].line == 31


def test_moe_losses_are_kept_by_name(tmp_path):
    line = iteration_line(5, 1000.0, 2.5, extra_losses={"load_balancing_loss": 1.02, "mtp_1 loss": 2.7})
    rec = get_parser("megatron-lm").read(write(tmp_path / "l.txt", [line])).steps[5]
    assert rec.loss == 2.5
    assert rec.extra_losses == {"load_balancing_loss": 1.02, "mtp_1 loss": 2.7}
    assert rec.global_batch_size == 16 and rec.skipped_iterations == 0 and rec.tflops_per_gpu == 402.7


# ---------------------------------------------------------------- Megatron-LM, the failure modes


def test_nan_loss_is_a_missing_field_keyed_by_iteration(tmp_path):
    values = losses()
    values[7] = None  # iteration 8: Megatron drops the "lm loss" field for a NaN
    path = write(tmp_path / "log.txt", megatron_lm_log(loss_values=values))
    m = read_metrics(path, gpus=4)
    assert m.step(8).loss is None
    # Pairing by iteration, not position: the losses after the gap stay on their own iterations.
    assert m.step(9).loss == pytest.approx(values[8]) and m.step(14).loss == pytest.approx(values[13])
    assert not m.valid
    assert m.invalid_reasons == ["iteration 8 has no loss (NaN or negative loss)"]
    assert m.loss_dict()["missing_or_nan_iterations"] == [8]
    assert m.failure_class == "ok"  # the run itself finished
    assert m.tokens_per_s_per_gpu is not None


def test_skipped_and_nan_iterations_invalidate_the_window(tmp_path):
    lines = megatron_lm_log()
    i = next(n for n, line in enumerate(lines) if "iteration        7/" in line)
    lines[i] = iteration_line(7, 1000.0, 0.0, skipped=1, nan=1)
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4)
    assert not m.valid
    assert "iteration 7 was skipped (1 skipped)" in m.invalid_reasons
    assert "iteration 7 had NaN (1 nan iterations)" in m.invalid_reasons


def test_truncated_log(tmp_path):
    lines = megatron_lm_log(noise=False)
    cut = next(n for n, line in enumerate(lines) if "iteration       11/" in line)
    lines = lines[: cut + 1]
    lines[-1] = lines[-1][:120]  # the writer died mid-line, inside "elapsed time per iteration"
    path = write(tmp_path / "log.txt", lines, trailing_newline=False)
    m = read_metrics(path, gpus=4)
    assert m.last_iteration == 10  # the cut line is not read as a record
    assert m.step(11) is None
    assert m.failure_class == "crash"
    assert m.verdict.reason == "the log stops at iteration 10 of 14 and no exit status was given"
    assert not m.valid
    assert "window iterations missing from the log: 11-14" in m.invalid_reasons
    assert any("unterminated" in w for w in m.warnings)
    # With the job's exit status the class follows it.
    assert read_metrics(path, gpus=4, exit_status=137).verdict.reason == "exit status 137"


def test_truncated_inside_the_arguments_block(tmp_path):
    lines = megatron_lm_log(noise=False)[:6]
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4)
    assert not m.arguments_complete and m.arguments  # what was there is kept
    assert any("no end marker" in w for w in m.warnings)
    assert m.failure_class == "crash" and m.last_iteration is None


def test_oom_traceback(tmp_path):
    lines = megatron_lm_log(n=14)[:-1]
    lines = lines[: next(n for n, line in enumerate(lines) if "iteration        3/" in line)] + OOM_TAIL
    path = write(tmp_path / "log.txt", lines)
    for exit_status in (None, 1):
        m = read_metrics(path, gpus=4, exit_status=exit_status)
        # The OOM is the cause; the peers' watchdog timeout and the traceback are its symptoms.
        assert m.failure_class == "oom"
        assert m.verdict.evidence[0].pattern == "ut of memory"
        assert "torch.OutOfMemoryError: CUDA out of memory" in m.verdict.evidence[0].text
        assert m.verdict.evidence[0].line == lines.index(OOM_TAIL[4]) + 1
        assert not m.valid and m.invalid_reasons[0].startswith("the run failed: oom")
    assert m.tokens_per_s_per_gpu is None  # no window step ran
    assert m.memory_dict()["per_rank"][0]["max_allocated_mib"] == 6102.25


def test_hang(tmp_path):
    lines = megatron_lm_log()
    lines = lines[: next(n for n, line in enumerate(lines) if "iteration        7/" in line)]
    quiet = write(tmp_path / "quiet.txt", lines)
    # No signature in the log: a hang is only told by how long the log has been quiet.
    assert read_metrics(quiet, gpus=4, seconds_since_progress=1200, hang_after_s=900).failure_class == "hang"
    m = read_metrics(quiet, gpus=4, seconds_since_progress=30, hang_after_s=900)
    assert m.failure_class == "crash" and "stops at iteration 6 of 14" in m.verdict.reason
    # The NCCL watchdog's timeout is a hang signature.
    watchdog = write(tmp_path / "watchdog.txt", lines + [OOM_TAIL[5]])
    m = read_metrics(watchdog, gpus=4)
    assert m.failure_class == "hang" and m.verdict.evidence[0].pattern.startswith("Watchdog")
    assert read_metrics(watchdog, gpus=4, exit_status=134).failure_class == "hang"


@pytest.mark.parametrize(
    "line",
    [
        "[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
        "slurmstepd: error: *** JOB 4242 ON node-07 CANCELLED AT 2026-10-02T11:20:00 DUE TO NODE FAILURE ***",
        "[rank2]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "sacct: 4242 pretrain NODE_FAIL",
    ],
)
def test_infrastructure_wins_over_crash(tmp_path, line):
    lines = megatron_lm_log()[:-5] + ["[rank3]: Traceback (most recent call last):", line]
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4, exit_status=1)
    assert m.failure_class == "infrastructure", m.verdict


def test_host_oom_kill_from_slurm(tmp_path):
    lines = megatron_lm_log()[:-5] + [
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been OOM Killed.",
        "srun: error: node-07: task 3: Out Of Memory",
    ]
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4, exit_status=137)
    assert m.failure_class == "oom" and m.verdict.evidence[0].pattern == "oom_kill"


def test_every_signature_is_reachable_through_a_gate():
    from attune.readers.metrics import failure

    for _, _, pattern in failure.SIGNATURES:
        assert any(gate in pattern for gate in failure.MARKERS) or pattern in (b"oom-kill", b"oom_kill"), pattern


def test_failure_precedence():
    def sig(cls, pattern):
        return Signal(cls, pattern, 1, pattern)

    node = sig("infrastructure", "NODE_FAIL")
    oom = sig("oom", "ut of memory")
    nccl = sig("infrastructure", "unhandled system error")
    hang = sig("hang", "DUE TO TIME LIMIT")
    crash = sig("crash", "Traceback (most recent call last)")
    assert classify([crash, oom, node]).failure_class == "infrastructure"
    assert classify([crash, nccl, oom]).failure_class == "oom"  # a peer's OOM breaks the NCCL sockets
    assert classify([crash, hang, nccl]).failure_class == "infrastructure"
    assert classify([crash, hang]).failure_class == "hang"
    assert classify([crash], exit_status=None, last_iteration=14, train_iters=14).failure_class == "crash"
    assert classify([crash], exit_status=0, last_iteration=14, train_iters=14).failure_class == "ok"
    assert classify([], exit_status=None, last_iteration=14, train_iters=14).failure_class == "ok"
    assert classify([], exit_status=-9).failure_class == "crash"
    assert signals_in_line("RuntimeError: CUDA error: out of memory") == [("oom", "ut of memory")]
    assert signals_in_line("[rank0]: AssertionError: bad flag") == []


def test_interleaved_ranks(tmp_path):
    """srun --label output: every rank's lines interleaved, two writes sharing one physical line."""
    arguments = megatron_lm_log(noise=False)
    times = step_times()
    lines = ["0: " + line for line in arguments[:17]]  # the arguments block, from rank 0
    for it in range(1, 15):
        lines.append(f"1: [rank1]:[W1002 11:04:{it:02d} reducer.cpp:1400] Warning: find_unused_parameters=True")
        line = "3: " + iteration_line(it, times[it - 1], losses()[it - 1])
        if it == 9:
            # rank 2's memory record lands inside the iteration line; the rest of it is lost
            line = line[:120] + memory_line_mb(2, 9, 3000.5, 5300.0, 6000.0, 6144.0)
        lines.append(line)
        if it == 1:
            lines.append("0: " + memory_line_mb(0, 1, 4000.5, 6100.25, 7000.0, 7168.0) + memory_line_mb(
                1, 1, 4001.5, 6200.5, 7000.0, 7168.0))
            lines.append("3: " + memory_line_mb(3, 1, 3000.0, 5100.0, 6000.0, 6144.0))
        lines.append(f"2: node-01:77:77 [2] NCCL INFO comm 0x5555 rank 2 nRanks 4 - Init COMPLETE {it}")
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4)
    assert m.seq_length == 1024 and m.arguments["world_size"] == "4"
    assert [r.iteration for r in m.steps] == list(range(1, 15))
    assert m.step(9).step_time_ms is None and m.step(9).loss is None
    assert m.step(9).problems and "interleaved" in m.step(9).problems[0]
    assert not m.valid
    assert m.invalid_reasons == [
        f"iteration 9: line {lines.index(next(x for x in lines if 'iteration        9/' in x)) + 1}: another record "
        "interleaved into the iteration line; field 'elapsed time per iterati' has no terminating '|' (cut or "
        "interleaved)"
    ]
    mem = {r["rank"]: r for r in m.memory_dict()["per_rank"]}
    assert sorted(mem) == [0, 1, 2, 3]
    assert mem[1]["max_allocated_mib"] == 6200.5 and mem[2]["max_allocated_mib"] == 5300.0
    assert [s["ranks"] for s in m.memory_dict()["per_stage"]] == [[0, 1], [2, 3]]
    # Measured over a window without the damaged step, the same log is valid.
    clean = read_metrics(tmp_path / "log.txt", gpus=4, window=(9, 13))
    assert clean.valid, clean.invalid_reasons
    assert clean.tokens_per_s_per_gpu == pytest.approx(expected_throughput(times, 16, 1024, 4, 10, 14))


def test_restart_duplicates_an_iteration(tmp_path):
    lines = megatron_lm_log()
    lines.insert(-1, iteration_line(12, 1003.0, 6.5))
    m = read_metrics(write(tmp_path / "log.txt", lines), gpus=4)
    assert m.step(12).loss == 6.5  # the later record wins
    assert "iterations logged more than once (a restart?): 12" in m.invalid_reasons


def test_sequence_length_rules(tmp_path):
    no_args = write(tmp_path / "noargs.txt", megatron_lm_log(args=None))
    with pytest.raises(MetricsInputError, match="seq_length: the log has no arguments block"):
        read_metrics(no_args, gpus=4)
    m = read_metrics(no_args, gpus=4, seq_length=2048)
    assert m.seq_length_source == "option"
    assert m.tokens_per_s_per_gpu == pytest.approx(expected_throughput(step_times(), 16, 2048, 4))
    assert m.memory_dict()["per_stage"] is None  # no layout without the arguments
    with_args = write(tmp_path / "args.txt", megatron_lm_log())
    with pytest.raises(MetricsInputError, match="seq_length: 2048 was given but the log's arguments say 1024"):
        read_metrics(with_args, gpus=4, seq_length=2048)
    assert read_metrics(with_args, gpus=4, seq_length=1024).valid
    with pytest.raises(MetricsInputError, match="gpus: 8 was given but the log's arguments say world_size 4"):
        read_metrics(with_args, gpus=8)


def test_bad_input_is_named():
    with pytest.raises(MetricsInputError, match="window: expected START:END"):
        parse_window("13:4")
    with pytest.raises(MetricsInputError, match="window"):
        parse_window("4-13")
    with pytest.raises(MetricsInputError, match="framework: expected one of megatron-lm"):
        get_parser("deepspeed")
    parsed = get_parser("megatron-lm").read(__file__)
    with pytest.raises(MetricsInputError, match="gpus: expected a positive integer"):
        analyze(parsed, gpus=0)
    assert FRAMEWORKS == ("megatron-lm", "megatron-bridge", "torchtitan")


# ---------------------------------------------------------------- Megatron-Bridge


def bridge_log(n=14, times=None):
    times = times or step_times(n)
    lines = ["p4_v2_perf/0 [NeMo I 2026-10-02 11:00:00 pretrain:120] Setting up optimizer"]
    for it in range(1, n + 1):
        lines.append(f"p4_v2_perf/0 Step Time : {times[it - 1] / 1000:.2f}s GPU utilization: 402.7MODEL_TFLOP/s/GPU")
        lines.append("p4_v2_perf/0 " + iteration_line(it, times[it - 1], losses(n)[it - 1],
                                                      timestamp=f"2026-10-02 11:04:{it:02d}", gbs=128))
        if it == 2:
            lines.append("p4_v2_perf/0 " + memory_line_gb(0, 2, 63.66, 153.4, 182.2, 182.2)
                         + memory_line_gb(1, 2, 61.881, 153.47, 182.24, 182.24))
    return lines


def test_megatron_bridge_log(tmp_path):
    path = write(tmp_path / "log.txt", bridge_log())
    with pytest.raises(MetricsInputError, match="seq_length"):
        read_metrics(path, framework="megatron-bridge", gpus=8)
    m = read_metrics(path, framework="megatron-bridge", gpus=8, seq_length=4096)
    assert m.valid, m.invalid_reasons
    assert m.tokens_per_s_per_gpu == pytest.approx(expected_throughput(step_times(), 128, 4096, 8))
    mem = {r["rank"]: r for r in m.memory_dict()["per_rank"]}
    assert mem[1]["max_allocated_mib"] == pytest.approx(153.47 * MIB_PER_GB)
    assert mem[0]["reserved_mib"] == pytest.approx(182.2e9 / 2**20)
    parsed = get_parser("megatron-bridge").read(path)
    assert parsed.step_time_lines == 14


def test_megatron_bridge_step_time_lines_alone_are_not_keyed(tmp_path):
    lines = [line for line in bridge_log() if "iteration" not in line]
    m = read_metrics(write(tmp_path / "log.txt", lines), framework="megatron-bridge", gpus=8, seq_length=4096)
    assert not m.valid and m.tokens_per_s_per_gpu is None
    assert any("cannot be keyed by iteration" in w for w in m.warnings)


# ---------------------------------------------------------------- torchtitan

TITAN_TPS = [900, 2100, 2900, 3050, 3100, 3080, 3120, 3090, 3110, 3070, 3100, 3095, 3105, 3085]


def titan_log(start_line=True, loss_nan_at=None, ranks=(0,)):
    lines = ["[rank0]:[titan] 2026-03-01 10:00:00,000 - root - INFO - Starting job: Llama 3 8B training"]
    if start_line:
        lines.append("[rank0]:[titan] 2026-03-01 10:00:01,000 - root - INFO - Training starts at step 1, with "
                     "local batch size 2, global batch size 16, sequence length 2048, total steps 14 (warmup 2)")
    for step, tps in enumerate(TITAN_TPS, start=1):
        loss = float("nan") if step == loss_nan_at else 11.0 - 0.3 * step
        for rank in ranks:
            lines.append(torchtitan_step_line(step, loss, 30.0 + rank + step * 0.01, tps + rank, rank=rank))
    lines.append("[rank0]:[titan] 2026-03-01 10:01:00,000 - root - INFO - Training completed")
    return lines


def test_torchtitan_log(tmp_path):
    m = read_metrics(write(tmp_path / "log.txt", titan_log()), framework="torchtitan", gpus=8)
    window = TITAN_TPS[4:14]
    harmonic = len(window) / sum(1 / t for t in window)
    assert m.valid, m.invalid_reasons
    assert m.tokens_per_s_per_gpu == pytest.approx(harmonic)
    assert m.step_time_source == "derived_from_tps" and m.seq_length == 2048
    # step time = tokens per step / (tps x GPUs)
    assert m.step_time_ms(m.step(5)) == pytest.approx(16 * 2048 / (3100 * 8) * 1000)
    assert m.step(3).loss == pytest.approx(10.1)
    assert m.train_iters == 14 and m.failure_class == "ok"
    assert m.memory_dict()["per_rank"][0]["max_reserved_mib"] == pytest.approx(30.14 * 1024)


def test_torchtitan_without_batch_information(tmp_path):
    path = write(tmp_path / "log.txt", titan_log(start_line=False))
    m = read_metrics(path, framework="torchtitan", gpus=8)
    window = TITAN_TPS[4:14]
    assert m.tokens_per_s_per_gpu == pytest.approx(len(window) / sum(1 / t for t in window))
    assert m.step_time_source == "tps_only" and m.step_time_ms(m.step(5)) is None
    assert m.to_dict()["steps"][4]["step_time_ms"] is None
    m = read_metrics(path, framework="torchtitan", gpus=8, seq_length=2048, global_batch_size=16)
    assert m.step_time_ms(m.step(5)) == pytest.approx(16 * 2048 / (3100 * 8) * 1000)


def test_torchtitan_nan_loss_and_several_logging_ranks(tmp_path):
    lines = titan_log(loss_nan_at=7, ranks=(0, 1))
    m = read_metrics(write(tmp_path / "log.txt", lines), framework="torchtitan", gpus=8)
    line_no = next(n for n, line in enumerate(lines, start=1) if "step:  7" in line)
    assert not m.valid
    assert m.invalid_reasons == [f"iteration 7: line {line_no}: loss is nan"]
    assert m.to_dict()["steps"][6]["loss"] is None  # JSON has no NaN
    assert m.step(5).tokens_per_s_per_device == 3100  # rank 0's line, not rank 1's
    assert sorted(r["rank"] for r in m.memory_dict()["per_rank"]) == [0, 1]
    assert any("ranks other than rank 0" in w for w in m.warnings)


# ---------------------------------------------------------------- streaming, as a property

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES = [
    iteration_line(3, 1000.0, 2.5),
    iteration_line(4, 1001.0, None, timestamp=None),
    memory_line_mb(1, 2, 1.5, 2.5, 3.5, 4.5) + memory_line_mb(2, 2, 5.5, 6.5, 7.5, 8.5),
    "node-07:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>",
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "\x1b[31m[rank0]: Traceback (most recent call last):\x1b[0m",
    "",
    "x" * 700,
    "caf\xe9 \u2603 non-ascii chatter",
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(_PIECES) - 1), max_size=40),
    args_at=st.integers(0, 40),
    block_size=st.integers(1, 900),
    newline_at_end=st.booleans(),
)
def test_any_block_size_reads_the_same(tmp_path, picks, args_at, block_size, newline_at_end):
    lines = [_PIECES[i] for i in picks]
    lines[args_at:args_at] = megatron_lm_log(noise=False)[:17]  # the arguments block, somewhere
    path = tmp_path / "log.txt"
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.write_bytes(text.encode())
    ref = get_parser("megatron-lm").read(path)
    got = get_parser("megatron-lm").read(path, block_size=block_size)
    assert got.steps == ref.steps
    assert got.memory == ref.memory
    assert got.arguments == ref.arguments == MEGATRON_ARGS
    assert [(s.pattern, s.line) for s in got.signals] == [(s.pattern, s.line) for s in ref.signals]
    assert got.lines == ref.lines == text.count("\n") + (0 if text.endswith("\n") else 1)
    assert got.truncated_tail == ref.truncated_tail
    for s in ref.signals:  # line numbers point at the lines that carry the signature
        assert s.pattern in lines[s.line - 1]
