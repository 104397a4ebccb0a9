"""What every node of every backend runs: one small wrapper around its torchrun agent.

    python -m fsdp_jobs.launchers.node TORCHRUN_FLAGS... ENTRY...      (cluster=local's agents, each Docker container,
                                                           each Kubernetes pod after boot.py, each SLURM node task)

What must happen on every node is written here once:
  * the working directory of the agent and its ranks is the run dir (FSDP_JOBS_RUN_DIR), on every
    backend, so a script= that writes to paths relative to its directory writes into its run dir
    wherever it runs; the ranks import the code this wrapper was started from (PYTHONPATH keeps it);
  * torchrun's error file (TORCHELASTIC_ERROR_FILE) is the node's RunDir.torchrun_error_file unless
    the backend named one, so a failing rank's exception can be named;
  * SIGTERM/SIGINT/SIGHUP go on to the agent (torchrun stops its ranks, which checkpoint); any other
    signal keeps the disposition the backend gave it (SLURM's stop signal stays ignored by the agent);
  * the exit status is the agent's, and a failure is one line naming the node and the first error.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # types only: this wrapper imports nothing of the project before it sets the umask
    from fsdp_jobs.planning.config import FaultConfig, JobConfig
    from fsdp_jobs.launchers.node.oom import OomWatch

RUN_DIR_ENV = "FSDP_JOBS_RUN_DIR"
NODE_ENV = "FSDP_JOBS_NODE"
OWNER_ONLY_UMASK = 0o077  # fsdp_jobs/rundir/runs.py's; this wrapper imports nothing of the project before it runs
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def code_root() -> str:
    """The directory this code is imported from (a code snapshot, a checkout or site-packages): the one
    holding the fsdp_jobs package, wherever its launchers subpackage sits (pyproject's package-dir)."""
    import fsdp_jobs  # already imported: this module is fsdp_jobs.launchers.node.wrapper

    return str(Path(fsdp_jobs.__file__).resolve().parents[1])


def agent_env(environ: dict[str, str], run_dir: str, node: str) -> dict[str, str]:
    from fsdp_jobs.rundir.layout import RunDir  # (after the umask: see OWNER_ONLY_UMASK)

    env = dict(environ)
    env.setdefault(NODE_ENV, node)
    env.setdefault("TORCHELASTIC_ERROR_FILE", str(RunDir(run_dir).torchrun_error_file(node)))
    paths = [p for p in env.get("PYTHONPATH", "").split(":") if p]
    if code_root() not in paths:  # after the snapshot/user code the backend put first
        env["PYTHONPATH"] = ":".join([*paths, code_root()])
    return env


def agent_error_file(run_dir: Path, node: str) -> str:
    from fsdp_jobs.rundir.layout import RunDir

    return os.environ.get("TORCHELASTIC_ERROR_FILE") or str(RunDir(run_dir).torchrun_error_file(node))


def write_error_file(path: Path, why: str) -> None:
    """In torchrun's format, for root_cause(): the agent was stopped before it could write its own."""
    import json
    import time

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": {"message": why, "extraInfo": {"timestamp": str(int(time.time()))}}}))


def root_cause(error_file: str) -> Optional[str]:
    """The first failing rank's error, from torchrun's error file (the ranks' @record writes it)."""
    import json

    try:
        message = json.loads(Path(error_file).read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    text = message.get("message") if isinstance(message, dict) else message
    return str(text).strip().splitlines()[-1][:300] if text else None


def first_error(run_dir: Path, error_file: str, since: float, stopped_here: bool) -> Optional[str]:
    """What the node's failure line names: the first failing rank of the job's last attempt, with its exit code
    and exception (its failure record: `rank 1 exited 3: SystemExit: 3 (train.py:9)`), else torchrun's error
    file; the wrapper's own reason where it stopped the agent (a repeat, hangs: its error file)."""
    from fsdp_jobs.rundir import failures

    return (None if stopped_here else failures.cause(run_dir, since)) or root_cause(error_file)


def stop_recorded(run_dir: Path) -> bool:
    """The launcher recorded that it is stopping this launch's nodes (its supervisor's stop, `fsdp-jobs cancel`),
    before it signalled them. Only a record made since the newest launch counts: a cancel of an earlier launch
    stays in the run dir until one node of the next clears it (SLURM's first task, TorchX's replica 0), and
    the other nodes of that next launch start meanwhile."""
    from fsdp_jobs.rundir import runs

    launched = float(runs.last_launch(run_dir).get("unix") or 0.0) - 0.001  # recorded to the millisecond
    return any(t is not None and t >= launched for t in (runs.nodes_stopped_at(run_dir), runs.cancel_asked(run_dir)))


def run(argv: list[str], environ: Optional[dict[str, str]] = None) -> int:
    """Run the torchrun agent with `argv` (its flags, then the ranks' entry) until it exits; its status."""
    started = time.time()  # goodput's queued time ends and start-up begins here (fsdp_jobs/rundir/goodput.py)
    environ = dict(os.environ if environ is None else environ)
    run_dir = environ.get(RUN_DIR_ENV)
    if not run_dir or not argv:
        print("usage: FSDP_JOBS_RUN_DIR=RUN_DIR python -m fsdp_jobs.launchers.node TORCHRUN_FLAGS... ENTRY...", file=sys.stderr)
        return 2
    node = environ.get(NODE_ENV) or socket.gethostname()
    stopped_on: list[int] = []  # the stop signals this node was sent, and passed on to its agent
    agents: list[subprocess.Popen[bytes]] = []
    passed_on = [0]  # how many of them reached the agent

    def forward(signum: int, _frame: Any) -> None:
        if not agents or agents[0].poll() is None:
            stopped_on.append(signum)
            if agents:
                agents[0].send_signal(signum)
                passed_on[0] += 1

    # the handlers first: a stop that came before them killed this wrapper (the agent orphaned, where it had
    # started), or, where this wrapper is a container's PID 1, was dropped by the kernel and the node trained on
    # (the launcher's stop record, read below, covers that moment); one that comes before the agent exists stops
    # the node before it starts one
    for s in FORWARDED:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, forward)
    # what the agent and the ranks write (checkpoints, logs, bytecode) is the owner's alone, as the
    # launcher's is, whatever umask the node (a container, a batch step) starts with (README: Security)
    os.umask(OWNER_ONLY_UMASK)
    from fsdp_jobs.rundir import events, liveness, streams

    streams.follow_readers()  # the node's lines outlive their reader (a launcher gone, a full disk)
    from fsdp_jobs.launchers.node.oom import OomWatch

    events.append_node_event(Path(run_dir), "node_start", node=node, time=started)
    # the ranks' heartbeats: node-local memory, this node's watchdog reads them (fsdp_jobs/rundir/liveness.py)
    beats = liveness.make_local_dir(liveness.derived_local_dir(Path(run_dir), node))
    owner = liveness.hold_local_dir(beats)  # held by the agent and its ranks too (pass_fds, then fork)
    freed = liveness.remove_abandoned_local_dirs(beats)
    if freed:  # a node wrapper killed outright (SIGKILL, the OOM killer) left its node memory behind
        print(f"fsdp-jobs: {node}: freed {sum(freed.values()) / 2**20:.1f} MiB of node memory left by "
              f"{len(freed)} killed node wrapper(s) in {beats.parent}: {', '.join(freed)}", flush=True)
    env = {**agent_env(environ, run_dir, node), liveness.LOCAL_DIR_ENV: str(beats)}
    Path(env["TORCHELASTIC_ERROR_FILE"]).parent.mkdir(parents=True, exist_ok=True)
    Path(env["TORCHELASTIC_ERROR_FILE"]).unlink(missing_ok=True)  # an earlier attempt's is not this one's
    # torchrun itself, its stores kept on loopback when the rendezvous host is (launchers/node/agent.py)
    oom = OomWatch()  # before the agent: its kills from here on
    if not stopped_on and stop_recorded(Path(run_dir)):
        stopped_on.append(signal.SIGTERM)  # the launcher's stop, sent before the handlers could take it
    try:
        if stopped_on:  # stopped before it began: no agent, nothing trained
            rc = 128 + stopped_on[0]
        else:
            agent = subprocess.Popen([sys.executable, "-m", "fsdp_jobs.launchers.node.agent", *argv], cwd=run_dir,
                                     env=env, pass_fds=(owner.fileno(),) if owner else ())
            agents.append(agent)
            if len(stopped_on) > passed_on[0]:  # came between the check above and the agent's start: once
                agent.send_signal(stopped_on[0])
            ended = supervise_agent(agent, Path(run_dir), node, beats, oom, began=started)
            rc = decided_status(ended, Path(run_dir), node, engine_restarts=environ.get(ENGINE_RESTARTS_ENV) == "1",
                                termination_log=environ.get(TERMINATION_LOG_ENV), began=started)
    finally:
        shutil.rmtree(beats, ignore_errors=True)  # node memory: nothing of the job may stay behind
        if owner is not None:
            owner.close()  # the lock goes with it (the agent and its ranks have ended)
    events.append_node_event(Path(run_dir), "node_end", node=node, rc=rc)
    if rc and stopped_on:  # a planned stop: one line, not a failure
        print(f"fsdp-jobs: {node}: stopped on {signal.Signals(stopped_on[0]).name}", flush=True)
    elif rc and rc != NO_RESTART_RC:
        cause = first_error(Path(run_dir), env["TORCHELASTIC_ERROR_FILE"], started, ended == STOPPED_BY_WRAPPER)
        oom.new_kills()
        memory = f"; out of memory: {oom.total()} OOM kills in {oom.where()}" if oom.total() else ""
        print(f"fsdp-jobs: {node}: torchrun exited {rc}" + (f"; first error: {cause}" if cause else "") + memory,
              flush=True)
    return rc


NO_RESTART_RC = 3  # the ranks decided the job failed (a preflight named a node, a non-finite loss): a restart repeats it
# supervise_agent stopped the agent itself: a failure that repeats, or hangs past fault.max_hang_restarts (its
# node verdict says why); not an exit status (those are 0-255, or minus a signal): decided_status maps it
STOPPED_BY_WRAPPER = 1000
# the hang watchdog looks at its node's ranks this often (node-local reads only: their heartbeat files and
# /proc); the looks that touch the shared run dir (the failure records' stat, the job's outcome) and the OOM
# count stay once a LOOK_S, a stat a second per node at 1,024 nodes
WATCH_S = 0.25
LOOK_S = 1.0
# set by a backend whose engine restarts a node that exits non-zero by itself, with no rule to tell exit 3
# apart (Docker's restart: on-failure, a PyTorchJob's OnFailure: launchers/kubernetes/manifests.py)
ENGINE_RESTARTS_ENV = "FSDP_JOBS_ENGINE_RESTARTS"
# a file whose text the engine keeps after the node ended (a Kubernetes container's terminationMessagePath):
# the preflight's verdict is written there, so the job's status can name it without reading the run dir
TERMINATION_LOG_ENV = "FSDP_JOBS_TERMINATION_LOG"
PREFLIGHT_MESSAGE = "fsdp-jobs preflight named a node: "  # how that text starts (launchers/kubernetes/backend.py)
FAILED_MESSAGE = "fsdp-jobs: the job failed: "  # the same for any other failure the ranks decided
TERMINATION_LOG_MAX = 4000  # the kubelet keeps 4096 bytes of it


def decided_status(rc: int, run_dir: Path, node: str, engine_restarts: bool = False,
                   termination_log: Optional[str] = None, began: Optional[float] = None) -> int:
    """The ranks exit 0 after a failure they decided on, which a restart would only repeat (a failure would
    make torchrun restart them): a preflight that named a node (fsdp_jobs/runtime/preflight.py), a non-finite
    loss (train.on_nonfinite, fsdp_jobs/runtime/trainer.py). The node's status is then NO_RESTART_RC, as the
    job's; the run's outcome says why (fsdp_jobs/rundir/outcome.py: only records written since `began`, this
    node's start, count). Except where the engine restarts failed nodes by itself: there a non-zero status would
    rerun the same checks on the same nodes until its restarts are used up, so the node exits 0 and whoever
    reports the job reads the verdict: Docker's supervisor from the records (launchers/supervisor.py's exit_status),
    `fsdp-jobs status` of a Kubernetes job from the container's termination message (`termination_log`).
    A node whose wrapper stopped the agent (STOPPED_BY_WRAPPER) exits 1 as it always has, or, where the engine
    restarts by itself, is such a decided failure too: Docker used to restart both containers of a job
    whose failure repeated until their restarts were used up, each stopping again at once."""
    if rc == STOPPED_BY_WRAPPER:
        if not engine_restarts:
            return 1
        rc = 0  # the node verdict, written since this node began, says why
    if rc == 0:
        from fsdp_jobs.rundir.outcome import outcome

        state = outcome(run_dir, began)
        if state.status == "failed":
            preflight = state.stage == "preflight"
            print(f"fsdp-jobs: {node}: {'stopped before training' if preflight else 'the job failed'}: {state.reason}"
                  + ("; not restarted" if engine_restarts else ""), flush=True)
            if termination_log:
                write_termination_log(termination_log, f"{PREFLIGHT_MESSAGE if preflight else FAILED_MESSAGE}{state.reason}")
            return 0 if engine_restarts else NO_RESTART_RC
    return rc


def write_termination_log(path: str, text: str) -> None:
    """Best effort: the node's exit status says the same where the engine has a rule for it."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.encode("utf-8")[:TERMINATION_LOG_MAX].decode("utf-8", "ignore"))
    except OSError as e:
        print(f"fsdp-jobs: cannot write the termination message {path}: {e}", flush=True)


def job_fault(run_dir: Path) -> Optional[FaultConfig]:
    """The job's fault.* keys through the schema (its defaults for what an older job record lacks), or None
    when its watchdog is off (or the job record cannot be read)."""
    import yaml

    from fsdp_jobs.planning.config import rank_config
    from fsdp_jobs.rundir import runs

    try:
        fault = rank_config(runs.load_job(run_dir) or {}).fault
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return fault if fault.watchdog else None


def supervise_agent(agent: subprocess.Popen, run_dir: Path, node: str, beats: Path,
                    oom: Optional[OomWatch] = None, began: Optional[float] = None) -> int:
    """Wait for the agent, with the hang watchdog (launchers/node/watchdog.py) looking at its ranks every WATCH_S,
    the node's OOM kills (launchers/node/oom.py) named as they happen, and the agent stopped once the job
    completed without this node (`LeftBehind`)."""
    from fsdp_jobs.launchers.node.watchdog import PAUSED_S, Watchdog

    from fsdp_jobs.rundir import failures

    fault = job_fault(run_dir)
    watchdog = Watchdog(run_dir, node, agent.pid, fault, beats) if fault is not None else None
    seen = failures.Changes(run_dir)
    left = LeftBehind(run_dir, agent.pid, time.time() if began is None else began)
    looked = float("-inf")
    while True:
        waited = time.time()  # wall time: a machine asleep stops the monotonic clock too
        try:
            rc = agent.wait(timeout=WATCH_S)
        except subprocess.TimeoutExpired:
            pass
        else:
            if watchdog is not None:
                watchdog.last_word()
            return rc
        if watchdog is not None and time.time() - waited - WATCH_S >= PAUSED_S:
            watchdog.pauses.add(waited + WATCH_S, time.time())
        line = watchdog.tick() if watchdog is not None else None
        if line:
            print(line, flush=True)
        if watchdog is not None and watchdog.given_up:  # before torchrun's restart (0.1 s) forks ranks again
            return give_up(agent, run_dir, node, "the hang watchdog used fault.max_hang_restarts", began)
        if time.monotonic() - looked < LOOK_S:
            continue
        looked = time.monotonic()
        if left.tick():
            print(f"fsdp-jobs: {node}: the job completed without this node (the others went on without it at "
                  "their last rendezvous: it was cut off from them, or too late); stopping its agent", flush=True)
            return stop_agent(agent)
        killed = oom.new_kills() if oom is not None else 0
        if killed:  # a rank SIGKILLed by the kernel records nothing itself: say what killed it
            print(f"fsdp-jobs: {node}: out of memory: the kernel's OOM killer killed {killed} process"
                  f"{'es' if killed > 1 else ''} in {oom.where()}; torchrun restarts the ranks it lost", flush=True)
        repeated = failures.repeating(failures.read(run_dir)) if seen.changed() else None
        if repeated:  # no restart can help: the job fails here
            return give_up(agent, run_dir, node, repeated, began)


def give_up(agent: subprocess.Popen, run_dir: Path, node: str, why: str, began: Optional[float]) -> int:
    """The node's end where no restart can help: its agent killed, the reason recorded where the job's status and
    torchrun's error file read it."""
    agent.kill()
    agent.wait()
    print(f"fsdp-jobs: {node}: stopping: {why}", flush=True)
    write_error_file(Path(agent_error_file(run_dir, node)), why)
    record_failed(run_dir, node, why, began)
    return STOPPED_BY_WRAPPER


def settle_script(job: "JobConfig", run_dir: Path, node: str, rc: int, since: Optional[float]) -> str:
    """The node task that saw a whole attempt end (a scheduler's task 0, TorchX's replica 0): a script= job's
    ranks record nothing when they end, so when every rank exited 0 (`rc`) the node's verdict says it completed,
    unless the run's outcome since `since` (this attempt's start) already says otherwise (fsdp_jobs.job's
    should_stop recorded "preempted", to be requeued; a node decided it "failed"). Returns the outcome's word."""
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.outcome import outcome

    recorded = outcome(run_dir, since).status
    script = bool(job.get("script") or job.get("module"))  # launchers/common.py user_mode, on the node side
    if not script or rc or recorded in ("preempted", "failed", "completed", "cancelled"):
        return recorded
    runs.write_node_verdict(run_dir, status="completed", node=node, reason="the script exited 0",
                            step=runs.read_state(run_dir).step)
    return "completed"


def record_failed(run_dir: Path, node: str, why: str, began: Optional[float]) -> None:
    """The job failed here (a failure that repeats, the hang restarts used): this node's verdict. Every node sees
    the repeat, one tick apart: the first to stop writes the reason, and a later one never overwrites it, nor the
    scheduler task's final word written meanwhile (launchers/slurm/node_task.py)."""
    from fsdp_jobs.rundir import runs

    said = runs.read_node_verdict(run_dir)
    if said is None or said.status != "failed" or (began is not None and said.time < began):
        runs.write_node_verdict(run_dir, status="failed", node=node, reason=why, step=runs.read_state(run_dir).step)


class LeftBehind:
    """A node the job went on without (cut off from the others' network, or too late for their last
    rendezvous) has an agent with no ranks, waiting for a rendezvous whose store is gone: torchrun's own
    timeouts keep it, and the job's SLURM allocation, its container or its pod, for many minutes after the
    job completed. `tick()` (every second) says when to stop it: the ranks recorded the job completed since
    this node began, and its agent has had no rank for GRACE_S. The run's outcome (a few small records:
    fsdp_jobs/rundir/outcome.py) is read only while the agent has had no rank that long (a rendezvous that
    waits, at start-up or after a failure: every node of a 1,024-node job may), first CHECK_S apart, then twice
    as far apart each time, at most MAX_CHECK_S: about 17 reads a second of each from 1,024 waiting nodes,
    none in steady state."""

    CHECK_S, GRACE_S, MAX_CHECK_S = 5.0, 30.0, 60.0

    def __init__(self, run_dir: Path, agent_pid: int, began: float) -> None:
        self.run_dir, self.agent_pid, self.began = run_dir, agent_pid, began
        self.idle_since: Optional[float] = None
        self.checked, self.every = 0.0, self.CHECK_S

    def tick(self) -> bool:
        now = time.monotonic()
        if now - self.checked < self.every:
            return False
        self.checked = now
        if child_pids(self.agent_pid):
            self.idle_since, self.every = None, self.CHECK_S
            return False
        self.idle_since = self.idle_since or now
        if now - self.idle_since < self.GRACE_S:
            return False
        from fsdp_jobs.rundir.outcome import outcome

        if outcome(self.run_dir, self.began).status == "completed":
            return True
        self.every = min(2 * self.every, self.MAX_CHECK_S)
        return False


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started that still run (its ranks, for a torchrun agent): not a zombie (a rank the
    watchdog killed stays one while the agent waits in its rendezvous, unreaped)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return [1]  # cannot tell: say busy, never stop an agent on a guess
    return [c for c in found if not _zombie(c)]


def _zombie(pid: int) -> bool:
    try:
        # /proc/PID/stat: "pid (comm) STATE ...", comm may hold spaces and parentheses
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone meanwhile


def stop_agent(agent: subprocess.Popen, grace_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `grace_s`; 0: the job this node belonged to completed."""
    agent.terminate()
    try:
        agent.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
    return 0


def main() -> None:
    sys.exit(run(sys.argv[1:]))
