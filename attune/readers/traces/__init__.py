"""The trace analyzer: PyTorch profiler (Kineto) traces in, a per-stage step breakdown out.

``analyze_paths(paths, layout=None)`` streams each rank's trace (plain or gzipped), splits every
profiled step into compute, communication (exposed and hidden), memory copies, host-side time and
idle, maps ranks to pipeline stages, and names the slowest stage and what it waits on. It also
gives, per rank, figures comparable with Holistic Trace Analysis' temporal breakdown.
"""

from attune.readers.traces.analyze import TraceInputError, analyze_paths, find_trace_files
from attune.readers.traces.layout import RankLayout, RankLayoutError
from attune.readers.traces.models import SCHEMA, TraceReport

__all__ = ["SCHEMA", "RankLayout", "RankLayoutError", "TraceInputError", "TraceReport", "analyze_paths", "find_trace_files"]
