"""cluster=docker without an engine: the compose file the dry run prints, and the refusal when no
engine answers. (The jobs themselves run on a real engine in tests/docker.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml


def dry_run(cli, run_root, *args: str) -> dict:
    r = cli("cluster=docker", f"run_root={run_root}", "name=d", "dry_run=true", *args)
    assert r.returncode == 0, r.stderr
    text = r.stdout.split("# launch commands (docker)\n", 1)[1]
    compose_text = text.split("\n", 1)[1].split("# then", 1)[0]
    assert list(run_root.iterdir()) == []  # a dry run writes nothing
    return {"compose": yaml.safe_load(compose_text), "text": compose_text, "commands": text.split("# then", 1)[1]}


def test_compose_file_has_one_node_per_service_on_a_private_network(cli_here, run_root):
    out = dry_run(cli_here, run_root, "nodes=3", "gpus_per_node=2", "cluster.device=cuda", "cluster.shm_size=8g")
    spec = out["compose"]
    run_dir = str((run_root / "d").resolve())
    assert sorted(spec["services"]) == ["node0", "node1", "node2"]
    assert spec["networks"]["job"]["driver"] == "bridge"
    for i, (name, s) in enumerate(sorted(spec["services"].items())):
        assert s["hostname"] == name and s["networks"] == ["job"]
        cmd = s["command"]
        assert cmd[1:3] == ["-m", "fsdp_jobs.launchers.node"] and cmd[-3:] == ["-m", "fsdp_jobs.runtime", run_dir]
        assert "--rdzv-endpoint=node0:29400" in cmd and "--nnodes=3" in cmd and "--nproc-per-node=2" in cmd
        assert s["environment"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert s["environment"]["PYTHONPATH"] == f"{run_dir}/code/001"  # the code snapshot, not the checkout
        assert f"{run_dir}:{run_dir}" in s["volumes"]  # the run dir at the same path in every container
        assert s["restart"] == "on-failure:3" and s["shm_size"] == "8g"
        assert not s["user"].startswith("0:")  # never root
        gpus = s["deploy"]["resources"]["reservations"]["devices"][0]
        assert gpus["device_ids"] == [str(2 * i), str(2 * i + 1)] and gpus["capabilities"] == ["gpu"]
    assert "up -d" in out["commands"] and "down -v" in out["commands"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed (.ci/run installs it)")
def test_compose_itself_accepts_the_file(cli_here, run_root, tmp_path):
    """`docker-compose config -q` checks a file against compose's own schema, with no engine."""
    for args in ((), ("cluster.device=cuda", "cluster.cpus=2", "cluster.mem=8g", "cluster.internal_network=true",
                      "cluster.tcp_rto_max_ms=2000")):
        f = tmp_path / "compose.yaml"
        f.write_text(dry_run(cli_here, run_root, "nodes=2", *args)["text"])
        r = subprocess.run(["docker-compose", "-f", str(f), "config", "-q"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_cpu_containers_get_no_gpus_and_a_cpu_thread_limit(cli_here, run_root):
    s = dry_run(cli_here, run_root, "nodes=2")["compose"]["services"]["node1"]
    assert "deploy" not in s and s["environment"]["OMP_NUM_THREADS"] == "1"


def test_no_engine_is_one_line_exit_2_nothing_written(cli_here, run_root):
    r = cli_here("cluster=docker", f"run_root={run_root}", "name=x", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Docker engine reachable" in lines[0] and "deploy/docker/start.sh" in lines[0], r.stderr
    assert list(run_root.iterdir()) == []


@pytest.mark.parametrize("override, key", [
    ("cluster.user=root", "cluster.user"), ("cluster.device=tpu", "cluster.device"),
    ("cluster.shm_size=lots", "cluster.shm_size"), ("cluster.mounts=[data]", "cluster.mounts"),
    ("cluster.tcp_rto_max_ms=500", "cluster.tcp_rto_max_ms"), ("cluster.tcp_rto_max_ms=fast", "cluster.tcp_rto_max_ms"),
    ("cluster.tcp_rto_max_ms='²'", "cluster.tcp_rto_max_ms"),  # a digit to str.isdigit, not to int()
])
def test_bad_docker_keys_are_one_line(cli_here, run_root, override, key):
    r = cli_here("cluster=docker", override, f"run_root={run_root}", "dry_run=true")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and key in r.stderr, r.stderr


@pytest.mark.parametrize("setting, kernel, sysctl", [
    ("auto", (6, 15), 1000), ("auto", (6, 14), None), ("auto", None, None), ("off", (6, 18), None),
    ("3000", (6, 18), 3000), ("3000", None, 3000),
])
def test_a_cut_off_nodes_connections_resend_within_a_second_where_the_engines_kernel_can(setting, kernel, sysctl):
    """While a node is cut off, TCP doubles the wait between retransmissions up to 120 s: healed after 5 s, its
    connections resent about 3 s later. The job's containers cap that at 1 s where the engine's kernel has the
    setting; a value set where it has not would fail the containers' creation, so it is refused first."""
    from fsdp_jobs.launchers.docker.engine import tcp_rto_max_ms
    from fsdp_jobs.planning.errors import UserError

    assert tcp_rto_max_ms(setting, lambda: kernel) == sysctl
    with pytest.raises(UserError, match=r"cluster.tcp_rto_max_ms.*kernel \(6.1\) has no net.ipv4.tcp_rto_max_ms"):
        tcp_rto_max_ms("3000", lambda: (6, 1), strict=True)


def test_the_compose_file_sets_the_cap_only_where_asked_or_known(cli_here, run_root):
    no_engine = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}  # auto: no kernel known, nothing set
    r = cli_here("cluster=docker", f"run_root={run_root}", "name=d", "dry_run=true", env=no_engine)
    assert r.returncode == 0 and "sysctls" not in r.stdout, r.stderr
    s = dry_run(cli_here, run_root, "nodes=2", "cluster.tcp_rto_max_ms=2000")["compose"]["services"]
    # with as many retransmissions as keep a cut node's connections about as long as the kernel's default does
    assert [s[n]["sysctls"] for n in ("node0", "node1")] == [{"net.ipv4.tcp_rto_max_ms": 2000,
                                                               "net.ipv4.tcp_retries2": 255}] * 2
    s = dry_run(cli_here, run_root, "nodes=2", "cluster.tcp_rto_max_ms=120000")["compose"]["services"]
    assert s["node0"]["sysctls"]["net.ipv4.tcp_retries2"] == 15  # the kernel's own cap: its own default
    s = dry_run(cli_here, run_root, "nodes=2", "cluster.tcp_rto_max_ms=10000")["compose"]["services"]
    assert s["node0"]["sysctls"]["net.ipv4.tcp_retries2"] == 97  # 12.6 s of doubling, then 10 s waits


def test_the_supervisor_acts_on_nothing_it_reads_back_from_the_run_dir():
    """The supervisor runs as the submitting user (root under sudo) while the containers' user can rewrite
    the run dir: the project, the `down` command and the job's numbers come from the submitting process
    (its stdin when detached), never from launches.jsonl or job.yaml."""
    import ast
    import inspect

    from fsdp_jobs.launchers.docker import supervisor

    calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(ast.parse(inspect.getsource(supervisor)))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
    assert not calls & {"runs.last_launch", "runs.launches", "runs.load_job"}, calls
    assert list(inspect.signature(supervisor.supervise).parameters)[:3] == ["run_dir", "launch", "job"]


def test_a_job_whose_containers_are_being_removed_is_ending_not_failed(tmp_path, monkeypatch):
    """Between the last container's exit and the end of `compose down` the containers are gone while the
    supervisor has not confirmed the removal: `status` (and so `logs -f`, which stops at a final state)
    must not call a cancelled job FAILED there."""
    import json
    import time

    from fsdp_jobs.launchers.docker import backend
    from fsdp_jobs.launchers.docker.engine import LEGACY_RESULT_FILE, RESULT_FILE, docker_dir
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.layout import RunDir
    from fsdp_jobs.rundir.status import JobState, Run

    monkeypatch.setattr(backend, "containers", lambda project: {})  # compose down took them already
    project = "fsdpjobs-bg-0123abcd"
    run = Run(tmp_path, {"backend": "docker", "project": project})
    result = {"project": project, "exit_status": 143, "containers": {}}
    runs.record_cancel(tmp_path)  # `fsdp-jobs cancel` (the CLI's record): the outcome is CANCELLED
    docker_dir(tmp_path).mkdir()

    def describe(**fields):
        (docker_dir(tmp_path) / RESULT_FILE).write_text(json.dumps({**result, **fields}))
        return backend.BACKEND.describe(run)

    ending = describe(time=time.time(), removed=False)
    assert ending.state == JobState.RUNNING and ending.detail.startswith("ENDING (CANCELLED"), ending
    assert describe(time=time.time(), removed=True).state == JobState.CANCELLED
    assert describe(time=time.time()).state == JobState.CANCELLED  # a result from before `removed` existed
    stale = describe(time=time.time() - 3600, removed=False)  # the supervisor died during the removal
    assert stale.state == JobState.CANCELLED and "did not confirm" in stale.detail
    (docker_dir(tmp_path) / RESULT_FILE).unlink()
    # a run submitted before the result moved into <run_dir>/docker/ still reads as it ended
    (tmp_path / LEGACY_RESULT_FILE).write_text(json.dumps({**result, "time": time.time(), "removed": True}))
    assert backend.BACKEND.describe(run).state == JobState.CANCELLED
    (tmp_path / LEGACY_RESULT_FILE).unlink()
    RunDir(tmp_path).cancel_file.unlink()
    assert backend.BACKEND.describe(run).state == JobState.FAILED  # gone with no record at all
    # `docker pause` of its containers: it goes on when unpaused, so it is running, paused (it read UNKNOWN)
    monkeypatch.setattr(backend, "containers", lambda project: {
        f"node{i}": {"State": {"Status": "paused", "ExitCode": 0}, "RestartCount": 0,
                     "Config": {"Labels": {backend.LABEL: str(tmp_path)}}} for i in range(2)})
    paused = backend.BACKEND.describe(run)
    assert paused.state == JobState.RUNNING and paused.detail == "RUNNING (node0: paused, node1: paused)", paused
