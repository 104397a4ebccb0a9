"""A run's status as one typed object, `RunStatus`, read from its run dir by one function, `read_status`: what
`status`, `list`, `top`, `compare`, the report page and the end-of-job summary show. The words users read are
made from it in one place (fsdp_jobs/cli/status_text.py); nothing here words anything.

The backend's word about the job (its state and its own description: a `JobStatus`) is handed in by the caller,
which asks the backend; this module imports none. Each view reads only the records it shows (`Read`): `list`
leaves out the goodput timeline (32,000 events for 100 attempts of 1,024 nodes); `compare` leaves out the job
record (YAML, for each member of a 1,000-member sweep) unless a member's metrics record holds no step; `top` reads
the metrics record's end and, every few seconds, the goodput timeline."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Mapping, Optional

import yaml

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir import events, failures, goodput, hangs, journal, liveness, replaced, runs, script_progress, stragglers
from fsdp_jobs.rundir.checkpoints import newest_checkpoint
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.outcome import outcome
from fsdp_jobs.rundir.records import StateRecord
from fsdp_jobs.rundir.status import JobState, JobStatus

WINDOW = 20  # steps the throughput figures are averaged over (the newest ones)
TAIL_ROWS = 4 * WINDOW + 1  # the most metrics rows the steady window is looked for in, from the end


class Read(str, enum.Enum):
    """The records a view reads; a view names a set of them (str: a member hashes as fast as its name, and
    `compare` asks its set for each member of a sweep)."""

    LAUNCH = "launch"  # the newest launch record: the backend, the job id, when this launch began
    JOB = "job"  # the job record: a script='s own progress, the hot spares, the straggler threshold
    TRAIN = "train"  # the state record (rank 0's own word)
    REFUSAL = "refusal"  # the journal's newest refused submission of the run, if after this launch
    NEWEST = "newest"  # the newest metrics row
    STEADY = "steady"  # the newest WINDOW steady rows (tokens/s and MFU medians) and the newest row
    FIRST = "first"  # the oldest metrics row
    CHECKPOINT = "checkpoint"  # the newest committed checkpoint
    FAILURE = "failure"  # the first failing rank of the newest failed attempt (a failed job, or no word)
    STRAGGLERS = "stragglers"  # every node's compute per step against the median node's
    HANGS = "hangs"
    GOODPUT = "goodput"  # the whole goodput timeline, accounted
    REPLICAS = "replicas"  # fault_tolerance=replica: the groups in the last step's quorum, the stalls


Reads = AbstractSet[Read]
STATUS: Reads = frozenset(Read) - {Read.STEADY, Read.FIRST}
LIST = STATUS - {Read.GOODPUT}  # a row shows no goodput
REPORT = STATUS
COMPARE = frozenset({Read.STEADY, Read.STRAGGLERS, Read.GOODPUT})
TOP = frozenset({Read.NEWEST})  # and its goodput, re-read every few seconds (fsdp_jobs/cli/top.py)
SUMMARY = frozenset({Read.LAUNCH, Read.JOB, Read.NEWEST, Read.FIRST, Read.CHECKPOINT, Read.FAILURE})


@dataclass(frozen=True)
class ScriptRun:
    """A script= / module= run's own progress (fsdp_jobs/rundir/script_progress.py)."""

    runs: str  # `script train.py`, `module pkg.train`
    progress: script_progress.Progress

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, **self.progress.to_json()}


@dataclass(frozen=True)
class Refusal:
    """A submission of the run refused after its newest launch (the journal's record)."""

    reason: str
    time: float

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))


@dataclass
class RunStatus:
    """What is known of a run: the fields its `reads` read (the others keep their defaults)."""

    run_dir: Path
    reads: Reads
    said: Optional[JobStatus] = None  # the backend's word; None where the view does not ask it
    launch: dict[str, Any] = field(default_factory=dict)
    train: Optional[StateRecord] = None
    refusal: Optional[Refusal] = None
    # the newest and the oldest metrics rows: MetricsRow's JSON objects (the reader keeps only rows that fit it)
    newest: Optional[dict[str, Any]] = None
    first: Optional[dict[str, Any]] = None
    tokens_per_s: Optional[float] = None  # the steady window's median
    mfu: Optional[float] = None  # the steady window's median
    checkpoint: Optional[Path] = None  # the newest: the script's own where it wrote one
    script: Optional[ScriptRun] = None
    failure: Optional[str] = None  # failures.describe of the first failing rank
    spare_nodes: Optional[int] = None
    replaced_nodes: list[str] = field(default_factory=list)
    spares_waiting: Optional[list[str]] = None  # only while the job runs
    stragglers: Optional[dict[str, Any]] = None  # fsdp_jobs/rundir/stragglers.py summary
    hang: Optional[dict[str, Any]] = None  # fsdp_jobs/rundir/hangs.py summary
    goodput: Optional[dict[str, Any]] = None  # fsdp_jobs/rundir/goodput.py of_run
    replicas: Optional[dict[str, Any]] = None

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def state(self) -> JobState:
        return self.said.state if self.said else JobState.UNKNOWN

    @property
    def step(self) -> Optional[int]:
        """The run's step: its newest metrics row's, else what a script= run reports or wrote."""
        if self.newest is not None:
            return self.newest["step"]
        return self.script.progress.step if self.script else None

    @property
    def loss(self) -> Optional[float]:
        """The newest metrics row's loss (a script's may have none)."""
        return self.newest.get("loss") if self.newest is not None else None

    @property
    def effective_pct(self) -> Optional[float]:
        return self.goodput["total"]["effective_pct"] if self.goodput else None

    def to_json(self, detail: str) -> dict[str, Any]:
        """`fsdp-jobs status RUN`: the fields, `detail` (the words, fsdp_jobs/cli/status_text.py) after the state."""
        out: dict[str, Any] = {"run": self.name, "run_dir": str(self.run_dir), "backend": self.launch.get("backend"),
                               "job_id": self.launch.get("job_id"), "state": self.state.value, "detail": detail,
                               **(self.said.info if self.said else {}), "step": self.step,
                               "train": self.train.to_json() if self.train else {}}
        if self.refusal:
            out["last_submission"] = {"refused": self.refusal.reason, "time": self.refusal.when}
        if self.newest is not None:
            out["last_step"] = {k: self.newest.get(k) for k in ("step", "loss", "tokens_per_s", "world_size")}
        out["checkpoint"] = str(self.checkpoint) if self.checkpoint else None
        optional = {"script": self.script.to_json() if self.script else None, "failure": self.failure,
                    "spare_nodes": self.spare_nodes, "replaced_nodes": self.replaced_nodes or None,
                    "spares_waiting": self.spares_waiting, "stragglers": self.stragglers, "hang": self.hang}
        out.update({k: v for k, v in optional.items() if v is not None})
        if Read.GOODPUT in self.reads:
            gp = self.goodput
            out["goodput"] = {**gp["total"], "attempts": len(gp["attempts"])} if gp else None
        if self.replicas:
            out["replicas"] = self.replicas
        return out


def read_status(run_dir: Path, reads: Reads, said: Optional[JobStatus] = None,
                launch: Optional[dict[str, Any]] = None) -> RunStatus:
    """The one reader of a run's status: `reads` says what the view needs, `said` is the backend's word
    (fsdp_jobs/cli/ctl.py asks it), `launch` the newest launch record where the caller read it already. The
    step is the newest metrics row's, else (a script that reports none) its own: the job record is read then."""
    s = RunStatus(run_dir if isinstance(run_dir, Path) else Path(run_dir), reads, said)
    if Read.LAUNCH in reads:
        s.launch = runs.last_launch(s.run_dir) if launch is None else launch
    since = float(s.launch.get("unix") or 0)
    if Read.TRAIN in reads:  # the outcome's view of the leader's record: another role's word where it decided
        judged = said.outcome if said is not None and said.outcome is not None else outcome(s.run_dir, since or None)
        s.train = StateRecord.from_dict(judged.train)
    if Read.REFUSAL in reads:
        s.refusal = newer_refusal(s.run_dir, since)
    _read_metrics(s)
    # a script that reports no step has its own: the job record says what it runs, wherever a view shows the step
    shows_step = s.newest is None and (Read.NEWEST in reads or Read.STEADY in reads)
    job = job_record(s.run_dir) if Read.JOB in reads or shows_step else None
    if Read.CHECKPOINT in reads:
        s.checkpoint = newest_checkpoint(s.run_dir)
    if job is not None:
        _read_job_parts(s, job, since)
    if Read.FAILURE in reads and (said is None or said.state == JobState.FAILED):
        s.failure = failures.cause(s.run_dir, since)
    if Read.STRAGGLERS in reads:  # the slowest node is the same whatever the threshold: `compare` shows only it
        ratio = straggler_threshold(job) if job is not None else stragglers.DEFAULT_RATIO
        s.stragglers = stragglers.of_run(s.run_dir, ratio, thorough=True)
    if Read.HANGS in reads:
        s.hang = hangs.summary(s.run_dir)
    if Read.GOODPUT in reads:
        s.goodput = goodput.of_run(s.run_dir)
    if Read.REPLICAS in reads:
        s.replicas = replica_summary(s.run_dir, s.newest)
    return s


def _read_metrics(s: RunStatus) -> None:
    if Read.STEADY in s.reads:
        tail = steady_tail(s.run_dir)
        s.tokens_per_s, s.mfu = steady_medians(tail)
    elif Read.NEWEST in s.reads or Read.REPLICAS in s.reads:
        tail = runs.read_metrics_tail(s.run_dir, 1)  # the newest row only: a long run's record is 1 M rows
    else:
        tail = []
    s.newest = tail[-1] if tail else None
    if Read.FIRST in s.reads:
        s.first = runs.first_metrics_row(s.run_dir)


def _read_job_parts(s: RunStatus, job: Mapping[str, Any], since: float) -> None:
    """What the job record leads to: the script's own progress (and its newest checkpoint), the hot spares."""
    code = script_progress.user_code(job)
    if code:
        s.script = ScriptRun(code, script_progress.progress(s.run_dir, job))
        newest = s.script.progress.newest
        if newest is not None and Read.CHECKPOINT in s.reads:
            s.checkpoint = newest.path
    spares = (job.get("cluster") or {}).get("spare_nodes") if isinstance(job.get("cluster"), dict) else None
    # cluster.spare_nodes: agents beyond the rendezvous' max_nodes, waiting to replace a node that dies
    if spares and Read.JOB in s.reads:
        s.spare_nodes = spares
        s.replaced_nodes = replaced.nodes_since(s.run_dir, since)  # nodes a preflight named, replaced by spares
        if s.state == JobState.RUNNING:
            s.spares_waiting = liveness.waiting_spares(s.run_dir, s.launch.get("unix"))


def job_record(run_dir: Path) -> dict[str, Any]:
    """The run's job record, or {} where it cannot be read (a status still answers)."""
    try:
        job = runs.load_job(run_dir)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return {}
    return job if isinstance(job, dict) else {}


def straggler_threshold(job: Mapping[str, Any]) -> float:
    """The job's fault.straggler_ratio (the default for a job record that is older or unreadable)."""
    fault = job.get("fault")
    value = fault.get("straggler_ratio") if isinstance(fault, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 1 else stragglers.DEFAULT_RATIO


def newer_refusal(run_dir: Path, since: float) -> Optional[Refusal]:
    """The journal's newest refused submission of the run, when it came after the launch `since`: the state
    is the run's, from that launch, not the outcome of the user's last command."""
    try:
        refused = journal.last_refusal(run_dir.resolve())
    except UserError:  # a damaged journal: a run's status needs none (the journal's own commands say so)
        return None
    if not refused or refused["time"] <= since:
        return None
    return Refusal(str(refused["reason"]), float(refused["time"]))


def replica_summary(run_dir: Path, newest: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """fault_tolerance=replica: how many replica groups the last step had (its metrics line's ranks, over a
    group's), and the steps that waited for a quorum (the goodput timeline's stalls: a group died or joined)."""
    layout = runs.replica_layout(run_dir)
    try:
        groups, per_group = int(layout["groups"]), int(layout["ranks_per_group"])  # type: ignore[index]
    except (ValueError, TypeError, KeyError):
        return None
    last = newest.get("world_size") if newest is not None else None
    stalls = [float(e.get("seconds") or 0) for e in events.read_timeline(run_dir)[0] if e["event"] == "stall"]
    return {"groups": groups, "in_quorum": int(last) // per_group if isinstance(last, int) else None,
            "stalls": len(stalls), "stalled_s": round(sum(stalls), 3)}


def steady_tail(run_dir: Path) -> list[dict[str, Any]]:
    """The newest metrics rows, oldest first, read backwards only until WINDOW of them are steady (the row
    before is of the same attempt), at most TAIL_ROWS: a finished run's WINDOW + 1 rows, not TAIL_ROWS
    (`compare` reads every member of a 1,000-member sweep)."""
    rows: list[dict[str, Any]] = []  # newest first
    steady = 0
    for row in itertools.islice(runs.metrics_newest_first(run_dir), TAIL_ROWS):
        if rows and rows[-1].get("attempt") == row.get("attempt"):
            steady += 1  # rows[-1], the next newer row, is steady: this row is of its attempt
        rows.append(row)
        if steady == WINDOW:
            break
    return rows[::-1]


def steady_medians(metrics: list[dict[str, Any]]) -> tuple[Optional[float], Optional[float]]:
    """Tokens/s and MFU as the median of the newest WINDOW steps, leaving out each attempt's first step
    (start-up and warm-up would drag it down)."""
    steady = [m for prev, m in zip([None] + metrics[:-1], metrics)
              if prev is not None and prev.get("attempt") == m.get("attempt")] or metrics
    recent = steady[-WINDOW:]
    return (_median([m["tokens_per_s"] for m in recent if isinstance(m.get("tokens_per_s"), (int, float))]),
            _median([m["mfu"] for m in recent if isinstance(m.get("mfu"), (int, float))]))


def _median(values: list[float]) -> Optional[float]:
    """statistics.median's value (the mean of the middle two of an even count), None of no values."""
    if not values:
        return None
    values = sorted(values)
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2
