"""The metrics reader on real logs from public sources (tests/data/real_logs/SOURCES.md).

Every expected value here was read off the log file by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attune.readers.metrics import get_parser, read_metrics

DATA = Path(__file__).parent / "data" / "real_logs"


def test_sources_name_every_log():
    sources = (DATA / "SOURCES.md").read_text()
    logs = sorted(p.name for p in DATA.glob("*.log"))
    assert len(logs) >= 7  # every log kept here, old and new, is named with its origin
    for name in logs:
        assert f"`{name}`" in sources, name


def test_torchtitan_current_start_line_and_an_interrupted_run():
    path = DATA / "torchtitan_aurora_interrupted.log"
    parsed = get_parser("torchtitan").read(path)
    assert parsed.train_iters == 1000  # "total steps 1000"
    assert (parsed.seq_length, parsed.global_batch_size) == (4096, 24)
    assert sorted(parsed.steps) == list(range(1, 106))
    assert parsed.duplicate_iterations == []
    assert parsed.steps[1].loss == pytest.approx(10.8595)
    assert parsed.steps[105].loss == pytest.approx(5.3256)
    assert parsed.steps[2].tokens_per_s_per_device == 6697
    # 24 ranks (global batch 24, local batch 1); the run was stopped by ^C at step 105 of 1000
    for exit_status in (None, 0, 1):
        m = read_metrics(path, framework="torchtitan", gpus=24, exit_status=exit_status)
        assert not m.valid
        assert any("incomplete: its log stops at iteration 105 of 1000" in r for r in m.invalid_reasons)
        assert m.failure_class == ("ok" if exit_status == 0 else "crash")
    # the window itself was measured: the run is invalid only for stopping early
    m = read_metrics(path, framework="torchtitan", gpus=24, exit_status=1)
    assert m.tokens_per_s_per_gpu is not None and m.step_time_source == "derived_from_tps"


def test_torchtitan_every_rank_printing_the_same_step_is_not_a_restart():
    path = DATA / "torchtitan_all_ranks_pr2389.log"
    parsed = get_parser("torchtitan").read(path)
    assert sorted(parsed.steps) == [4, 5]
    assert parsed.duplicate_iterations == []
    assert parsed.steps[4].loss == pytest.approx(7.62585) and parsed.steps[5].loss == pytest.approx(7.07623)
    assert parsed.steps[4].tokens_per_s_per_device == 10050  # the first of the seven copies
    assert any("6 step lines repeat the current step" in w for w in parsed.warnings)
    m = read_metrics(path, framework="torchtitan", gpus=8, window=(3, 4))
    assert not any("more than once" in r for r in m.invalid_reasons)


def test_torchtitan_a_real_restart_is_still_a_restart(tmp_path):
    lines = (DATA / "torchtitan_aurora_interrupted.log").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "Trainer is initialized" in line)
    steps = [line for line in lines if "components/metrics" in line and "step:" in line]
    log = tmp_path / "restart.log"
    log.write_text("\n".join([lines[start], *steps[:6], lines[start], *steps[3:8]]) + "\n")
    parsed = get_parser("torchtitan").read(log)
    assert parsed.duplicate_iterations == [4, 5, 6]


def test_megatron_lm_excerpt_is_read_and_never_valid():
    path = DATA / "megatron_lm_epfllm_issue11.log"
    parsed = get_parser("megatron-lm").read(path)
    assert sorted(parsed.steps) == [122, 123, 124, 125] and parsed.train_iters == 250000
    assert [parsed.steps[i].loss for i in (122, 125)] == [pytest.approx(2.504220), pytest.approx(2.477393)]
    assert parsed.steps[124].step_time_ms == pytest.approx(89474.8)
    assert parsed.steps[123].global_batch_size == 1024 and parsed.steps[123].problems is None
    m = read_metrics(path, framework="megatron-lm", gpus=8, seq_length=2048, window=(121, 124))
    assert not m.valid
    assert any("incomplete: its log stops at iteration 125 of 250000" in r for r in m.invalid_reasons)


def test_megatron_lm_line_without_a_loss():
    parsed = get_parser("megatron-lm").read(DATA / "megatron_lm_bert_nccl_issue743.log")
    rec = parsed.steps[10]
    assert rec.loss is None and rec.skipped_iterations == 10 and rec.problems is None
    assert rec.step_time_ms == pytest.approx(356.2)


def test_megatron_bridge_records_glued_after_the_last_bar_are_not_damage():
    parsed = get_parser("megatron-bridge").read(DATA / "megatron_bridge_glued_memory.log")
    assert sorted(parsed.steps) == [1, 2]
    assert parsed.steps[1].loss == pytest.approx(1.0) and parsed.steps[2].loss == pytest.approx(0.9)
    assert parsed.steps[1].problems is None and parsed.steps[2].problems is None
    assert parsed.steps[2].step_time_ms == pytest.approx(90.0)
    # every memory report is read, the glued ones too (GB = 1e9 bytes)
    assert sorted(parsed.memory) == [0, 1, 2, 3]
    assert parsed.memory[3].max_reserved_mib == pytest.approx(181.59 * 1e9 / 2**20)
    assert parsed.memory[1].max_reserved_mib == pytest.approx(182.2 * 1e9 / 2**20)


def test_megatron_bridge_complete_line_with_another_ranks_memory_glued(tmp_path):
    line = (DATA / "megatron_lm_epfllm_issue11.log").read_text().splitlines()[0]
    memory = (DATA / "megatron_bridge_glued_memory.log").read_text().splitlines()[0].split(" ", 1)[1]
    log = tmp_path / "glued.log"
    # a whole iteration line, another rank's memory report right after its last "|"
    log.write_text(line + memory + "\n")
    parsed = get_parser("megatron-bridge").read(log)
    rec = parsed.steps[122]
    assert rec.loss == pytest.approx(2.504220) and rec.problems is None
    assert parsed.memory[1].max_allocated_mib == pytest.approx(153.4 * 1e9 / 2**20)
    # the second line is cut mid-field before the glued report: that one is damaged
    log.write_text(line[:120] + memory + "\n")
    cut = get_parser("megatron-bridge").read(log).steps[122]
    assert cut.problems and "interleaved" in cut.problems[0]


def test_megatron_bridge_documented_line():
    parsed = get_parser("megatron-bridge").read(DATA / "megatron_bridge_mtp_doc.log")
    rec = parsed.steps[100]
    assert rec.loss == pytest.approx(7.968678) and rec.step_time_ms == pytest.approx(3738.6)
    assert rec.extra_losses == {"load_balancing_loss": pytest.approx(1.329517), "mtp_1 loss": pytest.approx(7.925096)}
    assert parsed.train_iters == 300000 and rec.problems is None


def test_megatron_bridge_parameter_count_glued_after_the_last_bar_is_not_a_cut_field(tmp_path):
    parsed = get_parser("megatron-bridge").read(DATA / "megatron_bridge_param_count_glued.log")
    rec = parsed.steps[1]
    assert rec.loss == pytest.approx(12.58695) and rec.problems is None
    assert parsed.train_iters == 1
    assert parsed.memory[0].max_reserved_mib == pytest.approx(216.89 * 1e9 / 2**20)
    # a field really cut after its "|" (a blank, then a key and a value without a bar) is still damage
    line = (DATA / "megatron_bridge_param_count_glued.log").read_text().splitlines()[0]
    log = tmp_path / "cut.log"
    log.write_text(line.split("|Number", 1)[0] + " lm loss: 1.2\n")
    cut = get_parser("megatron-bridge").read(log).steps[1]
    assert cut.problems and "no terminating" in cut.problems[0]
