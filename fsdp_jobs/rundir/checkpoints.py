"""The checkpoint layout of a run dir and its rules, in one place (imports no torch: the CLI, ctl,
export and the backends' in-job side read it too; fsdp_jobs/runtime/checkpoint.py writes through it):

    checkpoints/.tmp-step-000100-<attempt>/   written by every rank (DCP), never read
    checkpoints/step-000100/                  visible only once complete:
        .metadata, __*_*.distcp                   DCP's files
        manifest.json                             step, world size, mesh, config hash, and `files`: each
                                                  file's size and CRC-32 (checked before a resume); written last
    checkpoints/step-000100.unusable/         one that failed its check or its load: set aside, never deleted
        why-unusable.txt                          the reason

A checkpoint counts ("is committed") only as a step-N directory holding both DCP's .metadata and our
manifest: the manifest is written after every rank finished, then the directory is renamed into place,
so a reader sees a whole checkpoint or none. Pruning renames before deleting for the same reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir.layout import RunDir

MANIFEST_FILE = "manifest.json"
DCP_METADATA_FILE = ".metadata"
TMP_PREFIX = ".tmp-step-"
UNUSABLE_SUFFIX = ".unusable"
UNUSABLE_REASON_FILE = "why-unusable.txt"
CKPT_DIR_RE = re.compile(r"^step-(\d+)$")
# a committed checkpoint's directory as a user is told of it (export's help and refusals)
STEP_DIR_WORDS = f"{RunDir(Path()).checkpoints_dir.name}/step-N"
COMMITTED_WORDS = f"{STEP_DIR_WORDS} with {MANIFEST_FILE}"


def root_of(run_dir: Path) -> Path:
    """Where a run's checkpoints live."""
    return RunDir(run_dir).checkpoints_dir


def step_dir(root: Path, step: int) -> Path:
    """The committed name of step `step` under the checkpoints root."""
    return root / f"step-{step:06d}"


def tmp_dir(root: Path, step: int, attempt: str) -> Path:
    """Where one attempt writes step `step` before the commit renames it to step_dir()."""
    return root / f"{TMP_PREFIX}{step:06d}-{attempt}"


def step_of(ckpt: Optional[Path]) -> Optional[int]:
    """The step a step-N directory holds, None for any other name (or None)."""
    m = CKPT_DIR_RE.match(ckpt.name) if ckpt else None
    return int(m.group(1)) if m else None


def has_manifest(ckpt: Path) -> bool:
    return (ckpt / MANIFEST_FILE).is_file()


def read_manifest(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / MANIFEST_FILE).read_text())


def is_committed(ckpt: Path) -> bool:
    """A step-N directory with DCP's .metadata and our manifest (written last, before the rename)."""
    return bool(CKPT_DIR_RE.match(ckpt.name)) and has_manifest(ckpt) and (ckpt / DCP_METADATA_FILE).is_file()


def committed_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every committed checkpoint of the run, oldest first."""
    ckpts = root_of(run_dir)
    if not ckpts.is_dir():
        return []
    return sorted((int(p.name.split("-")[1]), p) for p in ckpts.iterdir() if is_committed(p))


def newest_checkpoint(run_dir: Path) -> Optional[Path]:
    """The newest committed checkpoint, or None."""
    found = committed_checkpoints(run_dir)
    return found[-1][1] if found else None


def uncommitted_entries(root: Path) -> list[Path]:
    """Everything under the checkpoints root that is neither a committed checkpoint nor one set aside, by
    name (a save that died mid-way, a prune cut short)."""
    return [p for p in sorted(root.iterdir()) if not is_committed(p) and not p.name.endswith(UNUSABLE_SUFFIX)]


def set_aside_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoints set aside as unusable, oldest first."""
    root = root_of(run_dir)
    return sorted(root.glob(f"step-*{UNUSABLE_SUFFIX}")) if root.is_dir() else []


def move_all_aside(run_dir: Path, stamp: str) -> Optional[Path]:
    """checkpoint.resume=false on a run that has checkpoints: the whole checkpoints folder is renamed out of
    the way (a new attempt must neither load nor prune them; a user who wants them back renames it back).
    None when there was nothing to move."""
    root = root_of(run_dir)
    if not root.is_dir() or not any(root.iterdir()):
        return None
    dest = RunDir(run_dir).checkpoints_before_dir(stamp)
    if dest.exists():
        dest = dest.with_name(f"{dest.name}-{os.getpid()}")
    os.rename(root, dest)
    return dest


def set_aside(ckpt: Path, reason: str) -> Path:
    """Rename a committed checkpoint that failed its check or its load out of the way (it no longer counts
    as committed; nothing is deleted: a user who knows better renames it back), with the reason beside."""
    dest = ckpt.with_name(ckpt.name + UNUSABLE_SUFFIX)
    if dest.exists():  # set aside once before, renamed back by hand, and failed again
        dest = ckpt.with_name(f"{ckpt.name}-{int(time.time())}{UNUSABLE_SUFFIX}")
    os.rename(ckpt, dest)
    (dest / UNUSABLE_REASON_FILE).write_text(reason + "\n")
    return dest


@contextlib.contextmanager
def quiet_dcp_logs() -> Any:
    """DCP logs every failed read attempt with its traceback before raising (two screens for one damaged
    .metadata), some through the root logger (state_dict_loader's is logging.getLogger()); the caller says
    what failed in one line, so they are kept out of the user's output while it loads."""
    loggers = [logging.getLogger(), logging.getLogger("torch.distributed.checkpoint")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# ------------------------------------------------------------------ integrity (sizes and CRC-32 per file)
SUM_BLOCK = 8 << 20


def file_sum(path: Path) -> list[int]:
    """[size, CRC-32] of one file, read in 8 MiB blocks (zlib's CRC-32: about 1 GB/s a core, no dependency)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(SUM_BLOCK):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return [size, crc]


def rank_files(ckpt: Path, rank: int) -> list[str]:
    """The files DCP's FileSystemWriter wrote for `rank` (its storage prefix is __<rank>_)."""
    return sorted(p.name for p in ckpt.glob(f"__{rank}_*.distcp"))


def sums(ckpt: Path, names: list[str]) -> dict[str, list[int]]:
    return {name: file_sum(ckpt / name) for name in names}


def manifest_files(ckpt: Path) -> tuple[dict[str, list[int]], Optional[str]]:
    """(the manifest's `files`: name -> [size, CRC-32], why it cannot be read or None). Empty, and nothing
    wrong, for a manifest from before `files` existed or a DCP directory without one (export reads any)."""
    try:
        files = read_manifest(ckpt).get("files")
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, AttributeError):
        return {}, f"its {MANIFEST_FILE} is unreadable"
    return (files if isinstance(files, dict) else {}), None


def check_sizes(ckpt: Path) -> Optional[str]:
    """Why `ckpt` cannot be what its manifest recorded, from sizes and DCP's .metadata alone (a stat per file:
    cheap at any world size), or None."""
    files, unreadable = manifest_files(ckpt)
    if unreadable:
        return unreadable
    for name, (size, _) in sorted(files.items()):
        try:
            actual = (ckpt / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, {size} when saved"
    if DCP_METADATA_FILE in files and file_sum(ckpt / DCP_METADATA_FILE)[1] != files[DCP_METADATA_FILE][1]:
        return f"{DCP_METADATA_FILE} changed since it was saved (CRC-32 differs)"
    return None


def check_sums(ckpt: Path, names: list[str]) -> Optional[str]:
    """Why one of `names` (a share of the checkpoint's files: every rank checks its own) no longer holds what
    was saved, or None."""
    files, unreadable = manifest_files(ckpt)
    if unreadable:
        return unreadable
    for name in names:
        if name in files:
            try:
                if file_sum(ckpt / name) != files[name]:
                    return f"{name} changed since it was saved (CRC-32 differs)"
            except OSError as e:
                return f"{name} cannot be read ({e.strerror})"
    return None


def listed_files(ckpt: Path) -> list[str]:
    """The files a checkpoint's manifest lists (none for one saved before `files` existed)."""
    return sorted(manifest_files(ckpt)[0])


def damage(ckpt: Path) -> Optional[str]:
    """Why one checkpoint fails its checks, all of them in this process (export; the ranks share the CRC-32s
    out: fsdp_jobs/runtime/checkpoint.py find_latest), or None."""
    return check_sizes(ckpt) or check_sums(ckpt, listed_files(ckpt))


def none_usable(aside: list[Path]) -> str:
    """What the job says, and the CLI before it starts, when every checkpoint of the run was set aside."""
    return (f"no usable checkpoint: {', '.join(p.name for p in aside)} failed their checks (the reason is in "
            f"each one's {UNUSABLE_REASON_FILE}); rename one back if you know it is good, or start over with "
            "checkpoint.resume=false or a new name=")


def commit(tmp: Path, manifest: dict[str, Any], final: Path) -> None:
    """Make a written checkpoint visible: the manifest last inside it, then one rename into place
    (each made durable before the next, so a crash leaves the old state or the new one)."""
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` committed checkpoints (and the newest that passes check_sizes,
    while none of those does), and the leftovers of saves older than the newest commit."""
    root = root_of(run_dir)
    committed = committed_checkpoints(run_dir)
    older, kept = committed[:-keep_last], committed[-keep_last:]
    # never the newest one that passes its check while none of those kept does (the newest may be damaged)
    if older and not any(check_sizes(p) is None for _, p in kept):
        spared = next((p for _, p in reversed(older) if check_sizes(p) is None), None)
        older = [(step, p) for step, p in older if p != spared]
    for step, p in older:
        # renamed first (atomic): a prune cut short by the process exiting leaves a .tmp leftover,
        # never a half-deleted directory that still looks committed
        doomed = root / f"{TMP_PREFIX}{step:06d}-pruned"
        try:
            os.rename(p, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
    # leftovers of saves that died mid-way, older than the newest commit, are garbage now
    newest = committed[-1][0] if committed else -1
    for step, p in tmp_entries(root):
        if step <= newest:
            shutil.rmtree(p, ignore_errors=True)


def tmp_entries(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of each save's or prune's temporary directory under the checkpoints root."""
    found = []
    for p in root.glob(f"{TMP_PREFIX}*"):
        try:
            found.append((int(p.name.split("-")[2]), p))
        except (IndexError, ValueError):
            continue
    return sorted(found)


def saves_under_way(run_dir: Path) -> list[Path]:
    """Temporary directories of steps newer than the newest commit: a save being written (or one whose
    writer died mid-way, until a newer save commits and prune removes it)."""
    root = root_of(run_dir)
    if not root.is_dir():
        return []
    committed = committed_checkpoints(run_dir)
    newest = committed[-1][0] if committed else -1
    return [p for step, p in tmp_entries(root) if step > newest]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
