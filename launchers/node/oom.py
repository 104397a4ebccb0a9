"""The kernel's OOM killer, as a node sees it: the kills counted in the node's memory cgroup.

A rank the OOM killer takes gets SIGKILL and records nothing; torchrun only says "Signal 9 (SIGKILL)", which
a user's `kill -9` or a scheduler also sends. The memory cgroup the node wrapper runs in (a container's, a
SLURM step's, a pod's, or the login session's on cluster=local) counts every OOM kill in it and below it:
cgroup v2 `memory.events` (oom_kill, its descendants included), cgroup v1 `memory.oom_control` (oom_kill).
The wrapper reads it once a second (one small node-local file: no shared-storage traffic) and names a new
kill as out of memory. None where neither can be read (no memory controller, an unprivileged container
without its cgroup mounted): the failure is then reported as before, never guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MOUNTINFO = Path("/proc/self/mountinfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def counter_file(proc_cgroup: str, root: Path = CGROUP_ROOT, mountinfo: str = "") -> Optional[Path]:
    """The file holding this process's memory cgroup's OOM kill count, from /proc/self/cgroup's text and,
    where given, /proc/self/mountinfo's: a container without a cgroup namespace of its own (Docker on a
    cgroup v1 host) sees the host's path in /proc/self/cgroup (/docker/ID) while its /sys/fs/cgroup/memory
    is that cgroup itself (mounted with root /docker/ID): the mount's root is taken off the path."""
    v1, v2 = None, None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    mounts = cgroup_mounts(mountinfo)
    candidates = []
    if v2 is not None:  # unified: mounted at the root, or beside the v1 hierarchies (a hybrid host)
        candidates += [_below(m, v2) / "memory.events" for m in mounts.get("cgroup2", []) if _below(m, v2)]
        candidates += [root / v2.lstrip("/") / "memory.events", root / "unified" / v2.lstrip("/") / "memory.events"]
    if v1 is not None:
        candidates += [_below(m, v1) / "memory.oom_control" for m in mounts.get("memory", []) if _below(m, v1)]
        candidates.append(root / "memory" / v1.lstrip("/") / "memory.oom_control")
    return next((c for c in candidates if c.is_file()), None)


def cgroup_mounts(mountinfo: str) -> dict[str, list[tuple[str, Path]]]:
    """{"cgroup2" | "memory": [(the mount's root in the hierarchy, where it is mounted)]} from mountinfo's
    text (proc(5): ID PARENT MAJ:MIN ROOT MOUNTPOINT ... - FSTYPE SOURCE SUPEROPTS)."""
    found: dict[str, list[tuple[str, Path]]] = {}
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            found.setdefault("cgroup2", []).append((fields[3], Path(fields[4])))
        elif tail[0] == "cgroup" and "memory" in tail[2].split(","):
            found.setdefault("memory", []).append((fields[3], Path(fields[4])))
    return found


def _below(mount: tuple[str, Path], path: str) -> Optional[Path]:
    """Where cgroup `path` is under this mount, or None when the mount does not hold it."""
    mount_root, where = mount
    rel = Path(path).relative_to(mount_root) if Path(path).is_relative_to(mount_root) else None
    return None if rel is None else where / rel


def read_kills(path: Optional[Path]) -> Optional[int]:
    """The oom_kill count in a memory.events or memory.oom_control file (None: unreadable, or no such key)."""
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def read_or_empty(path: Path) -> str:
    """A kernel file's text; "" where it cannot be read (no such cgroup controller, a process gone)."""
    try:
        return path.read_text()
    except OSError:
        return ""


class OomWatch:
    """New OOM kills in this node's memory cgroup since the node started (or since the last look)."""

    def __init__(self, proc_cgroup: Optional[str] = None, root: Path = CGROUP_ROOT,
                 mountinfo: Optional[str] = None) -> None:
        text = proc_cgroup if proc_cgroup is not None else read_or_empty(PROC_CGROUP)
        mounts = mountinfo if mountinfo is not None else "" if proc_cgroup is not None else read_or_empty(PROC_MOUNTINFO)
        self.path = counter_file(text, root, mounts)
        self.start = self.last = read_kills(self.path)

    def new_kills(self) -> int:
        """Kills since the last call (0 where the count cannot be read)."""
        now = read_kills(self.path)
        if now is None or self.last is None:
            return 0
        new, self.last = max(0, now - self.last), now
        return new

    def total(self) -> int:
        """Kills since the node started."""
        return max(0, (self.last or 0) - (self.start or 0)) if self.start is not None else 0

    def where(self) -> str:
        return str(self.path.parent) if self.path else "its memory cgroup"
