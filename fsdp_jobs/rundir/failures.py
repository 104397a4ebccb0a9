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
# the rendezvous round this rank's agent last joined (launchers/node/agent.py): the same on every node of an
# attempt, where torchrun's restart count (in attempt_id) is each agent's own: a node whose agent restarted once
# more (a healed cut, a container restarted) counts one ahead of the others in the same attempt (pitfall 37)
ROUND_ENV = "FSDP_JOBS_RENDEZVOUS_ROUND"


def attempt_id() -> str:
    """Which attempt this rank belongs to: the scheduler's (FSDP_JOBS_ATTEMPT, which a backend that requeues
    sets: its job id and requeue count) and torchrun's restart count."""
    return f"{os.environ.get(ATTEMPT_ENV, '')}:{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def exit_code(exc: BaseException) -> int:
    """The status the process exits with when `exc` ends it, as the interpreter decides it: sys.exit(N)'s N
    (a message or True: 1), 1 for any exception."""
    if isinstance(exc, SystemExit):
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) and not isinstance(code, bool) else 1
    return 1


def record(run_dir: Path, exc: BaseException, step: Optional[int]) -> None:
    """Append this rank's failure (best effort: recording must never hide the exception itself)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    entry = FailureRecord(
        time=time.time(), rank=int(os.environ.get("RANK", 0)), attempt=attempt_id(),
        round=os.environ.get(ROUND_ENV) or None, step=step, where=where,
        error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300],
        exit_code=exit_code(exc))
    try:
        with open(RunDir(run_dir).failures_file, "a") as f:
            f.write(json.dumps(entry.to_json()) + "\n")
    except OSError:
        pass


def read(run_dir: Path) -> list[FailureRecord]:
    """Every record, oldest first (a damaged line, or one that is not a failure record, is skipped)."""
    return [r for r in map(FailureRecord.from_dict, runs.read_jsonl(RunDir(run_dir).failures_file)) if r is not None]


def attempt_of(entry: FailureRecord) -> str:
    """The attempt a record belongs to, the same for every rank in it: the scheduler's attempt and the rendezvous
    round where the record has one (an older record: torchrun's restart count, which differs between nodes)."""
    if entry.round is None:
        return entry.attempt
    return f"{entry.attempt.rpartition(':')[0]}:round {entry.round}"


def repeating(entries: list[FailureRecord]) -> Optional[str]:
    """The reason to stop, if the last two attempts that failed failed first with the same exception at the
    same step (and place); None otherwise."""
    first: dict[str, FailureRecord] = {}
    for e in sorted(entries, key=lambda e: e.time):
        first.setdefault(attempt_of(e), e)  # an attempt's first failure is its cause; the rest follow from it
    if len(first) < 2:
        return None
    a, b = sorted(first.values(), key=lambda e: e.time)[-2:]
    if (a.error, a.step, a.where) != (b.error, b.step, b.where):
        return None
    at = f"step {b.step}" if b.step is not None else "start-up"
    return f"the same failure twice in a row, at {at}: {b.error} ({b.where}); not retried again"


def first_of_last_attempt(entries: list[FailureRecord], since: float = 0.0) -> Optional[FailureRecord]:
    """The failure that ended the newest attempt that failed since `since`: its first record (the other
    ranks' follow from it: a peer gone mid-collective), or None."""
    recent = [e for e in entries if e.time >= since]
    if not recent:
        return None
    last = attempt_of(max(recent, key=lambda e: e.time))
    return min((e for e in recent if attempt_of(e) == last), key=lambda e: e.time)


def describe(entry: FailureRecord) -> str:
    """One line: `rank 1 exited 3: SystemExit: 3 (train.py:40)`, with the step where the rank had one."""
    who = f"rank {entry.rank}" if entry.rank is not None else "a rank"
    code = f" exited {entry.exit_code}" if entry.exit_code is not None else " failed"
    step = f" at step {entry.step}" if entry.step is not None else ""
    return f"{who}{code}{step}: {entry.error}" + (f" ({entry.where})" if entry.where else "")


def cause(run_dir: Path, since: float = 0.0) -> Optional[str]:
    """describe() of the failure that ended the newest failed attempt since `since`, or None."""
    entry = first_of_last_attempt(read(run_dir), since)
    return describe(entry) if entry else None


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
