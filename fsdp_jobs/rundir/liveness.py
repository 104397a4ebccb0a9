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
  leader    the watchdog of the node holding rank 0 writes no node record of its own but the JobView
            (RunDir.job_liveness_file): a NodeSummary of every node (its ranks' phases, furthest step,
            compute and wait medians, silent ranks, laggard), from the node records it reads every
            LEADER_READ_S, written on a change or every PUBLISH_S
  readers   the other nodes' watchdogs (stragglers, a late rank's timeout, a hang's culprit), `status` and a
            replica group's start barrier read the one JobView (`job_nodes`), never every node's record
            (only while no fresh view exists: a leader gone, a job starting); a node reads its own ranks
            from `local_dir`

So the shared run dir receives, per node, one write every PUBLISH_S in steady training, whatever the ranks
per node, and one node reads O(nodes) records every LEADER_READ_S while each other node reads one file
when it needs the job's state (ARCHITECTURE.md: "What grows with the job").
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any, Optional

from fsdp_jobs.rundir import events, runs
from fsdp_jobs.rundir.layout import NODE_LOCAL_ROOTS, RunDir

SCHEMA = 1
HEARTBEAT_S = 1.0  # a rank's heartbeat thread, into node-local memory: free
PUBLISH_S = 10.0  # a node's record in the shared run dir when nothing changed, once settled
START_PUBLISH_S = 1.0  # ... and while its ranks settle (Settling)
SETTLE_S = 30.0  # how long new ranks have been stepping and timed before the record settles to PUBLISH_S
STALE_S = 5.0  # a heartbeat thread silent this long: the process itself is not running
FRESH_S = PUBLISH_S + 2 * STALE_S  # a node record older than this: its node's watchdog is gone
LEADER_READ_S = 2.0  # the leader reads the node records this often
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
    compute_s: Optional[float] = None  # mean compute per step, its longest left out (heartbeat.steady_mean)
    wait_s: Optional[float] = None  # mean wait in collectives per step
    save_s: Optional[float] = None  # the slowest of this process's finished saves: the watchdog's budget for the next
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
    # once its ranks have exited (the job ended, or its workers restart): their last timing, {compute_s,
    # wait_s, restart}, so that a finished run's straggler report still has this node (a short job's ranks
    # can be timed and gone between two of its records)
    kept: Optional[dict[str, Any]] = None
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


OWNER_LOCK = ".owner"  # flock'ed by the node wrapper, inherited by its agent and the ranks forked from it
ABANDONED_AFTER_S = 60.0  # a lock file younger than this is a wrapper starting (it locks right after creating it)


def hold_local_dir(path: Path) -> Optional[IO[str]]:
    """Mark `path` as in use for as long as this process or a process that inherits the returned file lives
    (the kernel drops the lock when the last one ends): a node wrapper SIGKILLed, whose ranks then end too,
    leaves its directory, snapshots of many GiB included, for the next wrapper on the node to remove
    (`remove_abandoned_local_dirs`). None: another live process holds it already."""
    import fcntl

    f = open(path / OWNER_LOCK, "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def remove_abandoned_local_dirs(keep: Path, now: Optional[float] = None) -> dict[str, int]:
    """This user's other node-local directories (beside `keep`) that no live process holds: removed; their
    names and bytes. One directory listing per node wrapper start. Directories without a lock file (made by
    an older version, whose wrapper may still run) are left alone."""
    import fcntl
    import shutil

    now = time.time() if now is None else now
    removed: dict[str, int] = {}
    for d in sorted(keep.parent.iterdir()):
        lock = d / OWNER_LOCK
        try:
            if d == keep or now - lock.stat().st_mtime < ABANDONED_AFTER_S:
                continue
            with open(lock, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                size = sum(os.lstat(os.path.join(top, n)).st_blocks * 512 for top, _, names in os.walk(d) for n in names)
                shutil.rmtree(d)
        except (OSError, BlockingIOError):  # held (BlockingIOError is an OSError too), gone, or not ours
            continue
        removed[d.name] = size
    return removed


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


# The agent's word on its rendezvous round (launchers/node/agent.py `report_nodes_that_left_the_round`), for its
# node's watchdog: the nodes of the round that left it, which torch's rendezvous drops once their agent's
# keep-alive lapsed (a node cut off from the network, a host gone with its agent), each with when this agent
# first saw it gone. Rewritten when that changes, removed when a new round begins: node-local, never the run dir.
LEFT_FILE = "rendezvous-left.json"


@dataclass
class LeftTheRound:
    round: int
    expiry_s: float  # torch's keep_alive_interval x keep_alive_max_attempt: how long a silent agent stays in
    left: dict[str, float]  # node (ours, or the agent's address where unknown) -> when this agent first saw it gone


def write_left(directory: Path, left: Optional[LeftTheRound]) -> None:
    """The record, or none (a new round)."""
    if left is None:
        (directory / LEFT_FILE).unlink(missing_ok=True)
    else:
        runs.write_atomic(directory / LEFT_FILE, json.dumps(asdict(left)) + "\n")


def read_left(directory: Path) -> Optional[LeftTheRound]:
    """None when no node left this round (or the record is not ours)."""
    try:
        d = json.loads((directory / LEFT_FILE).read_text())
        return LeftTheRound(int(d["round"]), float(d["expiry_s"]), {str(k): float(v) for k, v in d["left"].items()})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


# ------------------------------------------------------------------ the shared run dir: one record per node
class Settling:
    """When a record is due: on a change readers act on; else every START_PUBLISH_S until its ranks (the same
    processes) have been stepping and timed for SETTLE_S, then every PUBLISH_S. A rank's compute per step is
    a mean over its recent steps, noisy in its first seconds: `status` early in a job reads numbers a second
    old, not the first ones held for 10 s (a healthy node was named a straggler 60 steps in)."""

    def __init__(self) -> None:
        self.last_key: Optional[tuple[Any, ...]] = None
        self.last_time = float("-inf")
        self.ranks: Optional[frozenset[int]] = None  # the pids this settling is for
        self.steady_since: Optional[float] = None

    def due(self, key: tuple[Any, ...], pids: frozenset[int], steady: bool, now: float) -> bool:
        if pids != self.ranks:  # new processes (a start, a restart): settle again
            self.ranks, self.steady_since = pids, None
        if steady and self.steady_since is None:
            self.steady_since = now
        settled = self.steady_since is not None and now - self.steady_since >= SETTLE_S
        return key != self.last_key or now - self.last_time >= (PUBLISH_S if settled else START_PUBLISH_S)

    def wrote(self, key: tuple[Any, ...], now: float) -> None:
        self.last_key, self.last_time = key, now


class Publisher(Settling):
    """A node's record in the shared run dir (Settling says when)."""

    def __init__(self, run_dir: Path, node: str) -> None:
        super().__init__()
        self.path, self.node = RunDir(run_dir).node_liveness_file(node), node
        self.kept: Optional[dict[str, Any]] = None  # the last timing its ranks had, seen at any tick

    @staticmethod
    def key(beats: list[RankBeat], now: float) -> tuple[Any, ...]:
        # what a reader acts on; `timed`: the straggler report needs the first compute per step at once
        return tuple(sorted((b.rank, b.pid, b.phase, b.restart, b.silent(now), b.compute_s is not None)
                            for b in beats))

    def tick(self, beats: list[RankBeat], now: float) -> bool:
        """Publish if due; True when it wrote."""
        key = self.key(beats, now)
        summary = NodeSummary.of(self.node, now, beats, now)
        if summary.compute_s is not None:
            self.kept = {"compute_s": summary.compute_s, "wait_s": summary.wait_s, "restart": summary.restart}
        steady = bool(beats) and all(b.phase == "step" and b.compute_s is not None for b in beats)
        if not self.due(key, frozenset(b.pid for b in beats), steady, now):
            return False
        if not beats and self.last_key is None:
            return False  # nothing started yet: nothing to say
        record = NodeLiveness(self.node, now, beats, None if beats else self.kept)
        if not self.write(json.dumps(asdict(record))):
            return False
        self.wrote(key, now)
        return True

    def write(self, text: str) -> bool:
        try:
            self.path.parent.mkdir(exist_ok=True)
            write_in_place(self.path, text)
        except OSError:  # a full or vanished disk must not stop the watchdog
            return False
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
        kept = d.get("kept") if isinstance(d.get("kept"), dict) else None
        return NodeLiveness(str(d["node"]), float(d["written"]), [b for b in beats if b is not None], kept)
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
    its ranks look silent. Reads every node's record: for tools and the leader, not for every node."""
    return [b for r in read_nodes(run_dir) if r.node != exclude_node and r.written > since
            for b in vouched(r, now)]


def vouched(record: NodeLiveness, now: float) -> list[RankBeat]:
    """A record's ranks as seen from `now`: a fresh one moves each rank's `alive` forward by its age."""
    shift = now - record.written if 0 <= now - record.written <= FRESH_S else 0.0
    return [replace(b, alive=b.alive + shift) for b in record.ranks]


# ------------------------------------------------------------------ the job view: one file for every reader
@dataclass
class NodeSummary:
    """What the rest of the job needs to know of one node, as of its record's `written`."""

    node: str
    written: float
    ranks: int
    rank_min: int
    restart: int
    phases: dict[str, int]  # its live ranks by phase
    step_max: Optional[int]  # the furthest step a live rank of it advanced to in the step loop
    compute_s: Optional[float]  # its timed ranks' median compute per step (fsdp_jobs/rundir/stragglers.py)
    wait_s: Optional[float]
    silent: list[RankBeat]  # its ranks whose heartbeat thread went silent
    laggard: Optional[RankBeat]  # its live rank at the lowest (step, progress): a hang's suspect

    @classmethod
    def of(cls, node: str, written: float, beats: list[RankBeat], now: float) -> "NodeSummary":
        live = [b for b in beats if not b.silent(now)]
        stepping = [b.step for b in live if b.phase == "step"]
        timed = [b for b in beats if isinstance(b.compute_s, (int, float))]
        phases: dict[str, int] = {}
        for b in live:
            phases[b.phase] = phases.get(b.phase, 0) + 1
        return cls(node, written, len(beats), min((b.rank for b in beats), default=0),
                   max((b.restart for b in beats), default=0), phases, max(stepping) if stepping else None,
                   statistics.median(float(b.compute_s) for b in timed) if timed else None,  # type: ignore[arg-type]
                   statistics.median(float(b.wait_s or 0.0) for b in timed) if timed else None,
                   [b for b in beats if b.silent(now)],
                   min(live, key=lambda b: (b.step, b.progress)) if live else None)

    @classmethod
    def from_dict(cls, d: Any) -> Optional["NodeSummary"]:
        try:
            silent = [RankBeat.from_dict(b) for b in d["silent"]]
            return cls(str(d["node"]), float(d["written"]), int(d["ranks"]), int(d["rank_min"]), int(d["restart"]),
                       {str(k): int(v) for k, v in d["phases"].items()}, d["step_max"], d["compute_s"],
                       d["wait_s"], [b for b in silent if b is not None], RankBeat.from_dict(d["laggard"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def settled(self) -> bool:
        """Every rank of it stepping and timed: steady training, nothing a reader waits to hear."""
        return self.ranks > 0 and set(self.phases) == {"step"} and self.compute_s is not None

    def key(self) -> tuple[Any, ...]:
        return (self.node, self.ranks, self.restart, tuple(sorted(self.phases.items())),
                tuple(b.rank for b in self.silent), self.compute_s is not None)


@dataclass
class JobView:
    """RunDir.job_liveness_file: every node's summary, by the leader (the node of rank 0)."""

    written: float
    leader: str
    nodes: list[NodeSummary]
    v: int = SCHEMA


def keep_timing(new: NodeSummary, old: Optional[NodeSummary]) -> NodeSummary:
    """A node whose ranks have all exited (its record is empty: the job ended, or its workers restart)
    keeps its last compute per step and attempt, so a finished run's `status` and `compare` still show it."""
    return new if old is None else with_timing(new, old.compute_s, old.wait_s, old.restart)


def with_timing(new: NodeSummary, compute_s: Optional[float], wait_s: Optional[float], restart: int) -> NodeSummary:
    """`new`, a node with no ranks left, with the timing they last had (none: as it is)."""
    if new.ranks or compute_s is None:
        return new
    return replace(new, compute_s=compute_s, wait_s=wait_s, restart=restart)


def summarize(records: list[NodeLiveness], now: float) -> list[NodeSummary]:
    """Node records as summaries, each rank as alive as its record vouches (`vouched`); a node whose ranks
    have exited with the timing they last had (NodeLiveness.kept)."""
    return [with_kept(NodeSummary.of(r.node, r.written, vouched(r, now), now), r.kept) for r in records]


def with_kept(summary: NodeSummary, kept: Optional[dict[str, Any]]) -> NodeSummary:
    """with_timing from a record's `kept` (NodeLiveness), as written by Publisher.tick."""
    try:
        if not kept or not isinstance(kept.get("compute_s"), (int, float)):
            return summary
        return with_timing(summary, float(kept["compute_s"]), float(kept.get("wait_s") or 0.0),
                           int(kept.get("restart") or 0))
    except (TypeError, ValueError):  # a record not of our making
        return summary


class Leader:
    """The node of rank 0: reads the node records every LEADER_READ_S and writes the JobView on a change
    or every PUBLISH_S (its own node is in the view, from memory: it writes no node record)."""

    def __init__(self, run_dir: Path, node: str) -> None:
        self.run_dir, self.node = run_dir, node
        self.publisher = Publisher(run_dir, node)
        self.publisher.path = RunDir(run_dir).job_liveness_file
        self.others: list[NodeLiveness] = []
        self.last_read = float("-inf")
        self.last: dict[str, NodeSummary] = {}  # each node's summary in the view written last

    def tick(self, beats: list[RankBeat], now: float) -> bool:
        mine = NodeSummary.of(self.node, now, beats, now)
        others = summarize(self.others, now)
        # every START_PUBLISH_S while the job starts (a node not yet stepping and timed: their records come as
        # often), then every LEADER_READ_S; never every tick of the watchdog (4 a second)
        settled = bool(others) and all(n.settled() for n in [mine, *others])
        if now - self.last_read >= (LEADER_READ_S if settled else START_PUBLISH_S):
            self.others = [r for r in read_nodes(self.run_dir) if r.node != self.node]
            self.last_read = now
            others = summarize(self.others, now)
        nodes = [keep_timing(n, self.last.get(n.node)) for n in [mine, *others]]
        self.last = {n.node: n for n in nodes}
        key = tuple(n.key() for n in nodes)
        ranks = frozenset(b.pid for b in beats) | frozenset((n.node, n.restart) for n in nodes)
        if not self.publisher.due(key, ranks, all(n.settled() for n in nodes), now):
            return False
        if not self.publisher.write(json.dumps(asdict(JobView(now, self.node, nodes)))):
            return False
        self.publisher.wrote(key, now)
        return True


def read_view(run_dir: Path, now: float, fresh: bool = True) -> Optional[JobView]:
    """The leader's JobView; with `fresh`, only while it is fresh (else None: no leader now)."""
    text = read_in_place(RunDir(run_dir).job_liveness_file)
    try:
        d = json.loads(text) if text is not None else None
        if not isinstance(d, dict) or (fresh and not 0 <= now - float(d["written"]) <= FRESH_S):
            return None
        nodes = [NodeSummary.from_dict(n) for n in d["nodes"]]
        return JobView(float(d["written"]), str(d["leader"]), [n for n in nodes if n is not None])
    except (ValueError, KeyError, TypeError):
        return None


def job_nodes(run_dir: Path, now: float, thorough: bool = False) -> list[NodeSummary]:
    """Every node's summary, newest word first: the leader's view when fresh (one read); else the last view
    and the node records together (a job starting, a leader gone, a job that ended: `status` and `compare`
    of a finished run still show its last stragglers). `thorough` (a command a user waits on, not a
    watchdog's tick): while the view is not settled (a job starting), the node records too, which are up to
    a leader's read fresher. A summary's `written` says how old it is."""
    view = read_view(run_dir, now, fresh=False)
    fresh = view is not None and 0 <= now - view.written <= FRESH_S
    if fresh and not (thorough and not all(n.settled() for n in view.nodes)):
        age = now - view.written  # as of now: a fresh view vouches for its ranks as a node record does
        return [replace(n, silent=[replace(b, alive=b.alive + age) for b in n.silent],
                        laggard=replace(n.laggard, alive=n.laggard.alive + age) if n.laggard else None)
                for n in view.nodes]
    nodes = {n.node: n for n in (view.nodes if view else [])}
    for n in summarize(read_nodes(run_dir), now):
        if n.node not in nodes or n.written > nodes[n.node].written:
            nodes[n.node] = keep_timing(n, nodes.get(n.node))
    return sorted(nodes.values(), key=lambda n: n.node)


def waiting_spares(run_dir: Path, launched: Any) -> list[str]:
    """The nodes of this launch waiting as hot spares: started (the timeline's node_start since the launch), not
    ended, not in the newest attempt's world, and not trained since they last started. A node whose ranks died
    keeps its stale node record, and rank 0's node, which writes the job view instead, keeps its entry there:
    neither waits, unless the node started again after that record or entry was written (a container
    restarted by its runtime, which then waits as a spare). Both times are the node's own clock. None before this
    launch's first world: every node is still waiting then, spare or not. One read of the timeline, the world
    record and the view, and one node record per candidate."""
    since = float(launched) if isinstance(launched, (int, float)) else 0.0
    world = runs.read_world(run_dir)
    if not (world and world.time >= since):
        return []
    started: dict[str, float] = {}
    for e in events.read_timeline(run_dir)[0]:
        node, t = e.get("node"), float(e["time"])
        if t < since or not isinstance(node, str):
            continue
        if e["event"] == "node_start":
            started[node] = t
        elif e["event"] == "node_end":
            started.pop(node, None)
    view = read_view(run_dir, 0.0, fresh=False)
    in_view = {n.node: n.written for n in (view.nodes if view else [])}
    return sorted(n for n, t in started.items() if n not in world.nodes and not trained_since(run_dir, n, t, in_view))


def trained_since(run_dir: Path, node: str, started: float, in_view: dict[str, float]) -> bool:
    """Whether `node` had ranks after it `started`: its node record, or else its job-view entry, written since.
    A record that cannot be read counts as trained (never name a spare on a guess)."""
    path = RunDir(run_dir).node_liveness_file(node)
    if path.exists():
        record = read_node(path)
        return record is None or record.written >= started
    return node in in_view and in_view[node] >= started
