"""Plain records the log parsers fill in while they stream a log.

A parser never computes a verdict: it records what each line says, keyed by what the
line itself names (the iteration number, the rank), never by its position in the file.
`attune.readers.metrics.analysis` turns a `ParsedLog` into a `RunMetrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# 1 GB as Megatron-Bridge prints it (1e9 bytes), in MiB.
MIB_PER_GB = 1e9 / 2**20
MIB_PER_GIB = 1024.0


@dataclass(slots=True)
class StepRecord:
    """What one per-iteration log line says. Absent fields stay None."""

    iteration: int  # 1-based, as logged: the paper's step k is iteration k + 1
    step_time_ms: float | None = None
    loss: float | None = None  # the language-model loss; None when the line has none
    extra_losses: dict[str, float] | None = None  # MoE and MTP losses, by their logged name
    global_batch_size: int | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    skipped_iterations: int | None = None  # Megatron: skipped iterations in this log interval
    nan_iterations: int | None = None  # Megatron: NaN iterations in this log interval
    tflops_per_gpu: float | None = None
    tokens_per_s_per_device: float | None = None  # torchtitan's `tps`, as logged
    memory_mib: float | None = None  # torchtitan prints peak reserved memory on every step line
    problems: list[str] | None = None  # fields that could not be read (interleaving, truncation)

    def add_problem(self, text: str, line_no: int | None = None) -> None:
        """Note a field that could not be read; the first note names the log line."""
        if self.problems is None:
            self.problems = []
            if line_no is not None:
                text = f"line {line_no}: {text}"
        self.problems.append(text)


@dataclass(slots=True)
class MemoryReport:
    """Memory of one rank, folded over every report of that rank (MiB)."""

    rank: int | None
    after_iterations: int | None = None  # the latest report's iteration count
    allocated_mib: float | None = None  # from the latest report
    reserved_mib: float | None = None  # from the latest report
    max_allocated_mib: float | None = None  # the peak over all reports
    max_reserved_mib: float | None = None  # the peak over all reports
    reports: int = 0

    def fold(
        self,
        after_iterations: int | None,
        allocated: float | None,
        max_allocated: float | None,
        reserved: float | None,
        max_reserved: float | None,
    ) -> None:
        self.reports += 1
        if after_iterations is None or self.after_iterations is None or after_iterations >= self.after_iterations:
            self.after_iterations = after_iterations if after_iterations is not None else self.after_iterations
            if allocated is not None:
                self.allocated_mib = allocated
            if reserved is not None:
                self.reserved_mib = reserved
        self.max_allocated_mib = _max(self.max_allocated_mib, max_allocated if max_allocated is not None else allocated)
        self.max_reserved_mib = _max(self.max_reserved_mib, max_reserved if max_reserved is not None else reserved)


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


@dataclass(slots=True)
class Signal:
    """A line that carries a failure signature."""

    failure_class: str  # "oom", "hang", "crash", "infrastructure"
    pattern: str
    line: int
    text: str


@dataclass
class ParsedLog:
    """Everything a parser read from one log."""

    framework: str
    path: str = ""
    steps: dict[int, StepRecord] = field(default_factory=dict)
    train_iters: int | None = None  # the run's planned iterations, as the last record states them
    last_timestamp: str | None = None  # the last iteration line's timestamp, when the log has them
    duplicate_iterations: list[int] = field(default_factory=list)
    memory: dict[int | None, MemoryReport] = field(default_factory=dict)
    arguments: dict[str, str] = field(default_factory=dict)
    arguments_complete: bool = False  # the block's end marker was seen
    signals: list[Signal] = field(default_factory=list)
    signal_counts: dict[str, int] = field(default_factory=dict)
    last_step_line: int | None = None  # the line of the last iteration record read (where training got to)
    bytes_read: int = 0
    lines: int = 0
    step_time_lines: int = 0  # Megatron-Bridge "Step Time" lines (they carry no iteration number)
    truncated_tail: str | None = None  # an unterminated last line, not parsed as a record
    warnings: list[str] = field(default_factory=list)
    # Normalised facts a parser derives from its framework's own arguments.
    seq_length: int | None = None
    global_batch_size: int | None = None
    world_size: int | None = None
    pipeline_parallel_size: int | None = None

    def add_step(self, record: StepRecord) -> None:
        """Key a record by its iteration; a repeat (a restart) replaces the earlier one."""
        if record.iteration in self.steps:
            self.duplicate_iterations.append(record.iteration)
        self.steps[record.iteration] = record

    def add_memory(
        self,
        rank: int | None,
        after_iterations: int | None,
        allocated: float | None = None,
        max_allocated: float | None = None,
        reserved: float | None = None,
        max_reserved: float | None = None,
    ) -> None:
        report = self.memory.get(rank)
        if report is None:
            report = self.memory[rank] = MemoryReport(rank=rank)
        report.fold(after_iterations, allocated, max_allocated, reserved, max_reserved)

    def warn(self, text: str) -> None:
        if len(self.warnings) < 50 and text not in self.warnings:
            self.warnings.append(text)
