"""fault_tolerance=replica on cluster=local (README: Lose a node, keep training): 2 nodes x 2 ranks, each node a
replica group of its own torchrun world with its 2 ranks' FSDP shards, joined by torchft through the
lighthouse the launcher starts. (Docker, with the Done-when's timings: tests/docker/test_replicas_docker.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import MEASURED, PACED, REPO, SHORT, cli, committed, metrics

pytestmark = pytest.mark.integration

JOB = ("nodes=2", "gpus_per_node=2", "train.seed=3", "train.log_interval=1", *SHORT)
REPLICA = ("fault_tolerance=replica", "fault_tolerance.heartbeat_timeout_s=1")
# a killed group's ranks are forked again within about 2 s, which a loaded machine's new quorum (heartbeat
# 1 s, then a tick) can come after (the job then steps at full world throughout): the killed group
# waits 5 s before it rejoins, as a node slow to come back would, so the others certainly train without it
REJOIN = "+cluster.env.FSDP_JOBS_TEST_REJOIN_DELAY_S=5"


def assert_ok(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"


def node_lines(out: str, node: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(f"[{node}] ")]


def test_replica_groups_average_gradients_like_hsdp_and_resume_from_their_checkpoints(run_root):
    """Without a failure, two replica groups train what HSDP's replicate dimension trains (their gradients
    averaged by torchft instead of FSDP's all-reduce: the same losses but for the order of float sums); one
    group writes each checkpoint, and every group resumes from it."""
    assert_ok(cli(f"run_root={run_root}", "name=hsdp", *JOB, "train.steps=20", "checkpoint.interval=10"))
    r = cli(f"run_root={run_root}", "name=ft", *JOB, *REPLICA, "train.steps=10", "checkpoint.interval=10")
    assert_ok(r)
    assert "replica group 0 of 2: world 2" in r.stdout and "replica group 1 of 2: world 2" in r.stdout
    r = cli(f"run_root={run_root}", "name=ft", *JOB, *REPLICA, "train.steps=20", "checkpoint.interval=10")
    assert_ok(r)
    for node in ("node0", "node1"):  # each group loads the checkpoint: the whole job started again
        assert any("checkpoint: resumed from step-000010" in ln for ln in node_lines(r.stdout, node)), r.stdout
    ft, hsdp = metrics(run_root / "ft"), metrics(run_root / "hsdp")
    assert [m["step"] for m in ft] == list(range(1, 21)) and {m["world_size"] for m in ft} == {4}
    for a, b in zip(ft, hsdp):
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a["step"], a["loss"], b["loss"])
    assert committed(run_root / "ft") == ["step-000010", "step-000020"]


def after_restart(lines: list[str]) -> list[str]:
    """A group's log lines from its restart on (its first start may have joined the other live too, when it
    started late: at the job's start a group waits for the others, but a loaded machine can outlast that)."""
    starts = [i for i, ln in enumerate(lines) if "restart 1" in ln and "world" in ln]
    assert starts, "\n".join(lines[-20:])
    return lines[starts[0]:]


def kill_rank_3_when(run_root, name: str, args: tuple[str, ...], ready, env: dict[str, str] | None = None
                     ) -> tuple[str, dict[int, dict], int]:
    """Run the job; once `ready(run_dir)`, SIGKILL job rank 3 (group 1's second rank); let it finish. Returns
    its output, the rank files then, and how many metrics lines there were at the kill."""
    return signal_rank_when(run_root, name, args, ready, 3, signal.SIGKILL, env)


def signal_rank_when(run_root, name: str, args: tuple[str, ...], ready, rank: int, sig: int,
                     env: dict[str, str] | None = None) -> tuple[str, dict[int, dict], int]:
    """Run the job; once `ready(run_dir)`, send `sig` to job rank `rank`; let the job finish (the signalled
    process is killed at the end if it is still there). Returns what kill_rank_3_when does."""
    run_dir = run_root / name
    job = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={run_root}", f"name={name}", *args], cwd=REPO,
                           text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env={**os.environ, **(env or {})})
    signalled = None
    try:
        deadline = time.monotonic() + 300
        while not ready(run_dir):
            assert job.poll() is None, job.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "the job never got to where the rank is to be killed"
            time.sleep(0.1)
        ranks = {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()}
        killed_at = len(metrics(run_dir))
        signalled = ranks[rank]["pid"]
        os.kill(signalled, sig)
        out, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
        if sig == signal.SIGSTOP and signalled is not None:
            try:  # a stopped process the job left behind: never leave one
                os.kill(signalled, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert job.returncode == 0, out[-4000:]
    return out, ranks, killed_at


def test_a_killed_group_recovers_live_while_the_other_keeps_training(run_root):
    """SIGKILL of one rank of group 1 (of its 2): torchrun restarts that group alone; group 0 goes on at
    world 2 after the lighthouse drops group 1 (1 s), and group 1's new ranks take their shards of the model,
    the optimizer state, the schedule and the data position from group 0's ranks, with no checkpoint read."""
    run_dir = run_root / "kill"
    # 280 steps after the kill: group 1's restart outlasts none of them (a loaded CI machine slows both)
    out, ranks, killed_at = kill_rank_3_when(
        run_root, "kill", (*JOB, *REPLICA, REJOIN, "train.steps=300", "checkpoint.interval=20"),
        lambda d: (d / "checkpoints" / "step-000020" / "manifest.json").exists())
    assert {r: ranks[r]["replica_group"] for r in ranks} == {0: 0, 1: 0, 2: 1, 3: 1}  # job ranks, by group
    group1 = after_restart(node_lines(out, "node1"))
    assert any("recovered live from a peer" in ln for ln in group1), "\n".join(group1[-20:])
    assert not any("resumed from" in ln for ln in group1), "\n".join(group1[-20:])
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 301))  # every step trained once, none redone
    worlds = [x["world_size"] for x in m[killed_at:]]
    assert 2 in worlds and worlds[-1] == 4, worlds  # group 0 alone for a while, then both again
    assert {x["restart"] for x in m} == {0}  # group 0's ranks (which wrote every line) never restarted
    assert any("the quorum changed" in ln and "1 of 2 groups" in ln for ln in node_lines(out, "node0")), out[-3000:]
    # what the failure cost: status counts the stall, goodput takes it as lost time, with no step lost
    status = json.loads(cli("status", "kill", "--run-root", str(run_root)).stdout)
    assert status["replicas"]["groups"] == 2 and status["replicas"]["in_quorum"] == 2, status
    assert status["replicas"]["stalls"] >= 1 and status["replicas"]["stalled_s"] >= 0.5, status  # heartbeat 1 s
    total = json.loads(cli("goodput", "kill", "--json", "--run-root", str(run_root)).stdout)["total"]
    assert total["lost_steps"] == 0 and total["parts_s"]["lost"] >= 0.5, total


@pytest.mark.expects_hang  # the silent group's own watchdog restarts it
def test_a_group_gone_silent_costs_the_other_one_timeout_not_a_restart(run_root):
    """A group that stops answering without closing its connections (a host gone dead, a cut link: no TCP
    reset reaches the others; here its rank is SIGSTOPped) leaves the other group's rank in a gloo all-reduce
    that no abort frees: it fails its step when fault_tolerance.timeout_s expires (stopped between two steps,
    the silent group is simply left out of the next quorum: cheaper still), then trains on alone, before its
    own hang watchdog (fault.hang_timeout_s, at least twice as long) takes the wait for a hang.
    The silent group's watchdog restarts it, and it recovers live. (With both timeouts equal the survivor's
    watchdog may fire first and restart it from the checkpoint: pitfall 20.)"""
    run_dir = run_root / "silent"
    timeout_s, hang_s, steps = 8, 20, 300
    job = ("nodes=2", "gpus_per_node=1", "train.seed=3", "train.log_interval=1", *SHORT, *REPLICA, PACED,
           f"fault_tolerance.timeout_s={timeout_s}", f"fault.hang_timeout_s={hang_s}", f"train.steps={steps}",
           "checkpoint.interval=100")
    out, _, stopped_at = signal_rank_when(run_root, "silent", job,
                                          lambda d: (d / "metrics.jsonl").exists() and len(metrics(d)) >= 20,
                                          1, signal.SIGSTOP)
    node0, node1 = node_lines(out, "node0"), node_lines(out, "node1")
    assert not any(" hang: " in ln for ln in node0), "\n".join(node0[-30:])  # the survivor was never restarted
    # the survivor goes on in a quorum of its own; whether it first failed a step is a race: a stop inside the
    # step's all-reduce costs it the cross-group timeout ("not committed"), a stop between two steps costs less
    # (the lighthouse drops the silent group after its heartbeat timeout, before the survivor's next
    # all-reduce)
    assert any("the quorum changed" in ln and "1 of 2 groups" in ln for ln in node0), "\n".join(node0[-30:])
    failed_a_step = any("not committed" in ln for ln in node0)
    assert any(" hang: " in ln for ln in node1), "\n".join(node1[-30:])  # the silent group's own watchdog
    assert any("recovered live from a peer" in ln for ln in after_restart(node1)), "\n".join(node1[-30:])
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, steps + 1)) and {x["restart"] for x in m} == {0}
    worlds = [x["world_size"] for x in m[stopped_at:]]
    assert 1 in worlds and worlds[-1] == 2, worlds  # group 0 alone, then both again
    gaps = [b["time"] - a["time"] for a, b in zip(m[stopped_at - 1:], m[stopped_at:])]
    print(f"{MEASURED}survivor's longest step after the stop {max(gaps):.1f} s "
          f"(fault_tolerance.timeout_s {timeout_s}, fault.hang_timeout_s {hang_s}; "
          f"{'a step failed at the timeout first' if failed_a_step else 'stopped between steps: no step failed'})")
    assert max(gaps) < hang_s, max(gaps)  # one cross-group timeout, not a hang's restart


def test_a_job_api_script_recovers_live_too(run_root):
    """script= with fsdp_jobs.job (tests/scripts/job_train.py: job.optimizer, job.step, job.checkpoint): the
    objects given to job.checkpoint.load are what a restarted group recovers from the other, live."""
    script = REPO / "tests" / "scripts" / "job_train.py"
    run_dir = run_root / "script"
    # 290 steps of at least 0.1 s after the kill: group 1's restart can take seconds on a loaded machine, which a
    # much shorter run does not outlast (group 1 comes back to a finished job)
    out, _, _ = kill_rank_3_when(run_root, "script", (f"script={script}", *JOB, *REPLICA, REJOIN, "train.steps=300",
                                                      "checkpoint.interval=50"),
                                 lambda d: (d / "metrics.jsonl").exists() and len(metrics(d)) >= 10,
                                 env={"JOB_TRAIN_SECONDS_PER_STEP": "0.1"})
    assert any("recovered live from a peer" in ln for ln in after_restart(node_lines(out, "node1"))), out[-3000:]
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 301)) and 2 in [x["world_size"] for x in m]
    assert committed(run_dir)[-1] == "step-000300"


def test_a_lighthouse_whose_starter_is_gone_stops_instead_of_holding_its_port(tmp_path):
    """SLURM's batch script starts the lighthouse in the background (launchers/slurm/backend.py); when the script
    ends, proctrack/linuxproc no longer sees the re-parented child, which listened on after its job (found after
    CI runs, bound to 0.0.0.0). Here its starter, a shell, exits at once (often before the lighthouse's interpreter is
    up: the pid comes from the command line, as the batch script passes its $$): the lighthouse stops by itself."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "lighthouse.log"
    cmd = f"{sys.executable} -m fsdp_jobs.launchers.lighthouse --bind 127.0.0.1:{port} --parent $$ > {log} 2>&1 & echo $!"
    pid = int(subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=REPO, timeout=30).stdout)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
                not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"):
            time.sleep(0.2)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z"), \
            f"the lighthouse (pid {pid}) still runs 60 s after its starter exited:\n{log.read_text()}"
        text = log.read_text()
        assert "lighthouse listening" in text and "is gone: stopping" in text, text
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
