"""A user's script that succeeded ends its rank with status 0 even when the interpreter's teardown would
abort it (fsdp_jobs/runtime/user_code.py: `finished`): a process group the script never destroyed does
that to a rank now and then (gloo's threads at finalization), and torchrun then restarts that node alone.
A script's sys.exit(3) ends the rank with 3, recorded with its code and in torchrun's error file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fsdp_jobs.rundir import failures
from tests.conftest import REPO

# five interpreters that each import torch (the shim's torchrun @record): the jobs tier, not the quick loop
pytestmark = pytest.mark.integration

BOMB = '''
import atexit, os, sys

class Teardown:
    def __del__(self, _abort=os.abort):
        _abort()  # what std::terminate in a gloo thread at interpreter finalization does to the rank

sys.teardown = Teardown()  # lives until the interpreter's teardown
atexit.register(lambda: open(sys.argv[1], "w").write("atexit ran"))
print("script done")
{end}
'''


def run_shim(tmp_path, end: str) -> tuple[subprocess.CompletedProcess[str], str]:
    script, marker = tmp_path / "train.py", tmp_path / "marker"
    script.write_text(BOMB.format(end=end))
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs.runtime.user_code", str(script), str(marker)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    return r, marker.read_text() if marker.exists() else ""


def test_a_script_that_succeeded_exits_0_and_its_atexit_hooks_ran(tmp_path):
    for end in ("", "sys.exit(0)"):
        r, marker = run_shim(tmp_path, end)
        assert r.returncode == 0 and "script done" in r.stdout, (end, r.returncode, r.stderr[-2000:])
        assert marker == "atexit ran", end  # a tracker's finish() registered with atexit still happens


def test_a_failing_script_still_fails(tmp_path):
    r, _ = run_shim(tmp_path, "sys.exit(3)")
    assert r.returncode != 0  # 3, or the teardown's abort: a failure either way, which torchrun restarts
    r, _ = run_shim(tmp_path, "raise ValueError('bad batch')")
    assert r.returncode != 0 and "ValueError: bad batch" in r.stderr


def test_sys_exit_3_in_a_script_is_recorded_with_its_code_and_in_torchruns_error_file(tmp_path):
    script, err = tmp_path / "bad.py", tmp_path / "error.json"
    script.write_text("import sys\n\nsys.exit(3)\n")
    env = {"FSDP_JOBS_RUN_DIR": str(tmp_path), "TORCHELASTIC_ERROR_FILE": str(err), "RANK": "1", "PATH": "/usr/bin"}
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs.runtime.user_code", str(script)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
    assert failures.cause(tmp_path) == "rank 1 exited 3: SystemExit: 3 (bad.py:3)"
    assert json.loads(err.read_text())["message"]["message"] == "SystemExit: 3"  # the node's failure line's source
