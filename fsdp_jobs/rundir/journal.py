"""The submission journal: one SQLite file per user, in the user's state directory (never in a checkout).

    $FSDP_JOBS_STATE_DIR/journal.sqlite              (tests, or a shared team directory)
    $XDG_STATE_HOME/fsdp-jobs/journal.sqlite         (default ~/.local/state/fsdp-jobs/journal.sqlite)

Every submission is one row: sweep id (NULL for a single run), member name, the member's overrides,
backend, job id, run dir and config hash. Run dirs stay the truth about a run (launches.jsonl,
state.json); the journal is what finds a sweep's members again from anywhere.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:
    import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    time        REAL NOT NULL,
    sweep       TEXT,            -- NULL: a single run
    member      TEXT NOT NULL,   -- the run's name (inside the sweep dir for a sweep)
    overrides   TEXT NOT NULL,   -- JSON list: every override the member was composed with
    params      TEXT NOT NULL,   -- JSON object: the swept keys and this member's values
    backend     TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    run_dir     TEXT NOT NULL,
    config_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS submissions_sweep ON submissions (sweep, member);
CREATE TABLE IF NOT EXISTS refusals (   -- a submission of an existing run that was refused before it started
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    time        REAL NOT NULL,
    run_dir     TEXT NOT NULL,
    reason      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS refusals_run ON refusals (run_dir);
"""


def state_dir() -> Path:
    """Raises UserError where the user has no home directory and none of the variables names a place."""
    explicit = os.environ.get("FSDP_JOBS_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and Path(xdg).is_absolute():  # a relative one is invalid (XDG Base Directory spec): ignored
        return Path(xdg) / "fsdp-jobs"
    try:
        return Path.home() / ".local" / "state" / "fsdp-jobs"
    except (RuntimeError, KeyError):  # HOME unset and no passwd entry: a container run as an unnamed uid
        raise UserError("", None, f"no home directory to keep the journal in (HOME is unset and uid {os.getuid()} "
                                  "has no passwd entry): set HOME, XDG_STATE_HOME or FSDP_JOBS_STATE_DIR") from None


def path() -> Path:
    return state_dir() / "journal.sqlite"


def where() -> str:
    """The journal's path for a message, or why there is none; never raises."""
    try:
        return str(path())
    except UserError as e:
        return f"(none: {e.allowed})"


def damaged(e: Exception) -> UserError:
    """A journal sqlite cannot read: one line naming it and the way out, never a traceback."""
    return UserError("", None, f"the journal {path()} is damaged or unreadable ({e}); move it aside "
                               f"(mv {path()} {path()}.bad): runs and sweep dirs under the run root are found "
                               "without it")


def _connect(create: bool) -> Optional[sqlite3.Connection]:
    try:
        p = path()
    except UserError:
        if create:
            raise
        return None  # nowhere to keep one: there is none to read (runs are found under the run root)
    if not create and not p.is_file():
        return None  # reading never creates the state directory
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    import sqlite3  # here, not at the top: every CLI start imports this module, few open the journal

    try:
        conn = sqlite3.connect(p, timeout=30)  # several CLIs may submit at once: wait for the write lock
        p.chmod(0o600)  # the raw overrides are the owner's (secrets are masked before they get here)
        conn.row_factory = sqlite3.Row
        conn.executescript(SCHEMA)
    except (sqlite3.Error, OSError) as e:
        raise damaged(e) from None
    return conn


def record(*, sweep: Optional[str], member: str, overrides: list[str], params: dict[str, str], backend: str,
           job_id: str, run_dir: str, config_hash: str) -> None:
    conn = _connect(create=True)
    assert conn is not None
    with conn:
        conn.execute("INSERT INTO submissions (time, sweep, member, overrides, params, backend, job_id, run_dir, "
                     "config_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (time.time(), sweep, member, json.dumps(overrides), json.dumps(params), backend, str(job_id),
                      str(run_dir), config_hash))
    conn.close()


def record_refusal(run_dir: Path, reason: str) -> None:
    """A submission of the existing run `run_dir` was refused (nothing in the run dir changed): `status`
    says so beside the run's own state, which is then not the outcome of the user's last command."""
    conn = _connect(create=True)
    assert conn is not None
    with conn:
        conn.execute("INSERT INTO refusals (time, run_dir, reason) VALUES (?, ?, ?)",
                     (time.time(), str(run_dir), reason))
    conn.close()


def last_refusal(run_dir: Path) -> Optional[dict[str, Any]]:
    """The newest refused submission of `run_dir` ({time, reason}), or None."""
    conn = _connect(create=False)
    if conn is None:
        return None
    import sqlite3

    try:
        with conn:
            row = conn.execute("SELECT time, reason FROM refusals WHERE run_dir = ? ORDER BY id DESC LIMIT 1",
                               (str(run_dir),)).fetchone()
    except sqlite3.Error as e:
        raise damaged(e) from None
    finally:
        conn.close()
    return dict(row) if row else None


def _row(r: sqlite3.Row) -> dict[str, Any]:
    out = dict(r)
    out["overrides"] = json.loads(out["overrides"])
    out["params"] = json.loads(out["params"])
    return out


def submissions(sweep: Optional[str] = None) -> list[dict[str, Any]]:
    """Every row (of one sweep), oldest first."""
    conn = _connect(create=False)
    if conn is None:
        return []
    import sqlite3

    try:
        with conn:
            if sweep is None:
                rows = conn.execute("SELECT * FROM submissions ORDER BY id").fetchall()
            else:
                rows = conn.execute("SELECT * FROM submissions WHERE sweep = ? ORDER BY id", (sweep,)).fetchall()
        out = [_row(r) for r in rows]
    except (sqlite3.Error, ValueError, TypeError) as e:  # a damaged file, or rows not of our making
        raise damaged(e) from None
    finally:
        conn.close()
    return out


def members(sweep: str) -> list[dict[str, Any]]:
    """The newest submission of each member of a sweep, in the order the members were first submitted."""
    first: dict[str, int] = {}
    latest: dict[str, dict[str, Any]] = {}
    for row in submissions(sweep):
        first.setdefault(row["member"], row["id"])
        latest[row["member"]] = row
    return sorted(latest.values(), key=lambda r: first[r["member"]])


def sweeps() -> list[dict[str, Any]]:
    """One entry per sweep: id, member count, backend, last submission time, sweep dir."""
    out: dict[str, dict[str, Any]] = {}
    for row in submissions():
        if row["sweep"] is None:
            continue
        s = out.setdefault(row["sweep"], {"sweep": row["sweep"], "members": set(), "backend": row["backend"],
                                          "dir": str(Path(row["run_dir"]).parent)})
        s["members"].add(row["member"])
        s["time"] = row["time"]
        s["dir"] = str(Path(row["run_dir"]).parent)
    return [{**s, "members": len(s["members"])} for s in out.values()]
