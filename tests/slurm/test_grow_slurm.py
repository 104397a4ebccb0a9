"""`fsdp-jobs scale RUN nodes=N` on the real SLURM cluster: an allocation's nodes are fixed, so the third
node comes as a second job whose task joins the running attempt's rendezvous (launchers/slurm/grow.py).
The ranks checkpoint, re-rendezvous at the larger world and go on with the same global batch from the
same data position; `fsdp-jobs cancel` then ends both jobs. (cluster=local: tests/integration/test_grow.py.)"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import PACED, SHORT, cli, metrics
from tests.slurm.conftest import job_log, job_state, submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

GLOBAL_BATCH = 6  # world 2: 3 micro batches of 1 per rank; world 3: 2


def worlds(run_dir) -> list[int]:
    return [m["world_size"] for m in metrics(run_dir)] if (run_dir / "metrics.jsonl").exists() else []


def test_a_running_job_grows_by_a_second_job_whose_node_joins_its_rendezvous(run_root):
    job_id, _, _ = submit(f"run_root={run_root}", "name=grow", "nodes=2", "cluster.max_nodes=3", "gpus_per_node=1",
                          f"train.global_batch_size={GLOBAL_BATCH}", "train.micro_batch_per_rank=1",
                          "train.steps=1000000", "checkpoint.interval=100000", "train.log_interval=1",
                          PACED, *SHORT)  # runs until cancelled: paced
    run_dir = run_root / "grow"
    wait_for(lambda: len(worlds(run_dir)) >= 5, 300, "step 5")
    r = cli("scale", "grow", "nodes=3", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    grown = re.search(r"submitted SLURM job (\d+) \(grow-grow, 1 node\(s\)\)", r.stdout)
    assert grown, r.stdout
    grow_id = grown.group(1)
    wait_for(lambda: worlds(run_dir).count(3) >= 5, 300, "five steps at world 3")

    again = cli("scale", "grow", "nodes=3", "--run-root", str(run_root))
    assert again.returncode == 2 and again.stdout == "" and "has 3 nodes already" in again.stderr, again.stderr
    r = cli("cancel", "grow", "--run-root", str(run_root))
    assert r.returncode == 0 and f"cancelled SLURM job {job_id}, {grow_id}" in r.stdout, r.stdout + r.stderr
    assert wait_job(job_id, 300) == "CANCELLED"
    assert wait_job(grow_id, 300) in ("CANCELLED", "COMPLETED", "FAILED"), job_state(grow_id)

    m = metrics(run_dir)
    steps = [x["step"] for x in m]
    assert steps == list(range(1, len(steps) + 1)), "a step was skipped or trained twice"
    assert [x["sample_start"] for x in m] == [GLOBAL_BATCH * i for i in range(len(m))], "the data position jumped"
    ws = worlds(run_dir)
    switch = ws.index(3)
    assert 0 < switch and ws == [2] * switch + [3] * (len(ws) - switch), ws
    assert {x["restart"] for x in m} == {0}  # a membership change, not a failure: no restart counted
    records = [json.loads(line) for line in (run_dir / "slurm" / "grow.jsonl").read_text().splitlines()]
    assert [(r["job_id"], r["nodes"], r["of"]) for r in records] == [(grow_id, 1, job_id)]
    log = job_log(run_dir, job_id)
    assert "global batch 6 (3/rank = 3 micro batches of 1)" in log, log[-3000:]
    grow_log = "\n".join(p.read_text(errors="replace") for p in (run_dir / "slurm" / grow_id).glob("*_log.out"))
    assert "joins rendezvous" in grow_log and f"of job {job_id}" in grow_log, grow_log[-3000:]
    # on a node of its own: nodes here may be shared, and SLURM once put the grow task on the job's first node
    job_nodes = set(re.findall(r"\(slurm node (\S+)\) job ", log))
    grow_nodes = set(re.findall(r"\(slurm node (\S+)\) joins rendezvous", grow_log))
    assert len(job_nodes) == 2 and len(grow_nodes) == 1 and not job_nodes & grow_nodes, (job_nodes, grow_nodes)
    assert "global batch 6 (2/rank = 2 micro batches of 1)" in log + grow_log
