"""Plan-time checks of what the job will read besides its config: the token file, and any test
fault-injection variable (fsdp_jobs/planning/faults.py). Refused here in one line, not on every rank later."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, TYPE_CHECKING

from fsdp_jobs.planning import backends, faults
from fsdp_jobs.planning.byo import travel_note
from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

DTYPE_SIZES = {"uint8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "int64": 8}
TOKEN_FILE = "fsdp_jobs.runtime.data.TokenFile"  # conf/data/token_file.yaml: the reader whose format this is
SCAN_WHOLE_BYTES = 64 * 1024 * 1024  # token ids read at planning: the whole file up to this, else as many in blocks
SCAN_BLOCKS = 64


def host_token_file(cfg: JobConfig) -> Optional[Path]:
    """data.path where the job reads this machine's file; None without one, or where the job's processes see
    other files (the backend's traits' host_files: a pod reads a path on its volume)."""
    path = cfg.data.path
    if not path or not backends.traits(cfg.cluster.backend).host_files:
        return None
    return Path(path).expanduser()


def check_token_file(cfg: JobConfig) -> None:
    """data.path must be a readable file holding at least one window. Only backends whose processes see
    this machine's files check it here; the others read it where the job runs."""
    path, p = cfg.data.path, host_token_file(cfg)
    if p is None:
        return
    if not p.is_file():
        raise UserError("data.path", path, "no such file" + ("" if p.parent.is_dir() else f" (no directory {p.parent})"))
    size = DTYPE_SIZES.get(str(cfg.data.token_dtype))
    if size is None:
        raise UserError("data.token_dtype", cfg.data.token_dtype, "allowed: " + ", ".join(DTYPE_SIZES))
    if looks_like_text(p):
        raise UserError("data.path", path, "is a text file; a token file holds binary token ids "
                                           f"({cfg.data.token_dtype}, e.g. numpy's tofile of the tokenized corpus)")
    if p.stat().st_size % size:
        raise UserError("data.path", path, f"holds {p.stat().st_size} bytes, not a whole number of "
                                           f"{cfg.data.token_dtype} tokens ({size} bytes each): a wrong data.token_dtype?")
    tokens = p.stat().st_size // size
    if tokens < cfg.data.seq_len + 2:
        raise UserError("data.path", path, f"holds {tokens} {cfg.data.token_dtype} tokens, fewer than "
                                           f"data.seq_len+2={cfg.data.seq_len + 2}")
    if cfg.data._target_ == TOKEN_FILE:
        check_token_ids(cfg, p)


def check_token_ids(cfg: JobConfig, p: Path) -> None:
    """Every id the file holds must index the model's embedding (0 <= id < model.vocab_size): the ranks
    failed at the first window holding one. A file up to SCAN_WHOLE_BYTES is read whole; a larger one in
    SCAN_BLOCKS blocks spread over it, first and last included (a dry run stays quick on terabytes, and a
    wrong data.token_dtype or tokenizer shows in every block)."""
    import numpy as np  # here: only a token file pays for it

    dtype, vocab = np.dtype(str(cfg.data.token_dtype)), cfg.model.vocab_size
    try:
        tokens = np.memmap(p, dtype=dtype, mode="r")
    except OSError as e:
        raise UserError("data.path", cfg.data.path, f"cannot be read: {e.strerror or e}") from None
    block = SCAN_WHOLE_BYTES // SCAN_BLOCKS // dtype.itemsize
    starts = [0] if len(tokens) * dtype.itemsize <= SCAN_WHOLE_BYTES else \
        np.linspace(0, len(tokens) - block, SCAN_BLOCKS).astype(np.int64).tolist()
    span = len(tokens) if starts == [0] else block
    for start in starts:
        window = tokens[start:start + span]
        bad = np.flatnonzero((window >= vocab) | (window < 0))
        if len(bad):
            at = start + int(bad[0])
            raise UserError("data.path", cfg.data.path, f"holds token id {int(tokens[at])} at position {at}, outside "
                                                        f"model.vocab_size={vocab} (0 to {vocab - 1}): a wrong "
                                                        "data.token_dtype, or a tokenizer of another vocabulary?")


def looks_like_text(path: Path) -> bool:
    """Binary token ids hold zero bytes (every id below 256 has a zero high byte); text never does."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    if not head or b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 4  # only a character cut at the end of what was read
    return True


def check_inputs(cfg: JobConfig) -> list[str]:
    """Refuse bad inputs; return notes (warnings) for the plan."""
    check_token_file(cfg)
    env = {**os.environ, **{str(k): str(v) for k, v in cfg.cluster.env.items()}}
    notes = [f"warning: test fault injection {name}={value} reaches this job ({faults.KNOWN[name]})"
             for name, value in faults.parse(env).items()]
    travel = travel_note(cfg)
    return notes + ([travel] if travel else [])
