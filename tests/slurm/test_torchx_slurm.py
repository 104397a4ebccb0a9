"""`torchx run -s slurm fsdp_jobs.job ...` on the real SLURM cluster: TorchX's own SLURM scheduler (one sbatch
heterogeneous job, a group a node, srun) runs the job's node wrapper on two nodes; a second submission of the
same name resumes from the first's checkpoint; `fsdp-jobs status` reads the run through TorchX (sacct), and
`fsdp-jobs cancel` cancels it through TorchX (scancel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_jobs.rundir import runs
from tests.conftest import SHORT, cli, listed_row, metrics
from tests.slurm.conftest import wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

TORCHX = str(Path(sys.executable).parent / "torchx")
ARGS = ("name=txs", "nodes=2", "gpus_per_node=1", "cluster.device=cpu", "checkpoint.interval=10", *SHORT)


def torchx_submit(run_root: Path, *overrides: str) -> str:
    """The SLURM job id of the app `torchx run` submitted (it prints the handle and returns at once)."""
    r = subprocess.run([TORCHX, "run", "-s", "slurm", "fsdp_jobs.job", f"run_root={run_root}", *ARGS, *overrides],
                       cwd=run_root.parent, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    handle = next(line for line in r.stdout.splitlines() if line.startswith("slurm://"))
    return handle.rsplit("/", 1)[1]


def node_logs(run_root: Path, job_id: str) -> str:
    """What srun wrote for each node: TorchX's slurm-ID-node-K.out/.err, in the directory torchx ran in."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(run_root.parent.glob(f"slurm-{job_id}-*")))


def status(run_root: Path) -> dict:
    r = cli("status", "txs", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_torchx_submits_two_nodes_to_slurm_a_second_submission_resumes_status_reads_and_cancel_stops_it(run_root):
    run_dir = run_root / "txs"
    first = torchx_submit(run_root, "train.steps=20")
    assert status(run_root)["state"] in ("UNKNOWN", "PENDING", "RUNNING")  # not an outcome before it has one
    assert wait_job(first) == "COMPLETED", node_logs(run_root, first)
    assert [x["step"] for x in metrics(run_dir)] == list(range(1, 21))
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()]
    assert sorted(r["node"] for r in ranks) == ["node0", "node1"] and len({r["host"] for r in ranks}) == 2
    info = status(run_root)
    assert info["backend"] == "torchx" and info["job_id"] == first and info["app_handle"] == f"slurm://torchx/{first}"
    assert info["state"] == "SUCCEEDED" and f"slurm://torchx/{first}: SUCCEEDED" in info["detail"], info

    second = torchx_submit(run_root, "train.steps=30")
    assert wait_job(second) == "COMPLETED", node_logs(run_root, second)
    assert "resumed from step-000020" in node_logs(run_root, second)
    assert [x["step"] for x in metrics(run_dir)] == list(range(1, 31))
    info = status(run_root)
    assert info["job_id"] == second and info["state"] == "SUCCEEDED" and info["last_step"]["step"] == 30, info
    row = listed_row(cli("list", "--run-root", str(run_root)).stdout, "txs")
    assert row[1:5] == ["torchx", second, "SUCCEEDED", "30"], row

    third = torchx_submit(run_root, "train.steps=3000")  # cancelled as soon as its first node has started
    handle = f"slurm://torchx/{third}"  # replica 0 records it in the nodes' launch record
    wait_for(lambda: runs.last_launch(run_dir).get("app_handle") == handle, 120, "the first node")
    r = cli("cancel", "txs", "--run-root", str(run_root))
    assert r.returncode == 0 and f"asked TorchX to cancel slurm://torchx/{third}" in r.stdout, r.stderr
    assert wait_job(third) == "CANCELLED"
    info = status(run_root)
    assert info["job_id"] == third and info["state"] == "CANCELLED", info
