"""The checkpoint layout of a run dir and its rules, in one place (imports no torch: the CLI, ctl,
export and the backends' in-job side read it too; fsdp_jobs/runtime/checkpoint.py writes through it):

    checkpoints/.tmp-step-000100-<attempt>/   written by every rank (DCP), never read
    checkpoints/step-000100/                  visible only once complete:
        .metadata, __*_*.distcp                   DCP's files
        manifest.json                             step, world size, mesh, config hash; written last

A checkpoint counts ("is committed") only as a step-N directory holding both DCP's .metadata and our
manifest: the manifest is written after every rank finished, then the directory is renamed into place,
so a reader sees a whole checkpoint or none. Pruning renames before deleting for the same reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir.layout import RunDir

MANIFEST_FILE = "manifest.json"
DCP_METADATA_FILE = ".metadata"
TMP_PREFIX = ".tmp-step-"
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
    """Everything under the checkpoints root that is not a committed checkpoint, by name (a save that
    died mid-way, a prune cut short)."""
    return [p for p in sorted(root.iterdir()) if not is_committed(p)]


def commit(tmp: Path, manifest: dict[str, Any], final: Path) -> None:
    """Make a written checkpoint visible: the manifest last inside it, then one rename into place
    (each made durable before the next, so a crash leaves the old state or the new one)."""
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(final.parent)


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` committed checkpoints, and the leftovers of saves older
    than the newest commit."""
    root = root_of(run_dir)
    committed = committed_checkpoints(run_dir)
    for step, p in committed[:-keep_last]:
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
    for p in root.glob(f"{TMP_PREFIX}*"):
        try:
            step = int(p.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if step <= newest:
            shutil.rmtree(p, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
