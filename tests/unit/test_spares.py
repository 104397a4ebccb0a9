"""cluster.spare_nodes (issue 30, hot spares) in the plan and the local, Docker and SLURM requests; the refusals
in one line; a spare the job never needed ends with exit 0. The real-agent proofs that a spare replaces a killed
node: tests/integration/test_spares.py (local), tests/docker/test_docker_jobs.py, tests/slurm/test_slurm_jobs.py."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.plan import Plan, make_plan


def local_dryrun(*overrides: str):
    from fsdp_jobs.launchers.local.backend import BACKEND

    cfg, _ = compose(["nodes=2", "gpus_per_node=1", "cluster.device=cpu", *overrides])
    return BACKEND.dryrun(make_plan(cfg), cfg)


def test_local_starts_n_plus_k_agents_with_a_rendezvous_of_n():
    """The spare's agent is the same torchrun command (--nnodes=2): beyond max_nodes, torch keeps it in the
    rendezvous' redundancy list, so the job stays 2 nodes and the spare does not grow it."""
    dry = local_dryrun("cluster.spare_nodes=1")
    assert dry.plan.spare_nodes == 1 and dry.plan.rendezvous.max_nodes == 2
    assert len(dry.request.agents) == 3 and dry.request.spares == []  # all started with the job
    assert all("--nnodes=2" in a.argv for a in dry.request.agents)
    assert [a.env["FSDP_JOBS_NODE"] for a in dry.request.agents] == ["node0", "node1", "node2"]
    assert "# node2 (hot spare: cluster.spare_nodes)" in dry.request.render()


def test_no_spares_leaves_the_plan_record_as_it_was():
    """Golden dry runs unchanged: the key is written only when spares are configured, and read back."""
    plan = make_plan(compose(["nodes=2"])[0])
    assert "spare_nodes" not in plan.to_dict()
    spared = make_plan(compose(["nodes=2", "cluster.spare_nodes=2"])[0])
    assert Plan.from_dict(spared.to_dict()).spare_nodes == 2


@pytest.mark.parametrize("overrides, says", [
    (("cluster=kubernetes",), "cluster=kubernetes does not start spare nodes yet; allowed with "
                              "cluster=local|slurm|docker, or 0"),
    (("cluster.max_nodes=3",), "spares need cluster.max_nodes unset or = nodes=2"),
    (("fault_tolerance=replica",), "not with fault_tolerance=replica"),
    ((f"script={Path(__file__).parents[1] / 'scripts' / 'env_probe.py'}",), "only with the built-in trainer"),
    (("module=json.tool",), "only with the built-in trainer"),
])
def test_spares_where_they_cannot_work_are_refused_in_one_line(overrides, says):
    with pytest.raises(UserError) as e:
        make_plan(compose(["nodes=2", "cluster.spare_nodes=1", *overrides])[0])
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_negative_spare_count_is_refused():
    with pytest.raises(UserError, match="cluster.spare_nodes=-1: must be an integer from 0"):
        make_plan(compose(["nodes=2", "cluster.spare_nodes=-1"])[0])


def test_docker_starts_the_spares_with_the_job_and_slurm_allocates_them_with_no_kill():
    """Docker: node3 is a service like the others, with no profile (`compose up` starts it), and the same
    rendezvous of 3. SLURM: 4 nodes, each task an agent of a 3-node rendezvous, and --no-kill, so that the
    node a spare replaces does not end the allocation."""
    from fsdp_jobs.launchers.docker.backend import compose_spec
    from fsdp_jobs.launchers.slurm.backend import sbatch_parameters

    cfg, _ = compose(["cluster=docker", "nodes=3", "gpus_per_node=1", "cluster.spare_nodes=1"])
    services = compose_spec(make_plan(cfg), cfg, Path("/code"))["services"]
    assert sorted(services) == ["node0", "node1", "node2", "node3"]
    assert not any("profiles" in s for s in services.values())
    assert all("--nnodes=3" in s["command"] for s in services.values())
    cfg, _ = compose(["cluster=slurm", "cluster.gpus=false", "nodes=3", "gpus_per_node=1", "cluster.spare_nodes=1"])
    params = sbatch_parameters(make_plan(cfg), cfg, Path("/code"))
    assert params["nodes"] == 4 and params["additional_parameters"]["no-kill"] is True
    assert "--no-kill" in params["srun_args"]  # else SLURM kills the step on every node when one fails
    cfg, _ = compose(["cluster=slurm", "cluster.gpus=false", "nodes=3", "gpus_per_node=1"])
    params = sbatch_parameters(make_plan(cfg), cfg, Path("/code"))
    assert params["nodes"] == 3 and "no-kill" not in params["additional_parameters"] and "srun_args" not in params


USER_TRAP = "trap 'echo \"user trap saw $?\" > {marker}' EXIT"
USER_SETUPS = {  # cluster.setup lines before the spare job's own: a user's EXIT trap is kept and runs first
    "trap": USER_TRAP,
    "set -e": "set -e\n" + USER_TRAP,  # set -e and the user's trap given status 9 must not end the script there
    "trap that exits": "trap 'rc=$?; echo \"user trap saw $rc\" > {marker}; exit $rc' EXIT",  # a cleanup idiom
}


@pytest.mark.parametrize("srun_rc, state, script_rc, user_setup", [
    (9, "completed", 0, "trap"),  # a lost node's status, training completed without it: the job completed
    (9, "failed", 9, "trap"), (9, None, 9, "trap"),
    (9, "old completed", 9, "trap"),  # ... an earlier launch's completion is not this one's
    (0, None, 0, "trap"),
    (9, "completed", 0, "set -e"), (9, "completed", 0, "trap that exits"), (9, "failed", 9, "trap that exits"),
])
def test_a_spare_jobs_batch_script_exits_as_training_ended_not_as_srun_did(tmp_path, monkeypatch, srun_rc, state,
                                                                           script_rc, user_setup):
    """The setup lines the batch script of a spare job gets, run by bash with `(exit 9)` standing in for srun
    (seen on the test cluster: a node set DOWN mid-job, training completed at world 3 with a spare, srun then
    exited 9 and the SLURM job was FAILED). The interpreter's path has a space and a quote in it (a trap in
    single quotes broke on it). The user's own EXIT trap still runs, with srun's status."""
    import shlex
    import subprocess
    import sys

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.slurm.backend import spare_exit_setup

    python = sys.executable
    odd = tmp_path / "a user's python" / "python3"
    odd.parent.mkdir()
    odd.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    odd.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(odd))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if state == "old completed":  # an earlier launch's, written before this script began (in whole seconds)
        runs.write_state(run_dir, status="completed", step=300, time=time.time() - 2)
    write = f"from fsdp_jobs.rundir import runs; runs.write_state({str(run_dir)!r}, status={state!r}, step=300)"
    training = "true" if state in (None, "old completed") else f"{python} -c {shlex.quote(write)}"
    user = USER_SETUPS[user_setup].format(marker=shlex.quote(str(tmp_path / "marker")))
    script = "\n".join([user] + spare_exit_setup() + [training, f"(exit {srun_rc})"])
    env = {"FSDP_JOBS_RUN_DIR": str(run_dir), "PYTHONPATH": str(Path(__file__).parents[2]), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == script_rc, r.stdout + r.stderr
    assert ("training completed at step 300" in r.stdout) == (script_rc == 0 and srun_rc != 0), r.stdout
    assert (tmp_path / "marker").read_text() == f"user trap saw {srun_rc}\n"  # kept, with the script's status


@pytest.mark.parametrize("status, ends", [("completed", True), ("failed", True), ("running", False), (None, False)])
def test_a_node_waiting_in_the_rendezvous_exits_0_only_when_the_job_ended(tmp_path, monkeypatch, capsys,
                                                                           status, ends):
    """The spare's agent learns that the job ended from its rendezvous: the store is gone (or closed). torchrun
    would exit 1 with a traceback, and Docker would restart the container; launchers/node/agent.py ends it with
    exit 0 and one line when the ranks recorded the job completed or failed (a replica check that named a node
    no spare could replace) since the agent started, and the node wrapper says how; else the error stays."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.launchers.node import agent

    def store_gone(handler):
        raise RendezvousConnectionError("The connection to the C10d store has failed.")

    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", store_gone)
    monkeypatch.setattr(DynamicRendezvousHandler, "shutdown", lambda handler: True)
    monkeypatch.setenv("FSDP_JOBS_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FSDP_JOBS_NODE", "node3")
    runs.write_state(tmp_path, status="completed", step=5, time=time.time() - 60)  # an earlier launch's
    agent.end_a_waiting_node_when_the_job_completed()
    agent.let_the_store_host_leave_last()
    if status:
        runs.write_state(tmp_path, status=status, step=10)
    handler = object.__new__(DynamicRendezvousHandler)
    handler._store = None  # a store it no longer reaches: nothing to say on the way out
    if ends:
        with pytest.raises(SystemExit) as e:
            handler.next_rendezvous()
        assert e.value.code == 0 and handler.shutdown() is False  # nothing left to close
        said = capsys.readouterr().out.strip()
        assert said.startswith(f"fsdp-jobs: node3: the job {status} while this node waited"), said
    else:
        with pytest.raises(RendezvousConnectionError):
            handler.next_rendezvous()


def test_status_names_the_spares_that_wait_not_the_nodes_that_died(tmp_path):
    """This launch started node0..node3; node2 trained, died (no node_end: SIGKILL) and node3 took its place;
    node4 waits still; node5 ended. Only node4 waits: node2 left a node record behind, node5 its end. A node
    restarted since it trained (a Docker container) waits again."""
    from fsdp_jobs.rundir import events, runs
    from fsdp_jobs.rundir.liveness import JobView, NodeSummary, waiting_spares, write_in_place
    from fsdp_jobs.rundir.layout import RunDir

    launched = time.time() - 100
    events.append_node_event(tmp_path, "node_start", node="old", time=launched - 50)  # an earlier launch's
    for n in range(6):
        events.append_node_event(tmp_path, "node_start", node=f"node{n}", time=launched + 1)
    events.append_node_event(tmp_path, "node_end", node="node5", rc=0)
    assert waiting_spares(tmp_path, launched) == []  # no world of this launch yet: every node waits, none is named
    runs.write_world(tmp_path, 1, ["node0", "node1", "node3"])
    RunDir(tmp_path).liveness_dir.mkdir()
    for n in ("node1", "node2", "node3"):  # node0 leads: it writes the job view, not a node record
        RunDir(tmp_path).node_liveness_file(n).write_text("{}")
    assert waiting_spares(tmp_path, launched) == ["node4"]
    runs.write_world(tmp_path, 2, ["node0", "node1", "node4"])
    assert waiting_spares(tmp_path, launched) == []
    # node0, which led (the job view, no node record), was killed in turn and node4 took its place at world 3:
    # the view still names node0, so it is not taken for a spare that waits
    write_in_place(RunDir(tmp_path).job_liveness_file, json.dumps(asdict(JobView(time.time(), "node0", [
        NodeSummary.of(n, time.time(), [], time.time()) for n in ("node0", "node1", "node4")]))))
    runs.write_world(tmp_path, 3, ["node1", "node3", "node4"])
    assert waiting_spares(tmp_path, launched) == []
    # Docker restarts node2's container (and node0's): each waits as a spare now, its record or view entry
    # older than its new start (node2's record as its watchdog writes it, with the node's clock)
    write_in_place(RunDir(tmp_path).node_liveness_file("node2"), json.dumps({"node": "node2", "written": launched + 5,
                                                                            "ranks": []}))
    assert waiting_spares(tmp_path, launched) == []  # trained after it started
    events.append_node_event(tmp_path, "node_start", node="node2", time=launched + 60)
    assert waiting_spares(tmp_path, launched) == ["node2"]
    events.append_node_event(tmp_path, "node_start", node="node0", time=time.time() + 1)
    assert waiting_spares(tmp_path, launched) == ["node0", "node2"]


def test_a_lost_slurm_node_waits_for_the_outcome_while_the_job_goes_on_and_not_past_that():
    """With --no-kill no one ends a spare job's allocation but its tasks: a lost node's task waits while the job
    view is written after its agent died (the job went on), ends with the job's outcome, and gives up once no
    such sign came for the patience (the store host lost with it: the allocation sat idle to its time limit)."""
    from fsdp_jobs.launchers.slurm.node_task import SPARE_WAIT_MAX_S, SPARE_WAIT_S, LostNodeWait

    wait = LostNodeWait(died=100.0, patience_s=50.0)
    assert wait.verdict("running", None, 149.0) is None  # a spare's round and start-up may take that long
    assert wait.verdict("running", 90.0, 151.0) == "failed"  # a view from before the death is no sign
    assert wait.verdict("running", 140.0, 185.0) is None  # the job went on: written since the death
    assert wait.verdict("running", 140.0, 191.0) == "failed"  # ... and then stopped showing it
    assert wait.verdict("completed", None, 1e9) == "ok" and wait.verdict("preempted", None, 101.0) == "ok"
    assert wait.verdict("failed", 140.0, 141.0) == "failed"
    waits = [wait.next_wait() for _ in range(6)]
    assert waits[0] == SPARE_WAIT_S and waits == sorted(waits) and waits[-1] == SPARE_WAIT_MAX_S


@pytest.mark.parametrize("outcome, rc", [("completed", 0), ("failed", 137), (None, 137)])
def test_a_lost_slurm_nodes_task_reads_the_run_dir_and_ends_as_the_job_did(tmp_path, monkeypatch, capsys, outcome, rc):
    """NodeTask._outlive_lost_agent on a real run dir (the SLURM spare test's node is set DOWN, which kills this
    wait): the job view, written after the agent died, keeps it waiting; the state record ends it, 0 once the
    job completed; with neither, the patience (shortened here) ends it with the agent's status and one line."""
    import threading
    from types import SimpleNamespace

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.layout import RunDir
    from fsdp_jobs.rundir.liveness import JobView, write_in_place
    from fsdp_jobs.launchers.slurm import node_task

    monkeypatch.setattr(node_task, "SPARE_WAIT_S", 0.05)
    monkeypatch.setattr(node_task, "SPARE_WAIT_MAX_S", 0.05)
    monkeypatch.setattr(node_task, "join_timeout_s", lambda world: 0.2)
    task = node_task.NodeTask(str(tmp_path))
    task._began = time.time()
    RunDir(tmp_path).liveness_dir.mkdir()

    def the_job_goes_on() -> None:
        for _ in range(9):  # 0.45 s of job views, longer than the patience (0.2 s here)
            write_in_place(RunDir(tmp_path).job_liveness_file, json.dumps(asdict(JobView(time.time(), "n1", []))))
            time.sleep(0.05)
        if outcome:
            runs.write_state(tmp_path, status=outcome, step=300)

    writer = threading.Thread(target=the_job_goes_on)
    writer.start()
    started = time.monotonic()
    plan = SimpleNamespace(rendezvous=SimpleNamespace(max_nodes=3))
    job = SimpleNamespace(fault=SimpleNamespace(startup_timeout_s=0.0))
    assert task._outlive_lost_agent(tmp_path, 137, plan, job) == rc
    writer.join()
    assert time.monotonic() - started >= 0.4  # it waited while the views came
    assert ("has not gone on without this node" in capsys.readouterr().out) == (outcome is None)


def test_a_waiting_lost_nodes_task_ends_soon_after_sigterm():
    """Its waits back off to 60 s, and Python resumes an interrupted sleep: SLURM's KillWait (30 s) after a scancel
    or a requeue SIGKILLed the task before it said why it ended."""
    import signal
    import threading

    from fsdp_jobs.launchers.slurm import node_task

    task = node_task.NodeTask("/nonexistent")
    previous = signal.signal(signal.SIGTERM, task._on_sigterm)
    try:
        threading.Timer(0.2, lambda: signal.raise_signal(signal.SIGTERM)).start()
        started = time.monotonic()
        task._sleep_unless_terminated(node_task.SPARE_WAIT_MAX_S)
        assert task._terminated and time.monotonic() - started < 1.0
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------- a preflight that names a node while spares wait
def _named_by_preflight(tmp_path, spares: int, waiting: list[str], bad: str = "node2", host: str = "node0"):
    """Rank 0's report of a preflight of node0..node2 (node rank 2 slow twice over) in a run dir whose launch
    started node0..node2 and the `waiting` spares, with node0..node2 in this attempt's world; its outcome."""
    from types import SimpleNamespace

    from fsdp_jobs.planning.config import rank_config
    from fsdp_jobs.rundir import events, runs
    from fsdp_jobs.rundir.records import LaunchRecord
    from fsdp_jobs.runtime import preflight_verdict
    from fsdp_jobs.runtime.preflight import report

    launched = time.time() - 30
    runs.record_launch(tmp_path, LaunchRecord(backend="local", job_id="1", nodes=3, unix=launched))
    for n in ["node0", "node1", "node2", *waiting]:
        events.append_node_event(tmp_path, "node_start", node=n, time=launched + 1)
    runs.write_world(tmp_path, 0, ["node0", "node1", "node2"])
    ranks = [{"rank": i, "node": f"node{i}", "matmul_tflops": 0.3 if f"node{i}" == bad else 1.0, "error": None,
              "store_host": f"node{i}" == host} for i in range(3)]
    v = preflight_verdict.verdict(ranks, 2.0, None, expected_nodes=3)
    v.update(time=time.time(), seconds=1.0, ranks=ranks)
    cfg = rank_config({"nodes": 3, "cluster": {"backend": "local", "spare_nodes": spares}})
    return report(tmp_path, cfg, SimpleNamespace(restart=0), v)


def test_a_node_the_preflight_names_is_replaced_when_a_spare_waits(tmp_path):
    """The job does not fail: the named node is recorded for its agent to leave (launchers/node/agent.py), the
    state record says nothing failed, and every rank ends the attempt with REPLACED_EXIT so that the others
    restart and the next round takes the spare."""
    from fsdp_jobs.rundir import replaced, runs
    from fsdp_jobs.runtime import preflight_verdict
    from fsdp_jobs.runtime.preflight import REPLACED

    assert _named_by_preflight(tmp_path, spares=1, waiting=["node3"]) == REPLACED
    [entry] = replaced.read(tmp_path)
    assert entry.nodes == ["node2"] and entry.restart == 0 and "node2" in entry.reason
    assert replaced.is_replaced(tmp_path, "node2", entry.time - 1) and not replaced.is_replaced(tmp_path, "node1", 0)
    assert not replaced.is_replaced(tmp_path, "node2", entry.time + 1)  # a node started after it: a later launch's
    assert runs.read_state(tmp_path).status != "failed"
    assert preflight_verdict.read(tmp_path).replaced == ["node2"]


@pytest.mark.parametrize("spares, waiting, bad, says", [
    (0, [], "node2", None),  # no spares: the verdict as it always read
    (1, [], "node2", "not replaced: 1 node(s) named, 0 hot spare(s) waiting"),  # the spare is in use already
    (1, ["node3"], "node0", "not replaced: node0 hosts the rendezvous store, which no hot spare can replace"),
])
def test_a_named_node_no_spare_can_replace_fails_the_job_and_says_why(tmp_path, spares, waiting, bad, says):
    from fsdp_jobs.rundir import replaced, runs
    from fsdp_jobs.runtime.preflight import FAILED

    assert _named_by_preflight(tmp_path, spares=spares, waiting=waiting, bad=bad) == FAILED
    state = runs.read_state(tmp_path)
    assert state.status == "failed" and state.stage == "preflight" and state.bad_nodes == [bad], state
    assert ("not replaced" not in state.reason) if says is None else state.reason.endswith(says), state.reason
    assert replaced.read(tmp_path) == []


def test_status_names_the_nodes_spares_replaced_in_this_launch(tmp_path):
    """A finished local run of 2 nodes + 1 spare whose preflight named node2 in this launch; node1 was named in an
    earlier launch, which is not this one's story."""
    from fsdp_jobs.cli import ctl
    from fsdp_jobs.rundir import replaced, runs
    from fsdp_jobs.rundir.records import LaunchRecord, ReplacedNodes

    run_dir = tmp_path / "r"
    runs.prepare(run_dir, {"name": "r", "nodes": 2, "cluster": {"backend": "local", "spare_nodes": 1}}, {})
    replaced.record(run_dir, ReplacedNodes(time=time.time() - 100, nodes=["node1"], reason="an earlier launch's"))
    runs.record_launch(run_dir, LaunchRecord(backend="local", job_id="999999", nodes=2, unix=time.time() - 10,
                                             extra={"pid": 999999}))
    replaced.record(run_dir, ReplacedNodes(time=time.time(), nodes=["node2"], reason="slow"))
    runs.write_state(run_dir, status="completed", step=5)
    out = ctl.run_status(run_dir)
    assert out["state"] == "SUCCEEDED" and out["replaced_nodes"] == ["node2"], out
    assert "replaced by hot spares after the preflight named them: node2" in out["detail"], out["detail"]
