"""Count what a running job writes into its run dir (Linux inotify, no dependency): the measure behind
"the shared run dir receives O(nodes) bookkeeping writes" (`python -m fsdp_jobs.bench rundir-writes`).

A write here is a metadata operation a shared filesystem's server sees: a file created, a file written and
closed, a rename landing. Data the user asked for is left out: metrics, trackers' files, checkpoints.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import re
import select
import struct
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.rundir.layout import RunDir

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE, IN_ISDIR = 0x2, 0x8, 0x80, 0x100, 0x40000000
COUNTED = {IN_CREATE: "create", IN_CLOSE_WRITE: "close_write", IN_MOVED_TO: "moved_to"}


def data_paths(run_dir: Path) -> set[Path]:
    """What the user asked to be written (its size and rate are the user's choice), left out of the count."""
    rd = RunDir(run_dir)
    return {rd.metrics_file, rd.tensorboard_dir, rd.wandb_dir, rd.checkpoints_dir}


def count(run_dir: Path, seconds: float) -> dict[str, Any]:
    """Events under `run_dir` for `seconds`: per kind, and per file (numbers and temporary names folded)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    skip, watches = data_paths(run_dir), {}

    def watch(d: Path) -> None:
        if d in skip:
            return
        wd = libc.inotify_add_watch(fd, str(d).encode(), IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)
        if wd >= 0:
            watches[wd] = d
        for sub in d.iterdir():
            if sub.is_dir() and not sub.is_symlink():
                watch(sub)

    kinds: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    try:
        watch(run_dir)
        end = time.time() + seconds
        while (left := end - time.time()) > 0:
            if select.select([fd], [], [], left)[0]:
                for d, name, mask in _events(os.read(fd, 65536), watches):
                    path = d / name
                    if path in skip:
                        continue
                    if mask & IN_CREATE and mask & IN_ISDIR:
                        watch(path)
                    for bit, kind in COUNTED.items():
                        if mask & bit:
                            kinds[kind] += 1
                            files[_fold(str(path.relative_to(run_dir)))] += 1
    finally:
        os.close(fd)
    return {"seconds": seconds, "writes": sum(kinds.values()), "by_kind": dict(kinds), "by_file": dict(files)}


def _events(buf: bytes, watches: dict[int, Path]) -> list[tuple[Path, str, int]]:
    out, i = [], 0
    while i < len(buf):
        wd, mask, _cookie, length = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")
        i += 16 + length
        if wd in watches and name:
            out.append((watches[wd], name, mask))
    return out


def _fold(rel: str) -> str:
    return re.sub(r"\d+", "N", re.sub(r"\.tmp-[\w-]+$", ".tmp", rel))
