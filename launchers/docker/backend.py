"""cluster=docker: one container per node through docker-compose, on a private bridge network.

`dryrun` renders the compose file (data, and the YAML `dry_run=true` prints) and the exact commands;
`submit` snapshots the code, writes the compose file into the run dir, starts it (`up -d`) and hands
over to the supervisor (launchers/docker/supervisor.py): in the foreground by default, like
cluster=local (merged node-prefixed log, progress, the job's exit status, Ctrl-C stops exactly these
containers), or in the background with cluster.detach=true. The supervisor removes the containers
and the network when the job ends; the run dir stays.

Each container runs one torchrun agent as PID 1 (c10d rendezvous at node0), as the invoking user,
with the run dir bind-mounted at the same path. `restart: on-failure:N`: a node whose agent dies
comes back and the job resumes from the newest checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

import yaml

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.planning.secret_env import passed_names
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.launchers.base import Backend, DryRun, JobState, JobStatus, Run, Submitted, outcome
from fsdp_jobs.launchers.capabilities import Faults, Scaler, Stacks, request_scale
from fsdp_jobs.planning.chaos_kinds import DEFAULT_BIT, ChaosKind
from fsdp_jobs.launchers.common import (NODE_WRAPPER, lighthouse_command, lighthouse_port, python_path,
                              rank_entry, rank_env, replica_env, replica_group, runtime_env, torchrun_args,
                              user_code_dir)
from fsdp_jobs.launchers.docker.engine import (COMPOSE_FILE, DOWN_TIMEOUT_S, RESULT_FILE, SKEL_IMAGE,
                                     compose_command, container_user, containers, docker, docker_dir, engine_error,
                                     ensure_skel_image, give_to, last_exit, read_result, tcp_retries2, tcp_rto_max_ms)
from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV
from fsdp_jobs.launchers.supervisor import stop_signals
from fsdp_jobs.launchers.snapshot import PROJECT_ROOT, next_snapshot_dir, take_snapshot, take_user_code

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan
    from fsdp_jobs.launchers.docker.config import DockerClusterConfig

DEFAULT_RDZV_PORT = 29400
SCALE_WAIT_S = 120  # for the supervisor to start the containers a scale asked for
SCALE_PROFILE = "scale"  # the compose profile of the nodes a job may grow to (cluster.max_nodes)
LABEL = "fsdp-jobs.run"


# ------------------------------------------------------------------------------ what mounts
def python_mounts() -> list[str]:
    """Read-only mounts that give a skeleton container this machine's interpreter and packages at the
    same paths (the venv's python links into its base prefix, which links against /usr's libraries)."""
    paths = ["/usr", sys.base_prefix, sys.prefix, site.getusersitepackages()]
    # other import roots (a user site, a src/ layout); not the working directory `python -m` puts
    # first, nor this project: the job imports the run's code snapshot instead
    skip = {os.path.realpath(os.getcwd()), os.path.realpath(PROJECT_ROOT)}
    paths += [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) not in skip]
    chosen: list[str] = []
    for p in sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}, key=len):
        if p != "/" and not any(p == c or p.startswith(c + "/") for c in chosen):
            chosen.append(p)
    return [f"{p}:{p}:ro" for p in chosen]


def project_name(run_dir: Path) -> str:
    """Compose project name: readable, unique per run dir, in compose's alphabet."""
    base = re.sub(r"[^a-z0-9_-]", "-", run_dir.name.lower())[:40].strip("-_") or "run"
    return f"fsdpjobs-{base}-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:8]}"


def own_project(run: Run) -> str:
    """The run's compose project, proven: its launch record (a file the containers' user can edit) names it,
    but only containers labelled with this run dir (compose_spec sets the label) are taken as the run's."""
    project = str(run.launch.get("project", ""))
    if not re.fullmatch(r"fsdpjobs-[a-z0-9_-]+-[0-9a-f]{8}", project):
        raise UserError("RUN", run.run_dir.name, f"{RunDir(run.run_dir).launches_file} names compose project "
                                                 f"{project!r}, which fsdp-jobs never makes; nothing was touched")
    mine = str(run.run_dir.resolve())
    for name, c in containers(project).items():
        label = (c.get("Config", {}).get("Labels") or {}).get(LABEL, "")
        if not label or str(Path(label).resolve()) != mine:
            raise UserError("RUN", run.run_dir.name, f"container {name} of project {project} belongs to "
                                                     f"{label or 'no run'}, not to this run; nothing was touched")
    return project


# ------------------------------------------------------------------------------------ the request
def compose_text(compose: dict[str, Any]) -> str:
    """The compose file's text: the same YAML as yaml.safe_dump, by libyaml's emitter where PyYAML has it
    (1,024 services: 1.6 MB, 3.8 s in PyYAML's pure-Python emitter)."""
    return yaml.dump(compose, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def compose_spec(plan: Plan, cfg: JobConfig, code_dir: Path, user_dir: Optional[Path] = None,
                 rto_max_ms: Optional[int] = None) -> dict[str, Any]:
    """The compose file: one service per node on one private bridge network; rto_max_ms: the nodes'
    net.ipv4.tcp_rto_max_ms (engine.tcp_rto_max_ms), None for the kernel's."""
    c = cfg.cluster
    run_dir = plan.run_dir
    port = c.rdzv_port or DEFAULT_RDZV_PORT
    python = c.python or (sys.executable if c.image == "auto" else "python3")
    volumes = (python_mounts() if c.image == "auto" else []) + [f"{run_dir}:{run_dir}"] + list(c.mounts)
    user = container_user(cfg)
    services = {}
    user_code = str(user_dir) if user_dir else None
    # what every node's service shares, made once (OmegaConf reads per node add up to seconds at 1,024 nodes)
    head_env = {**runtime_env(cfg), **rank_env(cfg, run_dir, user_code)}  # then the node's name, then:
    shared_env = {
                  # the job imports the code frozen at launch; `-m` must not put the cwd before it
                  "PYTHONPATH": python_path(cfg, user_code, str(code_dir)), "PYTHONSAFEPATH": "1", "HOME": "/tmp",
                  # no bytecode written into the run dir (Python writes the first of it before
                  # launchers/node/wrapper.py can set the owner-only umask); the installed packages' own bytecode
                  # is still read. (A PYTHONPYCACHEPREFIX in the container would hide that bytecode: every
                  # container would compile torch's modules again before its ranks start.)
                  "PYTHONDONTWRITEBYTECODE": "1",
                  # Docker restarts a node that exits non-zero: not into a preflight that named a node
                  ENGINE_RESTARTS_ENV: "1",
                  "USER": f"uid{user.split(':')[0]}",
                  # secrets: named without a value, compose passes its own environment's (fsdp_jobs/planning/secret_env.py)
                  **{name: None for name in passed_names(cfg)}}
    entry = rank_entry(cfg, run_dir, user_code)
    restart = f"on-failure:{c.container_restarts}" if c.container_restarts else "no"
    # beyond `nodes`: started only by a scale (profile below); then cluster.spare_nodes hot spares, started with the
    # job, which torch's rendezvous keeps waiting beyond max_nodes (= nodes) until a node dies
    for i in range(plan.rendezvous.max_nodes + plan.spare_nodes):
        env = {**head_env, "FSDP_JOBS_NODE": f"node{i}", **shared_env,
               **(replica_env(plan, replica_group(i, plan), f"http://{LIGHTHOUSE}:{lighthouse_port(plan)}")
                  if plan.replicas else {})}
        service: dict[str, Any] = {
            "image": SKEL_IMAGE if c.image == "auto" else c.image,
            "hostname": f"node{i}",
            "user": user,
            "command": [python, "-m", NODE_WRAPPER, *node_args(plan, c, i, port), *entry],
            "environment": env,
            "volumes": list(volumes),
            "working_dir": run_dir,
            "networks": ["job"],
            "restart": restart,
            "shm_size": str(c.shm_size),
            # docker stop / Ctrl-C: torchrun's grace for the ranks' checkpoint, then ours
            "stop_grace_period": f"{c.stop_grace_s + 15}s",
            "labels": {LABEL: run_dir, "fsdp-jobs.node": str(i)},
            # training needs no capability and no setuid: a compromised rank stays that user
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"],
        }
        if plan.nodes <= i < plan.rendezvous.max_nodes:  # `compose up` starts no service with a profile (a scale names it)
            service["profiles"] = [SCALE_PROFILE]
        if c.cpus:
            service["cpus"] = float(c.cpus)
        if c.mem:
            service["mem_limit"] = str(c.mem)
        if c.device == "cuda":
            ids = [str(i * plan.gpus_per_node + g) for g in range(plan.gpus_per_node)]
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": ids, "capabilities": ["gpu"]}]}}}
        services[f"node{i}"] = service
    if plan.replicas is not None:
        services[LIGHTHOUSE] = lighthouse_service(plan, cfg, python, volumes, user, code_dir)
    for service in services.values() if rto_max_ms is not None else ():
        service["sysctls"] = {"net.ipv4.tcp_rto_max_ms": rto_max_ms, "net.ipv4.tcp_retries2": tcp_retries2(rto_max_ms)}
    network = {"driver": "bridge", "labels": {LABEL: run_dir}}
    if c.internal_network:
        network["internal"] = True
    # no "version": the Compose Specification (compose >= 1.27 and v2), which has GPU reservations
    return {"services": services, "networks": {"job": network}}


LIGHTHOUSE = "lighthouse"  # fault_tolerance=replica: the lighthouse's service (and host) name


def node_args(plan: Plan, c: DockerClusterConfig, i: int, port: int) -> list[str]:
    """Node i's torchrun flags: the job's rendezvous at node0, or with fault_tolerance=replica its replica
    group's at the group's first node, each agent named by its hostname (the group's rank 0 gives that
    name to the other groups: fsdp_jobs/runtime/replicas.py)."""
    if plan.replicas is None:
        return torchrun_args(plan, f"node0:{port}", c.stop_grace_s)
    group = replica_group(i, plan)
    first = group * plan.replicas.nodes_per_group
    return torchrun_args(plan, f"node{first}:{port}", c.stop_grace_s, group) + [f"--local-addr=node{i}"]


def lighthouse_service(plan: Plan, cfg: JobConfig, python: str, volumes: list[str], user: str, code_dir: Path) -> dict[str, Any]:
    """fault_tolerance=replica: the job's torchft lighthouse (launchers/lighthouse.py), a service beside the
    nodes on the job's network, never published on the host; compose down removes it with them."""
    c = cfg.cluster
    return {
        "image": SKEL_IMAGE if c.image == "auto" else c.image,
        "hostname": LIGHTHOUSE,
        "user": user,
        "command": lighthouse_command(plan, python, f"0.0.0.0:{lighthouse_port(plan)}"),
        "environment": {"PYTHONPATH": str(code_dir), "PYTHONSAFEPATH": "1", "HOME": "/tmp",
                        "PYTHONDONTWRITEBYTECODE": "1", "RUST_LOG": "warn"},
        "volumes": list(volumes),
        "networks": ["job"],
        "restart": "on-failure",  # stateless: a restarted one forms the next quorum from who asks
        "stop_grace_period": "5s",
        "labels": {LABEL: plan.run_dir, "fsdp-jobs.role": LIGHTHOUSE},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }


def drop_dotenv(run_dir: Path) -> None:
    """Compose reads a .env beside its file (variables, DOCKER_HOST): the run dir's, which the containers'
    user can write, must not steer the launcher's `compose up`/`down` (root under sudo). Called before both,
    when no container of the run is running."""
    (docker_dir(run_dir) / ".env").unlink(missing_ok=True)


def compose_args(compose: list[str], project: str, file: Path, *args: str) -> list[str]:
    return [*compose, "-p", project, "-f", str(file), *args]


@dataclass
class DockerRequest:
    """The compose file (as data) and the exact commands that start it and take it down."""

    compose: dict[str, Any]
    file: str  # where submit writes it: <run_dir>/docker/compose.yaml
    project: str
    code_dir: str  # the code snapshot the containers import (taken by submit)
    commands: list[list[str]]  # [up, down]
    user_dir: Optional[str]  # where submit copies the user's script/package, or None
    detach: bool

    def render(self) -> str:
        return (f"# {self.file}\n{compose_text(self.compose)}"
                f"# then (the second when the job ends{', run by a background supervisor' if self.detach else ''}):\n"
                + "\n".join(shlex.join(c) for c in self.commands))


class DockerBackend(Backend[DockerRequest]):
    name = "docker"

    def __init__(self) -> None:
        self.scaler, self.faults, self.stacks = DockerScaler(), DockerFaults(self), Stacks(self)

    def check(self, plan: Plan, cfg: JobConfig) -> None:
        why = engine_error()
        if why:
            raise UserError("cluster", "docker", f"no Docker engine reachable ({why}); start one with "
                                                 "`sudo deploy/docker/start.sh`, or set DOCKER_HOST")
        if not shutil.which(compose_command(cfg)[0]):
            raise UserError("cluster.compose", cfg.cluster.compose, "no docker compose here; install docker-compose "
                                                                    "(Debian: apt-get install docker-compose)")
        tcp_rto_max_ms(cfg.cluster.tcp_rto_max_ms, strict=True)  # a value Docker would fail to set: refused
        live = containers(project_name(Path(plan.run_dir)))
        if live:
            raise UserError("name", plan.name, f"run already has {len(live)} containers; cancel it "
                                               f"(fsdp-jobs cancel {plan.name}) or choose another name")

    def dryrun(self, plan: Plan, cfg: JobConfig) -> DryRun[DockerRequest]:
        run_dir = Path(plan.run_dir)
        code_dir = next_snapshot_dir(run_dir) if cfg.cluster.snapshot_code else PROJECT_ROOT
        user_dir = user_code_dir(cfg, run_dir)
        spec = compose_spec(plan, cfg, code_dir, user_dir, tcp_rto_max_ms(cfg.cluster.tcp_rto_max_ms))
        project = project_name(run_dir)
        file = docker_dir(run_dir) / COMPOSE_FILE
        compose = compose_command(cfg)
        # `down` with the scale profile: compose v2 removes only the services of the profiles it is given,
        # so the nodes a scale started would outlive the job (and its network)
        spares = ["--profile", SCALE_PROFILE] if plan.rendezvous.max_nodes > plan.nodes else []
        commands = [compose_args(compose, project, file, "up", "-d", "--no-build", "--remove-orphans"),
                    compose_args([*compose, *spares], project, file, "down", "-v", "--remove-orphans")]
        request = DockerRequest(spec, str(file), project, str(code_dir), commands,
                                str(user_dir) if user_dir else None, bool(cfg.cluster.detach))
        node0 = spec["services"]["node0"]
        entry = rank_entry(cfg, plan.run_dir, request.user_dir)
        return DryRun(self.name, plan, cfg, request, agent_args=node0["command"][3:-len(entry)],
                      agent_env={k: v for k, v in node0["environment"].items() if k in runtime_env(cfg)})

    def submit(self, dryrun: DryRun[DockerRequest]) -> Submitted:
        plan, cfg, req = dryrun.plan, dryrun.cfg, dryrun.request
        run_dir = Path(plan.run_dir)
        if cfg.cluster.image == "auto":
            ensure_skel_image()
        code = take_snapshot(Path(req.code_dir)) if cfg.cluster.snapshot_code else {"code": str(PROJECT_ROOT), "git_commit": ""}
        if req.user_dir:  # the user's script/package, where the containers' command names it
            take_user_code(cfg, Path(req.user_dir))
        Path(req.file).parent.mkdir(parents=True, exist_ok=True)
        runs.write_atomic(Path(req.file), compose_text(req.compose))
        drop_dotenv(run_dir)
        runs.clear_stop_request(run_dir)
        launch = LaunchRecord(backend="docker", job_id=req.project, nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
                              extra=dict(project=req.project, file=req.file, user=container_user(cfg),
                                         detach=bool(cfg.cluster.detach), down=req.commands[1],
                                         compose=compose_command(cfg), grace=cfg.cluster.stop_grace_s + 15, **code))
        with stop_signals() as caught:  # from the launch record on, a Ctrl-C stops the containers once they run
            return self.start_containers(dryrun, launch, caught)

    def start_containers(self, dryrun: DryRun[DockerRequest], launch: LaunchRecord, caught: list[int]) -> Submitted:
        """Record the launch, start the containers and supervise them (attached, or a stop signal `caught` while
        they started: stopped at once, CANCELLED) or leave that to a detached supervisor."""
        from fsdp_jobs.launchers.docker import supervisor as docker_supervisor

        plan, cfg, req = dryrun.plan, dryrun.cfg, dryrun.request
        run_dir = Path(plan.run_dir)
        runs.record_launch(run_dir, launch)
        launch_fields = launch.to_json()  # what the supervisor reads back, as the launch record holds it
        job = runs.load_job(run_dir)  # as submit wrote it, before any container could touch the run dir
        (docker_dir(run_dir) / RESULT_FILE).unlink(missing_ok=True)
        give_to(run_dir, container_user(cfg))
        # in a session of its own: the terminal's Ctrl-C stops the job (caught), never cuts compose up half way
        up = subprocess.run(req.commands[0], capture_output=True, text=True, timeout=300, start_new_session=True)
        if up.returncode:
            subprocess.run(req.commands[1], capture_output=True, timeout=300)
            lines = [ln for ln in up.stderr.strip().splitlines() if ln.strip()] or ["(no output)"]
            raise UserError("cluster", "docker", f"docker compose up failed: {lines[-1][:300]}")
        if cfg.cluster.detach and not caught:
            pid = docker_supervisor.start_detached(run_dir, launch_fields, job, req.compose)
            print(f"started {plan.nodes + plan.spare_nodes} containers (compose project {req.project}): {plan.name}\n"
                  f"  run dir:  {run_dir}\n"
                  f"  follow:   fsdp-jobs logs {plan.name} -f    status: fsdp-jobs status {plan.name}\n"
                  f"  cancel:   fsdp-jobs cancel {plan.name}     (supervisor pid {pid} removes the "
                  f"containers when the job ends)", flush=True)
            return Submitted(req.project)
        guardian = docker_supervisor.start_guardian(run_dir, launch_fields, job, req.compose)
        try:
            status = docker_supervisor.supervise(run_dir, launch_fields, job, req.compose, echo=True, caught=caught)
        except BaseException:  # a second Ctrl-C in the clean-up, an error: the guardian finishes it
            docker_supervisor.release_guardian(guardian, done=False)
            raise
        docker_supervisor.release_guardian(guardian)
        return Submitted(req.project, status)

    def describe(self, run: Run) -> JobStatus:
        project = own_project(run)
        result = read_result(run.run_dir)
        if result is not None and result.get("project") == project:
            said = outcome(run.run_dir, run.since, JobState.SUCCEEDED if result["exit_status"] == 0 else JobState.FAILED)
            state, kept = said.state, {"containers": result.get("containers", {})}
            if result.get("removed", True):
                return JobStatus(state, f"{state.value} (exit {result['exit_status']}; containers removed)", kept, said)
            # the supervisor is removing the containers (launchers/docker/supervisor.py writes the result
            # before and after): the job is ending, not ended, unless the supervisor died doing it
            if time.time() - float(result.get("time", 0)) < DOWN_TIMEOUT_S + 30:
                return JobStatus(JobState.RUNNING, f"ENDING ({state.value}, exit {result['exit_status']}; "
                                                   "removing the containers)", kept, said)
            return JobStatus(state, f"{state.value} (exit {result['exit_status']}; the supervisor did not confirm "
                                    "that the containers were removed)", kept, said)
        found = containers(project)
        if not found:  # gone without the supervisor's record: removed by hand, or the supervisor died
            said = outcome(run.run_dir, run.since, JobState.FAILED)
            return JobStatus(said.state, f"{said.state.value} (no containers left and no recorded result)",
                             {"containers": {}}, said)
        nodes = {name: f"{c['State']['Status']}" + (f" (exit {c['State']['ExitCode']})" if c["State"]["Status"] == "exited" else "")
                 + (f", restarted {c['RestartCount']}x" if c.get("RestartCount") else "") for name, c in found.items()}
        # `docker pause` (the cgroup freezer): the job holds its containers and goes on when unpaused, the watchdog
        # does not take the pause for a hang (ARCHITECTURE pitfall 32): running, and the detail says "paused"
        live = any(c["State"]["Status"] in ("running", "restarting", "created", "paused") for c in found.values())
        # every container exited but the supervisor has not recorded the result yet: the job is ending (the records
        # may already say how, but a terminal state now would turn back into ENDING once the result is written),
        # unless they exited long ago and no supervisor is left to record it
        ending = not live and time.time() - last_exit(found) < DOWN_TIMEOUT_S + 30
        said = outcome(run.run_dir, run.since, JobState.RUNNING if live or ending else JobState.UNKNOWN)
        shown = "ENDING" if ending else said.state.value
        return JobStatus(said.state, f"{shown} ({', '.join(f'{k}: {v}' for k, v in sorted(nodes.items()))})",
                         {"containers": nodes}, said)

    def cancel(self, run: Run) -> str:
        project = own_project(run)
        found = containers(project)
        if not found:
            return f"{run.run_dir.name} is not running (no containers of project {project})"
        # before the stop: the supervisor reads it when the last node ends, and a container still starting (whose
        # PID 1 may drop the SIGTERM) before it starts its agent
        runs.record_cancel(run.run_dir)
        # SIGTERM to every agent: the ranks checkpoint and stop; the supervisor removes the containers
        r = subprocess.run(["docker", "stop", "-t", str(int(run.launch.get("grace", 135))),
                            *[c["Id"] for c in found.values()]], capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise UserError("RUN", run.run_dir.name, f"docker stop failed: {r.stderr.strip()[:200]}")
        return (f"stopped {len(found)} containers of {run.run_dir.name} (project {project}); ranks that had begun "
                "to train checkpointed first")


class DockerScaler(Scaler):
    """The job's supervisor starts the new containers (from the compose file it holds in memory, never the run
    dir's copy, which the containers' user can rewrite); this waits until they exist."""

    def scale(self, run: Run, nodes: int) -> str:
        project = own_project(run)
        found = containers(project)
        if not found or read_result(run.run_dir) is not None:
            raise UserError("RUN", run.run_dir.name, "is not running: nothing to grow (submit it again with "
                                                     "nodes=N to resume at that size)")
        if nodes <= len(found):
            raise UserError("nodes", nodes, f"{run.run_dir.name} has {len(found)} nodes already; scale only grows")
        request_scale(run, nodes)  # the supervisor polls for it (its grow)
        deadline = time.monotonic() + SCALE_WAIT_S
        while time.monotonic() < deadline:
            now = containers(project)
            if len(now) >= nodes:
                return (f"started {', '.join(sorted(set(now) - set(found)))} of {run.run_dir.name}: they join the "
                        "rendezvous, the ranks checkpoint and go on at the new size")
            time.sleep(0.5)
        raise UserError("RUN", run.run_dir.name, f"its supervisor started no new container in {SCALE_WAIT_S}s "
                                                 f"(fsdp-jobs logs {run.run_dir.name} says why)")


class DockerFaults(Faults):
    """A node is a container: kill-node SIGKILLs its agent (Docker restarts it), stop-node removes it for good."""

    def inject(self, run: Run, kind: ChaosKind, node: int, rate: str = "100mbit", bit: int = DEFAULT_BIT) -> str:
        if kind not in (ChaosKind.KILL_NODE, ChaosKind.STOP_NODE):  # the rank-level faults: launchers/chaos/inject.py
            return super().inject(run, kind, node, rate, bit)
        found = containers(own_project(run))
        c = found.get(f"node{node}")
        if c is None or c["State"]["Status"] != "running":
            raise UserError("node", node, f"no running container for node{node}; nodes: "
                                          + (", ".join(f"{k} ({v['State']['Status']})" for k, v in sorted(found.items())) or "none"))
        if kind is ChaosKind.KILL_NODE:
            # SIGKILL from outside the container: Docker sees a failure and restarts it (on-failure);
            # `docker kill` would count as a manual stop and leave it down
            try:
                os.kill(int(c["State"]["Pid"]), signal.SIGKILL)
            except PermissionError:
                raise UserError("node", node, "cannot signal the container's agent from here (another user's "
                                              "container, or a remote engine)") from None
            then = ("its replica group rejoins and recovers live from the others" if runs.replica_layout(run.run_dir)
                    else "the job resumes from its newest checkpoint")
            return f"killed node{node}'s torchrun agent (pid {c['State']['Pid']}); Docker restarts the container and {then}"
        r = docker("kill", c["Id"])
        if r.returncode:
            raise UserError("node", node, f"docker kill failed: {r.stderr.decode(errors='replace').strip()[:200]}")
        return f"node{node} is gone for good (docker kill: not restarted); the others continue if min_nodes allows"


BACKEND = DockerBackend()
