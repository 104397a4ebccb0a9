"""A sweep on cluster=local: the members run one after another (the cores are shared), then a summary."""

from __future__ import annotations

import re

import pytest

from tests.conftest import SHORT, cli, metrics

pytestmark = pytest.mark.integration



def test_local_sweep_runs_members_one_after_another_and_summarizes(run_root, tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_JOBS_STATE_DIR", str(tmp_path / "state"))
    args = ("-m", f"run_root={run_root}", "nodes=1", "gpus_per_node=1", "train.steps=6", *SHORT, "train.lr=1e-3,2e-3")
    r = cli(*args, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sid = re.search(r"^fsdp-jobs: sweep (\S+): 2 members, 2 to submit", r.stdout, re.M).group(1)
    first, second = (run_root / sid / name for name in ("lr=0.001", "lr=0.002"))
    assert [m["step"] for m in metrics(first)] == list(range(1, 7)) == [m["step"] for m in metrics(second)]
    assert metrics(first)[-1]["time"] < metrics(second)[0]["time"]  # one after another, not at once

    summary = r.stdout.split(f"fsdp-jobs: sweep {sid} finished:\n", 1)[1].splitlines()
    assert summary[0].split() == ["MEMBER", "EXIT", "STEP", "FINAL", "LOSS", "TOKENS/S", "MFU"]
    for line, run in zip(summary[1:3], (first, second)):
        assert line.split()[:4] == [run.name, "0", "6", f"{metrics(run)[-1]['loss']:.4f}"], summary

    again = cli(*args, timeout=120)  # both completed: nothing runs again
    assert again.returncode == 0 and "0 to submit, 2 skipped" in again.stdout, again.stdout
    assert again.stdout.count("skipped: completed at step 6") == 2
