"""cluster=local on a GPU host: every simulated node gets GPUs of its own.

Each node's torchrun numbers its ranks from LOCAL_RANK 0 and rank r binds cuda:r, so two nodes without
their own CUDA_VISIBLE_DEVICES would put two ranks on one GPU (NCCL refuses: duplicate GPU). Checked on
the dry run's commands; no GPU is needed to read them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Optional


def dry(cli: Any, tmp_path: Path, env: dict[str, Optional[str]], *args: str) -> subprocess.CompletedProcess[str]:
    return cli("dry_run=true", f"run_root={tmp_path / 'runs'}", "nodes=2", "gpus_per_node=2", *args, env=env)


def visible_per_node(stdout: str) -> list[str]:
    commands = stdout.split("# launch commands (local)\n", 1)[1]
    return re.findall(r"CUDA_VISIBLE_DEVICES=(\S*) ", commands)


def test_each_simulated_node_gets_its_own_gpus(cli_here, tmp_path):
    r = dry(cli_here, tmp_path, {"CUDA_VISIBLE_DEVICES": None}, "cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    assert visible_per_node(r.stdout) == ["0,1", "2,3"]


def test_the_gpus_come_from_the_callers_cuda_visible_devices(cli_here, tmp_path):
    r = dry(cli_here, tmp_path, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "cluster.device=cuda")
    assert r.returncode == 0, r.stderr
    assert visible_per_node(r.stdout) == ["4,5", "6,7"]


def test_too_few_gpus_is_one_line_and_a_cpu_job_sets_none(cli_here, tmp_path):
    r = dry(cli_here, tmp_path, {"CUDA_VISIBLE_DEVICES": "4,5,6"}, "cluster.device=cuda")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cluster.device" in lines[0] and "need 4 GPUs" in lines[0], lines
    cpu = dry(cli_here, tmp_path, {"CUDA_VISIBLE_DEVICES": "4"}, "cluster.device=cpu")
    assert cpu.returncode == 0, cpu.stderr
    assert visible_per_node(cpu.stdout) == []
    assert not (tmp_path / "runs").exists()
