"""The trace analyzer's definitions on traces with known answers, synthetic runs and a real CPU profile."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from attune.readers.traces import RankLayout, RankLayoutError, TraceInputError, analyze_paths
from attune.readers.traces.classify import CommKind, DeviceClass, comm_kind, device_class, group_dim_from_desc
from tests.trace_synth import write_run
from tests.traces_helpers import kernel, known_gpu_events, launch, step, write_trace, x

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("compute_us", "comm_exposed_us", "memcpy_exposed_us", "other_exposed_us", "idle_us")
IDLE_PARTS = ("data_loading_us", "sync_wait_us", "launch_us", "python_us")


def assert_adds_up(b, rel: float = 1e-9) -> None:
    total = sum(getattr(b, p) for p in PARTS)
    assert math.isclose(total, b.step_us, rel_tol=rel, abs_tol=1e-6), (total, b.step_us)
    assert math.isclose(sum(getattr(b, p) for p in IDLE_PARTS), b.idle_us, rel_tol=rel, abs_tol=1e-6)
    assert math.isclose(sum(b.comm_exposed_by_kind.values()), b.comm_exposed_us, rel_tol=rel, abs_tol=1e-6)
    assert math.isclose(b.comm_exposed_us + b.comm_hidden_us, b.comm_us, rel_tol=rel, abs_tol=1e-6)
    assert b.memcpy_exposed_us <= b.memcpy_us + 1e-9
    assert all(getattr(b, f) >= -1e-9 for f in (*PARTS, *IDLE_PARTS, "comm_hidden_us"))


def test_known_breakdown(tmp_path):
    write_trace(tmp_path / "r0.json", known_gpu_events(), rank=0, world=1)
    report = analyze_paths([tmp_path])
    (r,) = report.ranks
    assert r.kind == "gpu" and r.steps == 2 and r.device == "Test GPU"
    s1, s2 = r.per_step
    assert (s1.step, s1.step_us, s1.start_us) == (1, 100, 0)
    assert s1.compute_us == 30
    assert s1.comm_us == 35 and s1.comm_exposed_us == 25 and s1.comm_hidden_us == 10
    assert s1.comm_exposed_by_kind["dp_reduce"] == 20
    assert s1.comm_exposed_by_kind["pipeline_p2p"] == 5
    assert s1.memcpy_us == 8 and s1.memcpy_exposed_us == 5
    assert s1.other_exposed_us == 2  # the cuda_sync marker
    assert s1.idle_us == 38
    assert (s1.data_loading_us, s1.launch_us, s1.sync_wait_us, s1.python_us) == (6, 8, 8, 16)
    assert s1.host_us == 30
    assert s2.compute_us == 20 and s2.launch_us == 5 and s2.python_us == 75 and s2.comm_us == 0
    for b in (s1, s2, r.breakdown):
        assert_adds_up(b)
    assert r.breakdown.step_us == 100 and r.breakdown.compute_us == 25
    # HTA-comparable: the last step's launch (correlation 7) is dropped, as HTA drops it
    assert r.hta_last_step_dropped
    assert (r.span_us, r.idle_us, r.compute_us, r.non_compute_us) == (150, 78, 40, 32)
    assert r.comm_comp_overlap_pct == pytest.approx(100 * 10 / 35)
    # waits: the mean step's largest non-compute part first
    assert r.waits_on[0].what == "host_python"
    assert {w.what for w in r.waits_on} >= {"dp_reduce", "pipeline_p2p", "host_launch", "sync_wait", "host_data_loading"}
    assert r.busy_us == pytest.approx(100 - 2.5)
    names = {k.name: k for k in r.top_kernels}
    assert names["gemm_kernel"].count == 3 and names["gemm_kernel"].total_us == 50
    assert names["gemm_kernel"].kind == "compute"
    assert names["ncclDevKernel_SendRecv"].kind == "comm"
    assert {o.name for o in r.top_operators} == {"aten::mm"}


def test_one_step_only_keeps_every_kernel_for_hta(tmp_path):
    ev = [e for e in known_gpu_events() if e["name"] != "ProfilerStep#2"]
    write_trace(tmp_path / "r0.json", ev)
    (r,) = analyze_paths([tmp_path]).ranks
    assert not r.hta_last_step_dropped
    assert r.span_us == 170 and r.compute_us == 50  # the kernel at 170-180 counts now
    assert r.steps == 1


def test_unstepped_trace_is_one_window(tmp_path):
    ev = [kernel("gemm", 10, 20, 1), launch(0, 5, 1), kernel("gemm", 50, 10, 2), launch(40, 5, 2)]
    write_trace(tmp_path / "r0.json", ev)
    (r,) = analyze_paths([tmp_path]).ranks
    assert r.steps == 0 and len(r.per_step) == 1 and r.per_step[0].step is None
    assert r.per_step[0].step_us == 60 and r.per_step[0].compute_us == 30
    assert_adds_up(r.per_step[0])
    assert any("ProfilerStep" in n for n in r.notes)


def test_comm_kind_from_the_launching_cpu_op(tmp_path):
    """A SendRecv kernel without a collective name is an all-to-all when nccl:all_to_all launched it."""
    ev = [
        step(1, 0, 100),
        step(2, 100, 10),
        x("user_annotation", "nccl:all_to_all", 0, 10),
        launch(2, 2, 1),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 10, 20, 1, stream=20),
        x("user_annotation", "nccl:send", 30, 5),
        launch(31, 2, 2),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 40, 10, 2, stream=20),
    ]
    write_trace(tmp_path / "r0.json", ev)
    (r,) = analyze_paths([tmp_path]).ranks
    kinds = r.per_step[0].comm_exposed_by_kind
    assert kinds["all_to_all"] == 20 and kinds["pipeline_p2p"] == 10


def test_classification_rules():
    assert device_class("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == DeviceClass.COMM
    assert device_class("ncclKernel_SendRecv_RING_SIMPLE") == DeviceClass.COMM
    assert device_class("Memcpy DtoH (Device -> Pinned)") == DeviceClass.MEMORY
    assert device_class("Memset (Device)") == DeviceClass.MEMORY
    assert device_class("Context Sync") == DeviceClass.OTHER
    assert device_class("void foo_Memcpy_kernel") == DeviceClass.OTHER
    assert device_class("sm90_xmma_gemm") == DeviceClass.COMPUTE
    assert group_dim_from_desc("PIPELINE_MODEL_PARALLEL_GROUP") == "pp"
    assert group_dim_from_desc("TENSOR_MODEL_PARALLEL_GROUP") == "tp"
    assert group_dim_from_desc("EXPERT_MODEL_PARALLEL_GROUP") == "ep"
    assert group_dim_from_desc("default_pg") is None
    assert comm_kind("all_to_all", "", None) == CommKind.ALL_TO_ALL
    assert comm_kind("allreduce", "", "tp") == CommKind.TP_COLLECTIVE
    assert comm_kind("_reduce_scatter_base", "", None) == CommKind.DP_REDUCE
    assert comm_kind("send", "", "pp") == CommKind.PIPELINE_P2P
    assert comm_kind(None, "ncclDevKernel_SendRecv", None) == CommKind.PIPELINE_P2P
    assert comm_kind("allreduce", "", "pp") == CommKind.OTHER


def test_layout_parsing_and_mapping():
    lay = RankLayout.parse("tp=2,pp=2").resolved(8)
    assert lay.dp == 2 and lay.world == 8
    assert [lay.stage(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert lay.group_dim([0, 1]) == "tp" and lay.group_dim([0, 2]) == "dp" and lay.group_dim([1, 5]) == "pp"
    assert lay.group_dim(list(range(8))) is None
    other = RankLayout.parse("pp=2,tp=2,order=pp-tp-dp-cp").resolved(4)
    assert [other.stage(r) for r in range(4)] == [0, 1, 0, 1]
    for bad, msg in (("tp=0", "positive"), ("xx=2", "unknown key"), ("tp", "key=value"), ("order=tp-pp", "once")):
        with pytest.raises(RankLayoutError, match=msg):
            RankLayout.parse(bad)
    with pytest.raises(RankLayoutError, match="not divisible"):
        RankLayout.parse("pp=3").resolved(8)
    with pytest.raises(RankLayoutError, match="does not match"):
        RankLayout.parse("pp=2,dp=2").resolved(8)


def test_synthetic_pipeline_run_stages_and_additivity(tmp_path):
    write_run(tmp_path / "run", pp=2, dp=2, steps=3, layers=4, microbatches=2)
    report = analyze_paths([tmp_path / "run"])
    assert report.stage_source == "process_groups"
    assert [r.stage for r in report.ranks] == [0, 0, 1, 1]
    assert [s.ranks for s in report.stages] == [[0, 1], [2, 3]]
    for r in report.ranks:
        assert r.kind == "gpu" and r.steps == 3 and r.world_size == 4
        for b in (*r.per_step, r.breakdown):
            assert_adds_up(b)
        kinds = r.breakdown.comm_exposed_by_kind
        assert kinds["all_to_all"] == kinds["tp_collective"] == 0
        assert r.breakdown.comm_us > 0 and r.comm_comp_overlap_pct is not None
        assert r.breakdown.memcpy_us > 0 and r.breakdown.data_loading_us >= 0
    # the second stage receives activations: it waits on the pipeline; the first does not
    assert report.stages[1].breakdown.comm_exposed_by_kind["pipeline_p2p"] > 0
    assert report.stages[0].breakdown.comm_exposed_by_kind["pipeline_p2p"] == 0
    assert report.slowest_stage is not None and report.slowest_stage.stage in (0, 1)
    top = max(report.stages, key=lambda s: s.busy_us)
    assert report.slowest_stage.stage == top.stage
    assert report.slowest_stage.bottleneck == top.waits_on[0].what
    assert report.top_kernels[0].name.startswith("sm90_xmma_gemm") and report.top_kernels[0].ranks == 4
    # the layout gives the same stages; a layout that does not fit is refused
    with_layout = analyze_paths([tmp_path / "run"], layout="pp=2")
    assert with_layout.stage_source == "layout" and [r.stage for r in with_layout.ranks] == [0, 0, 1, 1]
    assert with_layout.layout == {"tp": 1, "cp": 1, "pp": 2, "dp": 2, "order": "tp-cp-dp-pp"}
    with pytest.raises(TraceInputError, match="world size"):
        analyze_paths([tmp_path / "run"], layout="pp=2,dp=4")


def test_parallel_workers_match_serial(tmp_path):
    write_run(tmp_path / "run", pp=2, dp=1, steps=2, layers=2, microbatches=1, gz=True)
    a = analyze_paths([tmp_path / "run"], jobs=1).model_dump()
    b = analyze_paths([tmp_path / "run"], jobs=2).model_dump()
    for d in (a, b):
        d.pop("analysis_seconds")
    assert a == b


def test_input_errors(tmp_path):
    with pytest.raises(TraceInputError, match="no such file"):
        analyze_paths([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.json").write_text('{"a": 1}')
    with pytest.raises(TraceInputError, match="no PyTorch profiler traces"):
        analyze_paths([tmp_path / "empty"])
    (tmp_path / "notes.json").write_text("[1, 2]")
    with pytest.raises(TraceInputError, match="not a JSON object"):
        analyze_paths([tmp_path / "notes.json"])
    with pytest.raises(TraceInputError, match="unknown key"):
        analyze_paths([tmp_path / "notes.json"], layout="zz=1")
    write_trace(tmp_path / "w" / "a.json", [step(1, 0, 10)], rank=0, world=2)
    write_trace(tmp_path / "w" / "b.json", [step(1, 0, 10)], rank=1, world=4)
    with pytest.raises(TraceInputError, match="disagree on the world size"):
        analyze_paths([tmp_path / "w"])


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory) -> Path:
    """A real CPU-only profile: a two-stage pipeline over gloo (tests/gloo_profile.py)."""
    out = tmp_path_factory.mktemp("gloo")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gloo_profile.py"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_real_cpu_profile_adds_up(gloo_traces):
    report = analyze_paths([gloo_traces], layout="pp=2")
    assert [r.rank for r in report.ranks] == [0, 1] and [r.stage for r in report.ranks] == [0, 1]
    for r in report.ranks:
        assert r.kind == "cpu" and r.backend == "gloo" and r.steps == 3
        assert any("CPU-only" in n for n in r.notes)
        for b in r.per_step:
            assert_adds_up(b, rel=1e-6)
            assert b.compute_us > 0
            assert b.comm_us > 0
            # both stages exchange activations or gradients: pipeline traffic
            assert b.comm_exposed_by_kind["pipeline_p2p"] + b.comm_exposed_by_kind["dp_reduce"] > 0
        assert r.breakdown.comm_exposed_by_kind["pipeline_p2p"] > 0
        # the HTA-style figures on the CPU timeline are consistent with themselves
        assert r.span_us is not None and r.idle_us is not None
        assert r.compute_us + r.non_compute_us + r.idle_us == pytest.approx(r.span_us)
        assert any(o.name.startswith("aten::") for o in r.top_operators)
    assert report.slowest_stage is not None
    # the step windows are the profiler's: they cover the recorded ProfilerStep durations
    assert all(b.step_us > 0 for r in report.ranks for b in r.per_step)
