"""fault_tolerance=replica on a real Docker engine (README: Lose a node, keep training): three containers,
each a replica group with its own torchrun, and the job's lighthouse as a fourth service. `chaos kill-node
2` mid-run: the other two keep stepping, node2 comes back (Docker restarts it) and recovers the model live
from them, with no checkpoint read, and the run completes with the loss of an uninterrupted one. The same
job without replica groups and without in-memory snapshots, killed the same way, restarts every node from
its checkpoint: the test prints the training time each lost to the failure."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tests.conftest import MEASURED, cli, committed, metrics
from tests.docker.test_docker_jobs import assert_ok, labelled, result, start

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.usefixtures("docker_engine")]

# the kill half way between two checkpoints, as a failure falls on average; steps of about 0.7 s on this
# 2-core machine with the other test worker running (a realistic step is seconds: the fixed costs of a
# membership change, about 0.1 s here, are measured against it). node2's container starting again beside
# the survivors takes their CPU for a few steps: at much shorter steps that stretches a second step past 3x
# the median, a cost of sharing one host, not of replica groups.
# The lighthouse drops a silent group after 1 s (fault_tolerance.heartbeat_timeout_s, as in torchft's own
# examples; its default, 5 s, is this job's default too): the one step the survivors wait.
# 50 steps after the kill: node2's missing share of ~15 steps' batches leaves the final loss closer to the
# uninterrupted run's than another seed's (at 80 steps of 8 x 64 tokens a rank, a local Docker run: seed 8
# ended 0.031 from seed 7's 1.6070, the killed replica run 0.012; at 24 x 128, seeds 8 and 9 ended 0.012 and
# 0.010 from 1.4555. The test's tiny model (SHORT) is no use here: every seed ends within 0.0005.)
# The step's length is mostly a pause (FSDP_JOBS_TEST_STEP_PAUSE_MS: "as if the data came slower"), not
# compute: at 24 x 128 tokens a rank the default model's steps, two Docker runs and a local one of 3 x 80 steps,
# would be minutes of CPU in a test run that is CPU-bound; the pause leaves that CPU to the other test
# worker, and keeps a step's length when node2's container starting again takes the survivors' CPU
STEPS, INTERVAL, KILL_AFTER = 80, 20, 30
STEP_PAUSE = "+cluster.env.FSDP_JOBS_TEST_STEP_PAUSE_MS=600"
JOB = ("nodes=3", "gpus_per_node=1", f"train.steps={STEPS}", f"checkpoint.interval={INTERVAL}", "train.log_interval=1",
       "train.batch_per_rank=8", "data.seq_len=64", "checkpoint.keep_last=10", STEP_PAUSE)
HEARTBEAT_S = 1
REPLICA = ("fault_tolerance=replica", f"fault_tolerance.heartbeat_timeout_s={HEARTBEAT_S}")


def first_completions(run_dir: Path) -> dict[int, float]:
    """When each step was first completed (a restart from a checkpoint completes some steps twice)."""
    done: dict[int, float] = {}
    for m in metrics(run_dir):
        done.setdefault(m["step"], m["time"])
    return done


def killed_run(run_root: Path, name: str, *extra: str) -> tuple[Path, str, float]:
    """The job, `chaos kill-node 2` once it is KILL_AFTER steps in (past its first checkpoint): its run dir,
    its output and when the node was killed."""
    run_dir = run_root / name
    proc = start(f"run_root={run_root}", f"name={name}", "cluster=docker", *JOB, *extra)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < KILL_AFTER:
        assert proc.poll() is None, f"job ended early ({proc.returncode}):\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"no step {KILL_AFTER} in 300 s"
        time.sleep(0.1)
    killed_at = time.time()
    assert_ok(cli("chaos", name, "kill-node", "2", "--run-root", str(run_root)))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return run_dir, out, killed_at


def ratio_of(longer_s: float, shorter_s: float) -> str:
    """`12.5 s / 1.7 s` as `7.4x`; a replica run that lost under 0.1 s (the kill fell between two steps) has
    no meaningful ratio, and printed one in the thousands."""
    return f"{longer_s / shorter_s:.1f}x" if shorter_s >= 0.1 else "the replica run lost under 0.1 s"


def lost_to_the_kill(run_dir: Path, killed_at: float) -> dict[str, float]:
    """Training time the failure cost, from the steps first completed after the kill: what each step took
    beyond their median, on the steps over 3x it (the test's measure of a step the job did not take in
    stride: the survivors' stall; a restart, whose first new step waits for it and for the steps it redid).
    Not against the pace before the kill: the other test worker's load comes and goes (a run that sped up
    after its kill "lost" -1.1 s that way), and a restarting container takes the survivors' CPU on this one
    host (their steps took up to 2.9x the median while node2 started again: no cost on separate nodes)."""
    done = first_completions(run_dir)
    at_kill = max(s for s, t in done.items() if t <= killed_at)
    gaps = [done[s] - done[s - 1] for s in range(at_kill + 1, STEPS + 1)]
    pace = statistics.median(gaps)
    return {"median_step_s": round(pace, 3), "step_at_kill": at_kill, "longest_step_s": round(max(gaps), 2),
            "lost_s": round(sum(g - pace for g in gaps if g > 3 * pace), 2)}


def local_reference(run_root: Path, seed: int) -> float:
    """The final loss of an uninterrupted run (cluster=local runs the same numbers as Docker; unpaused: a pause
    changes no number)."""
    r = cli(f"run_root={run_root}", f"name=ref{seed}", f"train.seed={seed}", *(a for a in JOB if a != STEP_PAUSE))
    assert_ok(r)
    return metrics(run_root / f"ref{seed}")[-1]["loss"]


def test_a_killed_replica_group_rejoins_live_while_the_others_keep_stepping(run_root):
    run_dir, out, killed_at = killed_run(run_root, "replica", *REPLICA, "train.seed=7")
    # the other two never stopped: one step waited for the lighthouse to drop node2 (the heartbeat timeout)
    done = first_completions(run_dir)
    assert sorted(done) == list(range(1, STEPS + 1)) and len(metrics(run_dir)) == STEPS  # every step once
    lost = lost_to_the_kill(run_dir, killed_at)
    worlds = {m["step"]: m["world_size"] for m in metrics(run_dir) if m["step"] > lost["step_at_kill"]}
    assert 2 in worlds.values() and worlds[STEPS] == 3, worlds  # two groups while node2 was gone, then three
    # ... and kept stepping: by the job's own records (rank 0's timeline: a step that waited for its quorum is a
    # "stall"), after the kill one step waited for the lighthouse to drop node2 and, at most, one more for
    # node2's return; no other step waited for anything. That one holds the step under way at the kill, the
    # heartbeat timeout, a new quorum and the step done again: no longer than the timeout, two median steps
    # and 2.5 s (room for a loaded machine), and no step is longer: a longer one is the stall
    # fsdp_jobs/runtime/replicas.py Replicas.commit prevents. Not a count of steps over 3x the median: node2's
    # container starting again on this one host takes the survivors' CPU, which stretches steps that waited
    # for no quorum.
    back = min(s for s, w in worlds.items() if w == 3 and any(worlds.get(b) == 2 for b in range(s)))
    after = [(s, round(done[s] - done[s - 1], 2)) for s in range(lost["step_at_kill"] + 1, STEPS + 1)]
    slow = [(s, dt) for s, dt in after if dt > 3 * lost["median_step_s"]]
    bound = HEARTBEAT_S + 2 * lost["median_step_s"] + 2.5
    stalls = [e for e in map(json.loads, (run_dir / "goodput.jsonl").read_text().splitlines())
              if e.get("event") == "stall" and e["step"] > lost["step_at_kill"]]
    seen = (stalls, slow, bound, lost, f"node2 back at step {back}")
    assert stalls and stalls[0]["groups"] == 2 and stalls[0]["seconds"] <= bound, seen  # node2 dropped, once
    assert all(e["groups"] == 3 and e["step"] >= back - 1 for e in stalls[1:]) and len(stalls) <= 2, seen  # its return
    assert lost["longest_step_s"] <= bound, seen
    # node2 came back and caught up live: no checkpoint read in its log after the kill
    node2 = [ln for ln in out.splitlines() if ln.startswith("[node2]")]
    starts = [i for i, ln in enumerate(node2) if "replica group 2 of 3: world" in ln]
    assert len(starts) >= 2, "\n".join(node2[-30:])  # its first start, and the one after the kill
    restarted = starts[1]
    assert any("recovered live from a peer" in ln for ln in node2[restarted:]), "\n".join(node2[-30:])
    assert not any("checkpoint: resumed from" in ln for ln in node2), "\n".join(node2[-30:])
    assert result(run_dir)["containers"]["node2"]["restarts"] >= 1
    assert f"step-{STEPS:06d}" in committed(run_dir) and labelled("container", run_dir) == []

    # the same job, killed the same way, restarts every node from its newest checkpoint (and ends with the
    # state of an uninterrupted run, bit for bit: tests/docker/test_docker_jobs.py). Without in-memory
    # snapshots: the comparison is with a checkpoint restart (fsdp_jobs/ARCHITECTURE.md, "Replica groups")
    restart_dir, restart_out, restart_killed_at = killed_run(run_root, "restart", "train.seed=7",
                                                             "checkpoint.memory_interval=0")
    assert "resumed from step-0000" in restart_out
    restart = lost_to_the_kill(restart_dir, restart_killed_at)
    print(f"{MEASURED}training time lost to one killed node: replica groups {lost['lost_s']:.1f} s, checkpoint restart "
          f"{restart['lost_s']:.1f} s ({ratio_of(restart['lost_s'], lost['lost_s'])}); "
          f"replica {json.dumps(lost)} (node2 back at step {back}; steps over 3x the median {slow}), "
          f"restart {json.dumps(restart)}")

    # the loss: as far from the uninterrupted run's (the restarted one's) as runs with another seed are
    ref7, ref8 = metrics(restart_dir)[-1]["loss"], local_reference(run_root, 8)
    final = metrics(run_dir)[-1]["loss"]
    print(f"{MEASURED}final loss: replica, killed {final:.4f}; uninterrupted {ref7:.4f}; another seed {ref8:.4f}")
    assert abs(final - ref7) <= abs(ref8 - ref7), (final, ref7, ref8)
