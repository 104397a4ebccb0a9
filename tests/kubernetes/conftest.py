"""Fixtures for the Kubernetes backend tests: the REAL control plane of deploy/kubernetes/dev-apiserver
(dev_cluster.py), and a FAKE API server (fake_apiserver.py) for what Kubernetes 1.20 and no operator cannot
show; each with a kube config used through KUBECONFIG like kubectl would."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.kubernetes import dev_cluster as dev
from tests.kubernetes.fake_apiserver import FakeAPIServer, State, kubeconfig


@dataclass
class FakeCluster:
    url: str
    token: str
    state: State
    kubeconfig: Path
    env: dict[str, str]  # for the CLI: KUBECONFIG, and a private state dir for the user's journal


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    """The FAKE API server (fake_apiserver.py: only for the operators' rules, which the real one has no operator for)."""
    token = "fake-token-" + secrets.token_hex(8)
    with FakeAPIServer(token) as server:
        path = tmp_path / "kubeconfig.yaml"
        path.write_text(yaml.safe_dump(kubeconfig(server.url, token)))
        env = {"KUBECONFIG": str(path), "FSDP_JOBS_STATE_DIR": str(tmp_path / "state"),
               "KUBERNETES_SERVICE_HOST": ""}
        yield FakeCluster(server.url, token, server.state, path, env)


@pytest.fixture(scope="module")
def _dev_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.DevCluster]:
    """Started once for test_real_apiserver.py (tests/conftest.py gives all of its tests to one worker, one
    after the other), built on first use and cached; stopped after its last test (its daemons take a few
    percent of a core while idle), unless it was already running before (a developer's)."""
    started = dev.start()
    cluster = dev.open_cluster(tmp_path_factory.mktemp("dev-cluster"))
    yield cluster
    cluster.kubelet.close()
    if started:
        dev.stop()


@pytest.fixture
def dev_cluster(_dev_control_plane: dev.DevCluster, tmp_path: Path) -> dev.DevCluster:
    """The REAL dev control plane, with this test's own journal dir; the kubelet's logs and requests fresh."""
    cluster = _dev_control_plane
    cluster.env["FSDP_JOBS_STATE_DIR"] = str(tmp_path / "state")
    with cluster.kubelet.lock:
        cluster.kubelet.logs.clear()
        cluster.kubelet.ended.clear()
        cluster.kubelet.sent.clear()
        del cluster.kubelet.requests[:]
    return cluster
