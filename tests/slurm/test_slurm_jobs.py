"""`python -m fsdp_jobs cluster=slurm ...` on a real multi-node SLURM cluster (see conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import re
import shutil
import time
from pathlib import Path

import pytest

import yaml

from fsdp_jobs.rundir import runs
from tests.conftest import (MEASURED, PACED, REPO, SHORT, assert_a_spare_took_the_state_from_peers, assert_same_state, cli,
                            committed, losses, manifest, metrics, shared_run)
from tests.slurm.conftest import DEPLOY, job_log, sh, submit, wait_for, wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]



def test_four_node_job_runs_on_every_node_and_dry_run_matches(run_root):
    args = (f"run_root={run_root}", "name=four", "nodes=4", "gpus_per_node=1", "train.steps=60",
            "checkpoint.interval=20", *SHORT)
    dry = cli("cluster=slurm", *args, "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    script = dry.stdout.split("# launch commands (slurm)\n", 1)[1]
    # exactly the command (device=auto): the test cluster has no GPU nodes, so none are asked for
    job_id, took, out = submit(*args, device=None)
    print(f"submission returned in {took:.2f}s")  # the command never waits for the job
    run_dir = run_root / "four"
    submitted = (run_dir / "slurm" / job_id / f"{job_id}_submission.sh").read_text()
    assert submitted.strip() == script.strip()  # the dry run is exactly what was submitted
    assert "--gpus-per-node" not in submitted

    assert wait_job(job_id) == "COMPLETED", job_log(run_dir, job_id)
    log = job_log(run_dir, job_id)
    for node in ("n1", "n2", "n3", "n4"):
        assert f"host {node} " in log, log[-3000:]
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 61)) and m[-1]["world_size"] == 4
    assert sum(x["loss"] for x in m[-5:]) < sum(x["loss"] for x in m[:5]) - 1.0
    ranks = [json.loads(p.read_text()) for p in (run_dir / "ranks").iterdir()]
    assert sorted(r["node"] for r in ranks) == ["n1", "n2", "n3", "n4"]


def test_hybrid_shard_two_nodes_of_two(run_root):
    job_id, _, _ = submit(f"run_root={run_root}", "name=hsdp", "nodes=2", "gpus_per_node=2",
                          "fsdp=hybrid_shard", "train.steps=10", *SHORT)
    run_dir = run_root / "hsdp"
    assert wait_job(job_id) == "COMPLETED", job_log(run_dir, job_id)
    assert manifest(run_dir / "checkpoints" / "step-000010")["mesh"] == {"replicate": 2, "shard": 2}
    ranks = {json.loads(p.read_text())["rank"]: json.loads(p.read_text())["node"] for p in (run_dir / "ranks").iterdir()}
    # shard groups are the two ranks of one node; replicas are across the two nodes
    assert ranks[0] == ranks[1] and ranks[2] == ranks[3] and ranks[0] != ranks[2]


def steps_by_attempt(run_dir: Path) -> list[list[int]]:
    attempts: dict[str, list[int]] = {}
    for x in metrics(run_dir):
        attempts.setdefault(x["attempt"], []).append(x["step"])
    return list(attempts.values())


def assert_resumed_losing_at_most_one_step(run_dir: Path, total: int) -> list[list[int]]:
    attempts = steps_by_attempt(run_dir)
    assert len(attempts) >= 2, attempts
    for before, after in zip(attempts, attempts[1:]):
        resumed_from = after[0] - 1  # the checkpoint the next attempt loaded
        assert resumed_from <= before[-1]
        assert before[-1] - resumed_from <= 1, (before[-1], resumed_from)  # at most one step's work lost
    assert attempts[-1][-1] == total
    executed = sum(len(a) for a in attempts)
    assert executed <= total + (len(attempts) - 1), (executed, total)
    return attempts


def copy_checkout(dest: Path) -> Path:
    for name in ("fsdp_jobs", "launchers", "conf"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_preemption_then_a_killed_rank_resume_and_goodput_accounts_both(run_root):
    """Preempted once (a higher-priority partition's job takes the nodes: SLURM requeues ours), then a rank
    killed in the next attempt (torchrun restarts the ranks in the same allocation). `fsdp-jobs goodput`
    shows every attempt, the lost steps are exactly the steps logged after the state the next attempt resumed
    from (after the kill: the ranks' in-memory snapshots, newer than the checkpoint), and each attempt's parts
    add up to its wall time within 2% (README: Goodput)."""
    total, interval = 600, 200
    job_id, _, _ = submit(f"run_root={run_root}", "name=preempt", "nodes=2", "gpus_per_node=1",
                          f"train.steps={total}", f"checkpoint.interval={interval}", "checkpoint.keep_last=20",
                          "train.log_interval=1", *SHORT)
    run_dir = run_root / "preempt"
    wait_for(lambda: len(metrics(run_dir)) >= 20 if (run_dir / "metrics.jsonl").exists() else False, 300, "step 20")
    urgent = sh("sbatch", "-p", "urgent", "-N4", "--exclusive", "-o", str(run_dir / "urgent.out"),
                "--wrap", "hostname; sleep 2", check=True)
    urgent_id = re.search(r"(\d+)", urgent).group(1)
    # the requeued attempt passes a periodic checkpoint and logs 20 more steps: then one of its ranks dies.
    # The kill lands as late as `chaos` takes to start, which on a loaded machine is tens of steps: it could
    # fall just after the next checkpoint, where memory is no newer. So: 20-60 steps past a checkpoint, 140
    # before the next.
    def past_a_checkpoint() -> bool:
        attempts = steps_by_attempt(run_dir)
        if len(attempts) < 2:
            return False
        first, last = attempts[1][0], attempts[1][-1]
        return last // interval > (first - 1) // interval and 20 <= last % interval <= 60

    wait_for(past_a_checkpoint, 600, "the requeued attempt past a checkpoint")
    chaos = cli("chaos", "preempt", "kill-rank", "1", "--run-root", str(run_root))
    assert chaos.returncode == 0 and "killed rank 1" in chaos.stdout, chaos.stdout + chaos.stderr
    assert wait_job(job_id, 900) == "COMPLETED", job_log(run_dir, job_id)
    assert wait_job(urgent_id, 60) == "COMPLETED"
    assert "stop requested" in job_log(run_dir, job_id)
    attempts = steps_by_attempt(run_dir)
    assert len(attempts) == 3 and attempts[-1][-1] == total, [(a[0], a[-1]) for a in attempts]

    r = cli("goodput", "preempt", "--json", "--run-root", str(run_root))
    assert r.returncode == 0, r.stderr
    gp = json.loads(r.stdout)
    print(cli("goodput", "preempt", "--run-root", str(run_root)).stdout)
    rows = gp["attempts"]
    assert len(rows) == 3, rows
    for row, steps, after in zip(rows, attempts, [*attempts[1:], None]):
        assert row["steps"] == [steps[0], steps[-1]], (row, steps[0], steps[-1])
        resumed_from = after[0] - 1 if after else total
        assert row["lost_steps"] == steps[-1] - resumed_from, (row, steps[-1], resumed_from)
        parts = row["parts_s"]
        assert abs(sum(parts.values()) - row["wall_s"]) <= 0.02 * row["wall_s"], row
        assert parts["other"] <= 0.02 * row["wall_s"], row
    assert rows[0]["ended"].startswith("preempted"), rows[0]
    assert rows[1]["ended"].startswith("failed") or "no end" in rows[1]["ended"], rows[1]
    # the kill's restart took the state from memory, past the checkpoint: fewer steps computed again than were
    # done since it, and 'lost' seconds exactly when some were
    assert rows[2]["state_from"] in ("memory", "memory+peers"), rows[2]
    assert rows[1]["lost_steps"] < attempts[1][-1] % interval, (rows[1], attempts[1][-1])
    # steps computed again are lost time; the step in flight when the rank died is lost time too, though no step
    # logged is computed again (a resume from memory at the last step done)
    assert rows[1]["lost_steps"] == 0 or rows[1]["parts_s"]["lost"] > 0, rows[1]
    assert rows[1]["parts_s"]["queued"] > 0  # the requeued attempt waited for its nodes
    assert rows[2]["parts_s"]["recovery"] > 0 and rows[2]["ended"] == "completed"
    assert gp["total"]["lost_steps"] == sum(r["lost_steps"] for r in rows)
    assert abs(sum(gp["total"]["parts_s"].values()) - gp["total"]["wall_s"]) <= 0.02 * gp["total"]["wall_s"]


def test_time_limit_usr2_checkpoints_requeues_resumes_and_runs_the_submitted_code(run_root, tmp_path):
    """A 3-minute limit with the signal (USR2) 90 s before it: SLURM warns 30-60 s into the run, the ranks
    checkpoint at the signal step and the job is requeued and resumes losing at most one step. While the job
    waits to be requeued, the test raises the limit (as an admin would) and shortens what is left to 100
    steps, so the second attempt takes the same few seconds on any machine: a fixed step count made this
    test last 220 s on one machine and 610 s on a slower one, most of it training after the resume. The
    steps are paced (PACED): the test waits on SLURM's clock, and at full speed the wait cost CI 2 cores.
    Submitted from a copy of the checkout that the user edits while the job runs: every attempt runs the
    code snapshot taken at submission (with its git commit), never the edited checkout. (This job also
    carries what a manual `scancel --signal=USR2` job checked: the same signal, handler and requeue; the
    manual signal's own path is test_sweeps' USR2 test and test_byo_slurm's.)"""
    checkout = copy_checkout(tmp_path / "checkout")
    total = 12000  # at most ~10 paced steps/s: the 30-60 s before the warning never finish it
    # no in-memory snapshots: a requeue starts every node afresh (their memory goes with their node wrappers),
    # and what this test holds is the checkpoint taken at the signal
    job_id, _, _ = submit(f"run_root={run_root}", "name=timeout", "nodes=2", "gpus_per_node=1",
                          f"train.steps={total}", "checkpoint.interval=100000", "checkpoint.memory_interval=0",
                          "checkpoint.keep_last=10",
                          "cluster.time_min=3", "cluster.signal_delay_s=90", PACED, *SHORT,
                          env={"PYTHONPATH": str(checkout)}, cwd=checkout)
    run_dir = run_root / "timeout"
    wait_for(lambda: len(metrics(run_dir)) >= 20 if (run_dir / "metrics.jsonl").exists() else False, 300, "step 20")
    # the user edits the checkout: a requeued job must not run this
    train_py = checkout / "fsdp_jobs" / "runtime" / "train.py"
    train_py.write_text("raise SystemExit('EDITED CHECKOUT RAN')\n" + train_py.read_text())
    wait_for(lambda: runs.read_state(run_dir).get("status") == "preempted", 600, "the checkpoint at the time-out signal")
    stopped_at = int(runs.read_state(run_dir)["step"])
    assert stopped_at < total and len(steps_by_attempt(run_dir)) == 1  # requeued, not yet restarted
    job = yaml.safe_load((run_dir / "job.yaml").read_text())
    job["train"]["steps"] = total = stopped_at + 100
    runs.write_atomic(run_dir / "job.yaml", yaml.safe_dump(job, sort_keys=False))
    sh("scontrol", "update", f"JobId={job_id}", "TimeLimit=30", check=True)
    assert wait_job(job_id, 900) == "COMPLETED", job_log(run_dir, job_id)
    log = job_log(run_dir, job_id)
    assert "this job is timed-out" in log  # submitit told the time limit from a preemption
    assert "EDITED CHECKOUT RAN" not in log
    assert f"code {run_dir / 'code' / '001'}" in log and str(checkout) not in log.split("code ", 1)[1].split()[0]
    assert "attempt 1" in log and "stop requested (SIGUSR2)" in log
    attempts = assert_resumed_losing_at_most_one_step(run_dir, total)
    assert attempts[0][-1] == stopped_at
    assert f"step-{stopped_at:06d}" in committed(run_dir)  # the checkpoint was taken at the signal step
    assert (run_dir / "code" / "001" / "GIT_COMMIT").is_file()


@pytest.mark.expects_hang
def test_a_stopped_rank_on_a_slurm_node_is_found_and_the_job_resumes_bitwise(run_root):
    """The node wrapper under srun watches its ranks like everywhere else: `chaos hang-rank` (the nodes are
    network namespaces of this machine, so the host sees their processes), the hang is declared within
    the timeout on the rank's node, and the job ends where an uninterrupted one ends, bit for bit."""
    args = ("nodes=2", "gpus_per_node=1", "train.steps=200", "checkpoint.interval=20", "checkpoint.keep_last=20",
            "train.seed=5", *SHORT)
    ref_id, _, _ = submit(f"run_root={run_root}", "name=ref", *args)
    # 10 s, as the node-cut test has on CI: the hang is declared, and the job resumes, 10 s sooner than at 20
    job_id, _, _ = submit(f"run_root={run_root}", "name=hung", *args, "fault.hang_timeout_s=10")
    run_dir = run_root / "hung"
    wait_for(lambda: (run_dir / "checkpoints" / "step-000020" / "manifest.json").exists(), 300, "step 20")
    chaos = cli("chaos", "hung", "hang-rank", "1", "--run-root", str(run_root))
    stopped_at = time.time()
    assert chaos.returncode == 0, chaos.stderr
    node = re.search(r"on (\S+)\)", chaos.stdout).group(1)
    assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    assert wait_job(ref_id, 600) == "COMPLETED"
    records = [json.loads(line) for line in (run_dir / "hangs.jsonl").read_text().splitlines()]
    mine = next(r for r in records if r["node"] == node)
    assert mine["first_stopped"]["rank"] == 1 and mine["time"] - stopped_at <= 10 + 15, records
    frame = mine["first_stopped"]["frame"]
    assert frame and frame.split(" (")[0] in (Path(mine["dir"]) / "rank-1.txt").read_text()
    status = json.loads(cli("status", "hung", "--run-root", str(run_root)).stdout)
    assert status["hang"]["rank"] == 1 and status["hang"]["node"] == node
    print(f"slurm: stop -> hang declared {mine['time'] - stopped_at:.1f} s")
    assert_same_state(run_root / "ref" / "checkpoints" / "step-000200", run_dir / "checkpoints" / "step-000200")


def test_a_suspended_job_is_no_hang_when_resumed(run_root):
    """`scontrol suspend` (an admin's, or gang scheduling's time slices) stops every process of the job, the
    watchdogs too; `scontrol resume` continues them. A pause longer than the hang timeout is no hang: no
    record, no restart, the job completes; `status` says SUSPENDED meanwhile. It used to be declared a hang on
    every node the moment it was resumed, and restarted."""
    args = ("nodes=2", "gpus_per_node=1", "train.steps=200", "checkpoint.interval=20", "train.seed=5", *SHORT,
            "fault.hang_timeout_s=5")
    job_id, _, _ = submit(f"run_root={run_root}", "name=paused", *args)
    run_dir = run_root / "paused"
    wait_for(lambda: (run_dir / "checkpoints" / "step-000020" / "manifest.json").exists(), 300, "step 20")
    sh("scontrol", "suspend", job_id, check=True)
    time.sleep(3)
    status = json.loads(cli("status", "paused", "--run-root", str(run_root)).stdout)
    time.sleep(7)  # past the hang timeout and the watchdog's PAUSED_S
    sh("scontrol", "resume", job_id, check=True)
    assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    log = job_log(run_dir, job_id)
    assert not (run_dir / "hangs.jsonl").exists() and "hang:" not in log, log[-4000:]
    rows = metrics(run_dir)
    assert {m["restart"] for m in rows} == {0} and rows[-1]["step"] == 200
    # the common word (it holds its nodes) and SLURM's
    assert status["state"] == "RUNNING" and status["detail"].startswith("SUSPENDED"), status


def test_the_job_trains_through_a_controller_restart_and_status_keeps_answering(run_root):
    """An admin restarts slurmctld mid-job (deploy/slurm/restart-controller.sh: SIGTERM, down 20 s, start
    again from its saved state). The job's ranks never notice: steps keep being recorded while the
    controller is down, the job completes every step, and `fsdp-jobs status` answers before, while the
    controller is down (a clear word, not a traceback) and after, with the true outcome."""
    # paced (PACED), at most 10 steps/s: 380 steps after step 20 take 38 s or more, past the controller's
    # ~21-25 s away and back (600 steps made it 60-100 s, most of it after the controller was back)
    total = 400
    job_id, _, _ = submit(f"run_root={run_root}", "name=ctld", "nodes=2", "gpus_per_node=1", f"train.steps={total}",
                          "checkpoint.interval=200", "train.log_interval=1", PACED, *SHORT)
    run_dir = run_root / "ctld"
    wait_for(lambda: len(metrics(run_dir)) >= 20 if (run_dir / "metrics.jsonl").exists() else False, 300, "step 20")
    before = json.loads(cli("status", "ctld", "--run-root", str(run_root)).stdout)
    assert before["state"] == "RUNNING", before
    started = time.time()
    restart = subprocess.Popen(["bash", str(REPO / "deploy" / "slurm" / "restart-controller.sh")],
                               env={**os.environ, "DOWN_S": "20"}, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    # SIGTERM: slurmctld saves its state and exits, then stays down DOWN_S
    wait_for(lambda: subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0, 30, "slurmctld down")
    asked = time.time()
    down = cli("status", "ctld", "--run-root", str(run_root))
    answered_s = time.time() - asked
    assert subprocess.run(["scontrol", "ping"], capture_output=True).returncode != 0, "status was asked while it was up"
    out, _ = restart.communicate(timeout=120)
    assert restart.returncode == 0 and "slurmctld restarted" in out, out
    said = json.loads(down.stdout)["detail"] if down.returncode == 0 else down.stderr.strip()
    print(f"{MEASURED}{out.strip()}; status while down answered in {answered_s:.1f} s: {said}")
    assert "Traceback" not in down.stdout + down.stderr, down.stdout + down.stderr
    # squeue fails while slurmctld is down; the accounting record (slurmdbd) still says RUNNING
    assert down.returncode == 0 and json.loads(down.stdout)["state"] == "RUNNING", down.stdout + down.stderr
    assert "slurmctld is not answering" in said, said  # squeue gave up after SQUEUE_TIMEOUT_S, not its ~18 s
    down_at = [float(x) for x in re.findall(r"down ([\d.]+) s", out)]
    assert down_at and down_at[0] >= 20
    assert wait_job(job_id, 900) == "COMPLETED", job_log(run_dir, job_id)
    rows = metrics(run_dir)
    assert rows[-1]["step"] == total and {r["restart"] for r in rows} == {0}, "the ranks never restarted"
    while_down = [r for r in rows if started + 1 <= r["time"] <= started + down_at[0] - 0.5]
    assert len(while_down) >= 5, "steps are recorded while the controller is down"
    assert rows[-1]["time"] > started + down_at[0], "the job still trained when the controller was back"
    after = json.loads(cli("status", "ctld", "--run-root", str(run_root)).stdout)
    assert after["state"] == "SUCCEEDED", after


@pytest.mark.expects_hang  # the cut node's peers' collectives stop: a hang, declared by design
def test_a_node_cut_off_from_the_network_is_named_and_the_job_trains_on_without_it(run_root):
    """`chaos cut-node 2`: every packet of n3's network namespace dropped (iptables; slurmd's too). The others'
    collectives stop: their watchdogs declare the hang once n3's agent has left the rendezvous (its keep-alive
    lapsed; before, fault.hang_timeout_s), naming n3; their next rendezvous goes on without n3
    (cluster.min_nodes=3) and rank 0 names n3 as gone. The link then heals (chaos resume), well inside
    slurmd's 300 s timeout: past it slurmctld declares n3 down and ends the allocation (NODE_FAIL, a requeue:
    SLURM's call, seen in this test's first version). The job completes, every step once at its data."""
    # no in-memory snapshots: what this test holds is the checkpoint resharded to the nodes left
    job_id, _, _ = submit(f"run_root={run_root}", "name=cut", "nodes=4", "gpus_per_node=1", "cluster.min_nodes=3",
                          "train.steps=400", "checkpoint.interval=50", "checkpoint.memory_interval=0",
                          "train.log_interval=1", "fault.hang_timeout_s=10", *SHORT)
    run_dir = run_root / "cut"
    wait_for(lambda: (run_dir / "checkpoints" / "step-000100" / "manifest.json").exists(), 300, "checkpoint 100")
    cut_at = time.time()
    try:
        r = cli("chaos", "cut", "cut-node", "2", "--run-root", str(run_root))
        assert r.returncode == 0 and "cut n3 off" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: any(x["world_size"] == 3 for x in metrics(run_dir)), 240, "a step on three nodes")
    finally:
        undo = cli("chaos", "cut", "resume", "--run-root", str(run_root))
    assert "n3 on the network again" in undo.stdout, undo.stdout + undo.stderr
    assert wait_job(job_id, 600) == "COMPLETED"
    log = job_log(run_dir, job_id)
    assert "nodes: n3 left the job" in log, log[-4000:]
    # healed, n3's waiting agent reaches the store again and joins a re-rendezvous (as seen here), or, had the
    # job ended first, its wrapper stops it: never an allocation held by an agent waiting for nothing
    assert ("nodes: n3 joined" in log or "n3: the job completed without this node" in log
            or "n3: the job completed while this node waited in the rendezvous" in log), log[-4000:]
    m = metrics(run_dir)
    on_three = [x for x in m if x["world_size"] == 3]
    assert m[-1]["step"] == 400 and on_three
    assert f"resumed from step-{on_three[0]['step'] - 1:06d}" in log
    assert json.loads(cli("status", "cut", "--run-root", str(run_root)).stdout)["state"] == "SUCCEEDED"
    hangs_ = [json.loads(ln) for ln in (run_dir / "hangs.jsonl").read_text().splitlines()]
    assert any(h["first_stopped"].get("left") and h["first_stopped"]["node"] == "n3" for h in hangs_), hangs_
    hang = min(float(h["time"]) for h in hangs_)
    print(f"{MEASURED}node cut off: hang declared after {hang - cut_at:.1f} s, first step on three nodes after "
          f"{on_three[0]['time'] - cut_at:.1f} s (fault.hang_timeout_s=10); the job ended on "
          f"{m[-1]['world_size']} nodes")


SPARE_ARGS = ("nodes=3", "gpus_per_node=1", "train.steps=200", "checkpoint.interval=50", "checkpoint.keep_last=20",
              "train.seed=7", "train.log_interval=1", *SHORT)


@pytest.fixture
def spare_reference(tmp_path_factory) -> Path:
    """An uninterrupted 3-node job of SPARE_ARGS (no spare), run once per session: the spare tests' reference."""
    def run(root: Path) -> Path:
        ref_id, _, _ = submit(f"run_root={root}", "name=ref", *SPARE_ARGS)
        assert wait_job(ref_id, 600) == "COMPLETED", job_log(root / "ref", ref_id)[-4000:]
        return root / "ref"
    return shared_run(tmp_path_factory, "slurm-spare-reference", run)


def test_a_hot_spare_takes_a_killed_nodes_place_at_world_three_and_the_same_losses(run_root, spare_reference):
    """cluster.spare_nodes=1 on 3 nodes: an allocation of all 4 nodes (--no-kill), one agent waiting in torch's
    rendezvous redundancy list. A training node other than the store's (the first host) loses its agent and
    ranks to SIGKILL; its SLURM task stays and waits for the job's outcome, the next round takes the spare,
    and the job completes at world 3 with the losses and final checkpoint of an uninterrupted 3-node job.
    Meanwhile the node is set DOWN, as a health check would: SLURM kills its task and (srun --no-kill) keeps
    the others. Its SLURM state is COMPLETED: a lost node fails neither the allocation nor the job (without the
    batch script's exit trap srun's status 9 made it FAILED)."""
    from tests.integration.test_spares import node_wrappers

    job_id, _, submitted = submit(f"run_root={run_root}", "name=spare", "cluster.spare_nodes=1", *SPARE_ARGS)
    run_dir = run_root / "spare"
    wait_for(lambda: (run_dir / "checkpoints" / "step-000050" / "manifest.json").exists(), 300, "checkpoint 50")
    world = json.loads((run_dir / "world.json").read_text())["nodes"]
    [spare] = {"n1", "n2", "n3", "n4"} - set(world)  # the allocation is every node; which one waits is a race
    assert {x["restart"] for x in metrics(run_dir)} == {0}  # the waiting spare caused no restart
    victim = max(n for n in world if n != "n1")  # n1, the first host, holds the rendezvous store
    wrappers = node_wrappers(run_dir)
    assert sorted(wrappers) == ["n1", "n2", "n3", "n4"], wrappers
    killed_at = time.time()
    os.killpg(os.getpgid(wrappers[victim]), 9)
    # the spare took its place: now SLURM learns the node failed (a health check downs it), and kills its task
    wait_for(lambda: any(x["restart"] == 1 for x in metrics(run_dir)), 300, "a step after the spare joined")
    sh("scontrol", "update", f"nodename={victim}", "state=down", "reason=fsdp-jobs test: a lost node", check=True)
    try:
        assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    finally:  # back for the next tests (ReturnToService=2 may have done it already: resume then says "invalid")
        sh("scontrol", "update", f"nodename={victim}", "state=resume")
        # (its task's teardown on a loaded machine can keep it completing for over a minute)
        wait_for(lambda: sh("sinfo", "-h", "-n", victim, "-o", "%T").strip() == "idle", 180, f"{victim} idle again")
    m = metrics(run_dir)
    assert {x["world_size"] for x in m} == {3} and m[-1]["step"] == 200
    assert max(x["restart"] for x in m) == 1  # one restart: the kill
    log = job_log(run_dir, job_id)
    assert f"{victim}: this node's agent exited -9; the job goes on without it" in log, log[-4000:]
    # srun kept the step (--no-kill) and ended it with the lost task's status; the batch script's exit did not
    assert f"Node failure on {victim}" in log and "but training completed at step 200" in log, log[-4000:]
    assert "on 3 nodes x 1 (+ 1 hot spare)" in submitted, submitted
    assert f"nodes: {victim} left the job; {spare} joined" in log, log[-4000:]
    assert losses(run_dir) == losses(spare_reference)
    assert_same_state(spare_reference / "checkpoints" / "step-000200", run_dir / "checkpoints" / "step-000200")
    status = json.loads(cli("status", "spare", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and status["spare_nodes"] == 1, status
    after = next(x for x in m if x["restart"] == 1)
    print(f"{MEASURED}hot spare (SLURM 3 + 1): {victim} killed, {spare} took its place; first step at world 3 "
          f"{after['time'] - killed_at:.1f} s after the kill (resumed from step {after['step'] - 1})")


def test_a_hot_spare_takes_a_lost_nodes_state_from_the_other_replica_groups_memory(run_root, spare_reference):
    """fsdp=hybrid_shard on 3 nodes of 1 rank (3 replica groups, each the whole state) + 1 spare. Half way between
    checkpoints 50 and 100 a training node other than the store's is lost: its slurmd and every process on it
    SIGKILLed (deploy/slurm/node.sh stop), then set DOWN as a health check would. The next round takes the
    spare, whose node memory holds nothing: its rank receives the newest in-memory snapshot from a rank of
    another replica group, the two survivors read theirs from their own node's memory, and no DCP checkpoint is
    read. The job keeps world 3, completes, and ends bit for bit where an uninterrupted one does."""
    from fsdp_jobs.rundir.liveness import derived_local_dir

    job_id, _, _ = submit(f"run_root={run_root}", "name=memspare", "fsdp=hybrid_shard", "cluster.spare_nodes=1",
                          *SPARE_ARGS)
    run_dir = run_root / "memspare"
    wait_for(lambda: (run_dir / "checkpoints" / "step-000050" / "manifest.json").exists()
             and metrics(run_dir)[-1]["step"] >= 75, 300, "step 75, past checkpoint 50")
    world = json.loads((run_dir / "world.json").read_text())["nodes"]
    [spare] = {"n1", "n2", "n3", "n4"} - set(world)  # the allocation is every node; which one waits is a race
    assert {x["restart"] for x in metrics(run_dir)} == {0}  # the waiting spare caused no restart
    victim = max(n for n in world if n != "n1")  # n1, the first host, holds the rendezvous store
    reached = metrics(run_dir)[-1]["step"]
    killed_at = time.time()
    try:
        sh("bash", str(DEPLOY / "node.sh"), "stop", victim, check=True)
        wait_for(lambda: any(x["restart"] == 1 for x in metrics(run_dir)), 300, "a step after the spare joined")
        sh("scontrol", "update", f"nodename={victim}", "state=down", "reason=fsdp-jobs test: a lost node", check=True)
        assert wait_job(job_id, 600) == "COMPLETED", job_log(run_dir, job_id)[-4000:]
    finally:  # the node repaired, for the next tests; what its memory held went with it
        restarted = sh("bash", str(DEPLOY / "node.sh"), "start", victim)
        shutil.rmtree(derived_local_dir(run_dir, victim), ignore_errors=True)
    assert f"{victim} started again" in restarted, restarted
    log = job_log(run_dir, job_id)
    resumed = assert_a_spare_took_the_state_from_peers(log, run_dir, reached, after_checkpoint=50)
    m = metrics(run_dir)
    assert {x["world_size"] for x in m} == {3} and m[-1]["step"] == 200 and max(x["restart"] for x in m) == 1
    assert f"nodes: {victim} left the job; {spare} joined" in log, log[-4000:]
    assert_same_state(spare_reference / "checkpoints" / "step-000200", run_dir / "checkpoints" / "step-000200")
    after = next(x for x in m if x["restart"] == 1)
    logged = max(x["step"] for x in m if x["restart"] == 0)  # rank 0's last line before the loss
    print(f"{MEASURED}hot spare from memory (SLURM 3 + 1, hybrid_shard): {victim} lost after step {reached}; "
          f"{spare}'s rank took step {resumed} from a peer (the last step logged before the loss: {logged}); first "
          f"step at world 3 {after['time'] - killed_at:.1f} s after the loss")
