"""No value a user (or a careless copy-paste) gives can run a command through the batch script.

The dry run prints exactly the script sbatch gets (tests/unit/test_sbatch.py, and the SLURM tier holds
submitted == shown). Each case puts a harmless payload (`touch <dir>/PWNED`) into one value: either the
value is refused (one line, exit 2: a newline, which would start a line of its own) or the script is
accepted, then checked with `bash -n` and run with bash, `srun` being a stub that only records its
arguments. Either way the payload must never run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = str(REPO / "tests" / "scripts" / "ddp_train.py")


def payloads(pwned: Path) -> dict[str, str]:
    touch = f"touch {pwned}"
    return {"newline": f"x\n{touch} #", "subshell": f"$({touch})", "backticks": f"`{touch}`",
            "semicolon": f"x; {touch}", "quote": f"x'; {touch}; echo '", "dquote": f'x"; {touch}; echo "'}


# where a value lands in the script: an #SBATCH line, an export, the srun line, a comment
VECTORS = {
    "name": lambda v: [f"name='{v}'"],
    "cluster.partition": lambda v: [f"cluster.partition='{v}'"],
    "cluster.job_name": lambda v: [f"cluster.job_name='{v}'"],
    "cluster.sbatch.comment": lambda v: [f"+cluster.sbatch.comment='{v}'"],
    "cluster.env.FOO": lambda v: [f"+cluster.env.FOO='{v}'"],
    "script_args": lambda v: [f"script={SCRIPT}", f"script_args=['{v}']"],
    "sweep name": lambda v: ["-m", f"name='{v}'", "train.seed=1,2"],
}


def dry_run(argv: list[str], run_root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from fsdp_jobs.__main__ import main

    umask = os.umask(0o022)
    os.umask(umask)
    capsys.readouterr()
    try:
        rc = main(["cluster=slurm", "cluster.gpus=true", *argv, f"run_root={run_root}", "dry_run=true"])
    except SystemExit as e:
        rc = int(e.code or 0)
    finally:
        os.umask(umask)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("kind", sorted(payloads(Path("/x"))))
@pytest.mark.parametrize("vector", sorted(VECTORS))
def test_no_value_runs_a_command_in_the_batch_script(vector, kind, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    pwned = tmp_path / "PWNED"
    value = payloads(pwned)[kind]
    if "'" in value and vector != "cluster.env.FOO":
        pytest.skip("a quote inside a quoted Hydra value is Hydra's syntax error, tested once with cluster.env")
    rc, out, err = dry_run(VECTORS[vector](value.replace("'", "\\'")), tmp_path / "runs", capsys)
    if rc != 0:  # refused: one line, nothing written
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "runs").exists()
    else:
        script = out.split("# launch commands (slurm)\n", 1)[1]
        path = tmp_path / "job.sbatch"
        path.write_text(script)
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr
        stub = tmp_path / "bin"
        stub.mkdir()
        (stub / "srun").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/srun-args\n')
        (stub / "srun").chmod(0o755)
        env = {"PATH": f"{stub}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "7"}
        subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert (tmp_path / "srun-args").exists(), "the script did not reach srun"
    assert not pwned.exists(), f"{vector}: the payload ran ({kind})"
    if kind == "newline":
        assert rc == 2, "a newline must never reach the script"


def test_the_stub_harness_would_see_a_payload(tmp_path):
    """The harness itself: a script line that does run the payload is seen (so a pass means something)."""
    pwned = tmp_path / "PWNED"
    path = tmp_path / "job.sbatch"
    path.write_text(f"#!/bin/bash\n#SBATCH --job-name=x\n# every node: torchrun x\n{payloads(pwned)['newline'].split(chr(10))[1]}\n")
    subprocess.run(["bash", str(path)], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert pwned.exists()
