"""The streaming trace reader: same events and metadata as a whole-file json.load, in bounded batches."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attune.readers.traces.reader import TraceFormatError, TraceReader, looks_like_trace
from tests.traces_helpers import known_gpu_events, write_trace


def read_all(path: Path, chunk: int = 1 << 20) -> tuple[list, TraceReader]:
    reader = TraceReader(path, chunk_bytes=chunk)
    events = [e for batch in reader.batches() for e in batch]
    return events, reader


def same_events(events, raw: list[dict]) -> None:
    assert len(events) == len(raw)
    for e, r in zip(events, raw, strict=True):
        assert e.ph == r.get("ph", "")
        assert e.name == r.get("name")
        assert e.cat == r.get("cat")
        assert e.ts == r.get("ts")
        assert e.dur == r.get("dur")
        args = r.get("args") or {}
        if e.args is not None:
            assert e.args.stream == args.get("stream")
            assert e.args.correlation == args.get("correlation")
            assert e.args.collective == args.get("Collective name")


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
@pytest.mark.parametrize("meta_after", [False, True])
@pytest.mark.parametrize("pretty", [False, True])
@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_plain_gzip_metadata_anywhere_any_chunk(tmp_path, name, meta_after, pretty, chunk):
    events = known_gpu_events()
    path = write_trace(tmp_path / name, events, rank=3, world=8, meta_after=meta_after, pretty=pretty,
                       dist={"pg_config": [{"pg_name": "0", "ranks": [0, 1]}]}, traceName="x")
    got, reader = read_all(path, chunk)
    same_events(got, events)
    assert reader.metadata["distributedInfo"]["rank"] == 3
    assert reader.metadata["distributedInfo"]["pg_config"][0]["ranks"] == [0, 1]
    assert reader.metadata["traceName"] == "x"
    assert reader.events_read == len(events) and reader.events_skipped == 0
    assert TraceReader(path).head_metadata().get("traceName") == (None if meta_after else "x")
    assert looks_like_trace(path)


def test_tricky_strings_and_odd_types(tmp_path):
    """Cut points inside strings or nested objects never split an event; odd types are tolerated."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": 'x}, {"ph": "X"}, {', "ts": 1.5, "dur": 2, "pid": 1, "tid": 1,
         "args": {"nested": [{"a": 1}, {"b": "}, {"}], "stream": "7", "correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "ünïcødé ∑ kernel", "ts": 2, "dur": 1, "pid": 0, "tid": 7,
         "args": {"stream": 7, "correlation": 4}},
        {"ph": "X", "cat": "kernel", "name": "weird args", "ts": "5", "dur": 1.0, "pid": "Spans", "tid": "x",
         "args": {"stream": [1], "correlation": "no"}},
        {"ph": "i", "s": "g", "name": "instant", "ts": 9},
    ] * 40
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    for chunk in (16, 333, 1 << 20):
        got, reader = read_all(path, chunk)
        assert len(got) == len(events)
        assert got[0].name == 'x}, {"ph": "X"}, {' and got[0].args.stream == "7"
        assert got[1].name == "ünïcødé ∑ kernel"
        assert got[2].ts == 5.0 and got[2].args is None  # args of the wrong type are dropped
        assert reader.metadata == {"distributedInfo": {"rank": 0}}


def test_bad_files(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    with pytest.raises(TraceFormatError, match="not a JSON object"):
        read_all(tmp_path / "list.json")
    (tmp_path / "noevents.json").write_text('{"schemaVersion": 1}')
    with pytest.raises(TraceFormatError, match="no traceEvents"):
        read_all(tmp_path / "noevents.json")
    full = json.dumps({"traceEvents": known_gpu_events()})
    (tmp_path / "cut.json").write_text(full[: len(full) // 2])
    with pytest.raises(TraceFormatError, match="truncated|end of file|malformed"):
        read_all(tmp_path / "cut.json", chunk=128)
    with gzip.open(tmp_path / "cut.json.gz", "wb") as fh:
        fh.write(full.encode())
    data = (tmp_path / "cut.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError):
        read_all(tmp_path / "cut.json.gz")
    assert not looks_like_trace(tmp_path / "list.json")


_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "s", "f", "M", "i"]),
        "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "user_annotation", "gpu_memcpy"]),
        "name": st.text(min_size=0, max_size=30),
        "ts": st.floats(min_value=0, max_value=1e13, allow_nan=False),
        "dur": st.floats(min_value=0, max_value=1e6, allow_nan=False),
        "pid": st.integers(0, 10),
        "tid": st.integers(0, 10),
    },
    optional={
        "args": st.fixed_dictionaries(
            {},
            optional={
                "stream": st.integers(0, 100),
                "correlation": st.integers(0, 10**9),
                "Collective name": st.text(max_size=10),
                "junk": st.recursive(st.text(max_size=5) | st.integers(), lambda c: st.lists(c, max_size=3)
                                     | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6),
            },
        )
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, max_size=60), chunk=st.sampled_from([7, 64, 500, 1 << 16]), indent=st.sampled_from([None, 2]))
def test_reader_equals_json_load(tmp_path, events, chunk, indent):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "trailer": {"k": [1, 2]}}, indent=indent))
    got, reader = read_all(path, chunk)
    same_events(got, events)
    assert reader.metadata == {"schemaVersion": 1, "trailer": {"k": [1, 2]}}
