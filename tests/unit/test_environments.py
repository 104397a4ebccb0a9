"""The environments a user's shell may hand the CLI: each either works or is refused in one line,
exit 2, before anything is written; never a traceback. (A real job under an outer allocation's variables:
tests/integration/test_user_environment.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def dry_run(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FSDP_JOBS_TEST_")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "fsdp_jobs", "cluster=local", "nodes=2", "gpus_per_node=1",
                           "dry_run=true", *args], cwd=os.fsencode(cwd), env={**full, "PYTHONPATH": str(REPO)},
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def one_line(r: subprocess.CompletedProcess[bytes]) -> str:
    err = r.stderr.decode("utf-8", "backslashreplace")
    assert r.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (r.returncode, err)
    return err.strip()


def test_a_working_directory_whose_name_is_not_utf8_is_refused(tmp_path):
    """run_root is relative to it: the run dir's path then held a byte Python keeps as a lone surrogate, the dry
    run printed it as '\\udce9', and each node wrapper died encoding it (2 tracebacks, exit 1)."""
    cwd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9"))
    cwd.mkdir()
    line = one_line(dry_run(cwd, {}, "run_root=runs"))
    assert "run_root=b'" in line and "caf\\xe9/runs'" in line and "holds bytes that are not UTF-8" in line, line
    assert list(cwd.iterdir()) == []
    assert dry_run(cwd, {}, f"run_root={tmp_path}/runs").returncode == 0  # an absolute UTF-8 run root is fine


def test_a_locale_that_is_not_utf8_names_the_locale(tmp_path):
    """LC_ALL=C with UTF-8 mode off: a quoted non-ASCII run root reached the node wrappers as surrogates."""
    r = dry_run(tmp_path, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}, "run_root='/tmp/ünï'")
    line = one_line(r)
    assert "is UTF-8, but this Python reads it as ascii (the locale is not UTF-8)" in line, line
    assert "LANG=C.UTF-8" in line
    assert dry_run(tmp_path, {"LC_ALL": "C.UTF-8"}, f"run_root='{tmp_path}/ünï'").returncode == 0


@pytest.fixture
def homeless(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME unset and a uid with no passwd entry: a container run as `--user 12345`."""
    import pwd

    for name in ("HOME", "FSDP_JOBS_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)


def test_without_a_home_directory_the_commands_work_and_a_submission_only_warns(homeless, run_root, capsys):
    """`fsdp-jobs list` ended in 'RuntimeError: Could not determine home directory.'; a submission's journal
    warning called for the journal's path again inside its own handler, a second traceback after the job."""
    from types import SimpleNamespace

    from fsdp_jobs.__main__ import main
    from fsdp_jobs.cli import submit
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.rundir import journal

    assert main(["list", "--run-root", str(run_root)]) == 0
    assert journal.sweeps() == [] and journal.last_refusal(run_root / "x") is None  # no journal to read
    with pytest.raises(UserError, match="no home directory to keep the journal in .* set HOME, XDG_STATE_HOME or "
                                        "FSDP_JOBS_STATE_DIR"):
        journal.path()
    capsys.readouterr()
    member = SimpleNamespace(name="m", overrides=[], secrets={}, params={}, backend=SimpleNamespace(name="local"),
                             plan=SimpleNamespace(run_dir=str(run_root / "m")), job={"name": "m"})
    submit.record(None, member, "1")  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.startswith("fsdp-jobs: warning: could not record m in the journal (none: no home directory")
    assert len(err.strip().splitlines()) == 1


def test_a_relative_xdg_state_home_is_ignored(tmp_path, monkeypatch):
    """The XDG spec calls a relative path invalid: the journal went into whatever directory the command ran in."""
    from fsdp_jobs.rundir import journal

    monkeypatch.delenv("FSDP_JOBS_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", "state")
    assert journal.path() == tmp_path / "home" / ".local" / "state" / "fsdp-jobs" / "journal.sqlite"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert journal.path() == tmp_path / "xdg" / "fsdp-jobs" / "journal.sqlite"


# cluster=local, cluster.device=cuda on this machine: (its torch's version.py, its /dev/nvidiaN count) -> refusal
DEVICE_CASES = [
    ({"__version__": "2.13.0+cpu", "cuda": None, "hip": None}, 0, "torch 2.13.0+cpu is a CPU-only build"),
    ({"__version__": "2.13.0+cpu", "cuda": None, "hip": None}, 8, "torch 2.13.0+cpu is a CPU-only build"),
    ({"__version__": "2.13.0+cu128", "cuda": "12.8", "hip": None}, 0, "shows no NVIDIA GPU"),
    ({"__version__": "2.13.0+cu128", "cuda": "12.8", "hip": None}, 1, None),
    ({"__version__": "2.13.0+rocm6.4", "cuda": None, "hip": "6.4"}, 0, None),  # ROCm's GPUs are no /dev/nvidiaN
    ({}, 0, None),  # no readable torch/version.py: the ranks will say
]


@pytest.mark.parametrize("build, gpus, refused", DEVICE_CASES, ids=[f"{c[0].get('__version__')}-{c[1]}" for c in DEVICE_CASES])
def test_a_local_cuda_job_needs_this_machines_torch_and_gpus(run_root, monkeypatch, build, gpus, refused):
    """Every rank failed at torch.cuda.set_device (171 lines) on a machine with a CPU-only torch; now the
    submission is refused in one line. A dry run still plans it (a GPU job may be planned on a laptop)."""
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.launchers.local import config

    monkeypatch.setattr(config, "torch_build", lambda: build)
    monkeypatch.setattr(config, "nvidia_gpus", lambda: gpus)
    cfg, _ = compose(["cluster=local", "cluster.device=cuda", f"run_root={run_root}"])
    backend = launcher.get("local")
    if refused is None:
        backend.check(None, cfg)  # type: ignore[arg-type]
    else:
        with pytest.raises(UserError, match=re.escape(refused)):
            backend.check(None, cfg)  # type: ignore[arg-type]
    cfg.cluster.device = "cpu"
    backend.check(None, cfg)  # type: ignore[arg-type]


def test_this_machines_torch_build_is_read_without_importing_torch():
    code = ("import sys; from fsdp_jobs.launchers.local.config import torch_build; b = torch_build(); "
            "print('torch' in sys.modules, isinstance(b['__version__'], str), 'cuda' in b)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "True", "True"], r


def test_a_machine_that_will_not_start_the_nodes_is_one_line_not_a_traceback(run_root, monkeypatch, capsys):
    """The node processes' start failing (the interpreter not executable for this user, no pids left) ended
    the launcher in a traceback out of subprocess; now one line, in the run's log too, exit status 1."""
    import subprocess as sp

    from fsdp_jobs.__main__ import main

    real = sp.Popen

    def refuse_nodes(argv, *a, **k):  # type: ignore[no-untyped-def]
        if "fsdp_jobs.launchers.node" in argv:
            raise PermissionError(13, "Permission denied", argv[0])
        return real(argv, *a, **k)

    monkeypatch.setattr(sp, "Popen", refuse_nodes)
    umask = os.umask(0o022)
    try:
        assert main(["cluster=local", "nodes=2", "gpus_per_node=1", "name=nostart", f"run_root={run_root}"]) == 1
    finally:
        os.umask(umask)  # the CLI makes everything owner-only; later tests in this process must not inherit it
    out = capsys.readouterr()
    said = [line for line in (out.out + out.err).splitlines() if "could not start" in line]
    assert said == [f"fsdp-jobs: could not start the job's node0 on this machine: [Errno 13] Permission denied: "
                    f"'{sys.executable}'; nothing ran"], out
    assert "Traceback" not in out.out + out.err
    assert said[0] in (run_root / "nostart" / "logs" / "launcher.log").read_text()


# train.compile=true on CPU under cluster=local: (PATH holds g++, $CXX, TORCH_INDUCTOR_INSTALL_GXX) -> refused?
COMPILER_CASES = [
    ("with-g++", {}, False),
    ("no-g++", {"PATH": "EMPTY"}, True),
    ("no-g++-but-CXX", {"PATH": "EMPTY", "CXX": sys.executable}, False),  # an absolute $CXX needs no PATH
    ("no-g++-conda-gxx", {"PATH": "EMPTY", "TORCH_INDUCTOR_INSTALL_GXX": "1"}, False),
]


@pytest.mark.parametrize("name, env, refused", COMPILER_CASES, ids=[c[0] for c in COMPILER_CASES])
def test_a_local_compiled_cpu_job_needs_a_cxx_compiler(run_root, tmp_path, monkeypatch, name, env, refused):
    """Without g++ on PATH every rank failed at its first step (BackendCompilerFailed, 381 lines)."""
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.errors import UserError

    gxx = tmp_path / "bin" / "g++"
    gxx.parent.mkdir()
    gxx.write_text("#!/bin/sh\n")
    gxx.chmod(0o755)
    monkeypatch.setenv("PATH", str(gxx.parent))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("TORCH_INDUCTOR_INSTALL_GXX", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, str(tmp_path / "empty") if v == "EMPTY" else v)
    cfg, _ = compose(["cluster=local", "cluster.device=cpu", "train.compile=true", f"run_root={run_root}"])
    backend = launcher.get("local")
    if refused:
        with pytest.raises(UserError, match="on CPU needs a C\\+\\+ compiler, and the ranks' PATH has no g\\+\\+"):
            backend.check(None, cfg)  # type: ignore[arg-type]
        cfg.train.compile = False
    backend.check(None, cfg)  # type: ignore[arg-type]
