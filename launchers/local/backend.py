"""cluster=local: one torchrun agent per simulated node on this machine, c10d rendezvous on loopback.

Each agent is a subprocess in its own session, so Ctrl-C reaches only this launcher, which then
stops exactly the agents it started (SIGTERM, then SIGKILL of their process groups). The supervisor
(launchers/supervisor.py, shared with cluster=docker) merges their output into one node-prefixed
stream, on the terminal and in RunDir.launcher_log, and maps how they ended to an exit status.
"""

from __future__ import annotations

import ctypes
import os
import random
import time
import shlex
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TYPE_CHECKING

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir import outcome as outcomes
from fsdp_jobs.launchers.base import Backend, DryRun, JobState, JobStatus, Run, Submitted
from fsdp_jobs.launchers.capabilities import Faults, Scaler, Stacks, request_scale
from fsdp_jobs.launchers.common import (NODE_WRAPPER, REPLICA_ADDR_ENV, lighthouse_command, python_path,
                              rank_entry, rank_env, replica_env, replica_group, runtime_env, torchrun_args,
                              user_code_dir)
from fsdp_jobs.launchers.local.config import check_machine
from fsdp_jobs.launchers.snapshot import take_user_code
from fsdp_jobs.launchers.supervisor import LogSink, Node, exit_status, stop_signals, supervise, why_not_grow

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

# below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default) and clear of the fixed ports of
# the services this project starts beside jobs (deploy/slurm's MariaDB 23306, the dev apiserver's etcd 23790 and
# 23800) and of torch's own (29400, 29500); two jobs started at once draw the same port one time in 5,400
PORTS = range(24000, 29400)
_given: set[int] = set()  # every port this process handed out: a replica job's groups and lighthouse, a sweep's jobs


def free_port() -> int:
    """A loopback port free now, chosen where no outgoing connection can take it before node0's agent binds
    it, seconds later (pitfall 36), and not one this process gave before; the kernel's pick when the ephemeral
    range leaves no room below it."""
    low = ephemeral_ports()[0]
    candidates = [port for port in PORTS if port < low and port not in _given]
    random.shuffle(candidates)
    for port in candidates[:64]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes outgoing connections' local ports from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def agent_args(plan: Plan, cfg: JobConfig, port: int, group: Optional[int] = None) -> list[str]:
    return torchrun_args(plan, f"127.0.0.1:{port}", cfg.cluster.stop_grace_s, group) + ["--local-addr=127.0.0.1"]


def node_commands(plan: Plan, cfg: JobConfig, ports: list[int], user_dir: Optional[str] = None) -> list[list[str]]:
    """One per node the job may have: `nodes` started at once, then up to cluster.max_nodes for a scale.
    `ports`: the rendezvous port of each node (one job's, or each replica group's)."""
    entry = rank_entry(cfg, plan.run_dir, user_dir)
    groups = [replica_group(i, plan) if plan.replicas else None for i in range(plan.rendezvous.max_nodes)]
    groups += [None] * plan.spare_nodes  # spares: refused with replica groups (planning/validation.py)
    return [[sys.executable, "-m", NODE_WRAPPER, *agent_args(plan, cfg, ports[i], groups[i]), *entry]
            for i in range(agent_count(plan))]


def agent_count(plan: Plan) -> int:
    """Every agent the job may run: up to cluster.max_nodes, plus cluster.spare_nodes hot spares (these are
    beyond max_nodes, so torch's rendezvous keeps them in its redundancy list until a node dies)."""
    return plan.rendezvous.max_nodes + plan.spare_nodes


def rendezvous_ports(plan: Plan, cfg: JobConfig) -> list[int]:
    """Each node's rendezvous port: the job's one, or with fault_tolerance=replica one per replica group
    (each group is a torchrun world of its own; cluster.rdzv_port is then the first group's, and the
    next groups take the ports after it)."""
    if plan.replicas is None:
        port = cfg.cluster.rdzv_port or free_port()  # chosen now, so the dry run shows the real one
        return [port] * agent_count(plan)
    base = cfg.cluster.rdzv_port
    per_group = [base + g if base else free_port() for g in range(plan.replicas.groups)]
    return [per_group[replica_group(i, plan)] for i in range(plan.nodes)]


def lighthouse_agent(plan: Plan, cfg: JobConfig) -> Optional["Agent"]:
    """fault_tolerance=replica: the lighthouse beside the agents, on loopback (launchers/lighthouse.py)."""
    if plan.replicas is None:
        return None
    port = plan.replicas.lighthouse_port or free_port()
    return Agent({"RUST_LOG": "warn"}, lighthouse_command(plan, sys.executable, f"127.0.0.1:{port}"))


def node_gpus(plan: Plan, cfg: JobConfig) -> list[dict[str, str]]:
    """Each simulated node's own GPUs. Every agent numbers its ranks from LOCAL_RANK 0 and rank r binds
    cuda:r, so without this node1's ranks would take node0's GPUs (NCCL: duplicate GPU). Taken in order
    from CUDA_VISIBLE_DEVICES when it is set; a CPU job sets nothing."""
    nodes = agent_count(plan)  # a node a scale adds, and a spare, gets GPUs of its own too
    if cfg.cluster.device == "cpu":
        return [{} for _ in range(nodes)]
    g, need = plan.gpus_per_node, nodes * plan.gpus_per_node
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible is not None else [str(i) for i in range(need)]
    if len(ids) < need:
        raise UserError("cluster.device", cfg.cluster.device,
                        f"{nodes} simulated nodes x {g} GPUs need {need} GPUs, and CUDA_VISIBLE_DEVICES "
                        f"lists {len(ids)}; lower nodes/cluster.max_nodes/gpus_per_node or use cluster.device=cpu")
    return [{"CUDA_VISIBLE_DEVICES": ",".join(ids[i * g:(i + 1) * g])} for i in range(nodes)]


@dataclass
class Agent:
    """One simulated node: its torchrun command and the environment it gets beyond the caller's."""

    env: dict[str, str]
    argv: list[str]


@dataclass
class LocalRequest:
    agents: list[Agent]
    user_dir: Optional[str]  # where submit copies the user's script/package (the commands name it), or None
    spares: list[Agent] = field(default_factory=list)  # started by `fsdp-jobs scale` (cluster.max_nodes)
    lighthouse: Optional[Agent] = None  # fault_tolerance=replica: started first, stopped last
    hot_spares: int = 0  # the last this many of `agents`: cluster.spare_nodes, started with the job

    @property
    def lighthouse_url(self) -> str:
        assert self.lighthouse is not None
        return f"http://{self.lighthouse.argv[self.lighthouse.argv.index('--bind') + 1]}"

    def render(self) -> str:
        """The exact commands `submit` runs, one line per simulated node (and those a scale would add)."""
        lines = []
        if self.lighthouse is not None:
            extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.lighthouse.env.items()))
            lines.append(f"# lighthouse (fault_tolerance=replica)\n{extra} {shlex.join(self.lighthouse.argv)}")
        for i, agent in enumerate(self.agents + self.spares):
            extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(agent.env.items()))
            when = f" (started by fsdp-jobs scale RUN nodes={i + 1})" if i >= len(self.agents) else ""
            when = " (hot spare: cluster.spare_nodes)" if i >= len(self.agents) - self.hot_spares else when
            lines.append(f"# node{i}{when}\n{extra} {shlex.join(agent.argv)}")
        return "\n".join(lines)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def stop_with_launcher(launcher_pid: int) -> Callable[[], None]:
    """preexec_fn of a node's process: SIGTERM when the launcher dies, even by SIGKILL (PR_SET_PDEATHSIG), so
    that its ranks checkpoint and stop rather than train on unsupervised, their output read by nobody; the
    same command again resumes the run. In the child only a C call and a syscall: no allocation after fork."""
    def arm() -> None:
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
            if os.getppid() != launcher_pid:  # it died before the call: no signal would come
                os.kill(os.getpid(), signal.SIGTERM)
    return arm


class AgentNode(Node):
    """One simulated node: a torchrun agent in its own session (Ctrl-C reaches only the launcher), stopped
    with its ranks' checkpoint if the launcher dies (stop_with_launcher)."""

    def __init__(self, name: str, agent: Agent) -> None:
        self.name = name
        self.proc = subprocess.Popen(agent.argv, env={**os.environ, **agent.env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=stop_with_launcher(os.getpid()))
        self.pump: Optional[threading.Thread] = None

    def follow(self, sink: LogSink, done: threading.Event) -> None:
        def pump() -> None:
            assert self.proc.stdout is not None
            for raw in iter(self.proc.stdout.readline, b""):
                sink.write(f"[{self.name}] {raw.decode(errors='replace').rstrip()}")
            self.proc.stdout.close()  # else the launcher warns of an unclosed file at exit (a traceback under -W error)
        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()

    def ended(self) -> Optional[int]:
        return self.proc.poll()  # torchrun restarts its workers itself: its own exit is for good

    def stop(self, grace_s: float) -> None:
        if self.proc.poll() is None:  # torchrun forwards SIGTERM to its workers, which checkpoint
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:  # the agent's own session/group: it and the workers it spawned, nothing else
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def join(self, timeout: float) -> None:
        if self.pump is not None:
            self.pump.join(timeout)


class LocalBackend(Backend[LocalRequest]):
    name = "local"

    def __init__(self) -> None:
        self.scaler, self.faults, self.stacks = LocalScaler(self), Faults(self), Stacks(self)

    def check(self, plan: Plan, cfg: JobConfig) -> None:
        check_machine(cfg)  # the nodes are this machine: its torch, GPUs and compiler must run the job

    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[LocalRequest]:
        ports = rendezvous_ports(plan, cfg)
        user = user_code_dir(cfg, Path(plan.run_dir))
        user_dir = str(user) if user else None
        extra = rank_env(cfg, plan.run_dir, user_dir)
        path = python_path(cfg, user_dir, os.environ.get("PYTHONPATH", ""))
        if path:
            extra["PYTHONPATH"] = path
        gpus = node_gpus(plan, cfg)
        lighthouse = lighthouse_agent(plan, cfg)
        request = LocalRequest([], user_dir, [], lighthouse)

        def replica(i: int) -> dict[str, str]:  # the node's replica group, its servers on loopback
            if lighthouse is None:
                return {}
            return {**replica_env(plan, replica_group(i, plan), request.lighthouse_url), REPLICA_ADDR_ENV: "127.0.0.1"}

        agents = [Agent({**runtime_env(cfg), **extra, **gpus[i], "FSDP_JOBS_NODE": f"node{i}", **replica(i)}, cmd)
                  for i, cmd in enumerate(node_commands(plan, cfg, ports, user_dir))]
        # spares (cluster.spare_nodes) start with the job; max_nodes = nodes then, so no scale spares
        request.agents, request.spares = agents[:plan.nodes] + agents[plan.rendezvous.max_nodes:], \
            agents[plan.nodes:plan.rendezvous.max_nodes]
        request.hot_spares = plan.spare_nodes
        return DryRun(self.name, plan, cfg, request, agent_args=agent_args(plan, cfg, ports[0], 0 if plan.replicas else None),
                      agent_env=runtime_env(cfg))

    def submit(self, dryrun: DryRun[LocalRequest], echo: bool = True) -> Submitted:
        """Run the job in the foreground; its exit status is 0 when every node finished."""
        if dryrun.request.user_dir:  # the dry run named this copy of the user's code in the commands
            take_user_code(dryrun.cfg, Path(dryrun.request.user_dir))
        return Submitted(str(os.getpid()), run_agents(dryrun, echo))

    def describe(self, run: Run) -> JobStatus:
        pid = run.launch.get("pid")
        if runs.RunLock(run.run_dir).held():
            return JobStatus(JobState.RUNNING, f"RUNNING (launcher pid {pid})", {"launcher_pid": pid},
                             outcomes.outcome(run.run_dir, run.since, JobState.RUNNING))
        # no launcher holds the run: the job has ended, as its records say (none: it ended without a word, FAILED)
        said = outcomes.outcome(run.run_dir, run.since, JobState.FAILED)
        return JobStatus(said.state, f"{said.state.value} (launcher pid {pid} has exited; training state: "
                                     f"{runs.read_state(run.run_dir).status or 'none recorded'})", {"launcher_pid": None},
                         said)

    def launcher_pid(self, run: Run) -> int:
        """The pid of the launcher that runs the job, proven by the run's lock (its launch record alone is not)."""
        lock, pid = runs.RunLock(run.run_dir), run.launch.get("pid")
        if not isinstance(pid, int) or not lock.held_by(pid):
            raise UserError("RUN", run.run_dir.name, f"{RunDir(run.run_dir).launches_file} names pid {pid!r}, which "
                                                     f"does not hold the run's lock {lock.path}: not this run's "
                                                     "launcher, so nothing was signalled")
        return pid

    def cancel(self, run: Run) -> str:
        if not runs.RunLock(run.run_dir).held():
            return f"{run.run_dir.name} is not running"
        pid = self.launcher_pid(run)
        os.kill(pid, signal.SIGTERM)  # the launcher stops the agents it started; the ranks checkpoint
        return f"asked local launcher pid {pid} to stop ({run.run_dir.name})"


class LocalScaler(Scaler):
    """The launcher that runs the job starts the new agents (run_agents' grow)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def scale(self, run: Run, nodes: int) -> str:
        if not runs.RunLock(run.run_dir).held():
            raise UserError("RUN", run.run_dir.name, "is not running: nothing to grow (submit it again with nodes=N "
                                                     "to resume at that size)")
        pid = self.backend.launcher_pid(run)
        request_scale(run, nodes)  # the launcher polls for it (run_agents' grow)
        return (f"asked local launcher pid {pid} to grow {run.run_dir.name} to {nodes} nodes: the new agents join "
                "the rendezvous, the ranks checkpoint and go on at the new size")


def run_agents(dryrun: DryRun[LocalRequest], echo: bool = True) -> int:
    with stop_signals() as caught:  # a Ctrl-C or `fsdp-jobs cancel` from the launch record on stops the job
        return _run_agents(dryrun, echo, caught)


def _run_agents(dryrun: DryRun[LocalRequest], echo: bool, caught: list[int]) -> int:
    plan, cfg = dryrun.plan, dryrun.cfg
    run_dir = Path(plan.run_dir)
    began = time.time()  # the outcome of this launch is what the records written since say (rundir/outcome.py)
    runs.clear_stop_request(run_dir)
    runs.record_launch(run_dir, LaunchRecord(backend=dryrun.backend, job_id=str(os.getpid()), nodes=plan.nodes,
                                             gpus_per_node=plan.gpus_per_node, extra={"pid": os.getpid()}))
    sink = LogSink(RunDir(run_dir).launcher_log, echo)
    nodes: list[Node] = []
    spares = list(dryrun.request.spares)

    def grow() -> list[Node]:
        """The agents an `fsdp-jobs scale RUN nodes=N` asked for, started now."""
        wanted = runs.take_scale_request(run_dir)
        if wanted is None:
            return []
        why = why_not_grow(nodes, run_dir) or (
            None if len(nodes) < wanted <= len(nodes) + len(spares) else
            f"the job has {len(nodes)} nodes and may grow to {len(nodes) + len(spares)} (cluster.max_nodes)")
        if why:
            sink.write(f"fsdp-jobs: scale to {wanted} nodes ignored: {why}")
            return []
        started: list[Node] = []
        for i in range(len(nodes), wanted):
            try:
                started.append(AgentNode(f"node{i}", spares[0]))
            except OSError as e:  # the running job goes on without it
                sink.write(f"fsdp-jobs: could not start node{i}: {e}")
                break
            spares.pop(0)
        return started

    lighthouse: Optional[AgentNode] = None
    done = threading.Event()
    try:
        try:
            if dryrun.request.lighthouse is not None:  # first: every group's first quorum asks it
                lighthouse = AgentNode("lighthouse", dryrun.request.lighthouse)
                lighthouse.follow(sink, done)
            for i, agent in enumerate(dryrun.request.agents):
                nodes.append(AgentNode(f"node{i}", agent))
        except OSError as e:  # this machine would not start a process (no such interpreter, no pids left)
            sink.write(f"fsdp-jobs: could not start the job's node{len(nodes)} on this machine: {e}; nothing ran")
            return 1
        outcome = supervise(nodes, sink, min_live_nodes(plan), cfg.cluster.stop_grace_s, grow, began=began,
                            caught=caught)
    finally:
        for n in nodes:  # started before a failure to start the others
            if n.ended() is None:
                n.kill()
        if lighthouse is not None:  # after every group: none asks it any more
            lighthouse.kill()
            done.set()
            lighthouse.join(5)
        sink.close()
    return exit_status(outcome, run_dir)


def min_live_nodes(plan: Plan) -> int:
    """Fewer live nodes than this and the others cannot go on: the rendezvous' minimum, or with
    fault_tolerance=replica the nodes of min_replicas whole replica groups."""
    if plan.replicas is not None:
        return plan.replicas.min_replicas * plan.replicas.nodes_per_group
    return plan.rendezvous.min_nodes


BACKEND = LocalBackend()
