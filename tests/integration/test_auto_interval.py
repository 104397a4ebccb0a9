"""checkpoint.interval=auto on a real local 2x2 job (fsdp_jobs/runtime/interval.py): the first attempt saves at
once to measure a save, then chooses from the prior; a rank killed after that; the restarted attempt
chooses again from the job's own failure (one in its wall time so far) and its measured saves, and saves
more often; `goodput` and `status` show each choice with its inputs. That `auto` beats fixed intervals on
the chaos marathon's schedule is the benchmark's (`python -m fsdp_jobs.bench interval`, README)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli
from tests.integration.test_local_runs import SHORT, kill_rank_and_finish

pytestmark = pytest.mark.integration


def test_auto_measures_a_save_then_chooses_again_from_the_jobs_own_failure(run_root):
    # no in-memory snapshots: the failure must cost checkpointed work to count (one recovered from memory is
    # not counted: tests/unit/test_interval.py)
    run_dir, out = kill_rank_and_finish(run_root, "auto", ("checkpoint.interval=auto", "train.steps=300",
                                                           "train.log_interval=50", "checkpoint.memory_interval=0",
                                                           *SHORT), after_step=10)
    assert "checkpoint.interval=auto: a checkpoint now, to measure what a save blocks" in out
    gp = json.loads(cli("goodput", "auto", "--json", "--run-root", str(run_root)).stdout)
    first, last = gp["attempts"][0]["checkpoint_interval"], gp["attempts"][-1]["checkpoint_interval"]
    assert first["failures"] == 0 and first["mtbf_from"] == "prior: 6000 h per node / 2 nodes", first
    assert first["save_from"] == "measured: 1 save" and first["steps"] > 300, first  # the prior: hours apart
    assert last["failures"] == 1 and last["mtbf_from"].startswith("1 failure in "), last
    assert last["mtbf_s"] == pytest.approx(last["exposure_s"], rel=1e-3)  # one failure in the job's wall time
    assert last["save_from"].startswith("measured: ") and 1 <= last["steps"] < first["steps"], last
    assert last["next"] - last["step"] == last["steps"]
    status = json.loads(cli("status", "auto", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and status["goodput"]["checkpoint_interval"] == last
    text = cli("goodput", "auto", "--run-root", str(run_root)).stdout
    assert f"every {last['steps']} steps" in text and "1 failure in " in text
    # the restarted attempt checkpointed at the steps it chose (each save chose again: same inputs, about
    # the same interval), and every line of the job says which
    assert out.count("checkpoint.interval=auto: every ") >= 2
