"""The failure records (RunDir.failures_file): each rank's exception when it fails (fsdp_jobs/runtime/__main__.py and the user-code
shim record it), so that a failure that repeats is seen: the same exception at the same step in two
attempts in a row will come a third time. launchers/node/wrapper.py then stops the job as failed, with that
exception as its reason, instead of spending the rest of the restart budget on it (a script that raises at
start-up used to run cluster.max_restarts + 1 times)."""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import FailureRecord

ATTEMPT_ENV = "FSDP_JOBS_ATTEMPT"


def attempt_id() -> str:
    """Which attempt this rank belongs to: the scheduler's (FSDP_JOBS_ATTEMPT, which a backend that requeues
    sets: its job id and requeue count) and torchrun's restart count."""
    return f"{os.environ.get(ATTEMPT_ENV, '')}:{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def record(run_dir: Path, exc: BaseException, step: Optional[int]) -> None:
    """Append this rank's failure (best effort: recording must never hide the exception itself)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    entry = FailureRecord(
        time=time.time(), rank=int(os.environ.get("RANK", 0)), attempt=attempt_id(), step=step, where=where,
        error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300])
    try:
        with open(RunDir(run_dir).failures_file, "a") as f:
            f.write(json.dumps(entry.to_json()) + "\n")
    except OSError:
        pass


def read(run_dir: Path) -> list[FailureRecord]:
    """Every record, oldest first (a damaged line, or one that is not a failure record, is skipped)."""
    return [r for r in map(FailureRecord.from_dict, runs.read_jsonl(RunDir(run_dir).failures_file)) if r is not None]


def repeating(entries: list[FailureRecord]) -> Optional[str]:
    """The reason to stop, if the last two attempts that failed failed first with the same exception at the
    same step (and place); None otherwise."""
    first: dict[str, FailureRecord] = {}
    for e in sorted(entries, key=lambda e: e.time):
        first.setdefault(e.attempt, e)  # an attempt's first failure is its cause; the rest follow from it
    if len(first) < 2:
        return None
    a, b = sorted(first.values(), key=lambda e: e.time)[-2:]
    if (a.error, a.step, a.where) != (b.error, b.step, b.where):
        return None
    at = f"step {b.step}" if b.step is not None else "start-up"
    return f"the same failure twice in a row, at {at}: {b.error} ({b.where}); not retried again"


class Changes:
    """Whether the failure records changed since the last look: a node wrapper looks every second, and on a
    shared filesystem a stat (which the client caches) costs far less than opening and reading the file on
    every node every second; it is read only when a rank appended to it."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.last = RunDir(run_dir).failures_file, None

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
            now = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            now = None
        changed, self.last = now != self.last and now is not None, now
        return changed
