"""The TorchX component (launchers/torchx/): TorchX finds it by its entry point and still finds its own
components, it plans and writes the run as the CLI does, and `fsdp-jobs status` reads a run TorchX started,
on hand-made run dirs (the real jobs: tests/integration/test_torchx_local.py, tests/slurm/test_torchx_slurm.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, cli

ARGS = ("nodes=2", "gpus_per_node=1", "model=tiny", "cluster.device=cpu", "train.steps=5")


def test_torchx_finds_the_component_and_keeps_its_own():
    """`torchx run fsdp_jobs.job` resolves through pyproject.toml's entry point; TorchX lists its builtins only
    where no package registers components, so they must be registered again, under their own names."""
    from torchx.specs import finder

    component = finder.get_component("fsdp_jobs.job")
    assert component.fn.__module__ == "fsdp_jobs.launchers.torchx.component" and not component.validation_errors
    builtins = {c.name for c in finder.ModuleComponentsFinder("torchx.components", "").find() if not c.validation_errors}
    assert "dist.ddp" in builtins and builtins <= set(finder.get_components())


@pytest.fixture
def component(monkeypatch):
    """The component as TorchX calls it, in this process (its flag set back afterwards)."""
    from fsdp_jobs.launchers.torchx import backend
    from fsdp_jobs.launchers.torchx.component import job

    monkeypatch.setattr(backend.BACKEND, "component", False)
    return job


def test_the_component_writes_the_run_as_the_cli_does_and_returns_one_role_of_nodes(cli_here, run_root, component,
                                                                                     capsys):
    app = component(*ARGS, f"run_root={run_root}", "name=tx", cpu=3)
    run_dir = run_root / "tx"
    [role] = app.roles
    assert role.num_replicas == 2 and role.resource.cpu == 3 and role.resource.gpu == 0  # a CPU job asks no GPU
    assert role.entrypoint == sys.executable
    assert role.args == ["-m", "fsdp_jobs.launchers.torchx.node", str(run_dir), "${replica_id}", "${rank0_env}", "${app_id}"]
    assert (run_dir / "job.yaml").is_file() and json.loads((run_dir / "plan.json").read_text())["nodes"] == 2
    [launch] = [json.loads(x) for x in (run_dir / "launches.jsonl").read_text().splitlines()]
    assert launch["backend"] == "torchx" and launch["job_id"] == ""  # handed to TorchX, no app id yet
    out = capsys.readouterr()
    assert out.out == "" and f"starting run tx: 2 nodes x 1 ranks" in out.err  # stdout is TorchX's app handle's
    status = json.loads(cli_here("status", "tx", "--run-root", str(run_root)).stdout)
    assert status["state"] == "UNKNOWN" and "no node has started" in status["detail"]


def test_a_script_travels_in_the_run_dir_and_every_node_is_told_where(run_root, component, capsys):
    """script= (and module=): copied at submission as on every backend, its copy the ranks' (node.py's 5th argument)."""
    app = component(*ARGS, f"run_root={run_root}", "name=scr", f"script={REPO / 'tests' / 'scripts' / 'job_train.py'}")
    copy = run_root / "scr" / "script" / "001"
    assert app.roles[0].args[-1] == str(copy) and (copy / "job_train.py").is_file()


def test_the_component_refuses_what_it_cannot_run_in_one_line(run_root, component, capsys):
    """In this process, as `torchx run` calls it."""
    for bad, words in ((["cluster=slurm"], "the torchx component plans cluster=torchx"),
                       (["-m", "train.lr=1e-3,1e-4"], "one run per `torchx run`"),
                       (["fault_tolerance=replica", "nodes=2"], "needs a lighthouse")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            component(*ARGS, f"run_root={run_root}", "name=bad", *bad)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (run_root / "bad").exists()


def test_the_cli_does_not_submit_cluster_torchx_but_shows_each_node_s_command(cli_here, run_root):
    r = cli_here("cluster=torchx", *ARGS, f"run_root={run_root}", "name=viacli")
    assert r.returncode == 2 and "torchx run -s SCHEDULER fsdp_jobs.job" in r.stderr
    assert not (run_root / "viacli").exists()
    dry = cli_here("cluster=torchx", *ARGS, f"run_root={run_root}", "name=viacli", "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    assert "-m fsdp_jobs.launchers.torchx.node" in dry.stdout and "-m fsdp_jobs.launchers.node --nnodes=2 --nproc-per-node=1" in dry.stdout
    assert "--rdzv-id='<app id>'" in dry.stdout or "--rdzv-id=<app id>" in dry.stdout


def test_each_node_finds_rank_0_where_its_scheduler_says():
    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.launchers.torchx import node

    cfg, _ = compose(["cluster=torchx", *ARGS, "name=n"])
    plan = make_plan(cfg)
    here = node.agent_argv(plan, cfg, node.LOCAL_HOST, 29400, None)  # TorchX's local schedulers
    assert "--rdzv-endpoint=127.0.0.1:29400" in here and "--local-addr=127.0.0.1" in here
    there = node.agent_argv(plan, cfg, "n1", 29400, None)  # SLURM: SLURM_JOB_NODELIST_HET_GROUP_0
    assert "--rdzv-endpoint=n1:29400" in there and not any(a.startswith("--local-addr") for a in there)
    ports = {node.rdzv_port(cfg, f"app-{i}") for i in range(50)}
    assert node.rdzv_port(cfg, "app-1") == node.rdzv_port(cfg, "app-1") and len(ports) > 40
    assert all(20000 <= p < 40000 for p in ports)


def launch(run_dir: Path, **extra) -> None:
    record = {"time": "t", "unix": time.time() - 5, "backend": "torchx", "job_id": "a-1", "v": 1,
              "app_handle": "local_cwd://torchx/a-1", **extra}
    with open(run_dir / "launches.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def make_run(run_root: Path, name: str, state: str | None) -> Path:
    run_dir = run_root / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(f"name: {name}\nnodes: 2\n")
    if state:
        (run_dir / "state.json").write_text(json.dumps({"status": state, "step": 3, "time": time.time()}))
    return run_dir


def here() -> dict:
    from fsdp_jobs.launchers.torchx.node import boot_id

    return {"host": socket.gethostname(), "boot_id": boot_id()}


def status_of(cli, run_root: Path, name: str) -> dict:
    r = cli("status", name, "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_status_of_a_local_app_is_node0_s_process_then_the_training_outcome(cli_here, run_root):
    """TorchX's local schedulers keep their apps in the `torchx run` process: status asks /proc about node0's
    recorded pid, told apart from a recycled one by its command line."""
    run_dir = make_run(run_root, "loc", "running")
    node0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fsdp_jobs.launchers.torchx.node", str(run_dir)])
    try:
        # until the child has exec'd, /proc shows the forking test's command line: not node0's yet
        cmdline = Path(f"/proc/{node0.pid}/cmdline")
        while b"fsdp_jobs.launchers.torchx.node" not in cmdline.read_bytes():
            time.sleep(0.01)
        launch(run_dir, pid=node0.pid, **here())
        info = status_of(cli_here, run_root, "loc")
        assert info["state"] == "RUNNING" and f"pid {node0.pid}" in info["detail"], info
        assert info["app_handle"] == "local_cwd://torchx/a-1" and info["job_id"] == "a-1"
    finally:
        node0.kill()
        node0.wait()
    assert status_of(cli_here, run_root, "loc")["state"] == "FAILED"  # gone, and its ranks recorded no outcome
    (run_dir / "state.json").write_text(json.dumps({"status": "completed", "step": 3, "time": time.time()}))
    assert status_of(cli_here, run_root, "loc")["state"] == "SUCCEEDED"
    (run_dir / "state.json").unlink()
    (run_dir / "cancel-requested").write_text("t\n")  # fsdp-jobs cancel, before any rank could record the stop
    assert status_of(cli_here, run_root, "loc")["state"] == "CANCELLED"
    os.utime(run_dir / "cancel-requested", (1, 1))  # an earlier launch's cancel is not this one's
    assert status_of(cli_here, run_root, "loc")["state"] == "FAILED"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the pid reused
    try:
        launch(run_dir, pid=stranger.pid, **here())
        assert status_of(cli_here, run_root, "loc")["state"] == "FAILED"
    finally:
        stranger.kill()
        stranger.wait()
    launch(run_dir, pid=os.getpid(), host="another-machine", boot_id="x")  # seen from elsewhere: it cannot tell
    info = status_of(cli_here, run_root, "loc")
    assert info["state"] == "UNKNOWN" and "another machine" in info["detail"], info


def test_status_takes_the_scheduler_s_word_where_torchx_can_ask_it(run_root, monkeypatch):
    from torchx.specs import AppState, AppStatus

    from fsdp_jobs.launchers.base import Run
    from fsdp_jobs.launchers.torchx import backend

    run_dir = make_run(run_root, "remote", "running")
    launch(run_dir, app_handle="slurm://torchx/77", job_id="77", host="n1", boot_id="x", pid=1)
    said = {"slurm://torchx/77": AppStatus(AppState.RUNNING)}
    monkeypatch.setattr(backend, "scheduler_status", lambda h: (said.get(h), "not known"))
    status = backend.BACKEND.describe(Run.load(run_dir))
    assert status.state.value == "RUNNING" and "slurm://torchx/77: RUNNING" in status.detail
    said["slurm://torchx/77"] = AppStatus(AppState.CANCELLED)
    assert backend.BACKEND.describe(Run.load(run_dir)).state.value == "CANCELLED"
    said.clear()  # sacct forgot it (or failed): the ranks' own outcome
    (run_dir / "state.json").write_text(json.dumps({"status": "preempted", "step": 3, "time": time.time()}))
    assert backend.BACKEND.describe(Run.load(run_dir)).state.value == "CANCELLED"


def test_replica_0_records_the_app_handle_in_the_nodes_record_which_status_reads(run_root, component, capsys,
                                                                                monkeypatch):
    """The CLI's launch record keeps the component's line alone; replica 0's handle, in the nodes' record, keeps
    its time (goodput's queued time begins there) and is what status asks the scheduler about."""
    from torchx.specs import AppState, AppStatus

    from fsdp_jobs.launchers.base import Run
    from fsdp_jobs.launchers.torchx import backend, node
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.layout import RunDir

    component(*ARGS, f"run_root={run_root}", "name=rec")
    run_dir = run_root / "rec"
    [handed] = runs.launches(run_dir)
    node.record_launch(run_dir, runs.load_plan(run_dir), "77", "slurm://torchx/77")
    [cli_line] = [json.loads(x) for x in RunDir(run_dir).launches_file.read_text().splitlines()]
    assert cli_line["job_id"] == "" and "app_handle" not in cli_line  # the CLI's record: its own line only
    launch = Run.load(run_dir).launch
    assert launch["app_handle"] == "slurm://torchx/77" and launch["job_id"] == "77"
    assert (launch["time"], launch["unix"]) == (handed["time"], handed["unix"])
    said = {"slurm://torchx/77": AppStatus(AppState.RUNNING)}
    monkeypatch.setattr(backend, "scheduler_status", lambda h: (said.get(h), "not known"))
    status = backend.BACKEND.describe(Run.load(run_dir))
    assert status.state.value == "RUNNING" and "slurm://torchx/77: RUNNING" in status.detail, status.detail


def test_cancel_of_a_local_app_stops_its_torchx_run_and_nothing_else(run_root):
    run_dir = make_run(run_root, "stop", "running")
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "torchx", "run"])
    node0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fsdp_jobs.launchers.torchx.node", str(run_dir)])
    try:
        launch(run_dir, pid=node0.pid, parent_pid=node0.pid, **here())  # a parent that is not TorchX
        # a process of its own: a signal sent to the wrong pid must hit no test worker
        r = cli("cancel", "stop", "--run-root", str(run_root))
        assert r.returncode == 2 and "no longer TorchX's; nothing was signalled" in r.stderr and node0.poll() is None
        launch(run_dir, pid=node0.pid, parent_pid=parent.pid, **here())
        r = cli("cancel", "stop", "--run-root", str(run_root))
        assert r.returncode == 0 and f"asked `torchx run` pid {parent.pid}" in r.stdout, r.stderr
        assert parent.wait(timeout=30) == -15
    finally:
        for p in (parent, node0):
            p.kill()
            p.wait()


def test_a_run_that_still_runs_is_not_submitted_again(run_root, component, capsys):
    """Two apps must not share a run: the newest launch's backend says it runs (here node0's live process)."""
    component(*ARGS, f"run_root={run_root}", "name=busy")
    run_dir = run_root / "busy"
    node0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fsdp_jobs.launchers.torchx.node", str(run_dir)])
    try:
        # until the child has exec'd, /proc shows the forking test's command line: not node0's yet
        cmdline = Path(f"/proc/{node0.pid}/cmdline")
        while b"fsdp_jobs.launchers.torchx.node" not in cmdline.read_bytes():
            time.sleep(0.01)
        launch(run_dir, pid=node0.pid, **here())
        before = (run_dir / "launches.jsonl").read_text()
        with pytest.raises(SystemExit) as refused:
            component(*ARGS, f"run_root={run_root}", "name=busy")
    finally:
        node0.kill()
        node0.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and "run already has torchx job a-1 RUNNING" in err[-1], err
    assert (run_dir / "launches.jsonl").read_text() == before  # nothing written
