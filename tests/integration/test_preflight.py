"""preflight=true on a real local job of 3 nodes x 1 rank (README: Preflight): healthy nodes all pass and
the job trains, also when one was slow in the first round only (FSDP_JOBS_TEST_PREFLIGHT_SLOW_ONCE: the
recheck clears it); a node made 3x slower at its timed checks (FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE, a sleep
inside the timed region: fsdp_jobs/runtime/preflight.py) is named in the table, preflight.json and
state.json, and the job exits non-zero before any training step."""

from __future__ import annotations

import json

import pytest

from tests.conftest import cli, metrics
from tests.integration.test_local_runs import SHORT, assert_ok

pytestmark = pytest.mark.integration

ARGS = ("nodes=3", "gpus_per_node=1", "preflight=true", "train.steps=3", "checkpoint.interval=0", *SHORT)


def test_healthy_nodes_pass_preflight_and_the_job_trains(run_root):
    r = cli(f"run_root={run_root}", "name=ok", *ARGS, env={"FSDP_JOBS_TEST_PREFLIGHT_SLOW_ONCE": "node1"})
    assert_ok(r)
    print(r.stdout)
    run_dir = run_root / "ok"
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["ok"] and report["bad"] == [], report
    assert report["rechecked"] == ["node1"] and "node1" in report["first_round"]["bad"], report
    assert any(n.startswith("node1 was slow in the first round only") for n in report["notes"]), report["notes"]
    assert "node1 slow in the first round; measuring every node again" in r.stdout
    assert sorted(report["nodes"]) == ["node0", "node1", "node2"]
    assert all(row["verdict"] == "ok" for row in report["nodes"].values())
    assert len(report["ranks"]) == 3 and all(rk["matmul_tflops"] > 0 and rk["write_mb_s"] > 0 for rk in report["ranks"])
    assert report["checkpoint_gb"] > 0  # the plan's model state was compared with the free space
    assert "preflight: every node passed (3 nodes)" in r.stdout and "NODE   RANKS  MATMUL_TFLOPS" in r.stdout
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]  # then it trained


def test_a_slow_node_is_named_and_the_job_stops_before_any_step(run_root):
    r = cli(f"run_root={run_root}", "name=slow", *ARGS, env={"FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE": "node1"})
    print(r.stdout)
    assert r.returncode == 3, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    run_dir = run_root / "slow"
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["bad"] == ["node1"], report
    assert "worse than the median node's" in report["nodes"]["node1"]["verdict"]
    assert report["rechecked"] == ["node1"]  # slow twice: named
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "failed" and state["bad_nodes"] == ["node1"] and "node1" in state["reason"]
    assert "preflight: bad node(s) node1" in r.stdout
    assert not (run_dir / "metrics.jsonl").exists() or metrics(run_dir) == []  # no training step
    assert not list(run_dir.glob("checkpoints/step-*"))
