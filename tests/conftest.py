"""Shared helpers: run the real CLI in a subprocess, read run dirs and checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
        module: str = "fsdp_jobs") -> subprocess.CompletedProcess[str]:
    """`python -m fsdp_jobs ARGS` as a user runs it (stdin closed, output captured)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=full_env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def committed(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("step-*") if (p / "manifest.json").is_file())


def manifest(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "manifest.json").read_text())


def load_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Every tensor and value of a DCP checkpoint, consolidated in this process (no process group)."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(ckpt), f"{tmp}/full.pt")
        return torch.load(f"{tmp}/full.pt", weights_only=False)


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root
