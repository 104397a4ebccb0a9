"""Plan-time checks of what the job will read besides its config: the token file, and any test
fault-injection variable (fsdp_jobs/faults.py). Refused here in one line, not on every rank later."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fsdp_jobs import backends, faults
from fsdp_jobs.errors import UserError

DTYPE_SIZES = {"uint8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "int64": 8}


def check_token_file(cfg: Any) -> None:
    """data.path must be a readable file holding at least one window. Only backends whose processes see
    this machine's files check it here (HOST_FILES in launchers/<name>/config.py); the others read it
    where the job runs (a pod reads a path on its volume)."""
    path = cfg.data.path
    if not path or not backends.config_module(cfg.cluster.backend).HOST_FILES:
        return
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError("data.path", path, "no such file" + ("" if p.parent.is_dir() else f" (no directory {p.parent})"))
    size = DTYPE_SIZES.get(str(cfg.data.token_dtype))
    if size is None:
        raise UserError("data.token_dtype", cfg.data.token_dtype, "allowed: " + ", ".join(DTYPE_SIZES))
    tokens = p.stat().st_size // size
    if tokens < cfg.data.seq_len + 2:
        raise UserError("data.path", path, f"holds {tokens} {cfg.data.token_dtype} tokens, fewer than "
                                           f"data.seq_len+2={cfg.data.seq_len + 2}")


def check_inputs(cfg: Any) -> list[str]:
    """Refuse bad inputs; return notes (warnings) for the plan."""
    check_token_file(cfg)
    env = {**os.environ, **{str(k): str(v) for k, v in cfg.cluster.env.items()}}
    return [f"warning: test fault injection {name}={value} reaches this job ({faults.KNOWN[name]})"
            for name, value in faults.parse(env).items()]
