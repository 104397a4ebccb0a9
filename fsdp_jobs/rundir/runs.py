"""The run directory: the one place a job's config, plan, records, logs, metrics and checkpoints live.
Every path in it is named once, in layout.py (RunDir); this module reads and writes the shared records:

      job, plan       the resolved config the ranks read (earlier versions kept in history_dir), the plan
      launches        one line per launch/submission (backend, job id, time)
      metrics         one line per training step (rank 0)
      state           running / completed / preempted / failed (+ step, reason), written by rank 0 alone
      node verdict    a node's word on the job (failed, a scheduler's requeue), written by nodes alone
      launcher end    how a launch's nodes ended and whether a stop from outside reached them (the supervisor)
      stop request    present = "checkpoint and stop at the next step boundary" (launchers write it,
                      rank 0 reads it): the one channel from a launcher to the ranks besides signals
      scale request   {"nodes": N} from `fsdp-jobs scale` to a launcher that starts the new nodes itself
      cancel          `fsdp-jobs cancel` was asked (the CLI)

Who writes which record, and how the run's outcome is derived from them: fsdp_jobs/rundir/outcome.py.

Launchers and the in-job runtime meet only here: neither imports the other.
"""

from __future__ import annotations

import fcntl
import heapq
import itertools
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Optional, TextIO

import yaml

from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.logs import BLOCK, MAX_LINE, backward
from fsdp_jobs.rundir.records import (CancelRequest, LaunchRecord, LauncherEnd, MetricsRow, NodeVerdict, RankRecord,
                                      ScaleRequest, StateRecord, WorldRecord)

if TYPE_CHECKING:  # types only: load_plan imports it when called
    from fsdp_jobs.planning.plan import Plan


def write_atomic(path: Path, text: str) -> None:
    """Readers never see a half-written file (tmp + rename in the same directory). The temporary file is
    created exclusively (mkstemp, owner-only): a link planted at a predictable name by whoever else can
    write the run dir (a container's user) is never written through."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_append(path: Path) -> TextIO:
    """A log opened for appending that is never a link: a launcher running as root appends to files in a
    run dir another user can write (a container backend gives it to the containers' user)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "a")


# run dirs, their files and the journal are the owner's alone (README: Security): the CLI sets this umask
# before it writes anything, and the ranks it starts inherit it
OWNER_ONLY_UMASK = 0o077


def prepare(run_dir: Path, job: dict[str, Any], plan: dict[str, Any]) -> None:
    """Create or refresh a run dir. A config that differs from the saved one is kept in history_dir."""
    rd = RunDir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o700)  # also a run dir made by an older version (0755)
    rd.logs_dir.mkdir(exist_ok=True)
    rd.failures_file.unlink(missing_ok=True)  # a new submission: earlier ones' failures are not its (failures.py)
    text = yaml.safe_dump(job, sort_keys=False)
    old = rd.job_file
    if old.exists() and old.read_text() != text:
        rd.history_dir.mkdir(exist_ok=True)
        shutil.copy2(old, rd.history_dir / f"job-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.yaml")
    write_atomic(old, text)
    write_atomic(rd.plan_file, json.dumps(plan, indent=2) + "\n")


def replica_layout(run_dir: Path) -> Optional[dict[str, Any]]:
    """The plan's replica groups (fault_tolerance=replica: fsdp_jobs/planning/plan.py ReplicaLayout), or None: a run
    without them, or without a readable plan."""
    layout = plan_entry(run_dir, "replicas")
    return layout if isinstance(layout, dict) else None


def plan_entry(run_dir: Path, key: str) -> Any:
    """One entry of the plan the job was launched with, read without building a Plan; None where the plan has
    none or cannot be read."""
    try:
        return json.loads(RunDir(run_dir).plan_file.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


# libyaml's safe loader where PyYAML was built with it (its wheels are): the same data from the same text as
# yaml.safe_load, several times faster. Every rank reads the job record two or three times as it starts, every
# node wrapper and every `status` once.
JOB_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_job(run_dir: Path) -> dict[str, Any]:
    """The job record as plain data: for what hashes or shows it as written (job_hash, W&B's config). What
    reads its keys takes it through the schema: fsdp_jobs.planning.config.job_config(load_job(run_dir))."""
    return yaml.load(RunDir(run_dir).job_file.read_text(), Loader=JOB_LOADER)


def load_plan(run_dir: Path) -> Plan:
    """plan.json: the Plan the CLI launched the job with (fsdp_jobs/planning/plan.py)."""
    from fsdp_jobs.planning.plan import Plan

    return Plan.from_dict(json.loads(RunDir(run_dir).plan_file.read_text()))


def job_hash(job: dict[str, Any]) -> str:
    """What a checkpoint can be resumed with (model, sharding, training, data), hashed: checkpoints
    record it, and the sweep journal records it, so the two can be matched."""
    import hashlib

    keep = {k: job[k] for k in ("model", "fsdp", "train", "data")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def record_launch(run_dir: Path, record: LaunchRecord) -> None:
    """The CLI's launch: a backend's submit, or a launch handed to a scheduler's own submission tool."""
    with open(RunDir(run_dir).launches_file, "a") as f:
        f.write(json.dumps(record.to_json()) + "\n")


def record_node_launch(run_dir: Path, record: LaunchRecord) -> None:
    """A launch a node makes or learns inside the job (a preflight's requeue, a scheduler's app handle): the
    node's own record, so the CLI's has one writer; `launches` reads both."""
    with open_append(RunDir(run_dir).node_launches_file) as f:
        f.write(json.dumps(record.to_json()) + "\n")


def _launch_lines(path: Path) -> list[dict[str, Any]]:
    return [d for d in read_jsonl(path) if (r := LaunchRecord.from_dict(d)) is not None and r.backend]


def launches(run_dir: Path) -> list[dict[str, Any]]:
    """Every launch record, oldest first, as the JSON objects written (a backend's own keys at the top:
    its callers read those by name); a line cut short (a kill mid-write, a full disk) or not a launch
    record is skipped. The one reader of launches: the CLI's and the nodes' records merged by time, each
    file in its own order; on a tie the CLI's first (an app handle a node records keeps the submission's time).
    A run dir from before the nodes had their own record holds their lines among the CLI's, read alike."""
    rd = RunDir(run_dir)
    cli, nodes = _launch_lines(rd.launches_file), _launch_lines(rd.node_launches_file)
    if not nodes:
        return cli
    return list(heapq.merge(cli, nodes, key=lambda d: d.get("unix") or 0.0))


def last_launch(run_dir: Path) -> dict[str, Any]:
    """The newest launch record, or {} when none survives."""
    return (launches(run_dir) or [{}])[-1]


class RunLock:
    """One launcher per run dir at a time (an flock, released by the kernel if we die)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunDir(run_dir).lock_file
        self._file: IO[str] | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            self._file = None
            return False
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()
        return True

    def held_by(self, pid: int) -> bool:
        """Does process `pid` hold this lock file open (Linux /proc)? The proof that a pid named in
        the launch records, a file anyone who can write the run dir can edit, is this run's launcher."""
        target = os.path.realpath(self.path)
        try:
            fds = os.listdir(f"/proc/{int(pid)}/fd")
        except (OSError, ValueError):
            return False
        for fd in fds:
            try:
                if os.readlink(f"/proc/{int(pid)}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
        return False

    def held(self) -> bool:
        """Is a launcher holding this run right now? Only reads: never creates the lock file."""
        try:
            f = open(self.path)
        except OSError:
            return False
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def release(self) -> None:
        if self._file:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def write_state(run_dir: Path, **fields: Any) -> None:
    """The leader rank's state record: running / completed / preempted / failed (+ step, reason). Rank 0 alone
    writes it. The keywords are StateRecord's fields: a misspelt one raises here, in the writer."""
    write_atomic(RunDir(run_dir).state_file, json.dumps(StateRecord(**fields).to_json()) + "\n")


def read_state_record(run_dir: Path) -> Optional[StateRecord]:
    """None when missing or damaged (not JSON, not an object, not UTF-8, a field of the wrong type)."""
    return StateRecord.from_dict(_read_json(RunDir(run_dir).state_file))


def no_state() -> StateRecord:
    """What read_state gives when no record counts (a new one each time: records are mutable)."""
    return StateRecord(status="", time=0.0)


def read_state(run_dir: Path) -> StateRecord:
    """The state record; when there is none (not written yet, or damaged), one whose status is "" and step
    None, so a reader asks `read_state(d).status` without a None check. Whatever its time: the run's outcome
    is fsdp_jobs/rundir/outcome.py's."""
    return read_state_record(run_dir) or no_state()


def completed_at(run_dir: Path, steps: int) -> Optional[int]:
    """The step the run completed at when it completed `steps` or more (nothing left to train), else None."""
    state = read_state(run_dir)
    return state.step if state.status == "completed" and (state.step or 0) >= steps else None


def write_node_verdict(run_dir: Path, **fields: Any) -> None:
    """A node's verdict on the job (NodeVerdict's fields): nodes alone write it."""
    write_atomic(RunDir(run_dir).node_verdict_file, json.dumps(NodeVerdict(**fields).to_json()) + "\n")


def read_node_verdict(run_dir: Path) -> Optional[NodeVerdict]:
    return NodeVerdict.from_dict(_read_json(RunDir(run_dir).node_verdict_file))


def write_launcher_end(run_dir: Path, nodes: dict[str, int], stopped: Optional[float]) -> None:
    """How the launch's nodes ended (LauncherEnd): the supervisor alone writes it, once they all have."""
    write_atomic(RunDir(run_dir).launcher_end_file,
                 json.dumps(LauncherEnd(nodes=nodes, stopped=stopped).to_json()) + "\n")


def read_launcher_end(run_dir: Path) -> Optional[LauncherEnd]:
    return LauncherEnd.from_dict(_read_json(RunDir(run_dir).launcher_end_file))


def _read_json(path: Path) -> Any:
    """The JSON value in `path`, or None when missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # (json's and UTF-8's errors are ValueErrors)
        return None


def read_rank(path: Path) -> Optional[RankRecord]:
    """A rank's record (RunDir.rank_file), None when missing or damaged."""
    return RankRecord.from_dict(_read_json(path))


def read_world(run_dir: Path) -> Optional[WorldRecord]:
    """The newest attempt's nodes (RunDir.world_file), None when missing or damaged."""
    return WorldRecord.from_dict(_read_json(RunDir(run_dir).world_file))


def write_world(run_dir: Path, restart: int, nodes: list[str]) -> None:
    write_atomic(RunDir(run_dir).world_file,
                 json.dumps(WorldRecord(restart=restart, nodes=nodes, time=time.time()).to_json()) + "\n")


def node_changes(before: Optional[WorldRecord], nodes: list[str], launched: Optional[float]) -> Optional[str]:
    """One line naming the nodes that left the job, or joined it, since its last rendezvous (`before`); None
    when the same nodes, or when `before` is an earlier launch's (written before `launched`)."""
    if before is None or (launched is not None and before.time < launched):
        return None
    left, joined = sorted(set(before.nodes) - set(nodes)), sorted(set(nodes) - set(before.nodes))
    if not left and not joined:
        return None
    parts = ([f"{_names(left)} left the job"] if left else []) + ([f"{_names(joined)} joined"] if joined else [])
    return f"nodes: {'; '.join(parts)} since its last rendezvous: {len(before.nodes)} -> {len(nodes)} nodes"


def _names(nodes: list[str], shown: int = 8) -> str:
    """At most `shown` names (a rack of 32 nodes lost is one line, not 32 names)."""
    return ", ".join(nodes[:shown]) + (f" and {len(nodes) - shown} more" if len(nodes) > shown else "")


def request_scale(run_dir: Path, nodes: int) -> None:
    """`fsdp-jobs scale RUN nodes=N` for a launcher that starts the new nodes itself (it polls the file)."""
    write_atomic(RunDir(run_dir).scale_request_file, json.dumps(ScaleRequest(nodes=nodes).to_json()) + "\n")


def take_scale_request(run_dir: Path) -> Optional[int]:
    """The node count a `scale` asked for since the last call, or None; the request is used up. Read by a
    launcher that may run as root in a run dir the ranks' user can write: taken by a rename (a request
    written meanwhile is the next one, not lost), never through a link, never a FIFO, at most 4 KiB."""
    path, taken = RunDir(run_dir).scale_request_file, RunDir(run_dir).scale_taken_file
    try:
        os.rename(path, taken)
    except OSError:
        return None
    try:
        fd = os.open(taken, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            data = os.read(fd, 4096) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        request = ScaleRequest.from_dict(json.loads(data))
    except (OSError, ValueError):
        return None
    finally:
        taken.unlink(missing_ok=True)
    return request.nodes if request else None


# how a stop that the stop request asked for is named (a vote's reason in the state record and the log)
STOP_REQUEST_REASON = f"{RunDir(Path()).stop_request_file.name} file"


def request_stop(run_dir: Path, why: str) -> None:
    """Ask the ranks to checkpoint and stop at the next step boundary (they may have missed a signal)."""
    RunDir(run_dir).stop_request_file.write_text(why + "\n")


def stop_requested(run_dir: Path) -> bool:
    return RunDir(run_dir).stop_request_file.exists()


def stop_nodes(run_dir: Path) -> None:
    """Before a launcher signals its nodes to stop: a node's wrapper that cannot have taken the signal (not yet
    started, or PID 1 of a container before its handlers existed, where the kernel drops it) reads this once its
    handlers are in place (launchers/node/wrapper.py). Written once per stop, however many nodes; best effort (a
    full disk must not turn the stop into a kill: the signal still goes)."""
    path = RunDir(run_dir).stop_nodes_file
    try:
        if not path.exists():
            write_atomic(path, f"{time.time()}\n")
    except OSError:
        pass


def nodes_stopped_at(run_dir: Path) -> Optional[float]:
    """When a launcher recorded that it stops this run's nodes (stop_nodes), or None."""
    try:
        return float(RunDir(run_dir).stop_nodes_file.read_text().strip())
    except (OSError, ValueError):
        return None


def clear_stop_request(run_dir: Path) -> None:
    """At the start of every attempt, before any rank runs: an old request must not stop a new run."""
    rd = RunDir(run_dir)
    for path in (rd.stop_request_file, rd.cancel_file, rd.scale_request_file, rd.stop_nodes_file):
        path.unlink(missing_ok=True)


def record_cancel(run_dir: Path) -> None:
    """`fsdp-jobs cancel` was asked for this attempt (the CLI's record): however its nodes then exit (they are
    stopped one by one, so one may see its peer vanish mid-step and fail), the job ended as CANCELLED."""
    write_atomic(RunDir(run_dir).cancel_file, json.dumps(CancelRequest(time=time.time()).to_json()) + "\n")


def cancel_asked(run_dir: Path) -> Optional[float]:
    """When `fsdp-jobs cancel` was last asked, or None. A record from before CancelRequest (a line of text)
    is dated by its file."""
    path = RunDir(run_dir).cancel_file
    record = CancelRequest.from_dict(_read_json(path))
    if record is not None:
        return record.time
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, oldest first: a line cut short by a kill, or not an object, is
    skipped (these files are appended to by processes that may die mid-write)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The metrics rows, oldest first, as the JSON objects written (a user's script's own metrics at the top,
    by their names: trackers and report read any of them); a line cut by a kill mid-write or not a row
    (no int step, a known metric of the wrong type) is skipped. Every row: a command that needs the newest
    few reads read_metrics_tail instead (a long run's record is 1 M rows, 24 s to parse)."""
    return [d for d in read_jsonl(RunDir(run_dir).metrics_file) if MetricsRow.fits(d)]


TAIL_BLOCK = BLOCK  # read_tail's step backwards from a file's end (logs.backward's)
MAX_RECORD_LINE = MAX_LINE  # a longer "line" is no record of ours: read_tail sees only its first MAX_LINE bytes
CLOCK_SLACK_S = 60.0  # rank 0 may move to a node whose clock is behind: read_metrics_between's margin


def read_tail(path: Path, count: int, keep: Callable[[dict[str, Any]], bool] = lambda d: True) -> list[dict[str, Any]]:
    """The newest `count` objects of a JSON-lines file that `keep` accepts, oldest first (newest_first's)."""
    return list(itertools.islice(newest_first(path, keep), count))[::-1]


def newest_first(path: Path, keep: Callable[[dict[str, Any]], bool] = lambda d: True) -> Iterator[dict[str, Any]]:
    """The objects of a JSON-lines file that `keep` accepts, newest first, read backwards from its end a block
    at a time (logs.backward) only as far as the caller takes them: what a tail costs does not grow with the
    file. A damaged line is skipped as read_jsonl skips it; an unreadable file ends the objects."""
    try:
        with open(path, "rb") as f:
            for _, line in backward(f, f.seek(0, os.SEEK_END)):
                record = _json_object(line)
                if record is not None and keep(record):
                    yield record
    except OSError:
        return


def _json_object(line: bytes) -> Optional[dict[str, Any]]:
    try:
        record = json.loads(line.decode(errors="replace"))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_metrics_tail(run_dir: Path, count: int) -> list[dict[str, Any]]:
    """The newest `count` metrics rows (read_metrics' rows, without reading the others)."""
    return list(itertools.islice(metrics_newest_first(run_dir), count))[::-1]


def metrics_newest_first(run_dir: Path) -> Iterator[dict[str, Any]]:
    """read_metrics' rows, newest first, read only as far as the caller takes them."""
    return newest_first(RunDir(run_dir).metrics_file, MetricsRow.fits)


def read_metrics_between(run_dir: Path, after: float, until: Optional[float]) -> list[dict[str, Any]]:
    """The metrics rows whose time is after `after` and before `until` (None: to the end), found by
    bisecting the file's offsets (rank 0 appends its rows in time order, give or take CLOCK_SLACK_S between
    nodes' clocks), then read forward: a few blocks of a 1 M-row record, not all of it."""
    try:
        with open(RunDir(run_dir).metrics_file, "rb") as f:
            lo, hi = 0, f.seek(0, os.SEEK_END)
            while hi - lo > TAIL_BLOCK:  # the row after offset `lo` is at or before `after` (or lo is 0)
                mid = (lo + hi) // 2
                t = _time_after(f, mid)
                if t is None or t > after - CLOCK_SLACK_S:
                    hi = mid
                else:
                    lo = mid
            f.seek(lo)
            if lo:
                f.readline()  # the rest of a row that began before lo
            return _rows_until(f, after, until)
    except OSError:
        return []


def _time_after(f: IO[bytes], offset: int) -> Optional[float]:
    """The time of the first whole metrics row after `offset` (None: none before the file's end)."""
    f.seek(offset)
    f.readline()
    for line in f:
        record = _json_object(line)
        if record is not None and isinstance(record.get("time"), (int, float)):
            return float(record["time"])
    return None


def _rows_until(f: IO[bytes], after: float, until: Optional[float]) -> list[dict[str, Any]]:
    out = []
    for line in f:
        record = _json_object(line)
        t = record.get("time") if record is not None else None
        if not isinstance(t, (int, float)) or MetricsRow.from_dict(record) is None:
            continue
        if until is not None and t >= until + CLOCK_SLACK_S:
            break
        if t > after and (until is None or t < until):
            out.append(record)  # type: ignore[arg-type]
    return out


def trained_to(run_dir: Path) -> Optional[tuple[int, Path]]:
    """(the furthest step the run recorded, the record that says so): the newest metrics row, the state
    record's step, the goodput timeline's newest step window. None when none records a step past 0. Each
    read from its end only as far as its newest row: the cost does not grow with the run."""
    rd = RunDir(run_dir)
    row = next(metrics_newest_first(run_dir), None)
    window = next(newest_first(rd.goodput_file, lambda d: d.get("event") == "steps"), None)
    found = [(row.get("step") if row else None, rd.metrics_file), (read_state(run_dir).step, rd.state_file),
             (window.get("last") if window else None, rd.goodput_file)]
    steps = [(step, path) for step, path in found if isinstance(step, int) and not isinstance(step, bool) and step > 0]
    return max(steps, key=lambda s: s[0]) if steps else None


def move_progress_aside(run_dir: Path, stamp: str) -> list[Path]:
    """A start over (checkpoint.resume=false): each record of the earlier progress (RunDir.progress_files)
    renamed to RunDir.before(path, stamp), never deleted, so the new attempt's rows start records of their
    own. The paths moved to."""
    moved = []
    for path in RunDir(run_dir).progress_files:
        dest = RunDir.before(path, stamp)
        if dest.exists():  # a start over in the same second: never renamed onto an earlier one
            dest = RunDir.before(path, f"{stamp}-{os.getpid()}")
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            continue
        moved.append(dest)
    return moved


def first_metrics_row(run_dir: Path) -> Optional[dict[str, Any]]:
    """The oldest metrics row, reading from the file's start only as far as it."""
    try:
        with open(RunDir(run_dir).metrics_file, "rb") as f:
            for line in f:
                record = _json_object(line)
                if record is not None and MetricsRow.fits(record):
                    return record
    except OSError:
        pass
    return None
