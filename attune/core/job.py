"""The one job type: a run fully resolved, what a backend runs (standard library only).

The run generator (`attune.control.rungen.RunGenerator.resolve`) makes it from a candidate recipe; the
control plane checks it against the campaign's pinned shape and records it (`runs/<id>/job.json`);
the broker hands it, unchanged but for the nodes to avoid, to the campaign's backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import RUN_LOG


@dataclass(frozen=True)
class JobSpec:
    """One job, fully resolved: what to run, where, on how many GPUs."""

    job_id: str  # the campaign's run id; unique within the campaign
    campaign: str
    argv: tuple[str, ...]  # the full command line, placeholders already substituted
    env: dict[str, str]  # the job's own environment (added to a minimal base environment)
    workdir: Path  # the code directory: relative command words resolve here; the job runs in run_dir
    run_dir: Path  # the job writes its log (log.txt) and outputs here
    gpus: int
    gpus_per_node: int
    time_limit_s: float | None = None
    image: str | None = None  # container image, where the backend runs containers
    exclude_nodes: tuple[str, ...] = ()  # nodes not to run on (the retry of an infrastructure failure)
    # The final training arguments (candidate + profiling + stack fixes, placeholders filled), already
    # rendered into argv: kept for the pinned-shape check and the record. Backends do not read them.
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))

    @property
    def log_path(self) -> Path:
        return self.run_dir / RUN_LOG
