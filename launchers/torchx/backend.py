"""cluster=torchx: the job as a TorchX app. `torchx run -s SCHEDULER fsdp_jobs.job KEY=VALUE...` plans it and
writes its run dir (launchers/torchx/submission.py, the CLI's own path) and TorchX submits one role whose
replicas are the nodes (launchers/torchx/node.py). This backend is what `fsdp-jobs status|list|cancel` ask
about such a run: TorchX's scheduler where it can say (SLURM: sacct), else what the run dir and this
machine's processes say (TorchX's local schedulers keep their apps in the memory of the `torchx run`
process, which nothing else can ask). The CLI itself does not submit it (`check` says how to).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir import runs
from fsdp_jobs.launchers.base import Backend, DryRun, JobState, JobStatus, LogFilter, Run, Submitted, outcome
from fsdp_jobs.launchers.capabilities import Faults, Stacks
from fsdp_jobs.launchers.common import NODE_WRAPPER, rank_entry, runtime_env, user_code_dir
from fsdp_jobs.launchers.torchx import node
from fsdp_jobs.launchers.torchx.config import NAME

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

COMPONENT = "fsdp_jobs.job"  # the component's name for `torchx run` (pyproject.toml's torchx.components entry)
NODE_MODULE = node.__name__  # what each replica runs (its module path moves with the package)
# TorchX's macros, which it fills in per replica (torchx.specs.macros); kept here as text so that the
# dry run and the planning path never import torchx
MACROS = ("${replica_id}", "${rank0_env}", "${app_id}")
# TorchX's app states by name (torchx.specs.AppState), in this project's words
STATES = {"UNSUBMITTED": JobState.PENDING, "SUBMITTED": JobState.PENDING, "PENDING": JobState.PENDING,
          "RUNNING": JobState.RUNNING, "SUCCEEDED": JobState.SUCCEEDED, "FAILED": JobState.FAILED,
          "CANCELLED": JobState.CANCELLED}


@dataclass
class Resources:
    """The component's own arguments: what a TorchX scheduler allocates per replica, and how it starts one."""

    image: str = ""  # a container scheduler's image (fsdp-jobs installed); local_cwd and SLURM ignore it
    python: str = ""  # the interpreter on the nodes; "" = the one running `torchx run` (a shared filesystem)
    cpu: int = 2
    memMB: int = 0  # 0 = the scheduler's default
    h: Optional[str] = None  # a TorchX named resource, which takes precedence over cpu and memMB
    max_retries: int = 0  # the scheduler's retries of the whole app (torchrun restarts ranks within one)


@dataclass
class TorchXRequest:
    name: str
    run_dir: str
    nodes: int
    min_nodes: int
    gpus: int  # per replica: the plan's ranks per node on a GPU job, else 0
    user_dir: Optional[str]  # where the component copies the user's script/package, or None
    node_argv: list[str]  # the node wrapper's arguments, with rank 0's host and the port as placeholders
    node_env: dict[str, str]
    resources: Resources = field(default_factory=Resources)

    def role_args(self) -> list[str]:
        return ["-m", NODE_MODULE, self.run_dir, *MACROS, *([self.user_dir] if self.user_dir else [])]

    def app(self) -> Any:
        """The torchx.specs.AppDef `torchx run` submits: one role, a replica a node."""
        from torchx import specs

        r = self.resources
        return specs.AppDef(name=self.name, roles=[specs.Role(
            name="node", image=r.image, entrypoint=r.python or sys.executable, args=self.role_args(),
            num_replicas=self.nodes, min_replicas=self.min_nodes if self.min_nodes < self.nodes else None,
            resource=specs.resource(cpu=r.cpu, gpu=self.gpus, memMB=r.memMB, h=r.h), max_retries=r.max_retries)])

    def render(self) -> str:
        """The role TorchX submits, then the command each replica builds from it (launchers/torchx/node.py)."""
        r = self.resources
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.node_env.items()))
        at_least = f", at least {self.min_nodes}" if self.min_nodes < self.nodes else ""
        return "\n".join([
            f"# TorchX app {self.name}: `torchx run -s SCHEDULER {COMPONENT} OVERRIDES...` submits one role of "
            f"{self.nodes} replicas{at_least} (cpu {r.cpu}, gpu {self.gpus}, memMB {r.memMB or 'default'}), each:",
            shlex.join([r.python or sys.executable, *self.role_args()]),
            "# which, TorchX's macros filled in, runs on node <replica_id> (rank 0 host: $<rank0_env>; the port: "
            "cluster.rdzv_port, else 20000 + a hash of the app id % 20000):",
            f"{env} {shlex.join([sys.executable, '-m', NODE_WRAPPER, *self.node_argv])}"])


class TorchXBackend(Backend[TorchXRequest]):
    name = NAME

    def __init__(self) -> None:  # the ranks this machine sees (TorchX's local schedulers run them here)
        self.faults, self.stacks = Faults(self), Stacks(self)

    # True in the process of `torchx run`, whose component plans and writes the run (launchers/torchx/submission.py)
    component = False

    def check(self, plan: Plan, cfg: JobConfig) -> None:
        """The CLI does not submit to TorchX: TorchX does, through the component (which refuses a busy run itself:
        asking another backend about the run's newest launch is the CLI's business, not a backend's)."""
        if not self.component:
            raise not_submitted_here()

    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[TorchXRequest]:
        if plan.replicas is not None:
            raise UserError("fault_tolerance", "replica", "needs a lighthouse beside the nodes, which a TorchX role "
                                                          "of nodes does not start; use cluster=local|docker|slurm")
        user = user_code_dir(cfg, Path(plan.run_dir))
        user_dir = str(user) if user else None
        attempt = dataclasses.replace(plan, rendezvous=dataclasses.replace(plan.rendezvous, run_id="<app id>"))
        argv = node.agent_argv(attempt, cfg, "<rank 0 host>", cfg.cluster.rdzv_port or "<port>", user_dir)
        flags = argv[:-len(rank_entry(cfg, plan.run_dir, user_dir))]
        env = node.node_env(cfg, plan.run_dir, "node<replica_id>", user_dir)
        gpus = 0 if cfg.cluster.device == "cpu" else plan.gpus_per_node
        request = TorchXRequest(plan.name, plan.run_dir, plan.nodes, plan.rendezvous.min_nodes, gpus, user_dir, argv, env)
        return DryRun(self.name, plan, cfg, request, agent_args=flags, agent_env=runtime_env(cfg))

    def submit(self, dryrun: DryRun[TorchXRequest]) -> Submitted:
        raise not_submitted_here()

    def describe(self, run: Run) -> JobStatus:
        handle = run.launch.get("app_handle")
        training = runs.read_state(run.run_dir).status or "none recorded"
        if not handle:  # the component's record, written before TorchX submitted the app
            said = outcome(run.run_dir, run.since)
            return JobStatus(said.state, f"{said.state.value} (handed to `torchx run` at {run.launch.get('time')}; no "
                                         "node has started since: still queued, or never submitted, as by `torchx "
                                         f"run --dryrun` or a failed submission; training state: {training})", {}, said)
        reported, why = scheduler_status(handle)
        info = {"app_handle": handle}
        if reported is not None and reported.state.name in STATES:
            said = outcome(run.run_dir, run.since, STATES[reported.state.name])
            return JobStatus(said.state, f"{said.state.value} (TorchX {handle}: {reported.state.name}; training state: "
                                         f"{training})", info, said)
        where = f"pid {run.launch.get('pid')} on {run.launch.get('host')}"
        alive = node0_alive(run)
        if alive:
            return JobStatus(JobState.RUNNING, f"RUNNING (node0 runs as {where}; training state: {training})", info,
                             outcome(run.run_dir, run.since, JobState.RUNNING))
        # its nodes ended (alive False: without an outcome, they failed), or node0 ran where this machine cannot see
        said = outcome(run.run_dir, run.since, JobState.FAILED if alive is False else JobState.UNKNOWN)
        seen = f"node0 ({where}) has exited" if alive is False else f"{why}, and node0 ran on another machine"
        asked = runs.cancel_asked(run.run_dir)
        seen += "; fsdp-jobs cancel was asked" if asked is not None and asked >= (run.since or 0) else ""
        return JobStatus(said.state, f"{said.state.value} ({seen}; training state: {training})", info, said)

    def cancel(self, run: Run) -> str:
        handle = run.launch.get("app_handle")
        if not handle:
            raise UserError("RUN", run.run_dir.name, "no node of it has started: TorchX (or its scheduler) holds it, or "
                                                     "never submitted it; cancel it there (torchx cancel HANDLE)")
        if is_local(handle):
            return stop_torchx_run(run, handle)
        from torchx.runner import get_runner

        try:
            with get_runner() as runner:
                runner.cancel(handle)
        except Exception as e:  # noqa: BLE001  the scheduler's client missing or refusing: one line, nothing recorded
            raise UserError("RUN", run.run_dir.name, f"TorchX could not cancel {handle}: {type(e).__name__}: {e}") from None
        runs.record_cancel(run.run_dir)  # a job stopped before its first step then reads CANCELLED, not FAILED
        return f"asked TorchX to cancel {handle} ({run.run_dir.name}): its scheduler stops the nodes, the ranks checkpoint"

    def log_iter(self, run: Run, follow: bool = False, poll_s: float = 1.0, *,
                 where: Optional[LogFilter] = None,
                 on_quiet: Optional[Callable[[float, JobStatus], None]] = None) -> Iterator[str]:
        handle = run.launch.get("app_handle") or "HANDLE"
        raise UserError("RUN", run.run_dir.name, f"a TorchX app's logs are its scheduler's: torchx log {handle} (local "
                                                 "schedulers: the `torchx run` terminal)")


def not_submitted_here() -> UserError:
    return UserError("cluster", NAME, f"a TorchX app is submitted by TorchX: torchx run -s SCHEDULER {COMPONENT} "
                                      "KEY=VALUE... (README: TorchX); dry_run=true shows what each node runs")


def is_local(handle: str) -> bool:
    """TorchX's local schedulers (local_cwd, local_docker) keep their apps in the `torchx run` process's memory."""
    return handle.split("://", 1)[0].startswith("local")


def scheduler_status(handle: str) -> tuple[Any, str]:
    """TorchX's AppStatus of the app (None when its scheduler cannot say from here), and why not."""
    if is_local(handle):  # a new local scheduler would know nothing, and takes over SIGINT and SIGTERM
        return None, f"TorchX's {handle.split('://', 1)[0]} keeps its apps in the `torchx run` process"
    try:
        from torchx.runner import get_runner

        with get_runner() as runner:
            said = runner.status(handle)
    except Exception as e:  # noqa: BLE001  a scheduler's client missing or failing: the run dir still answers
        return None, f"TorchX could not ask its scheduler about {handle}: {type(e).__name__}: {e}"
    return said, "" if said is not None else f"TorchX's scheduler does not know {handle}"


def same_machine(launch: dict[str, Any]) -> bool:
    return launch.get("host") == socket.gethostname() and launch.get("boot_id") == node.boot_id() != ""


def cmdline(pid: int) -> Optional[list[str]]:
    """A process's arguments on this machine, or None when it is gone (or not ours to read)."""
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return None


def node0_alive(run: Run) -> Optional[bool]:
    """Whether replica 0's process (launchers/torchx/node.py) still runs, when it ran on this machine; None when
    this machine cannot see it. A recycled pid is told apart by its command line (the module and the run dir)."""
    pid = run.launch.get("pid")
    if not isinstance(pid, int) or not same_machine(run.launch):
        return None
    argv = cmdline(pid) or []
    here = os.path.realpath(run.run_dir)
    return NODE_MODULE in argv and any(os.path.realpath(a) == here for a in argv)


def stop_torchx_run(run: Run, handle: str) -> str:
    """A local scheduler's app is the `torchx run` process's: SIGTERM to it (proven by its command line) makes
    TorchX stop the replicas (SIGTERM, then SIGKILL after its 10 s), whose ranks checkpoint first."""
    parent = run.launch.get("parent_pid")
    if node0_alive(run) is not True or not isinstance(parent, int):
        raise UserError("RUN", run.run_dir.name, f"is not running on this machine ({handle}); nothing was signalled")
    argv = cmdline(parent) or []
    if "run" not in argv or not any(os.path.basename(a) == "torchx" or a == "torchx.cli.main" for a in argv):
        raise UserError("RUN", run.run_dir.name, f"its recorded `torchx run` pid {parent} is no longer TorchX's; "
                                                 "nothing was signalled")
    runs.record_cancel(run.run_dir)
    os.kill(parent, signal.SIGTERM)
    return f"asked `torchx run` pid {parent} to stop {handle} ({run.run_dir.name}): the ranks checkpoint first"


BACKEND = TorchXBackend()
