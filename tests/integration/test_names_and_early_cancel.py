"""Truthful outcomes at a job's start: two unnamed jobs started together both run (generated names are unique by
construction, not by the second)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, SHORT, metrics

pytestmark = pytest.mark.integration


def ended(proc: subprocess.Popen[str], timeout: float) -> str:
    """Its output once it ended; killed (and the test failed) if it has not within `timeout`."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running after {timeout:.0f} s:\n{proc.communicate()[0][-3000:]}") from None


# both launchers name their run in the same second, whenever each gets there (python -m fsdp_jobs otherwise)
SAME_SECOND = ("import runpy, time; time.strftime = lambda *a: '20261125-054153'; "
               "runpy.run_module('fsdp_jobs', run_name='__main__', alter_sys=True)")


def test_two_unnamed_jobs_started_together_both_run(run_root):
    """Their names were the model, the strategy and the second: the second job found the first's run dir busy
    and was refused for a name its user never gave."""
    args = [f"run_root={run_root}", "nodes=1", "gpus_per_node=1", "train.steps=2", *SHORT]
    jobs = [subprocess.Popen([sys.executable, "-c", SAME_SECOND, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT) for _ in range(2)]
    outs = [ended(p, 600) for p in jobs]
    assert [p.returncode for p in jobs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    names = sorted(p.name for p in run_root.iterdir())
    assert len(names) == 2 and all(f"finished: {n}" in "".join(outs) for n in names), (names, outs)
    assert all(n.startswith("tiny-hybrid_shard-20261125-054153-") for n in names), names
    assert all(metrics(run_root / n)[-1]["step"] == 2 for n in names)
