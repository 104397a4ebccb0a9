"""Secrets for the ranks' environment: by reference, on every backend, never in a file or a printout.

    cluster.secret_env.NAME=REF     the rank sees $NAME
        REF is env:VAR (this process's environment at submission) or file:PATH (the file's contents,
        without the final newline); a backend with a secret store of its own resolves REF itself and
        says what REF is (its config.py's TRAITS.secret_store)
    cluster.env.NAME=value where NAME looks like a secret (TOKEN, SECRET, PASSWORD, API_KEY, ...):
        warned about, masked as MASK in the job record, the journal and every printout, and passed like a
        secret_env value (refused where the backend has a secret store: that is the way there)

Only the reference is kept (the job record, the journal); the value is read here at planning (so a missing
variable or file is one line before anything is written) and held in memory. Right before the backend
submits, submit.py puts the values into this process's environment, and every backend passes that on
without writing it into the run dir (launchers/<name>/backend.py; README: Security says where each
keeps it: the scheduler's or the container engine's own state).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

MASK = "<secret: passed at submission, not stored>"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH",
                         re.IGNORECASE)
REF_FORMS = "env:VAR (from this environment at submission) or file:PATH"


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def resolve(var: str, ref: str) -> str:
    """The value a cluster.secret_env reference names (env:/file:), or a one-line refusal."""
    kind, _, where = str(ref).partition(":")
    key = f"cluster.secret_env.{var}"
    if kind == "env" and where:
        if where not in os.environ:
            raise UserError(key, ref, f"${where} is not set in this environment")
        return os.environ[where]
    if kind == "file" and where:
        path = Path(where).expanduser()
        try:
            return path.read_text().rstrip("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(key, ref, f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    raise UserError(key, ref, f"must be {REF_FORMS}")


def take(cfg: JobConfig, job: dict[str, Any], store: Optional[str]) -> tuple[dict[str, str], list[str]]:
    """Take the secrets out of a composed job: (their values, notes). cluster.env values that look secret are
    replaced by MASK in cfg and job. `store`: the backend's own secret store resolves cluster.secret_env
    (how to use it, from its config.py); then secret-looking cluster.env entries are refused."""
    values: dict[str, str] = {}
    notes: list[str] = []
    env = cfg.cluster.env
    for name in sorted(str(k) for k in env):
        if not looks_secret(name) or env[name] == MASK:
            continue
        if store:
            raise UserError(f"cluster.env.{name}", MASK, "looks like a secret, and cluster.env is written into what "
                                                         f"this backend submits: {store.format(name=name)}")
        values[name] = str(env[name])
        env[name] = job["cluster"]["env"][name] = MASK
        notes.append(f"warning: cluster.env.{name} looks like a secret: it is passed to the ranks at submission "
                     f"and masked everywhere it would be written; next time use cluster.secret_env.{name}=env:{name} "
                     "(README: Security)")
    if not store:
        for var, ref in cfg.cluster.get("secret_env", {}).items():
            if str(var) in env:
                raise UserError(f"cluster.secret_env.{var}", ref, f"cluster.env.{var} is set as well; keep one")
            values[str(var)] = resolve(str(var), str(ref))
    if values:
        notes.append(f"secrets for the ranks' environment: {', '.join(sorted(values))} (held in memory, passed at "
                     "submission, never written)")
    return values, notes


def mask(text: str, values: dict[str, str]) -> str:
    """text with every secret value replaced by MASK (the journal's raw overrides, printouts)."""
    for value in sorted((v for v in values.values() if v), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def passed_names(cfg: JobConfig) -> list[str]:
    """The variables the ranks get from the submitting process's environment (masked cluster.env entries
    and env:/file: cluster.secret_env): what a backend that writes its environment into a file must name
    without a value."""
    masked = [str(k) for k, v in cfg.cluster.env.items() if v == MASK]
    return sorted(set(masked) | {str(k) for k in cfg.cluster.get("secret_env", {})})
