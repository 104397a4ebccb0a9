"""The one interface every backend implements, modelled on TorchX's `Scheduler`.

    dryrun(plan, cfg) -> DryRun         the exact request, as data, plus the text `dry_run=true` prints
    submit(dryrun)    -> Submitted      submits exactly that request; records it (runs.record_launch)
    submit_group(...) -> [Submitted]    several requests of one shape (`group_key`) as one submission
                                        (`group_text`: that submission, as a sweep's dry run shows it)
    describe(run)     -> JobStatus      the backend's own word on the job, mapped to a common state
    log_iter(run, follow, where=...)    the job's log lines that a LogFilter keeps (node, rank, attempt, text,
                                        tail); with follow, until the job has ended
    cancel(run)       -> str            stop it (the ranks checkpoint first where the backend allows)

`run` is a `Run`: the run dir plus its newest launch record, which is all a backend needs to find its
job again (the run dir's launch records are the journal; `fsdp-jobs list` reads the run dirs). The CLI and
ctl know no backend by name: fsdp_jobs/cli/launcher.py's `get(name)` imports the module the registry
(fsdp_jobs/planning/backends.py) names for it and hands back its BACKEND, and they use this interface.
A new backend is one package, launchers/<name>/ (config.py + backend.py), and one line in
fsdp_jobs/planning/backends.py (fsdp_jobs/ARCHITECTURE.md, "Adding a backend").
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, Iterator, Optional, Protocol, TYPE_CHECKING, TypeVar

from fsdp_jobs.rundir import logs
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.rundir import runs
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
# the vocabulary the CLI reads (fsdp_jobs/rundir/status.py); backends import it from here
from fsdp_jobs.rundir.status import JobState, JobStatus, Run, Submitted, state_from_training

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

__all__ = ["Backend", "DryRun", "LogFilter", "Request", "JobState", "JobStatus", "Run", "Submitted", "state_from_training"]


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


def request_scale(run: Run, nodes: int) -> None:
    """Hand `fsdp-jobs scale` to a launcher that starts the new nodes itself (cluster=local's launcher,
    cluster=docker's supervisor): only once the ranks train (launchers/supervisor.py: why_not_grow)."""
    training = runs.read_state(run.run_dir).status or None
    if training != "running":
        raise UserError("RUN", run.run_dir.name, f"its ranks are not training ({RunDir(run.run_dir).state_file.name}: {training or 'none'}); "
                                                 "scale a job once it trains")
    runs.request_scale(run.run_dir, nodes)


class Backend(abc.ABC, Generic[R]):
    name = ""
    # the faults `chaos RUN marathon` deals (launchers/chaos/marathon.py); a backend with nodes of its own adds kill-node
    marathon_kinds: tuple[str, ...] = ("kill-rank", "hang-rank", "slow-node", "corrupt-checkpoint")

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

    def scale(self, run: Run, nodes: int) -> str:
        """Grow the running job to `nodes` (at most its cluster.max_nodes; fsdp_jobs/cli/ctl.py checked that):
        start the new nodes, which join its rendezvous; the ranks checkpoint and go on at the new size."""
        raise UserError("scale", self.name, f"the {self.name} backend cannot grow a running job; cluster=local, "
                                            "cluster=docker, cluster=slurm and kind=pytorchjob on Kubernetes can "
                                            "(resubmit the "
                                            "same name with nodes=N: it resumes from its newest checkpoint at the "
                                            "new size)")

    def chaos(self, run: Run, action: str, node: int, rate: str = "100mbit") -> str:
        """Failure injection for testing resilience. kill-rank R, hang-rank R, slow-node N and resume act on the rank
        processes this machine can see (launchers/chaos/inject.py); kill-node (it comes back) and stop-node (gone
        for good) are a backend's own (cluster=docker has them)."""
        from fsdp_jobs.launchers.chaos import inject

        try:
            if action == "kill-rank":
                return inject.kill_rank(run.run_dir, node)
            if action == "hang-rank":
                return inject.hang_rank(run.run_dir, node)
            if action == "slow-node":
                return inject.slow_node(run.run_dir, inject.node_name(run.run_dir, node))
            if action == "slow-link":
                return inject.slow_link(run.run_dir, inject.node_name(run.run_dir, node), rate)
            if action == "cut-node":
                return inject.cut_node(run.run_dir, inject.node_name(run.run_dir, node))
            if action == "resume":
                return inject.resume(run.run_dir)
        except LookupError as e:
            raise UserError("chaos", action, str(e)) from None
        raise UserError("chaos", action, f"not supported by the {self.name} backend (cluster=docker has it)")

    def marathon(self, run: Run, faults: int, seed: int, kinds: tuple[str, ...] = (),
                 margin: Optional[int] = None) -> int:
        """`chaos RUN marathon`: a seeded schedule of mixed faults into the running job (launchers/chaos/marathon.py)."""
        from fsdp_jobs.launchers.chaos import marathon

        return marathon.run_marathon(self, run, faults, seed, only=kinds, margin=margin)

    def stacks(self, run: Run, node: Optional[str], ranks: Optional[set[int]]) -> tuple[Path, list[str]]:
        """`fsdp-jobs stacks`: the Python stacks of every rank (of `node`: an index or a name; of `ranks`) into one
        file of the run dir (launchers/stacks.py); its path and one header line a rank ([] when none ran)."""
        import time

        from fsdp_jobs.launchers.chaos.inject import node_name
        from fsdp_jobs.launchers import stacks

        where = (node_name(run.run_dir, int(node)) if node.isdigit() else node) if node is not None else None
        when = time.time()
        parts = RunDir(run.run_dir).stacks_parts_dir(when)
        self.dump_stacks(run, parts, where, ranks)
        path, heads = stacks.gather(run.run_dir, parts, when)
        if not heads:
            path.unlink(missing_ok=True)
        return path, heads

    def dump_stacks(self, run: Run, parts: Path, node: Optional[str], ranks: Optional[set[int]]) -> None:
        """Each rank's stacks into `parts`, a file a rank. Here: the ranks this machine's /proc shows
        (cluster=local; Docker's containers are this machine's processes); a backend whose ranks run elsewhere
        runs launchers/stacks.py there."""
        from fsdp_jobs.launchers import stacks

        stacks.dump_here(run.run_dir, parts, ranks, node)

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
