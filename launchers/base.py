"""The one interface every backend implements, modelled on TorchX's `Scheduler`: what a backend IS.

    check(plan, cfg)                    refusals that need the backend, before anything is written
    dryrun(plan, cfg) -> DryRun         the exact request, as data, plus the text `dry_run=true` prints
    submit(dryrun)    -> Submitted      submits exactly that request; records it (runs.record_launch)
    submit_group(...) -> [Submitted]    several requests of one shape (`group_key`) as one submission
                                        (`group_text`: that submission, as a sweep's dry run shows it)
    describe(run)     -> JobStatus      the backend's own word on the job, mapped to a common state
    log_files(run, node) / log_iter(run, follow, where=...)
                                        the job's log lines that a LogFilter keeps (node, rank, attempt, text,
                                        tail); with follow, until the job has ended
    cancel(run)       -> str            stop it (the ranks checkpoint first where the backend allows)
    traits                              what it declares of itself, as data (its config.py's TRAITS)

What a backend MAY do beyond that reaches it through capability objects, None where it has none
(launchers/capabilities.py): `scaler` (fsdp-jobs scale), `faults` (fsdp-jobs chaos, the marathon), `stacks`
(fsdp-jobs stacks). `run` is a `Run`: the run dir plus its newest launch record, which is all a backend needs
to find its job again (the run dir's launch records are the journal; `fsdp-jobs list` reads the run dirs).
The CLI and ctl know no backend by name: fsdp_jobs/cli/launcher.py's `get(name)` imports the module the
registry (fsdp_jobs/planning/backends.py) names for it and hands back its BACKEND, and they use this
interface. A new backend is one package (config.py + backend.py) and one line in the registry, or an entry
point of its own distribution (fsdp_jobs/ARCHITECTURE.md, "Adding a backend").
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, Iterator, Optional, Protocol, TYPE_CHECKING, TypeVar

from fsdp_jobs.launchers.capabilities import Faults, Scaler, Stacks
from fsdp_jobs.planning import backends
from fsdp_jobs.rundir import logs
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.rundir.layout import RunDir
# the vocabulary the CLI reads (fsdp_jobs/rundir/status.py) and the run's outcome every describe() returns
# (fsdp_jobs/rundir/outcome.py); backends import them from here
from fsdp_jobs.rundir.outcome import outcome
from fsdp_jobs.rundir.status import JobState, JobStatus, Run, Submitted

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.cluster_config import BackendTraits
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

__all__ = ["Backend", "DryRun", "Faults", "LogFilter", "Request", "JobState", "JobStatus", "Run", "Scaler", "Stacks",
           "Submitted", "outcome"]


class Request(Protocol):
    """A backend's typed request: a dataclass that `dryrun` returns, `submit` takes, and `render` shows."""

    def render(self) -> str: ...


R = TypeVar("R", bound=Request)


@dataclass
class DryRun(Generic[R]):
    """What `submit` will hand to the backend, exactly; `text` (what `dry_run=true` prints) is rendered
    from that very request, so the dry run cannot show anything but what goes out."""

    backend: str
    plan: Plan
    cfg: JobConfig
    request: R
    # what every node's torchrun agent gets, whatever the backend (one test compares them across backends):
    agent_args: list[str] = field(default_factory=list)  # torchrun flags (endpoint as the backend names it)
    agent_env: dict[str, str] = field(default_factory=dict)  # environment of the agent and its ranks

    @property
    def text(self) -> str:
        return self.request.render()


class Backend(abc.ABC, Generic[R]):
    name = ""  # the registry's name of it (cluster=NAME)
    # what it may do beyond being a backend (launchers/capabilities.py), None where it cannot; its TRAITS say the same
    scaler: Optional[Scaler] = None
    faults: Optional[Faults] = None
    stacks: Optional[Stacks] = None

    @property
    def traits(self) -> BackendTraits:
        return backends.traits(self.name)

    def check(self, plan: Plan, cfg: JobConfig) -> None:
        """Refusals that need the backend (is it reachable? is the run busy?), before anything is written."""

    @abc.abstractmethod
    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[R]:
        ...

    @abc.abstractmethod
    def submit(self, dryrun: DryRun[R]) -> Submitted:
        ...

    def group_key(self, dryrun: DryRun[R]) -> Optional[str]:
        """Requests with the same key can go out as ONE submission (`submit_group`: a SLURM job array);
        None = this request goes out alone. Default: always alone."""
        return None

    def group_text(self, dryruns: list[DryRun[R]]) -> Optional[str]:
        """How `submit_group` submits these together, as a dry run shows it; None = as their own dry runs."""
        return None

    def submit_group(self, dryruns: list[DryRun[R]]) -> list[Submitted]:
        """Submit requests that share a `group_key` (members of a sweep), quietly: the caller reports.
        Default: one after another (an attached backend runs them one at a time)."""
        return [self.submit(d) for d in dryruns]

    @abc.abstractmethod
    def describe(self, run: Run) -> JobStatus:
        ...

    @abc.abstractmethod
    def cancel(self, run: Run) -> str:
        ...

    def log_files(self, run: Run, node: Optional[str] = None) -> list[Path]:
        """Files holding the job's log; the default `log_iter` reads them. With `node` (an index or a name), the
        files that hold that node's lines: a backend that keeps a file per node returns that node's
        (fsdp_jobs/rundir/logs.py `one_node`: one line when it has none). RunDir.launcher_log holds every node's
        lines, each prefixed with its node's name, and is returned whatever the node: log_iter keeps its lines."""
        return [RunDir(run.run_dir).launcher_log]

    def log_iter(self, run: Run, follow: bool = False, poll_s: float = 1.0, *,
                 where: Optional[LogFilter] = None,
                 on_quiet: Optional[Callable[[float, JobStatus], None]] = None) -> Iterator[str]:
        """The lines of the log files that `where` keeps (node, rank, attempt, text, the last N of each file:
        fsdp_jobs/rundir/logs.py), prefixed with the file's name when there are several; with `follow`, keep
        reading until the job has ended and nothing more was written. A tail reads each file from its end.
        `on_quiet(seconds, status)`: while following, no line for logs.QUIET_S (the backend's newest word)."""
        where = where or LogFilter()
        merged = RunDir(run.run_dir).launcher_log
        newest: list[JobStatus] = []  # what `ended` asked the backend last: on_quiet needs no second query

        def files() -> list[Path]:
            return self.log_files(run) if where.node is None else self.log_files(run, node=where.node)

        def ended() -> bool:
            newest[:] = [self.describe(run)]
            return newest[0].state.terminal

        quiet = None if on_quiet is None else (lambda seconds: on_quiet(seconds, newest[0]) if newest else None)
        return logs.read(files, where, lambda f: f == merged, follow=follow, poll_s=poll_s, ended=ended, quiet=quiet)
