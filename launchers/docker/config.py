"""cluster=docker's keys: one container per node through docker-compose (launchers/docker/backend.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

from fsdp_jobs.planning.chaos_kinds import MARATHON_ON_RANKS, ON_NETWORK, ON_RANKS, ChaosKind
from fsdp_jobs.planning.cluster_config import (BackendTraits, ClusterConfig, NodeMemory, choice, positive,
                                               register_cluster_schema)
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.launchers.common import system_path

if TYPE_CHECKING:  # types only, never imported at run time: no import cycle
    from fsdp_jobs.planning.config import JobConfig

NAME = "docker"
# spare nodes: K more containers, started with the job (launchers/docker/backend.py compose_spec); a node is a
# container of its own, which kill-node and stop-node act on (launchers/docker/backend.py DockerFaults)
TRAITS = BackendTraits(host_files=True, spare_nodes=True, scale="",
                       chaos=(*ON_RANKS, *ON_NETWORK, ChaosKind.KILL_NODE, ChaosKind.STOP_NODE),
                       marathon=(*MARATHON_ON_RANKS, ChaosKind.KILL_NODE, ChaosKind.CUT_NODE), stacks=True)


@dataclass
class DockerClusterConfig(ClusterConfig):
    """One container per node through docker-compose on a local engine, on a private bridge network."""

    backend: str = "docker"
    device: str = "cpu"  # cpu (gloo) or cuda (nccl; node i is given GPUs i*gpus_per_node ...)
    # auto = a minimal image built here in a second: this machine's Python, torch and packages come in
    # through read-only bind mounts at the same paths. Or any image that has torch and the project's
    # dependencies (deploy/docker/Dockerfile builds one); the code always comes from the run's snapshot
    image: str = "auto"  # auto = minimal local image + this machine's Python via read-only mounts; or an image name
    python: Optional[str] = None  # the interpreter in the container; None = this one (image=auto) or python3
    detach: bool = False  # return at once; follow with fsdp-jobs status|logs -f|cancel RUN
    user: Optional[str] = None  # "UID:GID" the containers run as; None = the invoking user (sudo's caller)
    shm_size: str = "2g"  # /dev/shm per container (NCCL and data loaders need more than Docker's 64m)
    container_restarts: int = 3  # Docker restarts a failed container this often (restart: on-failure:N)
    mounts: List[str] = field(default_factory=list)  # extra bind mounts "SRC:DST[:ro]"
    internal_network: bool = False  # true = the job's network has no route out of this machine
    cpus: Optional[float] = None  # CPU limit per container (compose cpus)
    mem: Optional[str] = None  # memory limit per container, e.g. "16g"
    compose: str = "auto"  # auto (docker compose v2 if present, else docker-compose v1), or a command
    snapshot_code: bool = True  # run from a copy of the code taken at launch (restarts too)
    rdzv_port: Optional[int] = None  # None = 29400 (each job has its own network, so no clash)
    # net.ipv4.tcp_rto_max_ms in the job's containers (their own network namespaces): how long TCP backs off
    # between retransmissions at most. The kernel's 120 s cap doubles from 0.2 s while a node is cut off, so a
    # connection healed after 5 s resent only ~3 s later. auto (the default) = 1000 where the engine's kernel has
    # the setting (Linux 6.15+, asked at launch); or 1000-120000; off = the kernel's own. net.ipv4.tcp_retries2
    # goes with it, so a cut node's connections last about as long as by default (at 1000: 4 min, not 15 s)
    tcp_rto_max_ms: str = "auto"
    # the containers never run as root nor see the host's system directories or the Docker socket
    # (root in a container with the socket is root on the host); true lifts both refusals
    allow_root: bool = False


SCHEMA = DockerClusterConfig
RTO_MAX_RANGE = (1000, 120000)  # what the kernel accepts for net.ipv4.tcp_rto_max_ms


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: DockerClusterConfig) -> None:
    """The checks of cluster.* keys the types alone do not express; the first bad key raises UserError."""
    choice("cluster.device", cl.device, ("cpu", "cuda"))
    rto = str(cl.tcp_rto_max_ms).lower()
    if rto not in ("auto", "off") and not (re.fullmatch(r"[0-9]+", rto) and RTO_MAX_RANGE[0] <= int(rto) <= RTO_MAX_RANGE[1]):
        raise UserError("cluster.tcp_rto_max_ms", cl.tcp_rto_max_ms, f"must be auto, off, or milliseconds from "
                                                                     f"{RTO_MAX_RANGE[0]} to {RTO_MAX_RANGE[1]} (the kernel's range)")
    positive("cluster.container_restarts", cl.container_restarts, minimum=0)
    if cl.user is not None and not re.fullmatch(r"\d+:\d+", str(cl.user)):
        raise UserError("cluster.user", cl.user, "must be UID:GID (numbers), or null for the invoking user")
    if not re.fullmatch(r"\d+[bkmg]?", str(cl.shm_size).lower()):
        raise UserError("cluster.shm_size", cl.shm_size, "must be a size such as 2g, 512m")
    if cl.mem is not None and not re.fullmatch(r"\d+[bkmg]?", str(cl.mem).lower()):
        raise UserError("cluster.mem", cl.mem, "must be a size such as 16g, 512m, or null for no limit")
    if cl.user is not None and str(cl.user).split(":")[0] == "0" and not cl.allow_root:
        raise UserError("cluster.user", cl.user, "uid 0 is root: the containers run as a user (null = the "
                                                 "invoking one); cluster.allow_root=true if you really mean it")
    for m in cl.mounts:
        if not re.fullmatch(r"/[^:]*:/[^:]*(:ro|:rw)?", str(m)):
            raise UserError("cluster.mounts", m, "each mount is /host/path:/container/path[:ro]")
        src, dst = str(m).split(":")[:2]
        for side, path in (("host", src), ("container", dst)):
            if system_path(path) and not cl.allow_root:
                raise UserError("cluster.mounts", m, f"the {side} path {path} is the system's (/, /etc, /usr, /proc, "
                                                     "/sys, /dev, /boot, /root, the Docker socket ...): mount your data "
                                                     "directories; cluster.allow_root=true if you really mean it")


SIZE_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}  # Docker's, binary; no suffix = bytes


def size_bytes(text: str) -> int:
    """A size as cluster.shm_size and cluster.mem take it (validate checked its form): 2g, 512m, 1024."""
    text = str(text).lower()
    return int(text.rstrip("bkmg")) * SIZE_UNITS.get(text[-1], 1)


def snapshot_memory(cfg: JobConfig) -> NodeMemory:
    """A node is a container: its in-memory snapshots live in its /dev/shm, a tmpfs of cluster.shm_size, whose pages
    also count against cluster.mem where one is set: the smaller of the two binds."""
    cl = cfg.cluster
    shm = NodeMemory("cluster.shm_size", cl.shm_size, size_bytes(cl.shm_size), "the /dev/shm of each container",
                     spell=lambda n: f"{-(-n // 1024**3)}g")
    if cl.mem is not None and 0 < size_bytes(cl.mem) < shm.size:
        return NodeMemory("cluster.mem", cl.mem, size_bytes(cl.mem), "the /dev/shm of each container, within its "
                          "memory limit", spell=shm.spell)
    return shm
