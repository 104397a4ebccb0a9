"""The environments a user's shell may hand the CLI (issue #44): each either works or is refused in one line,
exit 2, before anything is written; never a traceback. (A real job under an outer allocation's variables:
tests/integration/test_user_environment.py.)"""

from __future__ import annotations

import os
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
