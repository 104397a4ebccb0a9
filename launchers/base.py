"""The one interface every backend implements, modelled on TorchX's `Scheduler`.

    dryrun(plan, cfg) -> DryRun         the exact request, as data, plus the text `dry_run=true` prints
    submit(dryrun)    -> Submitted      submits exactly that request; records it (runs.record_launch)
    submit_group(...) -> [Submitted]    several requests of one shape (`group_key`) as one submission
                                        (`group_text`: that submission, as a sweep's dry run shows it)
    describe(run)     -> JobStatus      the backend's own word on the job, mapped to a common state
    log_iter(run, follow)               the job's log lines; with follow, until the job has ended
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Iterator, Optional, Protocol, TYPE_CHECKING, TypeVar

from fsdp_jobs.rundir import runs
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
# the vocabulary the CLI reads (fsdp_jobs/rundir/status.py); backends import it from here
from fsdp_jobs.rundir.status import JobState, JobStatus, Run, Submitted, state_from_training

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

__all__ = ["Backend", "DryRun", "Request", "JobState", "JobStatus", "Run", "Submitted", "state_from_training"]


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
    # the faults `chaos RUN marathon` deals (launchers/marathon.py); a backend with nodes of its own adds kill-node
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
        processes this machine can see (launchers/chaos.py); kill-node (it comes back) and stop-node (gone
        for good) are a backend's own (cluster=docker has them)."""
        from launchers import chaos

        try:
            if action == "kill-rank":
                return chaos.kill_rank(run.run_dir, node)
            if action == "hang-rank":
                return chaos.hang_rank(run.run_dir, node)
            if action == "slow-node":
                return chaos.slow_node(run.run_dir, chaos.node_name(run.run_dir, node))
            if action == "slow-link":
                return chaos.slow_link(run.run_dir, chaos.node_name(run.run_dir, node), rate)
            if action == "cut-node":
                return chaos.cut_node(run.run_dir, chaos.node_name(run.run_dir, node))
            if action == "resume":
                return chaos.resume(run.run_dir)
        except LookupError as e:
            raise UserError("chaos", action, str(e)) from None
        raise UserError("chaos", action, f"not supported by the {self.name} backend (cluster=docker has it)")

    def marathon(self, run: Run, faults: int, seed: int) -> int:
        """`chaos RUN marathon`: a seeded schedule of mixed faults into the running job (launchers/marathon.py)."""
        from launchers import marathon

        return marathon.run_marathon(self, run, faults, seed)

    def log_files(self, run: Run) -> list[Path]:
        """Files holding the job's log; the default `log_iter` tails them."""
        return [RunDir(run.run_dir).launcher_log]

    def log_iter(self, run: Run, follow: bool = False, poll_s: float = 1.0) -> Iterator[str]:
        """Every line of the log files (prefixed with the file's name when there are several); with
        `follow`, keep reading until the job has ended and nothing more was written."""
        offsets: dict[Path, int] = {}
        while True:
            ended = follow and self.describe(run).state.terminal  # asked before the last read
            files = self.log_files(run)
            for f in files:
                try:
                    with open(f, "rb") as fh:
                        fh.seek(offsets.get(f, 0))
                        data = fh.read()
                except OSError:
                    continue
                cut = data.rfind(b"\n") + 1 if follow and not ended else len(data)  # whole lines only
                offsets[f] = offsets.get(f, 0) + cut
                prefix = f"[{f.name}] " if len(files) > 1 else ""
                for line in data[:cut].decode(errors="replace").splitlines():
                    yield prefix + line
            if not follow or ended:
                return
            time.sleep(poll_s)
