"""Refusals before anything is written: no kube config, no kubernetes package, an unreachable or busy
cluster. One line `fsdp-jobs: error: ...`, exit status 2, no run dir, no journal entry."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli
from tests.kubernetes.conftest import FakeCluster

pytestmark = pytest.mark.kubernetes

SUBMIT = ["cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:1", "name=k8s-run", "cluster.device=cpu"]
# the interpreter without the kubernetes package: an import hook refuses it, then the CLI runs as usual
NO_KUBERNETES = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "kubernetes" or name.startswith("kubernetes."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["fsdp_jobs", *sys.argv[1:]]
runpy.run_module("fsdp_jobs", run_name="__main__", alter_sys=True)
"""


def one_line_refusal(r, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("fsdp-jobs: error: "), r.stderr
    assert needle in r.stderr, r.stderr


def test_no_kube_config(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "",
           "FSDP_JOBS_STATE_DIR": str(tmp_path / "state")}
    r = cli(*SUBMIT, f"run_root={tmp_path / 'runs'}", env=env, timeout=120)
    one_line_refusal(r, "cluster.context: no usable kube config")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "state").exists()
    # a dry run needs no cluster
    r = cli(*SUBMIT, f"run_root={tmp_path / 'runs'}", "dry_run=true", env=env, timeout=120)
    assert r.returncode == 0 and "kind: Job" in r.stdout, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dry_run", ["false", "true"])
def test_kubernetes_package_missing(tmp_path: Path, fake_cluster: FakeCluster, dry_run: str) -> None:
    """With a FAKE API server configured (no real one can run here): the refusal is about the package."""
    import subprocess
    import os

    r = subprocess.run([sys.executable, "-c", NO_KUBERNETES, *SUBMIT, f"run_root={tmp_path / 'runs'}",
                        f"dry_run={dry_run}"], cwd=REPO, env={**os.environ, **fake_cluster.env}, text=True,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    one_line_refusal(r, "the kubernetes Python package is not installed (pip install 'kubernetes>=30,<36')")
    assert not (tmp_path / "runs").exists() and fake_cluster.state.objects == {}


def test_unreachable_api_server(tmp_path: Path, fake_cluster: FakeCluster) -> None:
    """A kube config naming a port nothing listens on (the FAKE server's, after it stopped)."""
    text = fake_cluster.kubeconfig.read_text().replace(fake_cluster.url, "http://127.0.0.1:9")
    (tmp_path / "dead.yaml").write_text(text)
    r = cli(*SUBMIT, f"run_root={tmp_path / 'runs'}", env={**fake_cluster.env, "KUBECONFIG": str(tmp_path / "dead.yaml")},
            timeout=120)
    one_line_refusal(r, "cannot reach http://127.0.0.1:9")
    assert not (tmp_path / "runs").exists()


def test_a_run_with_an_active_job_is_refused(tmp_path: Path, fake_cluster: FakeCluster) -> None:
    """Against the FAKE API server (no real one can run here): two jobs must not share a run dir."""
    root = tmp_path / "runs"
    assert cli(*SUBMIT, f"run_root={root}", env=fake_cluster.env, timeout=120).returncode == 0
    before = (root / "k8s-run" / "launches.jsonl").read_text()
    r = cli(*SUBMIT, f"run_root={root}", env=fake_cluster.env, timeout=120)
    one_line_refusal(r, "run already has Kubernetes job fsdp-jobs:")
    assert (root / "k8s-run" / "launches.jsonl").read_text() == before and len(fake_cluster.state.jobs()) == 1
    # ctl without a kube config: status says why it cannot tell, cancel refuses in one line
    env = {**fake_cluster.env, "KUBECONFIG": str(tmp_path / "missing")}
    s = cli("status", "k8s-run", "--run-root", str(root), env=env, timeout=120)
    assert s.returncode == 0 and json.loads(s.stdout)["state"] == "UNKNOWN" and "kube config" in s.stdout
    one_line_refusal(cli("cancel", "k8s-run", "--run-root", str(root), env=env, timeout=120), "no usable kube config")
