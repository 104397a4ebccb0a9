"""Kubernetes sweep members keep apart on the PVC: same member name in two sweeps, two run dirs."""

from __future__ import annotations

import re


def pod_run_dirs(cli, run_root, sweep: str) -> set[str]:
    r = cli("-m", "cluster=kubernetes", "cluster.image=img", "train.lr=1e-3,2e-3", f"name={sweep}",
            f"run_root={run_root}", "dry_run=true")
    assert r.returncode == 0, r.stderr
    return set(re.findall(r"pods' run dir (\S+)", r.stdout))


def test_same_member_in_two_sweeps_gets_two_pvc_dirs(cli_here, run_root):
    a, b = pod_run_dirs(cli_here, run_root, "sweep-a"), pod_run_dirs(cli_here, run_root, "sweep-b")
    assert a == {"/runs/sweep-a/lr=0.001", "/runs/sweep-a/lr=0.002"}
    assert b == {"/runs/sweep-b/lr=0.001", "/runs/sweep-b/lr=0.002"}
    single = cli_here("cluster=kubernetes", "cluster.image=img", "name=one", f"run_root={run_root}", "dry_run=true")
    assert "pods' run dir /runs/one\n" in single.stdout  # a single run stays at <mount_path>/<name>
