"""Your own training script in containers (cluster=docker, a real engine from deploy/docker): the copy of
the script's directory in the run dir is what the containers run, and exit 0 everywhere completes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, cli, train_record

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.usefixtures("docker_engine")]


def test_plain_ddp_script_runs_unmodified_in_two_containers_of_two(run_root):
    r = cli("cluster=docker", f"run_root={run_root}", "name=ddp", f"script={REPO / 'tests' / 'scripts' / 'ddp_train.py'}",
            "script_args=[--epochs,2,--log,1]")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ranks = sorted(part.split(" of 4")[0] for part in r.stdout.split("ddp rank ")[1:])
    assert ranks == ["0", "1", "2", "3"], r.stdout[-3000:]
    assert "node0 exited 0" in r.stdout and "node1 exited 0" in r.stdout
    run_dir = run_root / "ddp"
    assert train_record(run_dir)["status"] == "completed"
    compose = (run_dir / "docker" / "compose.yaml").read_text()
    assert f"{run_dir}/script/001/ddp_train.py" in compose  # the containers run the run dir's copy
    status = json.loads(cli("status", "ddp", "--run-root", str(run_root)).stdout)
    assert "SUCCEEDED" in json.dumps(status), status


def test_secrets_reach_every_container_which_runs_unprivileged_and_nothing_holds_them(run_root, tmp_path):
    """compose names each secret without a value and takes it from its own environment, which submit filled
    (fsdp_jobs/planning/secret_env.py); the containers drop every capability and cannot gain privileges."""
    import os
    from pathlib import Path

    from tests.conftest import assert_no_secret_anywhere, assert_owner_only, secret_job

    overrides, env, values = secret_job(tmp_path)
    r = cli("cluster=docker", f"run_root={run_root}", "name=sec", "nodes=2", "gpus_per_node=1", *overrides, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.stdout.count("secrets ok on rank") == 2, r.stdout[-3000:]
    assert_no_secret_anywhere(values, [run_root, Path(os.environ["FSDP_JOBS_STATE_DIR"])], r.stdout + r.stderr)
    assert_owner_only(run_root / "sec")
    import yaml

    node = yaml.safe_load((run_root / "sec" / "docker" / "compose.yaml").read_text())["services"]["node0"]
    assert node["cap_drop"] == ["ALL"] and node["security_opt"] == ["no-new-privileges:true"]
    assert node["environment"]["HF_TOKEN"] is None and not node["user"].startswith("0:")
