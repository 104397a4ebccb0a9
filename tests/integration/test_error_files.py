"""A rank that raises writes torchrun's error file (@record): the agent's failure summary in the job
log carries the rank's real traceback instead of a pointer to the docs."""

from __future__ import annotations

import pytest

from tests.conftest import cli, train_record

pytestmark = pytest.mark.integration


def test_a_failing_ranks_traceback_reaches_the_failure_summary(run_root):
    r = cli(f"run_root={run_root}", "name=fails", "nodes=1", "gpus_per_node=2", "cluster.max_restarts=0",
            "train.steps=5", "model.dim=64", "model.n_layers=1", "model.ffn_dim=128", "model.vocab_size=128",
            "data.seq_len=16", env={"FSDP_JOBS_TEST_FAIL_AT_STEP": "2"})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    summary = out[out.index("Root Cause"):]  # torchrun's ChildFailedError report
    assert "To enable traceback" not in summary  # what torchrun says when no error file was written
    assert "test fault injection: step 2 raises" in summary and "train.py" in summary


def test_a_failing_scripts_exception_reaches_the_failure_summary_like_the_trainers(run_root, tmp_path):
    """script= runs under the same @record as the built-in trainer (fsdp_jobs/runtime/user_code.py)."""
    script = tmp_path / "boom.py"
    script.write_text("import os, sys\n"
                      "if __name__ == '__main__':\n"
                      "    assert sys.argv[1:] == ['--lr', '3'], sys.argv\n"
                      "    raise ValueError(f'boom from rank {os.environ[\"RANK\"]}')\n")
    r = cli(f"run_root={run_root}", "name=boom", "nodes=1", "gpus_per_node=2", "cluster.max_restarts=0",
            f"script={script}", "script_args=[--lr,3]")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    summary = out[out.index("Root Cause"):]
    assert "To enable traceback" not in summary and "error_file: <N/A>" not in summary
    assert "ValueError: boom from rank" in summary and "boom.py" in summary


def test_a_failure_that_repeats_is_not_retried_until_the_budget_is_gone(run_root, tmp_path):
    """A script that raises the same exception at start-up in two attempts in a row will raise it again:
    the job stops as failed after the second (not after cluster.max_restarts + 1 = 4), with that exception
    as its reason (fsdp_jobs/rundir/failures.py, launchers/node/wrapper.py)."""
    import json

    script = tmp_path / "boom.py"
    script.write_text("raise ValueError('bad config value 42')\n")
    r = cli(f"run_root={run_root}", "name=boom", f"script={script}", "cluster.max_restarts=3")
    assert r.returncode != 0
    failures = [json.loads(line) for line in (run_root / "boom" / "failures.jsonl").read_text().splitlines()]
    assert len({f["attempt"] for f in failures}) == 2, failures  # run twice, not four times
    state = train_record(run_root / "boom")
    assert state["status"] == "failed" and "ValueError: bad config value 42" in state["reason"], state
    assert "the same failure twice in a row, at start-up: ValueError: bad config value 42" in r.stdout
