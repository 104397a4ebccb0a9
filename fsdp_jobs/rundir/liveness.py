"""Liveness that scales: each rank's heartbeat stays on its node; the shared run dir gets one record per node.

On a shared filesystem (Lustre, NFS, GPFS) every file write is a metadata round trip to one server, so
what every rank did once a second (write + rename a heartbeat file into the run dir: 8,000 metadata
operations a second at 1,024 nodes x 8 ranks) now stays node-local:

  rank      every HEARTBEAT_S: its RankBeat into the node-local directory (tmpfs: `local_dir`), which only
            its own node reads (fsdp_jobs/runtime/heartbeat.py)
  node      every second its watchdog (launchers/node/watchdog.py) reads them, decides about hangs and
            stragglers, and publishes one NodeLiveness record to RunDir.node_liveness_file(node): when
            something a reader acts on changed (a rank started, stopped, changed phase, went silent) and
            otherwise every PUBLISH_S, written in place (no temporary file, no rename: one write)
  readers   `status`, the straggler report, other nodes' watchdogs and a replica group's start barrier
            read the node records (`read_published`); a node reads its own ranks from `local_dir`

So the shared run dir receives, per node, one write every PUBLISH_S in steady training (ARCHITECTURE.md:
"What grows with the job"), whatever the ranks per node.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import NODE_LOCAL_ROOTS, RunDir

SCHEMA = 1
HEARTBEAT_S = 1.0  # a rank's heartbeat thread, into node-local memory: free
PUBLISH_S = 10.0  # a node's record in the shared run dir when nothing changed
STALE_S = 5.0  # a heartbeat thread silent this long: the process itself is not running
FRESH_S = PUBLISH_S + 2 * STALE_S  # a node record older than this: its node's watchdog is gone
LOCAL_DIR_ENV = "FSDP_JOBS_LIVENESS_DIR"  # set by the node wrapper for its agent and ranks


@dataclass
class RankBeat:
    """One rank's heartbeat. `progress`: when it last advanced (or entered its phase); `alive`: when its
    heartbeat thread last wrote (a stopped process stops writing; one blocked in a collective does not)."""

    rank: int
    node: str
    pid: int
    step: int
    phase: str
    progress: float
    alive: float
    step_s: Optional[float] = None  # the slowest of its recent step gaps
    local_rank: int = 0
    restart: int = 0
    compute_s: Optional[float] = None  # mean compute per step (fsdp_jobs/cli/stragglers.py)
    wait_s: Optional[float] = None  # mean wait in collectives per step
    v: int = SCHEMA

    @classmethod
    def from_dict(cls, d: Any) -> Optional["RankBeat"]:
        """None for anything that is not a heartbeat of ours (damaged, half-written, foreign)."""
        if not isinstance(d, dict):
            return None
        try:
            known = {f.name for f in fields(cls)}
            beat = cls(**{k: v for k, v in d.items() if k in known})
            beat.rank, beat.pid, beat.step = int(beat.rank), int(beat.pid), int(beat.step)
            beat.progress, beat.alive, beat.node = float(beat.progress), float(beat.alive), str(beat.node)
        except (TypeError, ValueError):
            return None
        return beat

    def silent(self, now: float) -> bool:
        return now - self.alive > STALE_S


@dataclass
class NodeLiveness:
    """RunDir.node_liveness_file(node): a node's ranks as its watchdog last saw them, at `written`."""

    node: str
    written: float
    ranks: list[RankBeat]
    v: int = SCHEMA


# ------------------------------------------------------------------ node-local: the ranks and their watchdog
def local_dir(run_dir: Path, node: str) -> Path:
    """This node's heartbeat directory for this run: node-local memory, the owner's alone. The node wrapper
    names it in LOCAL_DIR_ENV for its ranks; without it (a rank started by hand), the same path is derived."""
    named = os.environ.get(LOCAL_DIR_ENV)
    return Path(named) if named else derived_local_dir(run_dir, node)


def derived_local_dir(run_dir: Path, node: str) -> Path:
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    base = next((Path(r) for r in NODE_LOCAL_ROOTS if os.access(r, os.W_OK)), Path(tempfile.gettempdir()))
    return base / f"fsdp-jobs-{os.getuid()}" / f"{key}-{node}"


def make_local_dir(path: Path) -> Path:
    """Create it owner-only; refuse a parent another user planted (a shared /dev/shm or /tmp)."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(path.parent)
    if st.st_uid != os.getuid() or not os.path.isdir(path.parent) or os.path.islink(path.parent):
        raise OSError(f"{path.parent} is not this user's own directory")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def beat_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.json"


def write_beat(directory: Path, beat: RankBeat) -> None:
    runs.write_atomic(beat_file(directory, beat.rank), json.dumps(asdict(beat)) + "\n")


def read_local(directory: Path) -> list[RankBeat]:
    """The heartbeats in a node-local directory (a file being replaced, or not ours, is skipped)."""
    out = []
    for path in sorted(directory.glob("rank-*.json")):
        try:
            beat = RankBeat.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        if beat is not None:
            out.append(beat)
    return out


# ------------------------------------------------------------------ the shared run dir: one record per node
class Publisher:
    """A node's record in the shared run dir: on a change readers act on, else every PUBLISH_S."""

    def __init__(self, run_dir: Path, node: str) -> None:
        self.path, self.node = RunDir(run_dir).node_liveness_file(node), node
        self.last_key: Optional[tuple[Any, ...]] = None
        self.last_time = float("-inf")

    @staticmethod
    def key(beats: list[RankBeat], now: float) -> tuple[Any, ...]:
        return tuple(sorted((b.rank, b.pid, b.phase, b.restart, b.silent(now)) for b in beats))

    def tick(self, beats: list[RankBeat], now: float) -> bool:
        """Publish if due; True when it wrote."""
        key = self.key(beats, now)
        if key == self.last_key and now - self.last_time < PUBLISH_S:
            return False
        if not beats and self.last_key is None:
            return False  # nothing started yet: nothing to say
        record = NodeLiveness(self.node, now, beats)
        try:
            self.path.parent.mkdir(exist_ok=True)
            write_in_place(self.path, json.dumps(asdict(record)))
        except OSError:  # a full or vanished disk must not stop the watchdog
            return False
        self.last_key, self.last_time = key, now
        return True


def write_in_place(path: Path, text: str) -> None:
    """One write to an existing file (no temporary file, no rename: a single metadata operation on a
    shared filesystem), followed by its CRC: a reader that catches it half-rewritten sees a CRC that does
    not match and skips it this once (`read_in_place`). Never through a link."""
    data = f"{text}\n#crc32={zlib.crc32(text.encode()):08x}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def read_in_place(path: Path) -> Optional[str]:
    """The text `write_in_place` wrote, or None (missing, torn, damaged, foreign)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    text, sep, tail = raw.partition(b"\n#crc32=")
    if not sep or len(tail) < 8:
        return None
    try:
        ok = int(tail[:8], 16) == zlib.crc32(text)
    except ValueError:
        return None
    return text.decode(errors="replace") if ok else None


def read_node(path: Path) -> Optional[NodeLiveness]:
    text = read_in_place(path)
    try:
        d = json.loads(text) if text is not None else None
        if not isinstance(d, dict) or not isinstance(d.get("ranks"), list):
            return None
        beats = [RankBeat.from_dict(r) for r in d["ranks"]]
        return NodeLiveness(str(d["node"]), float(d["written"]), [b for b in beats if b is not None])
    except (ValueError, KeyError, TypeError):
        return None


def read_nodes(run_dir: Path) -> list[NodeLiveness]:
    """Every node's latest record (damaged or foreign files skipped)."""
    nodes = [read_node(p) for p in sorted(RunDir(run_dir).liveness_dir.glob("node-*.json"))]
    return [n for n in nodes if n is not None]


def read_published(run_dir: Path, now: float, exclude_node: Optional[str] = None,
                   since: float = float("-inf")) -> list[RankBeat]:
    """Every node's ranks as last published, as seen from `now`, from records written after `since`. A
    fresh record (its watchdog publishes) vouches that its ranks were as alive as they were at its writing:
    their `alive` is moved forward by the record's age, so a rank silent when written stays silent and one
    that was beating counts as beating. A stale record (its node's watchdog is gone) is taken as written:
    its ranks look silent."""
    out = []
    for record in read_nodes(run_dir):
        if record.node == exclude_node or record.written <= since:
            continue
        age = now - record.written
        shift = age if 0 <= age <= FRESH_S else 0.0
        out.extend(replace(b, alive=b.alive + shift) for b in record.ranks)
    return out


def live_ranks(run_dir: Path, now: float, since: float = float("-inf")) -> list[RankBeat]:
    """The ranks beating now on every node, as stated after `since` (a record of the run's previous launch
    is no evidence): the published records, and this node's own ranks from node-local memory (newer)."""
    node = os.environ.get("FSDP_JOBS_NODE", "")
    mine = [b for b in read_local(local_dir(run_dir, node)) if b.alive > since] if node else []
    beats = {b.rank: b for b in read_published(run_dir, now, since=since)}
    beats.update({b.rank: b for b in mine})
    return [b for b in beats.values() if now - b.alive < STALE_S]
