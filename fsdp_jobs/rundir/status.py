"""The words every backend and the CLI share about a submitted job: its state, the backend's own
description of it, and the run it belongs to (the run dir plus its newest launch record).

They live here, not in launchers/, so that the CLI (fsdp_jobs/cli/ctl.py, fsdp_jobs/cli/submit.py) can read
a backend's answers without importing any backend: backends are found through fsdp_jobs/planning/backends.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.outcome import JobState, Outcome  # noqa: F401  (JobState: backends import it from here)


@dataclass
class JobStatus:
    state: JobState
    detail: str  # the backend's own words, e.g. "RUNNING (Reason=None)" or "exited 0 (node0, node1)"
    info: dict[str, Any] = field(default_factory=dict)  # backend-specific fields for `status` (JSON)
    outcome: Optional[Outcome] = None  # what `state` was derived from (fsdp_jobs/rundir/outcome.py): its train view


@dataclass
class Submitted:
    job_id: str
    exit_status: Optional[int] = None  # set by backends that stay attached until the job ends


@dataclass
class Run:
    run_dir: Path
    launch: dict[str, Any]  # the newest record in launches.jsonl ({} if none survived)

    @classmethod
    def load(cls, run_dir: Path) -> "Run":
        return cls(run_dir, runs.last_launch(run_dir))

    @property
    def since(self) -> Optional[float]:
        """When its newest launch began (the launch record's `unix`): a record older than that is another
        launch's, never this one's outcome."""
        unix = self.launch.get("unix")
        return float(unix) if isinstance(unix, (int, float)) and not isinstance(unix, bool) else None

