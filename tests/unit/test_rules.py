"""Pure rules the runtime and the launchers rely on: which checkpoint counts as committed, the
learning-rate schedules, and the code snapshot's record of what was submitted."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_jobs.rundir.checkpoints import committed_checkpoints, is_committed, newest_checkpoint
from tests.conftest import REPO


def checkpoint(root: Path, name: str, metadata: bool = True, manifest: bool = True) -> Path:
    d = root / "checkpoints" / name
    d.mkdir(parents=True)
    if metadata:
        (d / ".metadata").write_bytes(b"x")
    if manifest:
        (d / "manifest.json").write_text("{}")
    return d


def test_only_whole_checkpoints_count_and_the_newest_is_by_step(tmp_path):
    checkpoint(tmp_path, "step-000010")
    checkpoint(tmp_path, "step-000100")
    checkpoint(tmp_path, "step-000020")
    checkpoint(tmp_path, "step-000200", manifest=False)  # torn: shards and DCP metadata, no commit marker
    checkpoint(tmp_path, "step-000300", metadata=False)  # a manifest without DCP's metadata
    checkpoint(tmp_path, ".tmp-step-000400-1-2")  # still being written (a rename makes it visible)
    checkpoint(tmp_path, "step-x")
    assert [s for s, _ in committed_checkpoints(tmp_path)] == [10, 20, 100]
    assert newest_checkpoint(tmp_path).name == "step-000100"
    assert not is_committed(tmp_path / "checkpoints" / "step-000200")
    assert newest_checkpoint(tmp_path / "nothing") is None


def schedule(kind: str, warmup: int = 10, total: int = 110, floor: float = 0.1):
    from fsdp_jobs.runtime.trainer import lr_lambda

    from fsdp_jobs.planning.config import TrainConfig

    return lr_lambda(TrainConfig(warmup_steps=warmup, steps=total, min_lr_ratio=floor, lr_schedule=kind))


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_warmup_is_linear_then_the_schedule_runs_to_its_floor(kind):
    f = schedule(kind)
    assert [round(f(s), 6) for s in range(3)] == [0.1, 0.2, 0.3]  # (step+1)/warmup
    assert f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    end = {"cosine": 0.1, "linear": 0.1, "constant": 1.0}[kind]
    assert f(110) == pytest.approx(end) and f(500) == pytest.approx(end)  # never below the floor
    values = [f(s) for s in range(10, 111)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:]))  # non-increasing after warmup


def test_cosine_and_linear_differ_in_the_middle():
    cos, lin = schedule("cosine"), schedule("linear")
    mid = 10 + 50  # halfway through the decay
    assert lin(mid) == pytest.approx(0.1 + 0.9 * 0.5)
    assert cos(mid) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos(35) > lin(35)  # cosine stays high longer


def test_snapshot_records_the_real_git_commit_and_the_uncommitted_diff(tmp_path):
    """A checkout in its own git repo: the snapshot names its HEAD and carries the uncommitted change."""
    repo = tmp_path / "checkout"
    for name in ("fsdp_jobs", "launchers", "conf"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "fsdp_jobs" / "planning" / "plan.py").write_text((repo / "fsdp_jobs" / "planning" / "plan.py").read_text() + "# EDITED\n")
    code = ("import sys; from pathlib import Path; from fsdp_jobs.launchers.snapshot import take_snapshot; "
            "print(take_snapshot(Path(sys.argv[1]))['git_commit'])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "snap")], cwd=repo, capture_output=True,
                       text=True, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == head
    snap = tmp_path / "snap"
    assert (snap / "GIT_COMMIT").read_text().strip() == head
    diff = (snap / "uncommitted.diff").read_text()
    assert "fsdp_jobs/planning/plan.py" in diff and "+# EDITED" in diff
    assert (snap / "fsdp_jobs" / "planning" / "plan.py").read_text().endswith("# EDITED\n")  # the code as submitted
