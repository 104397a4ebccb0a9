"""Fixtures for the Kubernetes backend tests: a FAKE API server (no real one can run here; see
fake_apiserver.py) and a kube config pointing at it, used through KUBECONFIG like kubectl would."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

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
    token = "fake-token-" + secrets.token_hex(8)
    with FakeAPIServer(token) as server:
        path = tmp_path / "kubeconfig.yaml"
        path.write_text(yaml.safe_dump(kubeconfig(server.url, token)))
        env = {"KUBECONFIG": str(path), "FSDP_JOBS_STATE_DIR": str(tmp_path / "state"),
               "KUBERNETES_SERVICE_HOST": ""}
        yield FakeCluster(server.url, token, server.state, path, env)
