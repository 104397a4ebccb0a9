"""One dataclass per run-dir record, each carrying its schema version `v`.

Every writer builds the record (a misspelt field fails at once, not in a reader weeks later) and writes
`to_json()`; every reader in fsdp_jobs/rundir parses through `from_dict`, which returns None for anything
that is not a record of ours (not an object, a required field missing, a field of the wrong type) and
never raises: run dirs outlive versions, are shared by processes that die mid-write, and can be edited by
anyone who can write them. A record from a newer version (v=2, keys this one does not know) is still
read: unknown keys go to `extra` where a record has one (and are written back), else they are dropped.

The liveness records (RankBeat, NodeLiveness, JobView) live in liveness.py, in the same style.
"""

from __future__ import annotations

import functools
import time
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Optional, TypeVar

SCHEMA = 1

R = TypeVar("R", bound="Record")


@functools.lru_cache(maxsize=None)
def _check(kind: str) -> Callable[[Any], bool]:
    """Does a value fit the annotation `kind` (the string form: `from __future__ import annotations`)? The
    test, made once per annotation: read_metrics and the goodput
    timeline check every field of up to a million rows."""
    if kind.startswith("Optional[") and kind.endswith("]"):
        inner = _check(kind[len("Optional["):-1])
        return lambda value: value is None or inner(value)
    if kind == "bool":
        return lambda value: isinstance(value, bool)
    if kind in ("int", "float"):  # a bool is an int to Python, never to a record; NaN and inf are floats
        types = int if kind == "int" else (int, float)
        return lambda value: isinstance(value, types) and not isinstance(value, bool)
    if kind == "str":
        return lambda value: isinstance(value, str)
    if kind.startswith("list"):
        strings = kind == "list[str]"
        return lambda value: isinstance(value, list) and (not strings or all(isinstance(x, str) for x in value))
    if kind.startswith("dict"):
        return lambda value: isinstance(value, dict)
    return lambda value: kind == "Any"


# the exact types a JSON decoder gives that each annotation accepts: one set lookup per value instead of a
# call of its test (read_metrics and compare check ~10 fields of every row they read; bench scale)
_EXACT: dict[str, frozenset[type]] = {"bool": frozenset({bool}), "int": frozenset({int}),
                                      "float": frozenset({int, float}), "str": frozenset({str}),
                                      "dict[str, Any]": frozenset({dict}), "Any": frozenset()}


def _exact(kind: str) -> frozenset[type]:
    if kind.startswith("Optional[") and kind.endswith("]"):
        return _exact(kind[len("Optional["):-1]) | {type(None)}
    return _EXACT.get(kind, frozenset())


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> dict[str, tuple[frozenset[type], Callable[[Any], bool]]]:
    """{name: (the exact types its annotation accepts at once, the test of anything else)} of a record's
    fields ("extra" included), once per class."""
    return {f.name: (_exact(str(f.type)), _check(str(f.type))) for f in fields(cls)}


@functools.lru_cache(maxsize=None)
def _required(cls: type) -> frozenset[str]:
    """The fields a record cannot be made without (no default), once per class."""
    return frozenset(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)


class Record:
    """What every record shares: the tolerant read and the JSON object written (fields that are None are
    left out: readers ask with .get; `extra`'s keys are written at the top level)."""

    v: int
    extra: dict[str, Any]

    @classmethod
    def from_dict(cls: type[R], d: Any) -> Optional[R]:
        """The record, or None for anything that is not one of ours (never raises)."""
        values = cls._values(d)
        if values is None:
            return None
        try:
            return cls(**values)
        except TypeError:  # a required field is missing
            return None

    @classmethod
    def fits(cls, d: Any) -> bool:
        """Whether from_dict would return a record, without making it: the test a reader that keeps the JSON
        objects applies to every row (compare reads 21 metrics rows of each of 1,000 members)."""
        values = cls._values(d)
        return values is not None and _required(cls) <= values.keys()

    @classmethod
    def _values(cls, d: Any) -> Optional[dict[str, Any]]:
        """The keyword arguments of the record `d` is (unknown keys in "extra" where the record has one), or
        None when `d` is no object or a field has the wrong type."""
        if not isinstance(d, dict):
            return None
        known, values, rest = _fields(cls), {}, {}
        for k, value in d.items():
            field_types = known.get(k)
            if field_types is None or k == "extra":  # a key of a newer version (or a record's own "extra")
                rest[k] = value
            elif type(value) in field_types[0] or field_types[1](value):
                values[k] = value
            else:
                return None
        if "extra" in known:
            values["extra"] = rest
        return values

    def __getitem__(self, key: str) -> Any:
        """A field, or a key of `extra`: code that read these records as dicts keeps reading them so."""
        if key != "extra" and key in self.__dict__:
            return self.__dict__[key]
        extra = getattr(self, "extra", None) or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def to_json(self) -> dict[str, Any]:
        """The JSON object written: by hand, not dataclasses.asdict (a deep copy; metrics rows are per step)."""
        out = {k: value for k, value in self.__dict__.items() if value is not None and k != "extra"}
        out.update(getattr(self, "extra", None) or {})
        return out


@dataclass
class StateRecord(Record):
    """RunDir.state_file: the leader rank's (rank 0's) training state: running / completed / preempted / failed
    (+ step, reason; a preflight's verdict: stage, bad_nodes), written by rank 0 alone (the trainer, its
    preflight, fsdp_jobs.job, the user-code shim). What other roles know has a record of its own (NodeVerdict,
    LauncherEnd, CancelRequest); a run dir from before them may hold their words here (cancelled, requeued-*,
    a node's failed), which fsdp_jobs/rundir/outcome.py still reads."""

    status: str
    step: Optional[int] = None
    reason: Optional[str] = None
    checkpoint: Optional[str] = None  # the final checkpoint of a completed or preempted run
    resumed_from: Optional[str] = None
    stage: Optional[str] = None  # "preflight": the preflight decided this status
    bad_nodes: Optional[list[str]] = None  # the nodes a failed preflight named
    exclude: Optional[list[str]] = None  # the nodes a scheduler's requeue excludes
    time: float = field(default_factory=time.time)
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # `step` is written even when unknown (null), as before: tools read state["step"]
        return {"time": self.time, **super().to_json(), "step": self.step}


@dataclass
class NodeVerdict(Record):
    """RunDir.node_verdict_file: what a node decided about the job, written by a node alone: its wrapper
    (failed: a failure that repeats, the hang restarts used) or a scheduler's in-job node task (failed,
    requeued-excluding, requeued-after-crash; completed: a script that exited 0, which records nothing itself).
    The newest verdict replaces the one before: the first node to stop writes the reason, later ones keep it."""

    status: str
    node: str = ""
    reason: Optional[str] = None
    step: Optional[int] = None
    stage: Optional[str] = None  # "preflight": a preflight's verdict, carried on (its bad_nodes too)
    bad_nodes: Optional[list[str]] = None
    exclude: Optional[list[str]] = None  # the nodes a scheduler's requeue excludes
    time: float = field(default_factory=time.time)
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LauncherEnd(Record):
    """RunDir.launcher_end_file: how a launch's nodes ended, written by the supervisor alone (the launcher of
    local agents, a container engine's detached supervisor: launchers/supervisor.py) once every node has:
    each node's exit code, and when a stop from outside (a signal to the launcher, `fsdp-jobs cancel`) reached
    it (None: none did)."""

    nodes: dict[str, Any]  # node name -> its exit code
    stopped: Optional[float] = None
    time: float = field(default_factory=time.time)
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CancelRequest(Record):
    """RunDir.cancel_file: `fsdp-jobs cancel` was asked (the CLI alone writes it: a backend's `cancel`),
    at `time`. An older run dir holds a line of text there instead: its file's time is the request's."""

    time: float
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LaunchRecord(Record):
    """One line of RunDir.launches_file per launch or submission. The fields every backend writes are
    typed; a backend's own (a folder, a code snapshot, a namespace, a compose command...)
    are in `extra`, written at the top level, so readers keep `launch["folder"]`."""

    backend: str
    job_id: str
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    time: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))
    unix: Optional[float] = field(default_factory=lambda: round(time.time(), 3))  # goodput's queued time begins here
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # time and unix first, as the launch records always began
        out = {"time": self.time, "unix": self.unix}
        out.update(super().to_json())
        return out


@dataclass
class GoodputEvent(Record):
    """One line of RunDir.goodput_file: {event, time} + the event's own fields (fsdp_jobs/rundir/goodput.py's
    docstring names them), in `extra`; `pid` for a rank's events."""

    event: str
    time: float
    pid: Optional[int] = None
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, **super().to_json()}


@dataclass
class MetricsRow(Record):
    """One line of RunDir.metrics_file per step (rank 0; fsdp_jobs/runtime/trainer.py MetricsWindow.flush).
    A new metric is a field here and its value there. A user's script (fsdp_jobs.job.log) logs what it
    has: its own names are in `extra`, written right after `step` in the order logged (the progress line
    shows them in that order)."""

    step: int
    loss: Optional[float] = None
    lr: Optional[float] = None
    grad_norm: Optional[float] = None
    tokens_per_s: Optional[float] = None
    mfu: Optional[float] = None
    peak_mem_gb: Optional[float] = None
    step_time_s: Optional[float] = None
    sample_start: Optional[int] = None
    world_size: Optional[int] = None
    restart: Optional[int] = None
    attempt: Optional[str] = None
    time: Optional[float] = None
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        out.update(self.extra)
        for k, value in self.__dict__.items():
            if value is not None and k != "extra" and k != "step":
                out[k] = value
        return out


@dataclass
class PreflightRecord(Record):
    """RunDir.preflight_file: the newest preflight's verdict (fsdp_jobs/runtime/preflight_verdict.py verdict)
    and every rank's measures (fsdp_jobs/runtime/preflight.py)."""

    ok: bool
    nodes: dict[str, Any]
    bad: list[str]
    notes: list[str] = field(default_factory=list)
    slow_ratio: Optional[float] = None
    checkpoint_gb: Optional[float] = None
    medians: dict[str, Any] = field(default_factory=dict)
    ranks: Optional[list[Any]] = None
    time: Optional[float] = None
    seconds: Optional[float] = None
    rechecked: Optional[list[str]] = None  # the nodes slow in a first round, measured again
    first_round: Optional[dict[str, Any]] = None
    replaced: Optional[list[str]] = None  # the named nodes hot spares take the place of (cluster.spare_nodes)
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class HangRecord(Record):
    """One line of RunDir.hangs_file per node per hang (launchers/node/watchdog.py on_hang)."""

    time: float
    node: str
    first_stopped: dict[str, Any]  # rank, node, pid, step, state, frame: the rank that stopped first
    stalled_s: Optional[float] = None
    timeout_s: Optional[float] = None
    step: Optional[int] = None
    dir: Optional[str] = None  # this node's stacks
    hang: Optional[int] = None  # this node's count
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class FailureRecord(Record):
    """One line of RunDir.failures_file per failed rank (fsdp_jobs/rundir/failures.py)."""

    attempt: str
    error: str
    time: float = 0.0
    rank: Optional[int] = None
    step: Optional[int] = None
    where: str = ""
    exit_code: Optional[int] = None  # the rank's exit status (sys.exit's code; 1 for an exception); older: none
    round: Optional[str] = None  # the rendezvous round its agent joined (failures.ROUND_ENV); older: none
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "step": self.step}  # null: it failed at start-up


@dataclass
class DataIdentity(Record):
    """RunDir.data_identity_file: the token file a run was last submitted with (the CLI), which a resume at a
    checkpoint's data position compares with the file it would now read (fsdp_jobs/rundir/data_identity.py)."""

    path: str
    size: int
    mtime_ns: int
    blocks_sha256: str  # SHA-256 of its first, middle and last MiB (data_identity.py take: why these)
    time: float = field(default_factory=time.time)
    v: int = SCHEMA


@dataclass
class ScaleRequest(Record):
    """RunDir.scale_request_file: `fsdp-jobs scale RUN nodes=N` for a launcher that starts nodes itself."""

    nodes: int
    v: int = SCHEMA


@dataclass
class RankRecord(Record):
    """RunDir.rank_file(rank): who this rank is, for tools (launchers/chaos/inject.py, bench) and tests that kill
    ranks (fsdp_jobs/runtime/trainer.py write_rank_file)."""

    rank: int
    pid: int
    node: str = ""
    host: str = ""
    uid: Optional[int] = None
    node_rank: Optional[int] = None
    restart: Optional[int] = None
    world_size: Optional[int] = None
    time: Optional[float] = None
    replica_group: Optional[int] = None  # fault_tolerance=replica only
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorldRecord(Record):
    """RunDir.world_file: the nodes of the job's newest attempt, written by rank 0 once per attempt
    (fsdp_jobs/runtime/trainer.py), so that the next attempt names the nodes that left it or joined."""

    restart: int
    nodes: list[str]
    time: float
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplacedNodes(Record):
    """One line of RunDir.replaced_nodes_file per preflight (fsdp_jobs/runtime/preflight.py) or replica agreement
    check (fsdp_jobs/runtime/sdc.py) that named nodes of a job with hot spares waiting: those nodes' agents leave the rendezvous instead of restarting
    (launchers/node/agent.py), and the next round takes spares in their place."""

    time: float
    nodes: list[str]
    reason: str
    restart: Optional[int] = None  # the job's attempt whose preflight named them
    named_by: str = "the preflight"  # or "a replica agreement check", "a step recheck" (fsdp_jobs/runtime/sdc.py)
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChaosIncident(Record):
    """One line of RunDir.chaos_incidents_file per fault a chaos marathon injected (launchers/chaos/marathon.py):
    when (wall clock and the job's step), when the job first recorded it and how, when it stepped past
    that step again, and the steps it redid. None = did not happen (not detected, not recovered)."""

    n: int
    kind: str
    target: str
    injected_at: float
    step: Optional[int] = None
    detected_s: Optional[float] = None
    recovered_s: Optional[float] = None
    steps_lost: Optional[int] = None
    evidence: str = ""
    source: Optional[str] = None  # where the restart took the state from: the "loaded" timeline event's
    v: int = SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)


ALL = (StateRecord, NodeVerdict, LauncherEnd, CancelRequest, LaunchRecord, GoodputEvent, MetricsRow, PreflightRecord,
       HangRecord, FailureRecord, ScaleRequest, RankRecord, WorldRecord, ReplacedNodes, ChaosIncident)
