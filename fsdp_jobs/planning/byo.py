"""Bring your own training: the checks of `script=`, `module=` and `model=hf` made while composing.

Torch-free and transformers-free (the planning path must feel instant): files are read and compiled,
packages are found with importlib's finders, nothing of the user's is imported or run here.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional, TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

# the script's directory travels into the run dir; a script sitting in a big tree (a home directory,
# a data folder) would copy all of it on every submission
SCRIPT_DIR_LIMIT_MB = 100
SNAPSHOT_SKIP = {".git", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", "node_modules"}
HF_TARGET_PREFIX = "fsdp_jobs.models.hf."
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_hf(model: Any) -> bool:
    return str(model.get("_target_") or "").startswith(HF_TARGET_PREFIX)


def stays_behind(name: str) -> bool:
    """A file next to the user's code that is not code and may hold credentials: dotfiles (.env, .netrc),
    keys and files named like secrets. It is never copied into the run dir, nor into a ConfigMap."""
    return name.startswith(".") or name.endswith((".pyc", ".pyo")) or bool(_SECRET_FILE.search(name))


# (a whole-word "token": hf_token, token.txt; never tokenizer.json)
_SECRET_FILE = re.compile(r"secret|credential|passw|(^|[._-])token([._-]|$)|\.pem$|\.key$|\.p12$|\.pfx$"
                          r"|^id_(rsa|ed25519|ecdsa|dsa)", re.IGNORECASE)


def snapshot_files(src: Path, exclude: tuple[Path, ...] = (), skipped: Optional[list[Path]] = None) -> Iterator[Path]:
    """Files of the user's code directory that travel with the job (what the snapshot copies); those that
    stay behind are appended to `skipped` when given."""
    skip = {os.path.realpath(p) for p in exclude}
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SNAPSHOT_SKIP and not d.startswith(".")
                         and os.path.realpath(os.path.join(root, d)) not in skip)
        for f in sorted(files):
            if not stays_behind(f):
                yield Path(root) / f
            elif skipped is not None and not f.endswith((".pyc", ".pyo")):
                skipped.append(Path(root) / f)


def travel_note(cfg: JobConfig) -> Optional[str]:
    """What the dry run says travels with script=/module= (and what stays behind)."""
    src = user_code_source(cfg)
    if src is None or not src.is_dir():
        return None
    skipped: list[Path] = []
    files = list(snapshot_files(src, (Path(cfg.run_root).expanduser().resolve(),), skipped))
    names = [str(f.relative_to(src)) for f in files]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    # (no path in it: the note must read the same wherever the checkout is)
    what = "script='s directory" if cfg.get("script") else f"module='s package {src.name}"
    note = f"{what}: {len(names)} files travel into the run dir: {shown}"
    if skipped:
        note += f"; left behind (dotfiles, keys, secret-looking names): {', '.join(str(f.relative_to(src)) for f in skipped[:12])}"
    return note


def user_code_source(cfg: JobConfig) -> Optional[Path]:
    """What is copied into the run dir for script= (the script's directory, as its contents) or module=
    (the top-level package, under its own name); None: nothing to copy."""
    if cfg.get("script"):
        return Path(cfg.script).parent
    if cfg.get("module"):
        return module_source(str(cfg.module))
    return None


def module_source(module: str) -> Optional[Path]:
    """module's top-level package directory (or single file), copied into the run dir; None when it is
    installed in the environment (site-packages: the nodes' environment has it as well) or is ours."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or top in ("fsdp_jobs", "launchers"):
        return None
    where = list(spec.submodule_search_locations or [])
    origin = Path(where[0]) if where else Path(spec.origin or "")
    if not origin.exists() or any(part in ("site-packages", "dist-packages") for part in origin.parts):
        return None
    return origin


def _check_dir_size(key: str, value: str, src: Path, run_root: Path) -> None:
    total, limit = 0, SCRIPT_DIR_LIMIT_MB * 1024 * 1024
    for f in snapshot_files(src, (run_root,)):
        try:
            total += f.stat().st_size
        except OSError:
            continue
        if total > limit:
            raise UserError(key, value, f"its directory {src} holds more than {SCRIPT_DIR_LIMIT_MB} MB, and it is "
                                        "copied into the run dir on every submission; put the script in a directory "
                                        "with just its code")


def check_script(cfg: JobConfig) -> None:
    raw = str(cfg.script)
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        raise UserError("script", raw, f"no such file ({path}); script= names a Python file (relative to the "
                                       "directory you run fsdp-jobs in)")
    try:
        source = path.read_bytes()
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        where = f" (line {e.lineno}: {e.msg})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise UserError("script", raw, f"is not a Python script{where}; script= runs a Python file under "
                                       "torchrun (module= runs a package's module)") from None
    except OSError as e:
        raise UserError("script", raw, f"cannot be read: {e.strerror}") from None
    _check_dir_size("script", raw, path.parent, Path(cfg.run_root).expanduser().resolve())
    cfg.script = str(path)  # the job record keeps where it came from, whatever the working directory


def check_module(cfg: JobConfig) -> None:
    name = str(cfg.module)
    if not _MODULE_RE.fullmatch(name):
        raise UserError("module", name, "must be a dotted module name, e.g. module=mypkg.train")
    top = name.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise UserError("module", name, f"package {top!r} is not importable here (install it, or run from the "
                                        "directory that holds it)")
    where = list(spec.submodule_search_locations or [])
    rest = name.split(".")[1:]
    if where:  # without importing the package (it may import torch): find the file
        base = Path(where[0]).joinpath(*rest)
        if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
                or (not rest and (base / "__main__.py").is_file())):
            raise UserError("module", name, f"no module file {base}.py (or {base}/__main__.py)")
    elif rest:
        raise UserError("module", name, f"{top!r} is a single-file module, not a package")
    src = module_source(name)
    if src is not None and src.is_dir():
        _check_dir_size("module", name, src, Path(cfg.run_root).expanduser().resolve())


def check_hf(model: Any) -> None:
    if importlib.util.find_spec("transformers") is None:
        raise UserError("model", model.name, "needs the transformers package, which is not installed here: "
                                             "pip install 'fsdp-jobs[hf]' (or choose another model=)")
    kwargs = model.get("kwargs") or {}
    config_dir = kwargs.get("config_dir")
    if config_dir and not (Path(str(config_dir)).expanduser() / "config.json").is_file():
        raise UserError("model.kwargs.config_dir", config_dir, "must be a local directory holding config.json "
                                                               "(nothing is downloaded)")
    if not config_dir and not (kwargs.get("config") or {}).get("model_type"):
        raise UserError("model.kwargs.config", dict(kwargs.get("config") or {}),
                        "needs model_type (e.g. llama), or set model.kwargs.config_dir=DIR with a config.json")
    from fsdp_jobs.models.hf_config import config_dict, shape

    try:
        hf = config_dict(kwargs)
    except (OSError, ValueError) as e:
        raise UserError("model.kwargs.config_dir", config_dir, f"config.json cannot be read: {e}") from None
    # the plan (memory estimate), the data (vocabulary) and MFU read the llama-shape keys: take them from
    # the HF config, so they describe the model that is really built
    for key, value in shape(hf).items():
        model[key] = value
    if model.get("pretrained"):
        d = Path(str(model.pretrained)).expanduser()
        if not d.is_dir() or not any(d.glob("*.safetensors")):
            raise UserError("model.pretrained", model.pretrained, "must be a local directory holding *.safetensors "
                                                                  "weights (nothing is downloaded)")


def validate(cfg: JobConfig) -> None:
    """Raises UserError on the first bad key of script=/module=/script_args/model=hf."""
    if cfg.get("script") and cfg.get("module"):
        raise UserError("module", cfg.module, f"script={cfg.script} is set too; choose one of script= and module=")
    if cfg.get("script"):
        check_script(cfg)
    elif cfg.get("module"):
        check_module(cfg)
    elif cfg.get("script_args"):
        raise UserError("script_args", list(cfg.script_args), "needs script= or module= (the built-in trainer "
                                                              "takes no arguments)")
    if is_hf(cfg.model):
        check_hf(cfg.model)
        if cfg.data.seq_len > cfg.model.max_seq_len:
            raise UserError("data.seq_len", cfg.data.seq_len, f"must be <= the model's max_position_embeddings "
                                                              f"({cfg.model.max_seq_len})")
    elif cfg.model.get("pretrained"):
        raise UserError("model.pretrained", cfg.model.pretrained, "is for model=hf (Hugging Face models)")
