"""preflight on the real 4-node SLURM cluster (README: Preflight). A node whose link is slowed
(deploy/slurm/slow-link.sh: a tc token bucket on its namespace's eth0) is named by the pair all-reduce,
and with cluster.exclude_bad_nodes=true the job is requeued without it and trains on the other nodes;
healthy clusters pass, run after run."""

from __future__ import annotations

import json
import subprocess

import pytest

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from tests.conftest import REPO, SHORT, cli, metrics
from tests.slurm.conftest import job_log, submit, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

SLOW_LINK = REPO / "deploy" / "slurm" / "slow-link.sh"


def slow_link(node: str, rate: str) -> None:
    r = subprocess.run(["bash", str(SLOW_LINK), node, rate], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def slowed_n1():
    slow_link("n1", "500mbit")
    try:
        yield "n1"
    finally:
        slow_link("n1", "off")


def test_a_node_with_a_slowed_link_is_named_excluded_and_the_job_trains_on_the_others(run_root, slowed_n1):
    # 3 of the 4 nodes: SLURM gives an idle cluster's lowest-numbered nodes first, so n1 is in the first
    # allocation, and three others are left once it is excluded
    job_id, _, _ = submit(f"run_root={run_root}", "name=pf", "nodes=3", "gpus_per_node=1", "preflight=true",
                          "cluster.exclude_bad_nodes=true", "train.steps=20", *SHORT)
    run_dir = run_root / "pf"
    assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    log = job_log(run_dir, job_id)
    print(log[-6000:])
    assert "preflight: bad node(s) n1: n1: all-reduce bus GB/s with its neighbour nodes" in log, log[-4000:]
    assert f"requeued job {job_id} with --exclude=n1" in log
    launch = runs.last_launch(run_dir)
    assert launch["requeue"] == "preflight" and launch["exclude"] == ["n1"] and "n1" in launch["why"]
    rd = RunDir(run_dir)  # the CLI's record holds the submission alone, task 0's the requeue
    assert [r.get("requeue") for r in runs.read_jsonl(rd.launches_file)] == [None]
    assert [r.get("requeue") for r in runs.read_jsonl(rd.node_launches_file)] == ["preflight"]
    report = json.loads((run_dir / "preflight.json").read_text())  # the newest: the second attempt's
    assert report["ok"] and sorted(report["nodes"]) == ["n2", "n3", "n4"], report
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()]
    assert sorted(r["node"] for r in ranks) == ["n2", "n3", "n4"]
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 21))
    assert runs.read_state(run_dir)["status"] == "completed"


def test_a_healthy_cluster_passes_preflight_five_times_out_of_five(run_root):
    """preflight=only on all 4 nodes, five jobs queued at once (they run one after another): no node named
    (a false alarm costs a requeue)."""
    jobs = [submit(f"run_root={run_root}", f"name=healthy{i}", "nodes=4", "gpus_per_node=1", "preflight=only",
                   *SHORT)[0] for i in range(5)]
    for i, job_id in enumerate(jobs):
        run_dir = run_root / f"healthy{i}"
        assert wait_job(job_id, 300) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
        report = json.loads((run_dir / "preflight.json").read_text())
        assert report["ok"] and report["bad"] == [] and sorted(report["nodes"]) == ["n1", "n2", "n3", "n4"], \
            job_log(run_dir, job_id)[-3000:]
        # the four nodes share this machine's kernel (one boot id, four host names): their local checks take turns
        assert {rk["turns"] for rk in report["ranks"]} == {4}, report["ranks"]
        print(f"run {i}: {report['seconds']} s, rechecked {report.get('rechecked', [])}, medians {report['medians']}")


def test_a_node_the_preflight_names_is_replaced_by_the_hot_spare_and_the_job_completes(run_root):
    """cluster.spare_nodes=1 on 3 nodes (all 4 allocated, --no-kill) with preflight=true, the first attempt's second
    node by node rank that does not serve the rendezvous store 3x slow at its checks (a test fault: which node
    waits as the spare is a race). The preflight names it and, a spare waiting, does not fail the job: that
    node's agent leaves and its SLURM task ends 0 with one line (not `torchrun exited with 0 ...`, which a
    task read as a failure: launchers/slurm/node_task.py), the spare joins, the new world passes, and the
    job trains at world 3 on the other three nodes; SLURM says COMPLETED."""
    job_id, _, _ = submit(f"run_root={run_root}", "name=vet", "nodes=3", "gpus_per_node=1", "preflight=true",
                          "cluster.spare_nodes=1", "train.steps=20", "+cluster.env.FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE_RANK=2",
                          *SHORT)
    run_dir = run_root / "vet"
    assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    log = job_log(run_dir, job_id)
    [entry] = [json.loads(line) for line in (run_dir / "replaced-nodes.jsonl").read_text().splitlines()]
    [named] = entry["nodes"]
    assert named != "n1", entry  # n1, the first host, serves the rendezvous store: never replaceable
    assert f"{named}: the preflight named this node and a hot spare takes its place" in log, log[-4000:]
    assert "torchrun exited" not in log and "RuntimeError" not in log, log[-4000:]
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()]
    assert named not in {r["node"] for r in ranks} and len(ranks) == 3, ranks
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 21)) and {x["world_size"] for x in m} == {3}
    status = json.loads(cli("status", "vet", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and status["replaced_nodes"] == [named], status
