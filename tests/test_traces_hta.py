"""attune's HTA-comparable figures against Holistic Trace Analysis on HTA's own sample traces.

tests/data/hta/ holds a selection of HTA's sample traces (see its README) and expected.json, the
figures HTA 0.5.0 reported for them. Each folder is one HTA trace directory. The figures must agree
within 1% (idle, compute, non-compute time per rank) and 0.01 points (overlap, which HTA rounds to
two decimals). When HTA is installed, it is also run live on the smaller samples.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from attune.readers.traces import analyze_paths

DATA = Path(__file__).resolve().parent / "data" / "hta"
EXPECTED = json.loads((DATA / "expected.json").read_text())["figures"]
LIVE = ["two_ranks", "collective_args", "ns_resolution", "no_steps"]


def _check(folder: str, expected: dict[str, dict]) -> None:
    report = analyze_paths([DATA / folder])
    got = {str(r.rank): r for r in report.ranks}
    assert set(got) == set(expected), folder
    for rank, exp in expected.items():
        r = got[rank]
        for key in ("idle_us", "compute_us", "non_compute_us", "span_us"):
            assert getattr(r, key) == pytest.approx(exp[key], rel=0.01, abs=1.0), (folder, rank, key)
        if exp.get("comm_comp_overlap_pct") is None:
            assert r.comm_comp_overlap_pct is None
        else:
            assert round(r.comm_comp_overlap_pct, 2) == pytest.approx(exp["comm_comp_overlap_pct"], abs=0.01)


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_against_recorded_hta_figures(folder):
    _check(folder, EXPECTED[folder])


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::RuntimeWarning")  # HTA's own, with pandas 2.x
@pytest.mark.parametrize("folder", LIVE)
def test_against_hta_itself(folder):
    pytest.importorskip("hta", reason="holistictraceanalysis (the dev extra) is not installed")
    from tests.data.hta.record_expected import hta_figures

    logging.disable(logging.WARNING)
    try:
        live = hta_figures(DATA / folder)
    finally:
        logging.disable(logging.NOTSET)
    _check(folder, live)


def test_the_samples_own_breakdown_adds_up():
    for folder in sorted(EXPECTED):
        for r in analyze_paths([DATA / folder]).ranks:
            for b in r.per_step:
                parts = b.compute_us + b.comm_exposed_us + b.memcpy_exposed_us + b.other_exposed_us + b.idle_us
                assert parts == pytest.approx(b.step_us, rel=1e-9, abs=1e-6), (folder, r.rank, b.step)


def test_all_to_all_and_cpu_only_samples():
    (a2a,) = analyze_paths([DATA / "all_to_all"]).ranks
    kinds = a2a.breakdown.comm_exposed_by_kind
    assert kinds["all_to_all"] > 0 and kinds["dp_reduce"] > 0 and kinds["pipeline_p2p"] == 0
    (cpu,) = analyze_paths([DATA / "cpu_only"]).ranks
    assert cpu.kind == "cpu" and cpu.rank == 34 and cpu.world_size == 300
    assert cpu.breakdown.comm_us > 0  # gloo:all_reduce on the gloo threads
