"""How a sweep's members of one shape go out as SLURM job arrays (launchers/slurm/backend.py submit_jobs and
group_text use the same split, so a sweep's dry run shows exactly what is submitted).

One array holds at most the cluster's MaxArraySize elements: its indices run 0..MaxArraySize-1 (SLURM: "the
maximum job array task index value will be one less than MaxArraySize"). More members go out as consecutive
arrays of as even a size as can be (1,500 at MaxArraySize=1001: 750 + 750, never 1,001 + 499 nor a lone
last element), each with the sweep's throttle (cluster.array_parallelism, per array). MaxArraySize=0
(arrays disabled) or 1: every member is a job of its own.
"""

from __future__ import annotations

import functools
import re
import subprocess

DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's own default, taken when `scontrol show config` does not answer
SCONTROL_TIMEOUT_S = 10.0  # a controller that does not answer in this long: take the default


def scontrol_config() -> str:
    """`scontrol show config`'s text, or "" when scontrol is missing, fails or does not answer in time."""
    try:
        r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


@functools.lru_cache(maxsize=None)
def max_array_size() -> int:
    """The cluster's MaxArraySize, asked once per process (DEFAULT_MAX_ARRAY_SIZE when unreadable)."""
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)\s*$", scontrol_config(), flags=re.M)
    return int(m.group(1)) if m else DEFAULT_MAX_ARRAY_SIZE


def split(count: int, limit: int) -> list[range]:
    """Members 0..count-1 as consecutive submissions of at most max(limit, 1) each, sizes differing by at most
    one: split(1000, 1001) -> [range(0, 1000)]; split(1500, 1001) -> [range(0, 750), range(750, 1500)]."""
    if count <= 0:
        return []
    per = max(limit, 1)
    parts = -(-count // per)
    size, bigger = divmod(count, parts)  # the first `bigger` parts get one more
    out, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < bigger else 0)
        out.append(range(start, stop))
        start = stop
    return out


def throttle(parallelism: int | None, elements: int) -> int:
    """The K of --array=0-N%K: cluster.array_parallelism, or (None) every element at once."""
    return elements if parallelism is None else min(parallelism, elements)
