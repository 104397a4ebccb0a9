"""A slow node is named (fsdp_jobs/rundir/stragglers.py), on a real local job of 3 nodes x 1 rank: `fsdp-jobs chaos
RUN slow-node 1` throttles node1's rank (a CPU quota of a fifth of a core); `status` names node1 with a ratio of
at least 1.5 and no other node, node1's own watchdog warns in the log, and no node is named while the job
runs unthrottled."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import cli, metrics
from tests.integration.test_local_runs import start, wait_for

pytestmark = pytest.mark.integration

# steps of several times the smallest model's compute (about 0.12 s on CI's machine): a node's compute is a
# mean over its last 20 steps without the longest (fsdp_jobs/runtime/heartbeat.py steady_mean), and over 20 of
# the smallest steps a scheduling stall of the other test worker's containers named a healthy node
MODEL = ("model.dim=128", "model.n_layers=2", "model.ffn_dim=512", "model.vocab_size=256", "data.seq_len=128")
ARGS = ("nodes=3", "gpus_per_node=1", "train.steps=100000", "checkpoint.interval=0", "train.log_interval=10",
        "fault.straggler_checks=2", *MODEL)


def status(run_root, name) -> dict:
    r = cli("status", name, "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_throttled_node_is_named_by_status_and_warned_about_and_no_other(run_root):
    run_dir = run_root / "slow"
    proc = start([f"run_root={run_root}", "name=slow", *ARGS])
    try:
        wait_for(lambda: len(metrics(run_dir)) >= 60 if (run_dir / "metrics.jsonl").exists() else False, 300, proc)
        healthy = status(run_root, "slow")["stragglers"]
        assert healthy["stragglers"] == [], healthy  # unthrottled: nobody is named

        chaos = cli("chaos", "slow", "slow-node", "1", "--run-root", str(run_root))
        assert chaos.returncode == 0 and "throttling node1" in chaos.stdout, chaos.stderr
        throttled_at, named = time.time(), None
        while time.time() - throttled_at < 120 and proc.poll() is None:
            s = status(run_root, "slow")
            if s["stragglers"]["stragglers"]:
                named = s
                break
            time.sleep(2)
        assert named is not None, status(run_root, "slow")
        slow = named["stragglers"]
        print(f"named {time.time() - throttled_at:.0f} s after the throttle: {slow}")
        assert slow["stragglers"] == ["node1"] and slow["slowest"] == "node1" and slow["ratio"] >= 1.5, slow
        assert "straggler: node1 (slowest node1" in named["detail"]
        # the node's watchdog checks every 10 s and warns after fault.straggler_checks=2 checks in a row
        log = run_dir / "logs" / "launcher.log"
        wait_for(lambda: ": straggler: " in log.read_text(), 90, proc)
        assert cli("chaos", "slow", "resume", "--run-root", str(run_root)).returncode == 0
    finally:
        cli("cancel", "slow", "--run-root", str(run_root))
        out, _ = proc.communicate(timeout=300)
    warnings = [line for line in out.splitlines() if ": straggler: " in line]
    print("\n".join(warnings))
    assert warnings and all("node1: straggler: this node's ranks compute" in w for w in warnings), warnings


def test_a_job_shorter_than_a_watchdog_tick_still_has_every_nodes_compute(run_root):
    """20 tiny steps on 2 nodes: the ranks are timed and gone within a second, between two ticks of a node's
    watchdog. Each watchdog publishes its ranks' final heartbeats when its agent exits, so `status` of the
    finished run compares both nodes (without that, 3 of 4 such runs here had no straggler view at all; a
    SLURM sweep member's `compare` row named no slowest node)."""
    r = cli(f"run_root={run_root}", "name=short", "nodes=2", "gpus_per_node=1", "train.steps=20",
            "checkpoint.interval=10", "model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128",
            "data.seq_len=32")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    view = status(run_root, "short").get("stragglers")
    assert view and sorted(view["nodes"]) == ["node0", "node1"], view
