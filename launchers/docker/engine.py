"""The Docker engine as cluster=docker's backend (launchers/docker/backend.py) and its supervisor
(launchers/docker/supervisor.py) both use it: the docker command, compose, the skeleton image, who the
containers run as, the project's containers, and the supervisor's record of how they ended."""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import shlex
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional, TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

SKEL_IMAGE = "fsdp-jobs-skel:1"  # an empty root: /usr and Python come from the host, read-only
COMPOSE_FILE = "compose.yaml"  # the job's compose spec as submitted, in docker_dir
RESULT_FILE = "result.json"  # the supervisor's record of how the containers ended, in docker_dir
LEGACY_RESULT_FILE = "docker-result.json"  # where runs submitted before docker_dir existed have it: the top


def docker_dir(run_dir: Path) -> Path:
    """This backend's own folder in a run dir: the compose file (and the .env compose would read beside it,
    which drop_dotenv removes) and the supervisor's result."""
    return RunDir(run_dir).backend_dir("docker")  # launchers/docker/config.py NAME (engine imports no config)
DOWN_TIMEOUT_S = 300  # the most `docker compose down` is given to remove a job's containers and network
NOBODY = "65534:65534"


def docker(*args: str, timeout: float = 60, input: Optional[bytes] = None) -> subprocess.CompletedProcess[bytes]:
    """In a session of its own: the terminal's Ctrl-C is the launcher's to act on (it catches it), and must not cut a
    query it acts on (a `docker ps` cut by it read as "no containers": the supervisor let them go unstopped)."""
    return subprocess.run(["docker", *args], capture_output=True, timeout=timeout, input=input, start_new_session=True)


def compose_command(cfg: JobConfig) -> list[str]:
    """Compose v2 (`docker compose`) where installed, else v1 (`docker-compose`, Debian 12's)."""
    choice = str(cfg.cluster.compose)
    if choice != "auto":
        return shlex.split(choice)
    try:
        if docker("compose", "version", timeout=20).returncode == 0:
            return ["docker", "compose"]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return ["docker-compose"]


def engine_error() -> Optional[str]:
    """Why no engine answers (None when one does)."""
    try:
        r = docker("version", "--format", "{{.Server.Version}}", timeout=20)
    except FileNotFoundError:
        return "the docker command is not installed"
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer in 20 s"
    if r.returncode:
        lines = r.stderr.decode(errors="replace").strip().splitlines()
        return lines[-1][:200] if lines else "docker version failed"
    return None


RTO_MAX_SINCE = (6, 15)  # the first Linux with net.ipv4.tcp_rto_max_ms (per network namespace)
AUTO_RTO_MAX_MS = 1000
KERNEL_GIVE_UP_S = 924.6  # tcp_retries2's default 15 retransmissions, waits doubling from 0.2 s to the 120 s cap
MAX_RETRIES2 = 255  # the kernel keeps net.ipv4.tcp_retries2 in a byte


def tcp_retries2(rto_max_ms: int) -> int:
    """net.ipv4.tcp_retries2 beside a capped backoff: the retransmissions whose waits (0.2 s doubling, up to the
    cap) add up to the kernel's default give-up time, 15 minutes, at most MAX_RETRIES2 (at a 1 s cap: 4 min).
    With the default 15, a 1 s cap gave up after 15 s: a node cut off for longer had its agent fail on the store
    and its container restarted."""
    waited, waits = 0.0, 0
    while waited < KERNEL_GIVE_UP_S:
        waited += min(0.2 * 2 ** waits, rto_max_ms / 1000)
        waits += 1
    return max(15, min(MAX_RETRIES2, waits - 1))  # the wait after the last retransmission is the last one


def engine_kernel() -> Optional[tuple[int, int]]:
    """The engine's kernel (major, minor), which its containers share; None where no engine answers."""
    try:
        r = docker("info", "--format", "{{.KernelVersion}}", timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    found = re.match(r"(\d+)\.(\d+)", r.stdout.decode(errors="replace").strip()) if r.returncode == 0 else None
    return (int(found[1]), int(found[2])) if found else None


def tcp_rto_max_ms(setting: str, kernel: Optional[Callable[[], Optional[tuple[int, int]]]] = None,
                   strict: bool = False) -> Optional[int]:
    """The net.ipv4.tcp_rto_max_ms the containers get for cluster.tcp_rto_max_ms (None: the kernel's own); the
    engine's kernel (`kernel`, else `engine_kernel`) is asked only where the answer depends on it. strict: a value
    set on a kernel without the setting is refused (Docker would fail to create the containers)."""
    setting, kernel = str(setting).lower(), kernel or engine_kernel
    if setting == "off":
        return None
    if setting == "auto":
        found = kernel()
        return AUTO_RTO_MAX_MS if found is not None and found >= RTO_MAX_SINCE else None
    found = kernel() if strict else None
    if found is not None and found < RTO_MAX_SINCE:
        raise UserError("cluster.tcp_rto_max_ms", setting, f"the engine's kernel ({found[0]}.{found[1]}) has no "
                        f"net.ipv4.tcp_rto_max_ms (Linux {RTO_MAX_SINCE[0]}.{RTO_MAX_SINCE[1]} on): auto or off")
    return int(setting)


def ensure_skel_image() -> None:
    """Build SKEL_IMAGE (a few empty directories, 0.05 s) unless the engine already has it."""
    if docker("image", "inspect", SKEL_IMAGE).returncode == 0:
        return
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, mode: int = 0o755, kind: bytes = tarfile.DIRTYPE, target: str = "",
                data: bytes = b"") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, target, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
        for d in ("etc", "proc", "sys", "dev", "root", "run", "usr", "home", "var"):
            add(d)
        add("tmp", 0o1777)
        for d in ("bin", "lib", "lib64", "sbin"):  # Debian 12's merged /usr, as on the host
            add(d, kind=tarfile.SYMTYPE, target=f"usr/{d}")
        for name, data in (("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n"),
                           ("etc/group", b"root:x:0:\nnogroup:x:65534:\n"), ("etc/hosts", b""),
                           ("etc/resolv.conf", b""), ("etc/hostname", b"")):
            add(name, 0o644, tarfile.REGTYPE, data=data)
    r = docker("import", "-", SKEL_IMAGE, input=buf.getvalue())
    if r.returncode:
        raise UserError("cluster.image", "auto", f"docker import failed: {r.stderr.decode(errors='replace').strip()[:200]}")


def invoking_user() -> tuple[int, int]:
    """The user who asked for the job: sudo's caller when run through sudo, else this process's user."""
    if os.getuid() == 0 and os.environ.get("SUDO_UID", "").isdigit() and os.environ.get("SUDO_GID", "").isdigit():
        return int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    return os.getuid(), os.getgid()


def container_user(cfg: JobConfig) -> str:
    """UID:GID the containers run as: cluster.user, else the invoking user; never root (root gets nobody)."""
    if cfg.cluster.user:
        return str(cfg.cluster.user)
    uid, gid = invoking_user()
    return NOBODY if uid == 0 else f"{uid}:{gid}"


def containers(project: str) -> dict[str, dict[str, Any]]:
    """`docker inspect` of the project's node containers, by compose service name (node0, node1, ...)."""
    if not project:
        return {}
    try:
        ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}", timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    id_list = ids.stdout.decode().split()
    if ids.returncode or not id_list:
        return {}
    r = docker("inspect", *id_list, timeout=30)
    if r.returncode:  # a container removed between the two calls
        return {}
    # the nodes (label fsdp-jobs.node), not a replica job's lighthouse service, which compose down removes with them
    return {c["Config"]["Labels"].get("com.docker.compose.service", c["Name"]): c for c in json.loads(r.stdout)
            if "fsdp-jobs.node" in (c["Config"].get("Labels") or {})}


def last_exit(found: dict[str, dict[str, Any]]) -> float:
    """When the last of these inspected containers exited (Unix time; 0.0 when none says)."""
    ends = []
    for c in found.values():
        stamp = str(c.get("State", {}).get("FinishedAt", ""))[:26].rstrip("Z")  # Docker's nanoseconds: microseconds
        try:
            ends.append(datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp())
        except ValueError:
            continue
    return max(ends, default=0.0)


def read_result(run_dir: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((docker_dir(run_dir) / RESULT_FILE).read_text())
    except FileNotFoundError:
        pass
    except (OSError, json.JSONDecodeError):
        return None
    try:
        return json.loads((run_dir / LEGACY_RESULT_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def give_to(path: Path, user: str) -> None:
    """Files the launcher writes as root (through sudo) go to the user the containers run as (the
    invoking user), so both can write the run dir. A non-root launcher already writes them as that user."""
    if os.getuid() != 0:
        return
    uid, gid = (int(x) for x in user.split(":"))
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        try:
            os.lchown(p, uid, gid)
        except FileNotFoundError:
            pass
