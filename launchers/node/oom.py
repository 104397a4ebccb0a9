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
CGROUP_ROOT = Path("/sys/fs/cgroup")


def counter_file(proc_cgroup: str, root: Path = CGROUP_ROOT) -> Optional[Path]:
    """The file holding this process's memory cgroup's OOM kill count, from /proc/self/cgroup's text."""
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
    candidates = []
    if v2 is not None:  # unified: mounted at the root, or beside the v1 hierarchies (a hybrid host)
        candidates += [root / v2.lstrip("/") / "memory.events", root / "unified" / v2.lstrip("/") / "memory.events"]
    if v1 is not None:
        candidates.append(root / "memory" / v1.lstrip("/") / "memory.oom_control")
    return next((c for c in candidates if c.is_file()), None)


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


class OomWatch:
    """New OOM kills in this node's memory cgroup since the node started (or since the last look)."""

    def __init__(self, proc_cgroup: Optional[str] = None, root: Path = CGROUP_ROOT) -> None:
        try:
            text = proc_cgroup if proc_cgroup is not None else PROC_CGROUP.read_text()
        except OSError:
            text = ""
        self.path = counter_file(text, root)
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
