"""The preflight's verdict on hand-made numbers (fsdp_jobs/runtime/preflight_verdict.py): a node 2x worse than the median
node on any measure is named, healthy nodes are not, a node whose check failed is named, the run dir's free
space is compared with the next checkpoint only when its size is known. And how the ranks' entry is chosen."""

from __future__ import annotations

import pytest

from fsdp_jobs.runtime.preflight_verdict import MEASURES, best_of, cleared_notes, slow_named, table, verdict


def rank(r: int, node: str, **over: object) -> dict:
    rec = {"rank": r, "node": node, "matmul_tflops": 10.0, "allreduce_busbw_gbps": 20.0, "pair_busbw_gbps": 15.0,
           "write_mb_s": 500.0,
           "host_free_gb": 100.0, "gpu_free_gb": 70.0, "disk_free_gb": 1000.0, "error": None}
    return {**rec, **over}


def cluster(**slow: dict) -> list[dict]:
    """4 nodes x 2 ranks, healthy unless `slow` gives a node's rank 1 other numbers."""
    return [rank(2 * n + i, f"gpu-{n}", **(slow.get(f"gpu_{n}", {}) if i == 1 else {}))
            for n in range(4) for i in range(2)]


def test_healthy_nodes_with_ordinary_spread_are_not_named():
    results = cluster(gpu_1={"matmul_tflops": 6.0}, gpu_2={"write_mb_s": 300.0}, gpu_3={"host_free_gb": 60.0})
    v = verdict(results, 2.0, checkpoint_gb=10.0)
    assert v["ok"] and v["bad"] == [] and all(row["verdict"] == "ok" for row in v["nodes"].values()), v


@pytest.mark.parametrize("key", [m[0] for m in MEASURES if m[0] != "allreduce_busbw_gbps"])
def test_a_node_2x_worse_on_any_measure_is_named_and_no_other(key):
    v = verdict(cluster(gpu_2={key: rank(0, "x")[key] / 2}), 2.0)
    assert v["bad"] == ["gpu-2"] and not v["ok"], v
    assert "2.00x worse than the median node's" in v["nodes"]["gpu-2"]["verdict"]
    assert v["nodes"]["gpu-2"]["ranks"] == [4, 5]  # a node's value is its worst rank's


def test_the_threshold_is_the_configured_ratio():
    results = cluster(gpu_0={"matmul_tflops": 10.0 / 1.8})
    assert verdict(results, 2.0)["bad"] == [] and verdict(results, 1.5)["bad"] == ["gpu-0"]


def test_a_node_whose_check_failed_is_named_with_its_error():
    v = verdict(cluster(gpu_3={"matmul_tflops": None, "error": "matmul_tflops: RuntimeError: CUDA error: ECC"}), 2.0)
    assert v["bad"] == ["gpu-3"] and "failed: rank 7: matmul_tflops: RuntimeError: CUDA error: ECC" in \
        v["nodes"]["gpu-3"]["verdict"]


def test_the_all_reduce_is_job_wide_and_names_nobody():
    """Every rank waits for the slowest in a collective: no node can be told apart by it (it is reported)."""
    assert verdict(cluster(gpu_1={"allreduce_busbw_gbps": 1.0}), 2.0)["bad"] == []


@pytest.mark.parametrize("nodes", range(1, 10))
def test_the_ring_of_node_pairs_puts_every_node_in_two_pairs_and_no_node_twice_in_a_round(nodes):
    from fsdp_jobs.runtime.preflight import ring_edges

    rounds = ring_edges(nodes)
    if nodes < 3:
        assert rounds == []
        return
    for pairs in rounds:
        members = [n for p in pairs for n in p]
        assert len(members) == len(set(members))
    edges = [p for pairs in rounds for p in pairs]
    assert sorted(edges) == sorted((i, (i + 1) % nodes) for i in range(nodes)) and len(rounds) <= 3


def test_free_space_is_compared_with_the_next_checkpoint_only_when_its_size_is_known():
    results = cluster(gpu_1={"disk_free_gb": 5.0})
    v = verdict(results, 2.0, checkpoint_gb=8.0)
    assert v["bad"] == ["gpu-1"] and "disk: 5 GB free in the run dir < the next checkpoint 8 GB" in \
        v["nodes"]["gpu-1"]["verdict"]
    v = verdict(results, 2.0, checkpoint_gb=None)
    assert v["ok"] and any("free space is shown, not compared" in n for n in v["notes"])


def test_one_node_is_judged_on_failures_alone_and_missing_nodes_are_noted():
    v = verdict([rank(0, "a", matmul_tflops=0.001)], 2.0, expected_nodes=2)
    assert v["ok"] and any("1 of 2 nodes came up" in n for n in v["notes"])
    assert any("only failures count" in n for n in v["notes"])


def test_the_table_has_one_row_per_node_with_every_measure_and_the_verdict():
    v = verdict(cluster(gpu_2={"write_mb_s": 100.0}), 2.0, checkpoint_gb=1.0)
    lines = table(v).splitlines()
    assert lines[0].split() == ["NODE", "RANKS", "MATMUL_TFLOPS", "ALLREDUCE_GB/S", "PAIR_GB/S", "WRITE_MB/S", "HOST_FREE_GB",
                                "GPU_FREE_GB", "DISK_FREE_GB", "VERDICT"]
    assert len(lines) == 5 and lines[3].startswith("gpu-2  4,5") and "run dir write MB/s 100 is 5.00x" in lines[3]
    assert lines[1].split()[-1] == "ok"


def test_a_node_slow_once_is_cleared_by_the_recheck_and_one_slow_twice_is_named():
    """The recheck round: each rank keeps the better of its two numbers, so a node is named slow only when
    both rounds found it slow (a healthy node's fsync can be several times slower for one round: another
    process's writeback)."""
    first = cluster(gpu_1={"write_mb_s": 100.0}, gpu_2={"matmul_tflops": 2.0})
    v1 = verdict(first, 2.0)
    assert v1["bad"] == ["gpu-1", "gpu-2"] and slow_named(v1) == ["gpu-1", "gpu-2"]
    second = cluster(gpu_1={"write_mb_s": 490.0}, gpu_2={"matmul_tflops": 2.5}, gpu_3={"write_mb_s": 90.0})
    merged = best_of(first, second)
    assert [r["rank"] for r in merged] == list(range(8))
    assert merged[3]["write_mb_s"] == 490.0 and merged[5]["matmul_tflops"] == 2.5
    assert merged[7]["write_mb_s"] == 500.0  # slow in the second round only: the first round's number stands
    v2 = verdict(merged, 2.0)
    assert v2["bad"] == ["gpu-2"], v2
    notes = cleared_notes(v1, v2)
    assert len(notes) == 1 and notes[0].startswith("gpu-1 was slow in the first round only (run dir write MB/s 100")


def test_no_recheck_for_a_failed_check_or_a_full_disk():
    """A failure is not noise (and a failed collective leaves the ranks out of step); free space is no timing."""
    assert slow_named(verdict(cluster(gpu_3={"matmul_tflops": None, "error": "ECC"}, gpu_1={"write_mb_s": 1.0}),
                              2.0)) == []
    assert slow_named(verdict(cluster(gpu_1={"disk_free_gb": 5.0}), 2.0, checkpoint_gb=8.0)) == []
    assert slow_named(verdict(cluster(), 2.0)) == []


def test_preflight_only_runs_the_checks_instead_of_a_script():
    from omegaconf import OmegaConf

    from fsdp_jobs.launchers.common import rank_entry

    cfg = OmegaConf.create({"script": "/x/train.py", "module": None, "script_args": [], "preflight": "only"})
    assert rank_entry(cfg, "/runs/a", None) == ["-m", "fsdp_jobs.runtime", "/runs/a"]
    cfg.preflight = False
    assert rank_entry(cfg, "/runs/a", None)[:3] == ["-m", "fsdp_jobs.runtime.user_code", "--"]


def test_a_named_node_makes_the_node_wrapper_exit_non_zero(tmp_path, capsys):
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.node.wrapper import NO_RESTART_RC, decided_status

    assert decided_status(0, tmp_path, "node0") == 0
    runs.write_state(tmp_path, status="failed", stage="preflight", bad_nodes=["node1"], reason="preflight: node1")
    assert decided_status(0, tmp_path, "node0") == NO_RESTART_RC
    assert "node0: stopped before training: preflight: node1" in capsys.readouterr().out
    assert decided_status(1, tmp_path, "node0") == 1  # a real failure keeps its own status
    # where the engine restarts a failed node (Docker): exit 0, or it reruns the same checks N times
    assert decided_status(0, tmp_path, "node0", engine_restarts=True) == 0
    assert "stopped before training: preflight: node1; not restarted" in capsys.readouterr().out
    # Kubernetes: the verdict is also the container's termination message, which `fsdp-jobs status` reads
    log = tmp_path / "termination-log"
    assert decided_status(1, tmp_path, "node0", termination_log=str(log)) == 1 and not log.exists()
    assert decided_status(0, tmp_path, "node0", termination_log=str(log)) == NO_RESTART_RC
    assert log.read_text() == "fsdp-jobs preflight named a node: preflight: node1"


def test_the_preflight_command_is_the_job_with_preflight_only(cli_here, tmp_path):
    """`fsdp-jobs preflight OVERRIDES` plans the job those overrides describe with preflight=only (also over
    a preflight=true among them): the same run, the same backend, the checks in place of training."""
    from tests.conftest import REPO

    script = REPO / "tests" / "scripts" / "ddp_train.py"
    r = cli_here("preflight", f"run_root={tmp_path}", "name=pf", f"script={script}", "preflight=true", "dry_run=true")
    assert r.returncode == 0, r.stderr
    assert "-m fsdp_jobs.runtime " in r.stdout and "user_code" not in r.stdout.split("# launch commands", 1)[1]
    assert not (tmp_path / "pf").exists()  # a dry run writes nothing


def test_a_node_whose_wrapper_stopped_a_repeating_failure_is_not_restarted_by_its_engine(tmp_path, capsys):
    """The wrapper stops the agent on a failure that repeats (STOPPED_BY_WRAPPER, its node verdict saying
    why): exit 1 where nothing restarts nodes by itself (local, SLURM), exit 0 where the engine would
    (Docker's on-failure), so that the engine does not start it again to stop again; the job still fails by
    that verdict. And a user's script whose nodes exited 0 so is not then recorded as completed."""
    import time

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.outcome import JobState, outcome
    from fsdp_jobs.launchers.node.wrapper import STOPPED_BY_WRAPPER, decided_status, record_failed, settle_script

    began = time.time() - 1
    why = "the same failure twice in a row, at step 2: RuntimeError: boom (x.py:1); not retried again"
    record_failed(tmp_path, "node1", why, began)
    record_failed(tmp_path, "node0", "a later node's words", began)  # the first node to stop keeps its reason
    assert runs.read_node_verdict(tmp_path).reason == why and runs.read_state_record(tmp_path) is None
    assert decided_status(STOPPED_BY_WRAPPER, tmp_path, "node0", began=began) == 1
    assert decided_status(STOPPED_BY_WRAPPER, tmp_path, "node0", engine_restarts=True, began=began) == 0
    assert f"node0: the job failed: {why}; not restarted" in capsys.readouterr().out
    assert (outcome(tmp_path, began).state, outcome(tmp_path, began).train["reason"]) == (JobState.FAILED, why)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    job, _ = compose([f"script={script}"])
    assert settle_script(job, tmp_path, "node0", 0, since=began) == "failed"
    assert runs.read_node_verdict(tmp_path).status == "failed"  # not overwritten by "the script exited 0"
    assert settle_script(job, tmp_path, "node0", 0, since=time.time() + 1) == "completed"  # an older launch's failure
