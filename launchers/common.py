"""What every backend launches the same way: the torchrun command line and the ranks' environment."""

from __future__ import annotations

import functools
import math
import os.path
import re
from importlib import metadata
from pathlib import Path
from typing import Optional, TYPE_CHECKING

from fsdp_jobs.planning.plan import LIGHTHOUSE_ENV, REPLICA_ADDR_ENV, REPLICA_GROUP_ENV  # noqa: F401  (backends import them here)
from fsdp_jobs.planning.secret_env import MASK

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan


def torchrun_args(plan: Plan, endpoint: str, stop_grace_s: int, group: Optional[int] = None) -> list[str]:
    """torchrun (elastic agent) flags for one node of the plan; the rendezvous decides node order.
    stop_grace_s: on SIGTERM torchrun gives the ranks this long (default 30 s) to save and exit.
    `group`: with fault_tolerance=replica, the node's replica group, whose torchrun world is its own
    (its nodes, its rendezvous at `endpoint`, its restarts): replica_group() below."""
    r = plan.rendezvous
    nnodes = f"{r.min_nodes}:{r.max_nodes}" if r.min_nodes != r.max_nodes else str(r.max_nodes)
    run_id, world = r.run_id, r.max_nodes
    if plan.replicas is not None:
        if group is None:
            raise ValueError("a replica job's torchrun flags are per replica group")
        nnodes, run_id = str(plan.replicas.nodes_per_group), f"{r.run_id}-rg{group}"
        world = plan.replicas.nodes_per_group
    # a job that may grow starts with fewer than its rendezvous' most nodes: once min_nodes have joined,
    # torchrun's c10d rendezvous waits last_call_timeout (30 s by default) for more, at every start
    # and restart; the nodes a `scale` adds join a running job instead (fsdp-jobs scale). Only where
    # min_nodes is `nodes`: with a lower bound the 30 s are what lets late nodes into the first round
    grow = r.max_nodes > plan.nodes and r.min_nodes == plan.nodes
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={plan.gpus_per_node}",
        f"--rdzv-backend={r.backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--max-restarts={r.max_restarts}",
        f"--monitor-interval={monitor_interval_s(world)}",
        *([f"--shutdown-timeout={stop_grace_s}"] if torchrun_has_shutdown_timeout() else []),
        *rdzv_conf(world, grow),
    ]


GROW_LAST_CALL_S = 2

# torchrun's c10d rendezvous keeps the whole membership in one store key that every agent rewrites by
# compare-and-set, so its cost grows with the nodes of one torchrun world (fsdp_jobs/bench/rendezvous.py
# simulates it). Up to LARGE_WORLD_NODES torch's defaults hold; above, three of them do not:
# - join_timeout (600 s, counted by each agent from its own start): the first agent up waits for the last
#   one, and a large job's nodes come up over many minutes (image pulls share a registry, allocations and
#   pods start over minutes): 10 min plus 1 s per node (27 min at 1,024), where a node that never comes
#   still fails the round rather than hold the allocation for hours;
# - keep_alive_interval x keep_alive_max_attempt (5 s x 3): an agent whose heartbeat is not written for
#   that long is dropped as dead. When all agents enter a round at once (every restart: their workers fail
#   together), each winning write costs a losing attempt of every other agent, and a heartbeat that comes
#   due queues behind them: with more than ~480 agents at a 1,024-node state (81 KB; the store's cost of a
#   losing attempt: fsdp_jobs/ARCHITECTURE.md, "What grows with the job") live agents are dropped about as
#   fast as they join and the round never completes (the simulation shows it at far fewer agents, whose
#   attempts are slower on a small machine).
#   60 s x 3: heartbeats first come due after such a round, 120 s of slack (~1,600 agents), 12x fewer
#   heartbeat writes; a lost node is dropped within 180 s, less than the hang watchdog (>= 60 s) plus the
#   collective timeout after which the others restart anyway;
# - --monitor-interval: every agent's monitor loop reads the whole state each time (1,024 x 81 KB a
#   second at 1 s): every 5 s instead; the agent then notices its workers' exit within 5 s instead of 1.
LARGE_WORLD_NODES = 256
LARGE_MONITOR_INTERVAL_S = 5
# Up to LARGE_WORLD_NODES, torch's own default (0.1 s): a failed rank is noticed within 0.1 s instead of 1 s,
# half a second of every restart on average (`python -m fsdp_jobs.bench recovery` times a restart). The
# store's load is not set by it: beside the agent's polls of its own processes (local, cheap) its only store
# read is the check for waiting nodes, which goes through the rendezvous state's cache (torch's
# _BackendRendezvousStateHolder.sync), so each agent reads the state at most once per cache period:
# launchers/node/agent.py's rendezvous_poll_s, whose budget holds the load of the whole world.
SMALL_MONITOR_INTERVAL_S = 0.1


def monitor_interval_s(world: int) -> float:
    """torchrun's --monitor-interval for a torchrun world of `world` nodes."""
    return SMALL_MONITOR_INTERVAL_S if world <= LARGE_WORLD_NODES else LARGE_MONITOR_INTERVAL_S
LARGE_KEEP_ALIVE_S = 60
# Up to LARGE_WORLD_NODES: a node whose agent died with it (a container killed, a host lost, slurmd stopped with its
# processes) stays among the round's participants until its keep-alive lapses (keep_alive_interval x
# keep_alive_max_attempt), and the next round begins only once no participant is left: every survivor and the
# node's replacement waited out torch's 5 s x 3 (Docker, a container's agent killed: 14.1 s back to a step once in
# three, 4.6-5.0 s the others, whose replacement seems to have taken its predecessor's identity, address and pid,
# in the state); a node's new agent now drops a dead predecessor of another pid itself (launchers/node/agent.py
# `forget_this_nodes_dead_agent`), so a node gone for good is what is waited out. Each keep-alive rewrites the whole
# state (a key per node): the interval grows with the square of the nodes, as the rendezvous poll does
# (launchers/node/agent.py rendezvous_poll_s), from SMALL_KEEP_ALIVE_S to torch's 5 s at 64 nodes, so the
# store's load never exceeds torch's own at 64 nodes. A live node dropped by a late keep-alive (an agent starved
# for 3 s) stays out of the round's list while its workers run (torch sends no more beats for a node the state
# lacks) and is back at the next round; the watchdog does not take it for a lost node while the ranks step
# (launchers/node/watchdog.py left_stall_s).
SMALL_KEEP_ALIVE_S = 1
TORCH_KEEP_ALIVE_S = 5
KEEP_ALIVE_BUDGET_NODES = 64


def keep_alive_s(world: int) -> int:
    """torch's rendezvous keep_alive_interval (whole seconds) for a torchrun world of `world` nodes."""
    if world > LARGE_WORLD_NODES:
        return LARGE_KEEP_ALIVE_S
    scaled = TORCH_KEEP_ALIVE_S * world * world / KEEP_ALIVE_BUDGET_NODES ** 2
    return int(min(TORCH_KEEP_ALIVE_S, max(SMALL_KEEP_ALIVE_S, math.ceil(scaled))))


TORCH_JOIN_TIMEOUT_S = 600  # torch's c10d rendezvous default


def join_timeout_s(world: int) -> int:
    """How long an agent waits for a rendezvous round of a torchrun world of `world` nodes to complete."""
    return TORCH_JOIN_TIMEOUT_S + world if world > LARGE_WORLD_NODES else TORCH_JOIN_TIMEOUT_S


def rdzv_conf(world: int, grow: bool) -> list[str]:
    """torchrun's --rdzv-conf for a torchrun world of `world` nodes (one flag: torchrun keeps the last)."""
    conf: dict[str, int] = {}
    if world > LARGE_WORLD_NODES:
        conf["join_timeout"] = join_timeout_s(world)
    if keep_alive_s(world) != TORCH_KEEP_ALIVE_S:
        conf.update(keep_alive_interval=keep_alive_s(world), keep_alive_max_attempt=3)
    if grow:
        conf["last_call_timeout"] = GROW_LAST_CALL_S
    return [f"--rdzv-conf={','.join(f'{k}={v}' for k, v in conf.items())}"] if conf else []


def replica_group(node: int, plan: Plan) -> int:
    """The replica group of the node-th node (0-based): consecutive nodes form a group, as consecutive
    ranks form a shard group without replica mode (fsdp_jobs/runtime/mesh.py)."""
    return node // plan.replicas.nodes_per_group


def replica_env(plan: Plan, group: int, lighthouse: str) -> dict[str, str]:
    """What the agents of one replica group need beyond runtime_env (empty without replica mode)."""
    if plan.replicas is None:
        return {}
    return {REPLICA_GROUP_ENV: str(group), LIGHTHOUSE_ENV: lighthouse}


DEFAULT_LIGHTHOUSE_PORT = 29510  # fault_tolerance.lighthouse_port=null on a backend whose job has its own network


def lighthouse_port(plan: Plan) -> int:
    return plan.replicas.lighthouse_port or DEFAULT_LIGHTHOUSE_PORT


def lighthouse_command(plan: Plan, python: str, bind: str) -> list[str]:
    """The lighthouse process (launchers/lighthouse.py) listening on `bind` (HOST:PORT)."""
    from fsdp_jobs.launchers.lighthouse import args_for

    r = plan.replicas
    return [python, "-m", "fsdp_jobs.launchers.lighthouse",
            *args_for(bind, r.min_replicas, r.heartbeat_timeout_s, r.quorum_tick_ms)]


@functools.lru_cache(maxsize=1)
def torchrun_has_shutdown_timeout() -> bool:
    """Whether torchrun takes --shutdown-timeout: torch 2.13 does, torch 2.11's torchrun refuses the
    flag and exits (pyproject.toml asks for torch>=2.13 for it). Read from the installed distribution's
    metadata, never by importing torch (planning imports no torch, fsdp_jobs/ARCHITECTURE.md). This is the torch
    installed where the job is planned: with cluster=local that is the torch the agents run; a remote
    backend's image or environment may differ, which this cannot see. No torch found, or a version this
    cannot read: the flag stays, as the requirement says. Without the flag an older torchrun gives the
    ranks its own default grace on SIGTERM instead of stop_grace_s."""
    try:
        m = re.match(r"(\d+)\.(\d+)", metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return True
    return m is None or (int(m.group(1)), int(m.group(2))) >= (2, 13)


def runtime_env(cfg: JobConfig) -> dict[str, str]:
    """Environment every agent and rank needs, whatever the backend."""
    env = {
        # torch 2.13: without it, restarted workers read stale addresses from the rendezvous
        # store the agent shares with them and fail in init_process_group (fsdp_jobs/ARCHITECTURE.md, pitfall 1)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if "signal" in cfg.cluster:
        env["FSDP_JOBS_STOP_SIGNAL"] = str(cfg.cluster.signal)  # the ranks checkpoint and stop on it
    if cfg.cluster.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # several ranks share the cores; torchrun would set 1 anyway
    if cfg.fault_tolerance.mode == "replica":
        env["RUST_LOG"] = "warn"  # torchft's servers log every quorum and commit of every rank at info
    # a masked secret is not a value: it reaches the ranks from the submitting process's environment
    env.update({str(k): str(v) for k, v in cfg.cluster.env.items() if v != MASK})
    return env


# the run dir of the job, for every rank (fsdp_jobs.job.init() reads the job config from it) and the copy of the
# user's code (script=/module=) that the ranks run, decided by the dry run and taken by submit
RUN_DIR_ENV = "FSDP_JOBS_RUN_DIR"
NODE_WRAPPER = "fsdp_jobs.launchers.node"  # what every backend starts on each node, around torchrun (launchers/node/wrapper.py)
USER_CODE_SHIM = "fsdp_jobs.runtime.user_code"  # runs script=/module= under torchrun's @record
USER_CODE_ENV = "FSDP_JOBS_USER_CODE"


def user_mode(cfg: JobConfig) -> bool:
    """script= or module=: the user's own training runs instead of the built-in trainer."""
    return bool(cfg.get("script") or cfg.get("module"))


def user_code_dir(cfg: JobConfig, run_dir: Path) -> Optional[Path]:
    """Where submit copies the user's code (RunDir.script_dir/NNN), or None: the built-in trainer, or a
    module installed in the environment."""
    from fsdp_jobs.planning.byo import user_code_source
    from fsdp_jobs.launchers.snapshot import next_user_code_dir

    if not user_mode(cfg) or user_code_source(cfg) is None:
        return None
    return next_user_code_dir(run_dir)


def rank_entry(cfg: JobConfig, run_dir: str, user_dir: Optional[str]) -> list[str]:
    """What torchrun starts on every rank, after its own flags: THE place the entry point is chosen, for
    every backend. The built-in trainer takes the run dir; a user's script or module runs under
    fsdp_jobs/runtime/user_code.py, which records its exception in torchrun's error file as the trainer
    does. Everything after the `--` is the rank's, which torchrun drops: without it torchrun's parser
    would claim arguments that prefix-match its own flags (`--log`, `--max`, `--nproc`: fsdp_jobs/ARCHITECTURE.md,
    pitfall 5)."""
    args = [str(a) for a in cfg.get("script_args") or []]
    if cfg.get("preflight") == "only":  # the checks alone, whatever trains later (fsdp_jobs/runtime/preflight.py)
        return ["-m", "fsdp_jobs.runtime", run_dir]
    if cfg.get("script"):
        script = str(Path(user_dir or Path(str(cfg.get("script"))).parent) / Path(str(cfg.get("script"))).name)
        return ["-m", USER_CODE_SHIM, "--", script, *args]
    if cfg.get("module"):
        return ["-m", USER_CODE_SHIM, "--", "-m", str(cfg.get("module")), *args]
    return ["-m", "fsdp_jobs.runtime", run_dir]


def rank_env(cfg: JobConfig, run_dir: str, user_dir: Optional[str]) -> dict[str, str]:
    """The per-run part of the ranks' environment (runtime_env is the per-config part)."""
    env = {RUN_DIR_ENV: run_dir}
    if user_dir:
        env[USER_CODE_ENV] = user_dir
    return env


def python_path(cfg: JobConfig, user_dir: Optional[str], rest: str = "") -> str:
    """PYTHONPATH for the ranks: the copy of the user's code first (a module='s package; a script's
    siblings, which PYTHONSAFEPATH=1 would otherwise hide where a backend sets it), then `rest`."""
    parts = ([user_dir] if user_dir else []) + ([rest] if rest else [])
    return ":".join(parts)


# host paths that hand a container the machine, and container paths that would replace its system
SYSTEM_PATHS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/dev", "/proc", "/sys", "/root",
                "/var/run", "/run", "/var/lib/docker", "/var/lib/kubelet")


def system_path(path: str) -> bool:
    """/, a system directory or anything under one, or a socket (the container engine's)."""
    p = os.path.normpath(path)
    return p == "/" or p.endswith(".sock") or any(p == s or p.startswith(s + "/") for s in SYSTEM_PATHS)
