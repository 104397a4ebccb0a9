"""The words every backend and the CLI share about a submitted job: its state, the backend's own
description of it, and the run it belongs to (the run dir plus its newest launch record).

They live here, not in launchers/, so that the CLI (fsdp_jobs/cli/ctl.py, fsdp_jobs/cli/submit.py) can read
a backend's answers without importing any backend: backends are found through fsdp_jobs/planning/backends.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class JobStatus:
    state: JobState
    detail: str  # the backend's own words, e.g. "RUNNING (Reason=None)" or "exited 0 (node0, node1)"
    info: dict[str, Any] = field(default_factory=dict)  # backend-specific fields for `status` (JSON)


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


def state_from_training(run: "Run") -> JobState:
    """When the backend has nothing left to say, the state record (rank 0's own) tells the outcome: only
    one written since the run's newest launch began (runs.read_outcome). UNKNOWN when it wrote none."""
    status = runs.read_outcome(run.run_dir, run.launch.get("unix")).status or None
    return {"completed": JobState.SUCCEEDED, "failed": JobState.FAILED,
            "preempted": JobState.CANCELLED, "cancelled": JobState.CANCELLED}.get(str(status), JobState.UNKNOWN)
