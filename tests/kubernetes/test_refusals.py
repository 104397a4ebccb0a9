"""Refusals before anything is written that need no API server: no kube config, no kubernetes package. One
line `fsdp-jobs: error: ...`, exit status 2, no run dir, no journal entry. An unreachable or busy cluster,
RBAC, 409 and 422: test_real_apiserver.py, against the real one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
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


def one_line_refusal(r, *needles: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr naming each of `needles`."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("fsdp-jobs: error: "), r.stderr
    assert all(n in r.stderr for n in needles), r.stderr


def test_no_kube_config(cli_here, tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "",
           "FSDP_JOBS_STATE_DIR": str(tmp_path / "state")}
    r = cli_here(*SUBMIT, f"run_root={tmp_path / 'runs'}", env=env)
    one_line_refusal(r, "cluster.context: no usable kube config")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "state").exists()
    # a dry run needs no cluster
    r = cli_here(*SUBMIT, f"run_root={tmp_path / 'runs'}", "dry_run=true", env=env)
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
