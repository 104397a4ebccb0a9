"""Inside the SLURM job: one NodeTask per node (submitit task), each running one torchrun agent.

Keeping the run alive:
  * preemption / time limit: SLURM signals every process of the step (cluster.signal, USR2 by
    default). The torchrun agent ignores it (inherited SIG_IGN) so it does not die; the ranks catch
    it, agree at the next step boundary, save one checkpoint and exit 0. submitit's handler on task 0
    calls `checkpoint()`, which waits for that save, then submitit requeues the job. Preemptions
    requeue without limit; time-outs up to cluster.max_timeouts.
  * crash (torchrun gave up after its restarts): task 0 requeues the job only if this attempt
    committed a newer checkpoint than the one it started from; otherwise it stops and says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import submitit

from fsdp_jobs.planning.config import job_config
from fsdp_jobs.rundir import replaced, runs, streams
from fsdp_jobs.rundir.checkpoints import newest_checkpoint, step_of
from fsdp_jobs.rundir.failures import ATTEMPT_ENV
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.outcome import Outcome, outcome
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.rundir.runs import clear_stop_request, request_stop
from fsdp_jobs.launchers.common import (LIGHTHOUSE_ENV, NODE_WRAPPER, REPLICA_GROUP_ENV, USER_CODE_ENV, join_timeout_s,
                              rank_entry, torchrun_args)
from fsdp_jobs.launchers.node.wrapper import code_root, first_error, settle_script
from fsdp_jobs.launchers.slurm.config import slurm_dir
from fsdp_jobs.launchers.slurm.hostlist import expand
from fsdp_jobs.launchers.slurm.requeue import (COMPLETED, EXCLUDE, NAMING_STAGES, PREEMPTED, REQUEUE, TERMINATED,
                                               Decision, after_named_nodes, decide)

if TYPE_CHECKING:  # types only: the node reads both from the run dir (job_config, runs.load_plan)
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan

KILL_WAIT_S = 300  # after a requeue, SLURM kills the tasks; do not report "done" meanwhile
SPARE_WAIT_S = 5.0  # a node lost while spares stand in: its task's first wait between reads of the job's outcome
SPARE_WAIT_MAX_S = 60.0  # ... twice as long each time, up to this: should rank 0's node be the one lost, all
#                          1,023 other tasks of a 1,024-node job wait, about 17 reads a second of two small files
SLEEP_SLICE_S = 0.25  # each wait slept in slices this long, so that SIGTERM ends it at once


class LostNodeWait:
    """cluster.spare_nodes on SLURM: a node task whose agent died waits for the job's outcome (see
    NodeTask._outlive_lost_agent), but not for ever. The job went on without the node when the job view
    (rank 0's node writes it every few seconds while its ranks train: fsdp_jobs/rundir/liveness.py) was
    written after the agent died. Without such a sign for `patience_s` (a rendezvous round's join timeout
    plus the ranks' start-up allowance: a spare's round and start can take that long) nothing goes on: the
    store host's node was lost with it, say, and every other agent failed too. With --no-kill no one ends
    that allocation but its tasks: the task then ends with its agent's status, which fails (or, through
    task 0, requeues) the SLURM job as a lost node did before there were spares."""

    def __init__(self, died: float, patience_s: float) -> None:
        self.died, self.patience_s = died, patience_s
        self.wait_s = SPARE_WAIT_S

    def verdict(self, status: str, view_written: Optional[float], now: float) -> Optional[str]:
        """'ok' (the job completed or stopped for a requeue), 'failed' (it failed, or has shown no sign of
        going on for patience_s), or None: wait `next_wait()` and ask again."""
        if status in ("completed", "preempted"):
            return "ok"
        if status == "failed":
            return "failed"
        sign = max(self.died, view_written or 0.0)
        return "failed" if now - sign > self.patience_s else None

    def next_wait(self) -> float:
        wait, self.wait_s = self.wait_s, min(2 * self.wait_s, SPARE_WAIT_MAX_S)
        return wait


def _step_of(ckpt: Optional[Path]) -> int:
    return step_of(ckpt) or 0


def _ignore_stop_signal(signame: str) -> Any:
    sig = getattr(signal, f"SIG{signame}")

    def preexec() -> None:
        os.setsid()  # our own group: the signal can be forwarded to this agent and its ranks only
        signal.signal(sig, signal.SIG_IGN)  # the agent must survive it; the ranks install handlers
    return preexec


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait for a child to exit without reaping it. (Popen.wait cannot be used here: this runs in a
    signal handler that interrupted Popen.wait in __call__, which holds the Popen's wait lock.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


def excluded_nodes(run_dir: Path, job: JobConfig) -> list[str]:
    """The nodes this job is kept off: cluster.exclude, and those a preflight named (the newest launch record)."""
    return sorted({str(n) for n in job.cluster.get("exclude") or []} |
                  {str(n) for n in runs.last_launch(run_dir).get("exclude") or []})


def requeue_excluding(run_dir: Path, job_id: str, decision: Decision) -> None:
    """Requeue this job kept off the nodes a preflight named: held while its excluded nodes are changed
    (only a pending job's can be), then released. Recorded in the nodes' launch record and the log.

    `requeuehold` makes the job pending at once and stops its steps, this task among them: SIGTERM now,
    SIGKILL KillWait seconds later (30 by default). This task ignores the SIGTERM to finish the three
    commands first; killed between them it would leave the job released with no exclusion (then it
    reruns on the same nodes) or excluded and held for good (the real cluster did both)."""
    nodes = ",".join(decision.exclude)
    runs.write_node_verdict(run_dir, status="requeued-excluding", node=hostname(), reason=decision.reason,
                            exclude=list(decision.exclude))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.run(["scontrol", "requeuehold", job_id], check=True, timeout=60)
    try:
        deadline = time.monotonic() + 10  # pending at once in practice; a busy controller may lag
        while True:
            r = subprocess.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"],
                               capture_output=True, text=True, timeout=60)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if r.returncode:
            print(f"fsdp-jobs: could not exclude {nodes} from job {job_id}: {r.stderr.strip()[:300]}", flush=True)
    finally:
        subprocess.run(["scontrol", "release", job_id], timeout=60)
    last = LaunchRecord.from_dict(runs.last_launch(run_dir)) or LaunchRecord(backend="slurm", job_id=job_id)
    runs.record_node_launch(run_dir, LaunchRecord(
        backend=last.backend, job_id=last.job_id, nodes=last.nodes, gpus_per_node=last.gpus_per_node,
        extra={**last.extra, "requeue": "preflight", "exclude": list(decision.exclude), "why": decision.reason}))
    print(f"fsdp-jobs: requeued job {job_id} with --exclude={nodes}: {decision.reason}", flush=True)


def act(run_dir: Path, job_id: str, decision: Decision, reason: str, state: Outcome) -> None:
    """Task 0, once an attempt failed: requeue it (with progress, or without the nodes a preflight named), or
    record it as failed (this node's verdict). By <array id>_<i>: the element holding the array's own id would
    requeue them all."""
    step = _step_of(newest_checkpoint(run_dir))
    if decision.action == EXCLUDE:
        requeue_excluding(run_dir, job_id, decision)
        time.sleep(KILL_WAIT_S)
    elif decision.action == REQUEUE:
        runs.write_node_verdict(run_dir, status="requeued-after-crash", node=hostname(), reason=reason, step=step)
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)
        time.sleep(KILL_WAIT_S)
    else:  # a failure that named nodes (a preflight, a replica check) keeps naming them
        named = state.stage in NAMING_STAGES
        runs.write_node_verdict(run_dir, status="failed", node=hostname(), reason=reason, step=step,
                                stage=state.stage if named else None, bad_nodes=state.bad_nodes if named else None)


def agent_args(plan: Plan, cfg: JobConfig, run_id: str, endpoint: str, group: Optional[int] = None) -> list[str]:
    """torchrun's flags on a node of the allocation, from the plan record (what the dry run showed: launchers/
    slurm/backend.py) with this attempt's rendezvous id and the allocation's first node as the endpoint. The
    node range is the plan's (up to cluster.max_nodes: the nodes a scale adds join from a second job,
    launchers/slurm/grow.py), decided once in fsdp_jobs/planning/plan.py. `group`: with fault_tolerance=replica,
    the node's replica group (its own rendezvous at `endpoint`)."""
    attempt = dataclasses.replace(plan, rendezvous=dataclasses.replace(plan.rendezvous, run_id=run_id))
    return torchrun_args(attempt, endpoint, cfg.cluster.stop_grace_s, group)


@dataclass(frozen=True)
class NodeFacts:
    """What a node task learns only inside the allocation, as text: on a node the values themselves
    (`allocation_facts`; a grow node's from the running attempt's rendezvous record), in the dry run the shell
    variables that stand for them (`shown_facts`)."""

    job_id: str  # submitit's: the SLURM job id, <array id>_<index> for an array element
    node: str  # SLURM_NODEID
    host: str  # how the node's ranks and the run dir's records name it (hostname())
    run_id: str  # the attempt's rendezvous id: <SLURM_JOB_ID>-<SLURM_RESTART_COUNT>
    endpoint: str  # the rendezvous: the allocation's first node (replica: the group's first node) and the port
    attempt_id: str  # <job id>.<SLURM_RESTART_COUNT>: which attempt the ranks belong to (fsdp_jobs/rundir/failures.py)
    group: Optional[str] = None  # fault_tolerance=replica: the node's replica group,
    node_host: Optional[str] = None  # ... its name in the allocation's order (its --local-addr),
    lighthouse: Optional[str] = None  # ... and the job's lighthouse (launchers/slurm/backend.py lighthouse_setup)


def node_launch(plan: Plan, job: JobConfig, run_dir: str, python: str, user_dir: Optional[str],
                facts: NodeFacts) -> tuple[list[str], dict[str, str]]:
    """THE command a node task starts (the node wrapper around this node's torchrun agent, then what torchrun
    starts on every rank) and what it adds to the environment the task inherits (the batch script's exports):
    the node task runs exactly this, and the dry run prints it with shown_facts (launchers/slurm/backend.py)."""
    args = agent_args(plan, job, facts.run_id, facts.endpoint, facts.group)  # type: ignore[arg-type]
    # the agent writes its failing rank's exception to the error file, so the job's reason can name it
    env = {"TORCHELASTIC_ERROR_FILE": str(RunDir(run_dir).torchrun_error_file(f"{facts.job_id}-node{facts.node}")),
           "FSDP_JOBS_NODE": facts.host, ATTEMPT_ENV: facts.attempt_id}
    if facts.group is not None:  # fault_tolerance=replica: this node's replica group is a torchrun world of its own
        args.append(f"--local-addr={facts.node_host}")
        env.update({REPLICA_GROUP_ENV: facts.group, LIGHTHOUSE_ENV: str(facts.lighthouse)})
    return [python, "-m", NODE_WRAPPER, *args, *rank_entry(job, run_dir, user_dir)], env


def rdzv_port(job: JobConfig, raw_id: int) -> int:
    """The rendezvous port: cluster.rdzv_port, else one of the job's own (elements sharing a node, or a requeue
    meeting a stale agent, must not meet at one port)."""
    return job.cluster.get("rdzv_port") or 20000 + raw_id % 20000


def allocation_facts(plan: Plan, job: JobConfig, job_id: str, node: int, hostnames: list[str], raw_id: int,
                     attempt: int) -> NodeFacts:
    """This node's facts, from SLURM's environment as the node task reads it."""
    from fsdp_jobs.launchers.slurm.config import lighthouse_port_of

    port = rdzv_port(job, raw_id)
    facts = NodeFacts(job_id=job_id, node=str(node), host=hostname(), run_id=f"{raw_id}-{attempt}",
                      endpoint=f"{hostnames[0]}:{port}", attempt_id=f"{job_id}.{attempt}")
    if plan.replicas is None:
        return facts
    group = node // plan.replicas.nodes_per_group  # consecutive nodes form a group (launchers/common.py replica_group)
    lighthouse = f"http://{hostnames[0]}:{lighthouse_port_of(raw_id, plan.replicas.lighthouse_port)}"
    return dataclasses.replace(facts, endpoint=f"{hostnames[group * plan.replicas.nodes_per_group]}:{port}",
                               group=str(group), node_host=hostnames[node], lighthouse=lighthouse)


def this_node(plan: Plan, job: JobConfig) -> tuple[Any, NodeFacts]:
    """submitit's view of this task's allocation, and this node's facts from SLURM's environment."""
    env = submitit.JobEnvironment()
    # every job, array elements too, has its own numeric SLURM_JOB_ID: elements sharing a node
    # (or a requeue meeting a stale agent) must not meet at one rendezvous port
    raw_id = os.environ.get("SLURM_JOB_ID", env.job_id.split("_")[0])
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    hostnames = job_hostnames(os.environ.get("SLURM_JOB_NODELIST", ""), env.num_nodes)
    return env, allocation_facts(plan, job, env.job_id, env.node, hostnames, int(raw_id), attempt)


HOSTNAMES = 'scontrol show hostnames "$SLURM_JOB_NODELIST"'  # job_hostnames: SLURM's own expansion, in its order


def shown_facts(plan: Plan, job: JobConfig) -> tuple[NodeFacts, list[str]]:
    """allocation_facts as shell on a node of the job: the facts as variables, and the lines that set each
    of them exactly as allocation_facts computes it from SLURM's variables (tests/unit/test_sbatch.py runs
    them in bash against allocation_facts)."""
    from fsdp_jobs.launchers.slurm.config import LIGHTHOUSE_PORT_BASE

    port = job.cluster.get("rdzv_port")
    lines = ["JOB_ID=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID}; JOB_ID=${JOB_ID:-$SLURM_JOB_ID}",
             "ATTEMPT=${SLURM_RESTART_COUNT:-0}", "HOST=${SLURMD_NODENAME:-$(hostname)}",
             f"FIRST_NODE=$({HOSTNAMES} | head -n 1)", f"PORT={port or '$((20000 + SLURM_JOB_ID % 20000))'}"]
    job_id, attempt = shell_var("JOB_ID"), shell_var("ATTEMPT")
    facts = NodeFacts(job_id=job_id, node=shell_var("SLURM_NODEID"), host=shell_var("HOST"),
                      run_id=f"{shell_var('SLURM_JOB_ID')}-{attempt}", attempt_id=f"{job_id}.{attempt}",
                      endpoint=f"{shell_var('FIRST_NODE')}:{shell_var('PORT')}")
    if plan.replicas is None:
        return facts, lines
    k, configured = plan.replicas.nodes_per_group, plan.replicas.lighthouse_port
    lines += [f"GROUP=$((SLURM_NODEID / {k}))",
              f'GROUP_FIRST_NODE=$({HOSTNAMES} | sed -n "$((GROUP * {k} + 1))p")',
              f'NODE_HOST=$({HOSTNAMES} | sed -n "$((SLURM_NODEID + 1))p")',
              f"LIGHTHOUSE_PORT={configured or f'$(({LIGHTHOUSE_PORT_BASE} + SLURM_JOB_ID % 20000))'}"]
    return dataclasses.replace(facts, endpoint=f"{shell_var('GROUP_FIRST_NODE')}:{shell_var('PORT')}",
                               group=shell_var("GROUP"), node_host=shell_var("NODE_HOST"),
                               lighthouse=f"http://{shell_var('FIRST_NODE')}:{shell_var('LIGHTHOUSE_PORT')}"), lines


def shell_var(name: str) -> str:
    """A shell variable inside a shown fact, marked apart from the literal text around it (shell_word)."""
    return f"\0{name}\0"


def shell_word(word: str) -> str:
    """One word of the shown command as bash reads it: quoted as shlex quotes it, or, holding shell_var
    variables, in double quotes with the variables expanded and everything else literal."""
    if "\0" not in word:
        return shlex.quote(word)
    parts = word.split("\0")  # literal, variable, literal, ...
    return '"' + "".join(re.sub(r'([\\"`$])', r"\\\1", p) if i % 2 == 0 else "${" + p + "}"
                         for i, p in enumerate(parts)) + '"'


def shown_command(plan: Plan, job: JobConfig, user_dir: Optional[str]) -> list[str]:
    """The batch script's comment lines that show what every node task starts: node_launch's command and
    environment, the values only the allocation knows as shell variables, set (above it) as the node computes them."""
    facts, lines = shown_facts(plan, job)
    cmd, env = node_launch(plan, job, str(Path(plan.run_dir)), sys.executable, user_dir, facts)
    words = [f"{k}={shell_word(v)}" for k, v in env.items()] + [shell_word(w) for w in cmd]
    return ["# every node's task starts the command below (launchers/slurm/node_task.py node_launch, which printed it",
            "# here); what only the allocation knows, the task computes from SLURM's variables as these lines do:",
            *(f"#   {line}" for line in lines), "#   " + " ".join(words)]


def job_hostnames(nodelist: str, nodes: int) -> list[str]:
    """The allocation's nodes in SLURM's order, from SLURM_JOB_NODELIST (compressed: n[0001-1024]). SLURM's own
    expansion, `scontrol show hostnames` (the node's slurm.conf, no call to the controller), when it names
    `nodes` hosts; else launchers/slurm/hostlist.py's, by the same rule. Every node must name the same first
    node: the rendezvous host."""
    if not nodelist:
        return [socket.gethostname()]
    try:
        r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        names = r.stdout.split() if r.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    if len(names) == nodes:
        return names
    try:
        return expand(nodelist)
    except ValueError as e:
        raise RuntimeError(f"cannot read this job's nodes from SLURM_JOB_NODELIST={nodelist!r}: {e}") from None


RENDEZVOUS_FILE = "rendezvous.json"  # in slurm_dir: the running attempt's, for the nodes a scale adds


def write_rendezvous(run_dir: Path, job_id: str, attempt_id: str, run_id: str, endpoint: str) -> None:
    """Task 0 of a job that may grow (cluster.max_nodes) says where its attempt's rendezvous is."""
    slurm_dir(run_dir).mkdir(exist_ok=True)
    runs.write_atomic(slurm_dir(run_dir) / RENDEZVOUS_FILE, json.dumps(
        {"job_id": job_id, "attempt": attempt_id, "run_id": run_id, "endpoint": endpoint}) + "\n")


def read_rendezvous(run_dir: Path) -> dict[str, Any]:
    try:
        record = json.loads((slurm_dir(run_dir) / RENDEZVOUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def start_agent(job: JobConfig, cmd: list[str], extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    """This node's agent (node_launch: the node wrapper, launchers/node/wrapper.py, around torchrun) in a process
    group of its own that ignores the job's stop signal (the ranks handle it)."""
    error_file = Path(extra_env["TORCHELASTIC_ERROR_FILE"])
    error_file.parent.mkdir(exist_ok=True)
    error_file.unlink(missing_ok=True)
    return subprocess.Popen(cmd, preexec_fn=_ignore_stop_signal(job.cluster.signal), env={**os.environ, **extra_env})


def hostname() -> str:
    """How this node's ranks, its wrapper and the run dir's records name it: SLURM's name for it."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class NodeTask(submitit.helpers.Checkpointable):
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._terminated = False  # SLURM sent SIGTERM: scancel, its own requeue, or the end of the job
        self._began: Optional[float] = None  # when this attempt's task started (None: not started here)

    def __getstate__(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["run_dir"])  # type: ignore[misc]

    def __call__(self) -> dict[str, Any]:
        streams.follow_readers()  # SLURM's output file may be on a disk that fills: lines lost, never the task
        run_dir = Path(self.run_dir)
        self._began = time.time()  # this attempt's outcome is what the records written since say (rundir/outcome.py)
        job, plan = job_config(runs.load_job(run_dir)), runs.load_plan(run_dir)
        env, facts = this_node(plan, job)
        job_id = env.job_id  # <array id>_<i> for an array element: what scontrol/scancel/sacct name it by
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        start_ckpt = newest_checkpoint(run_dir)
        if env.global_rank == 0:
            clear_stop_request(run_dir)  # before torchrun starts: only rank 0 (on this node) reads it
        print(f"fsdp-jobs: node {env.node}/{env.num_nodes} host {socket.gethostname()} "
              f"(slurm node {os.environ.get('SLURMD_NODENAME')}) job {job_id} attempt {attempt} "
              f"rendezvous {facts.endpoint} code {code_root()}", flush=True)

        if env.global_rank == 0 and plan.rendezvous.max_nodes > plan.nodes:
            write_rendezvous(run_dir, job_id, facts.attempt_id, facts.run_id, facts.endpoint)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        cmd, extra = node_launch(plan, job, str(run_dir), sys.executable, os.environ.get(USER_CODE_ENV), facts)
        error_file = Path(extra["TORCHELASTIC_ERROR_FILE"])
        self._proc = start_agent(job, cmd, extra)
        rc = self._proc.wait()
        if rc == 0 and plan.spare_nodes and replaced.is_replaced(run_dir, hostname(), self._began):
            return {"status": "replaced", "node": env.node, "step": None}  # its agent left for a spare, and said so
        if rc and plan.spare_nodes and env.global_rank != 0 and not self._terminated:
            rc = self._outlive_lost_agent(run_dir, rc, plan, job)
        settle_script(job, run_dir, hostname(), rc, self._began)  # a plain script exiting 0 completed
        state = outcome(run_dir, self._began)
        decision = after_named_nodes(state, bool(job.cluster.get("exclude_bad_nodes")), excluded_nodes(run_dir, job),
                                     self._terminated) or decide(rc, state.status, self._terminated,
                                                                 _step_of(start_ckpt), _step_of(newest_checkpoint(run_dir)))
        done = {"status": decision.action, "node": env.node, "step": state.step}
        if decision.action == COMPLETED:
            if rc:  # the others went on without it (the wrapper's LeftBehind says the same, had it stopped first)
                print(f"fsdp-jobs: {hostname()}: the job completed without this node (its torchrun exited {rc})",
                      flush=True)
            return done
        if decision.action == TERMINATED:
            print(f"fsdp-jobs: {decision.reason}", flush=True)
            return done
        if decision.action == PREEMPTED:  # task 0's signal handler requeues; everyone waits to be killed by it
            print(f"fsdp-jobs: stopped at step {state.step} for a requeue", flush=True)
            time.sleep(KILL_WAIT_S)
            return done
        if env.global_rank != 0:
            time.sleep(30)  # give task 0 the time to act (a requeue kills us)
            raise RuntimeError(f"torchrun exited with {rc} on node {env.node}")
        # the job's first failing rank (the ranks' failure records), as the node wrapper names it: this node's error
        # file holds its own ranks' errors, which may only follow from another's (a peer gone mid-collective)
        cause = first_error(run_dir, str(error_file), self._began, stopped_here=False)
        reason = f"{decision.reason} (first error: {cause})" if cause else decision.reason
        print(f"fsdp-jobs: {reason}", flush=True)
        act(run_dir, env.job_id, decision, reason, state)
        raise RuntimeError(reason)

    def _outlive_lost_agent(self, run_dir: Path, rc: int, plan: "Plan", job: "JobConfig") -> int:
        """cluster.spare_nodes: this node's agent died and a spare takes its place at the next rendezvous, so the
        job goes on without this node (the allocation has --no-kill). A task that failed now would fail the
        SLURM job that completes without it, and one that requeued would restart every node: it waits for the
        job's outcome instead (LostNodeWait: the run's outcome and the job view, read every SPARE_WAIT_S, then
        less often; only lost nodes wait) and ends as the job does: 0 once it completed or stopped for a
        requeue; its agent's status once the job failed or showed no sign of going on. Not task 0: its node
        holds the rendezvous store, without which no spare can join."""
        from fsdp_jobs.rundir import liveness

        node = hostname()
        patience = join_timeout_s(plan.rendezvous.max_nodes) + float(job.fault.startup_timeout_s)
        print(f"fsdp-jobs: {node}: this node's agent exited {rc}; the job goes on without it (cluster.spare_nodes: "
              "a spare takes its place at the next rendezvous); waiting for the job's outcome", flush=True)
        wait = LostNodeWait(time.time(), patience)
        while not self._terminated:
            now = time.time()
            view = liveness.read_view(run_dir, now, fresh=False)
            status = outcome(run_dir, self._began).status
            verdict = wait.verdict(status, view.written if view else None, now)
            if verdict == "ok":
                return 0
            if verdict == "failed":
                if status != "failed":
                    print(f"fsdp-jobs: {node}: the job has not gone on without this node for {patience:.0f} s (no "
                          f"job view written since its agent exited); ending with the agent's status {rc}", flush=True)
                return rc
            self._sleep_unless_terminated(wait.next_wait())
        return rc

    def _sleep_unless_terminated(self, seconds: float) -> None:
        """A sleep that SIGTERM ends within SLEEP_SLICE_S: Python resumes an interrupted time.sleep (PEP 475),
        and a 60 s one outlived SLURM's KillWait (30 s by default) after a scancel or a requeue."""
        deadline = time.monotonic() + seconds
        while not self._terminated and time.monotonic() < deadline:
            time.sleep(min(SLEEP_SLICE_S, max(0.0, deadline - time.monotonic())))

    def _on_sigterm(self, signum: int, _frame: Any) -> None:
        self._terminated = True  # torchrun gets it too and stops its ranks, which checkpoint first

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on task 0 when the stop signal arrives: let the ranks save, then requeue."""
        run_dir = Path(self.run_dir)
        job = job_config(runs.load_job(run_dir))
        # ranks that are still starting cannot have caught the signal: they will read this file
        request_stop(run_dir, f"SLURM sent SIG{job.cluster.signal} (preemption or time limit)")
        if self._proc is not None:
            try:  # SLURM signals every process already; this covers a signal sent to the task alone
                os.killpg(self._proc.pid, getattr(signal, f"SIG{job.cluster.signal}"))
            except ProcessLookupError:
                pass
            deadline = max(10, job.cluster.signal_delay_s - 15)
            if not _wait_exit(self._proc.pid, deadline):
                print(f"fsdp-jobs: ranks did not finish their checkpoint within {deadline}s; requeueing anyway",
                      flush=True)
        if outcome(run_dir, self._began).status == "completed":
            print("fsdp-jobs: training completed before the stop took effect; not requeueing", flush=True)
            raise SystemExit(0)
        ckpt = newest_checkpoint(run_dir)
        print(f"fsdp-jobs: requeueing; will resume from {ckpt}", flush=True)
        return submitit.helpers.DelayedSubmission(NodeTask(self.run_dir))
