"""Freeze the project code into the run dir at submission, so a job requeued days later runs the
code as it was submitted, not whatever the checkout holds by then."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional, TYPE_CHECKING

import fsdp_jobs

from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

PROJECT_ROOT = Path(fsdp_jobs.__file__).resolve().parent.parent
CODE_DIRS = ("fsdp_jobs", "launchers", "conf")  # as a checkout holds them (the uncommitted diff is of these)
# where the launchers package sits in a checkout (pyproject's package-dir installs it as fsdp_jobs.launchers)
LAUNCHERS_DIR = Path(__file__).resolve().parent


def owner_only(tree: Path) -> None:
    """A copy keeps its source's modes (0644, 0755); in a run dir everything is the owner's alone
    (README: Security), whatever the checkout's modes."""
    for p in [tree, *tree.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & 0o700)


def next_snapshot_dir(run_dir: Path) -> Path:
    """RunDir.code_dir/NNN: deterministic, so a dry run names the same path the submission will use."""
    return _next_numbered(RunDir(run_dir).code_dir)


def _next_numbered(parent: Path) -> Path:
    existing = [int(p.name) for p in parent.glob("[0-9][0-9][0-9]") if p.is_dir()]
    return parent / f"{max(existing, default=0) + 1:03d}"


def _git(*args: str) -> str:
    try:
        r = subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


def copy_code(dest: Path) -> None:
    """The packages laid out as installed (fsdp_jobs/launchers inside fsdp_jobs/), and conf/: with `dest`
    first on PYTHONPATH every module of the project comes from the copy, never from the checkout that
    an editable install maps fsdp_jobs.launchers to."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(fsdp_jobs.__file__).resolve().parent, dest / "fsdp_jobs", ignore=skip)
    if not (dest / "fsdp_jobs" / "launchers").exists():
        shutil.copytree(LAUNCHERS_DIR, dest / "fsdp_jobs" / "launchers", ignore=skip)
    if (PROJECT_ROOT / "conf").is_dir():
        shutil.copytree(PROJECT_ROOT / "conf", dest / "conf", ignore=skip)


def take_snapshot(dest: Path) -> dict[str, str]:
    """Copy the packages and conf/ (`copy_code`), and record the git commit and any uncommitted diff beside them."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_code(tmp)
    commit = _git("rev-parse", "HEAD").strip()
    (tmp / "GIT_COMMIT").write_text((commit or "not a git checkout") + "\n")
    (tmp / "uncommitted.diff").write_text(_git("diff", "HEAD", "--", *CODE_DIRS))
    (tmp / "SOURCE").write_text(str(PROJECT_ROOT) + "\n")
    owner_only(tmp)
    tmp.rename(dest)
    return {"code": str(dest), "git_commit": commit}


def next_user_code_dir(run_dir: Path) -> Path:
    """RunDir.script_dir/NNN: where submit copies the user's script= directory or module= package (the
    number is decided by the dry run, like the code snapshot's)."""
    return _next_numbered(RunDir(run_dir).script_dir)


def take_user_code(cfg: JobConfig, dest: Path) -> None:
    """Copy the user's code (fsdp_jobs.planning.byo.user_code_source) into dest: a requeued job or a container
    finds it in the run dir, as it was at submission. The run root is never copied into itself."""
    from fsdp_jobs.planning.byo import snapshot_files, user_code_source

    src = user_code_source(cfg)
    if src is None:
        return
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    run_root = Path(cfg.run_root).expanduser().resolve()
    if src.is_file():  # module= naming a single-file module
        shutil.copy2(src, tmp / src.name)
    else:
        # script=: the directory's contents (the script's siblings import as before);
        # module=: the package under its own name, so `python -m pkg.mod` finds it on PYTHONPATH
        base = src.parent if cfg.get("module") else src
        for f in snapshot_files(src, (run_root,)):
            target = tmp / f.relative_to(base)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    owner_only(tmp)
    tmp.rename(dest)


def user_code_tar(cfg: JobConfig) -> Optional[bytes]:
    """The files take_user_code copies, as a reproducible .tar.gz (same bytes for the same files): what
    travels to Kubernetes pods in the job's ConfigMap, where no submitter can write the run dir."""
    import gzip
    import io
    import tarfile

    from fsdp_jobs.planning.byo import snapshot_files, user_code_source

    src = user_code_source(cfg)
    if src is None:
        return None
    if src.is_file():
        members = [(src, src.name)]
    else:
        base = src.parent if cfg.get("module") else src
        members = [(f, str(f.relative_to(base))) for f in snapshot_files(src, (Path(cfg.run_root).expanduser().resolve(),))]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, name in members:
            info = tarfile.TarInfo(name)
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)
