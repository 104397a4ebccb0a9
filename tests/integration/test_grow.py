"""`fsdp-jobs scale RUN nodes=N` on cluster=local: a running 2-node job grows to 3 nodes; the ranks
checkpoint, re-rendezvous at the larger world and go on with the same global batch from the same data
position. (cluster=docker: tests/docker/test_docker_jobs.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import PACED, REPO, assert_grew_without_skipping_data, cli

pytestmark = pytest.mark.integration

SHORT = ("model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=16")
# 12 sequences a step: world 4 = 3 micro batches of 1 per rank, world 6 = 2. STEPS: the new node must join
# before the last step. Unpaced, a loaded machine can end the job before it joins. Paced (PACED: 0.1 s a
# step), the steps before the join cost sleep, not CPU, whatever the load: 100 steps last at least 10 s
STEPS = 100
GROW_ARGS = ("nodes=2", "cluster.max_nodes=3", "gpus_per_node=2", "train.global_batch_size=12",
             "train.micro_batch_per_rank=1", f"train.steps={STEPS}", "checkpoint.interval=50", "train.log_interval=1",
             PACED, *SHORT)


def wait_for_steps(run_dir: Path, proc: subprocess.Popen[str], steps: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        path = run_dir / "metrics.jsonl"
        if path.exists() and path.read_text().count('"step"') >= steps:
            return
        assert proc.poll() is None, f"job ended early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"no step {steps} in {timeout}s"
        time.sleep(0.2)


def test_a_running_job_grows_from_two_nodes_to_three_without_skipping_data(run_root):
    run_dir = run_root / "grow"
    job = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", "name=grow", *GROW_ARGS],
                           cwd=REPO, text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    try:
        wait_for_steps(run_dir, job, 3)
        r = cli("scale", "grow", "nodes=3", "--run-root", str(run_root))
        assert r.returncode == 0, r.stderr
        assert "to grow grow to 3 nodes" in r.stdout
        out, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out[-4000:]
    assert "node2 added (fsdp-jobs scale)" in out
    assert_grew_without_skipping_data(run_dir, 4, 6, 12, STEPS)
    assert "global batch 12 (3/rank = 3 micro batches of 1)" in out, out[-3000:]  # world 4, then world 6:
    assert "global batch 12 (2/rank = 2 micro batches of 1)" in out, out[-3000:]  # the same batch by accumulation
    for args, says in ((("nodes=3",), "is not running"), (("nodes=4",), "must be from 3 to 3"),
                       (("3",), "need nodes=N, N from 3 to 3")):
        r = cli("scale", "grow", *args, "--run-root", str(run_root))
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert says in r.stderr, (args, r.stderr)
