"""What a run's token file was when it was submitted (RunDir.data_identity_file, records.DataIdentity).

A resume continues at its checkpoint's data position, the number of samples consumed (fsdp_jobs/runtime/data.py):
over another file, or the same path rewritten, that position names other samples, and the run would go on
without a word. The CLI records the file's identity at every submission and compares it at a resume
(fsdp_jobs/cli/rundir_checks.py check_same_data)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import DataIdentity

BLOCK = 1 << 20


def take(path: Path) -> DataIdentity:
    """The file's path, size, mtime and a SHA-256 of three fixed blocks of 1 MiB (its first, middle and last).
    Not a hash of the whole file: a token file can hold terabytes, and every submission would wait while all of
    it is read; three blocks are 3 MiB and three seeks at any size. A rewrite that keeps the size and those
    blocks still changes the mtime, which is compared too. Raises OSError."""
    st = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in sorted({0, max(0, (st.st_size - BLOCK) // 2), max(0, st.st_size - BLOCK)}):
            f.seek(offset)
            digest.update(f.read(BLOCK))
    return DataIdentity(path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns, blocks_sha256=digest.hexdigest())


def read(run_dir: Path) -> Optional[DataIdentity]:
    """The recorded identity; None when there is none (a run from before it was recorded) or it is damaged."""
    try:
        return DataIdentity.from_dict(json.loads(RunDir(run_dir).data_identity_file.read_text()))
    except (OSError, ValueError):
        return None


def changes(before: DataIdentity, now: DataIdentity) -> list[str]:
    """What differs, in words: the path, the size, the sampled content; the mtime alone when nothing else does."""
    found = [f"path {before.path} -> {now.path}"] if before.path != now.path else []
    if before.size != now.size:
        found.append(f"size {before.size:,} -> {now.size:,} bytes")
    elif before.blocks_sha256 != now.blocks_sha256:
        found.append("content: its first, middle or last MiB differs")
    if not found and before.mtime_ns != now.mtime_ns:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now.mtime_ns / 1e9))
        found.append(f"modified at {when} (same size and sampled blocks; a copy or a touch does this too)")
    return found


def record(run_dir: Path, now: DataIdentity) -> bool:
    """Record `now` unless the same identity is recorded already; whether it wrote."""
    before = read(run_dir)
    if before is not None and not changes(before, now):
        return False
    runs.write_atomic(RunDir(run_dir).data_identity_file, json.dumps(now.to_json()) + "\n")
    return True
