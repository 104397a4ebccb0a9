"""Your own training script in containers (cluster=docker, a real engine from deploy/docker): the copy of
the script's directory in the run dir is what the containers run, and exit 0 everywhere completes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, cli

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.usefixtures("docker_engine")]


def test_plain_ddp_script_runs_unmodified_in_two_containers_of_two(run_root):
    r = cli("cluster=docker", f"run_root={run_root}", "name=ddp", f"script={REPO / 'tests' / 'scripts' / 'ddp_train.py'}",
            "script_args=[--epochs,2,--log,1]")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ranks = sorted(part.split(" of 4")[0] for part in r.stdout.split("ddp rank ")[1:])
    assert ranks == ["0", "1", "2", "3"], r.stdout[-3000:]
    assert "node0 exited 0" in r.stdout and "node1 exited 0" in r.stdout
    run_dir = run_root / "ddp"
    assert json.loads((run_dir / "state.json").read_text())["status"] == "completed"
    compose = (run_dir / "compose.yaml").read_text()
    assert f"{run_dir}/script/001/ddp_train.py" in compose  # the containers run the run dir's copy
    status = json.loads(cli("status", "ddp", "--run-root", str(run_root)).stdout)
    assert "SUCCEEDED" in json.dumps(status), status
