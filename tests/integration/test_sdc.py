"""Silent data corruption (fsdp_jobs/runtime/sdc.py, issue 47): a bit flipped in one rank's parameter shard is
found by the replica agreement check before the next in-memory snapshot, the node named, the state newer than the
last agreed check set aside, and the job goes on from the agreed step to the end, bit for bit equal to a run that
never saw the flip. cluster=local, CPU + gloo."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import assert_same_state, cli, losses, reference_job

pytestmark = pytest.mark.integration

TRAINING = ("train.steps=30", "checkpoint.interval=10", "checkpoint.memory_interval=1", "train.log_interval=1",
            "train.seed=5", "model.dim=64", "model.n_layers=1", "model.ffn_dim=128", "model.vocab_size=128",
            "data.seq_len=32")
THREE = ("nodes=3", "gpus_per_node=1", "train.global_batch_size=3", "train.micro_batch_per_rank=1")
TWO = ("nodes=2", "gpus_per_node=2")


def events(run_dir: Path, name: str) -> list[dict]:
    return [e for e in map(json.loads, (run_dir / "goodput.jsonl").read_text().splitlines()) if e["event"] == name]


def test_three_replica_groups_name_the_flipped_node_by_majority_and_a_spare_takes_its_place(run_root, tmp_path_factory):
    """3 nodes x 1 (hybrid_shard: 3 replicas of the whole state) + 1 hot spare; `fsdp-jobs chaos RUN corrupt-rank R`
    flips a bit of a rank not on the rendezvous store's node (which no spare can replace) mid-run. The check before
    that step's snapshot finds it, the majority names that node, the spare takes its place, the job resumes from
    the step before, from the other nodes' memory, and completes with the uninterrupted run's losses and state."""
    from tests.integration.test_memory_recovery import rank_record, start, wait_for_step
    from tests.integration.test_spares import node_wrappers, store_host

    ref = reference_job(tmp_path_factory, "sdc-three", *THREE, *TRAINING)
    run_dir = run_root / "flip3"
    # 0.3 s a step: the chaos command (a new interpreter, slow on a loaded machine) lands well before the last step
    proc = start(run_root, "flip3", *THREE, *TRAINING, "cluster.spare_nodes=1",
                 "+cluster.env.FSDP_JOBS_TEST_STEP_PAUSE_MS=300")
    wait_for_step(run_dir, 5, proc)
    hosts = store_host(node_wrappers(run_dir))
    rank = max(r for r in range(3) if rank_record(run_dir, r)["node"] not in hosts)
    said = cli("chaos", "flip3", "corrupt-rank", str(rank), "--run-root", str(run_root))
    assert said.returncode == 0 and f"asked rank {rank}" in said.stdout, said.stdout + said.stderr
    assert "the majority names its node, and a hot spare takes its place" in said.stdout, said.stdout
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    [found] = events(run_dir, "sdc")
    [named] = found["nodes"]
    flipped = int(re.search(r"chaos: flipped bit 20 of this rank's first parameter shard after step (\d+)", out)[1])
    assert found["ranks"] == [rank] and found["step"] == flipped and found["agreed_step"] == flipped - 1, found
    assert found["by_majority"]
    assert (f"silent data corruption: rank(s) {rank} on {named} disagreed with the other replicas of their shards at "
            f"step {flipped} (the last check that agreed: step {flipped - 1})") in out, out[-4000:]
    assert f"{named}: a replica agreement check named this node and a hot spare takes its place" in out, out[-4000:]
    [entry] = [json.loads(line) for line in (run_dir / "replaced-nodes.jsonl").read_text().splitlines()]
    assert entry["nodes"] == [named] and entry["named_by"] == "a replica agreement check"
    assert f"resumed from the in-memory snapshot of step {flipped - 1}" in out, out[-4000:]
    trained = {json.loads(p.read_text())["node"] for p in (run_dir / "ranks").glob("rank-*.json")}
    assert named not in trained and len(trained) == 3, trained
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")


def test_two_replica_groups_roll_back_recompute_and_name_the_node_that_does_not_reproduce_its_state(
        run_root, tmp_path_factory):
    """2 nodes x 2 (2 replicas of each shard) + 1 hot spare: a flipped bit makes a pair disagree, and two replicas
    make no majority. The job restarts in place from step 11, the last agreed snapshot, and recomputes step 12: the
    flip is not in the snapshot, so the healthy replica reproduces its own fingerprint and the flipped one does
    not. That names its node; the spare takes its place and the job ends bit for bit where the uninterrupted run
    does."""
    from tests.integration.test_memory_recovery import rank_record

    ref = reference_job(tmp_path_factory, "sdc-two", *TWO, *TRAINING)
    said = (ref / "logs" / "launcher.log").read_text()  # healthy: every step checked (a snapshot each), all agreed
    assert "replica check: every shard's replicas agreed at 30 of the 30 steps checked in this attempt" in said, said
    r = cli(f"run_root={run_root}", "name=flip2", *TWO, *TRAINING, "cluster.spare_nodes=1",
            env={"FSDP_JOBS_TEST_CORRUPT_AT": "12:-1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "flip2"
    first, second = events(run_dir, "sdc")
    assert first["step"] == 12 and first["agreed_step"] == 11 and first["named_by"] is None, first
    assert len(first["ranks"]) == 2 and len(first["nodes"]) == 2, first  # the flipped rank and its replica
    assert ("and two replicas make no majority; every rank rolls back to step 11 (its in-memory snapshot) and takes "
            "the steps to 12 again") in out, out[-4000:]
    assert second["step"] == 12 and second["named_by"] == "recomputation", second
    [flipped] = second["ranks"]
    [named] = second["nodes"]
    assert flipped in first["ranks"] and named in first["nodes"], (first, second)
    assert (f"silent data corruption: rank(s) {flipped} on {named} did not reproduce their own state when the steps "
            f"to 12 were recomputed from an agreed snapshot; their replicas did; going on from step 12, and a hot "
            f"spare takes the place of {named}") in out, out[-4000:]
    assert not (run_dir / "sdc-recheck.json").exists()  # judged: a later attempt does not judge it again
    trained = {rank_record(run_dir, rank)["node"] for rank in range(4)}
    assert named not in trained and len(trained) == 2, trained
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")


# checks every 6th step, snapshots every 2nd (as memory_interval=auto spaces them apart: issue #47)
SPACED = (*(a for a in TRAINING if not a.startswith("checkpoint.memory_interval=")), "checkpoint.memory_interval=2",
          "fault.sdc_check_interval=6")


def test_with_checks_spaced_wider_than_snapshots_the_job_rolls_back_past_the_unchecked_ones(run_root,
                                                                                            tmp_path_factory):
    """3 x 1 + 1 hot spare, a check every 6 steps and a snapshot every 2: a bit flipped after step 14 is in the
    unchecked snapshots of 14 and 16, and found by the check at 18. The majority names the node, and the job goes
    back to 12, the snapshot that check vouched for and kept while the unchecked ones took turns in the other
    slot; the spare takes its state from the other nodes' memory (12 vouched: a peer's 16 could carry the flip), and
    the run ends bit for bit where the uninterrupted one does."""
    ref = reference_job(tmp_path_factory, "sdc-three", *THREE, *TRAINING)
    r = cli(f"run_root={run_root}", "name=spaced3", *THREE, *SPACED, "cluster.spare_nodes=1",
            env={"FSDP_JOBS_TEST_CORRUPT_AT": "14:-1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "spaced3"
    [found] = events(run_dir, "sdc")
    assert (found["step"], found["agreed_step"], found["by_majority"]) == (18, 12, True), found
    assert "resumed from the in-memory snapshot of step 12 (ranks from their own node's memory: 2, from a peer's: 1" \
        in out, out[-4000:]
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")


def test_two_replicas_spaced_checks_recompute_from_the_vouched_snapshot_and_name_no_node(run_root, tmp_path_factory):
    """2 x 2, a check every 6 steps, a snapshot every 2: a flip after step 14 reaches the other replica through the
    gradients of steps 15-18 before the check at 18 finds the pair apart. Recomputed from 12, the snapshot the last
    check vouched for, neither replica reproduces its own state: no node is named (only a check at the flip's own
    step tells them apart), and the job goes on from the recomputed state, bit for bit where the uninterrupted run
    ends."""
    ref = reference_job(tmp_path_factory, "sdc-two", *TWO, *TRAINING)
    r = cli(f"run_root={run_root}", "name=spaced2", *TWO, *SPACED, env={"FSDP_JOBS_TEST_CORRUPT_AT": "14:-1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "spaced2"
    first, second = events(run_dir, "sdc")
    assert (first["step"], first["agreed_step"], first["how"]) == (18, 12, "pair"), first
    assert "every rank rolls back to step 12 (its in-memory snapshot) and takes the steps to 18 again" in out
    assert (second["step"], second["how"], second["named_by"]) == (18, "unresolved", None), second
    assert not (run_dir / "replaced-nodes.jsonl").exists()
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")


def test_a_majority_with_no_hot_spare_stops_the_job_naming_the_node(run_root, tmp_path_factory):
    """3 nodes x 1, no hot spare: the flipped node is named by the majority and nothing can take its place, so the
    job stops (exit 1) instead of training on a node that corrupts state; the run's record, `status` and the
    nodes' last lines all name it, and a requeue is told to exclude it (SLURM's --exclude)."""
    r = cli(f"run_root={run_root}", "name=flipstop", *THREE, *TRAINING, env={"FSDP_JOBS_TEST_CORRUPT_AT": "12:-1"})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    run_dir = run_root / "flipstop"
    [found] = events(run_dir, "sdc")
    [named] = found["nodes"]
    assert found["step"] == 12 and found["agreed_step"] == 11 and found["by_majority"], found
    line = (f"disagreed with the other replicas of their shards at step 12 (the last check that agreed: step 11); "
            f"stopped: no hot spare (cluster.spare_nodes) to take the place of {named}")
    assert line in out, out[-4000:]
    status = json.loads(cli("status", "flipstop", "--run-root", str(run_root)).stdout)
    assert status["state"] == "FAILED" and line in status["train"]["reason"], status
    assert status["train"]["bad_nodes"] == [named] and status["train"]["exclude"] == [named], status
    assert not (run_dir / "checkpoints" / "step-000020").exists()  # nothing past the flip was kept


def test_two_replicas_that_disagree_with_nothing_agreed_to_go_back_to_restart_naming_no_node(run_root,
                                                                                               tmp_path_factory):
    """No snapshots, no checkpoint yet, a check every 5 steps: the pair disagrees at step 5 and there is no agreed
    state to recompute from. Neither node is named (nothing tells them apart): the job restarts from the start,
    which the transient flip does not follow, and ends where the uninterrupted run does."""
    plain = ("train.steps=12", "checkpoint.interval=0", "checkpoint.memory_interval=0", "fault.sdc_check_interval=5",
             "train.log_interval=1", "train.seed=5", "model.dim=64", "model.n_layers=1", "model.ffn_dim=128",
             "model.vocab_size=128", "data.seq_len=32")
    ref = reference_job(tmp_path_factory, "sdc-none", *TWO, *plain)
    r = cli(f"run_root={run_root}", "name=flipnone", *TWO, *plain, env={"FSDP_JOBS_TEST_CORRUPT_AT": "4:3"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "flipnone"
    [found] = events(run_dir, "sdc")
    assert found["step"] == 5 and found["named_by"] is None, found
    assert "no agreed state to recompute from: restarting" in out, out[-4000:]
    assert not (run_dir / "replaced-nodes.jsonl").exists()
    status = json.loads(cli("status", "flipnone", "--run-root", str(run_root)).stdout)
    assert status["state"] == "SUCCEEDED" and not status["train"].get("bad_nodes"), status
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000012", run_dir / "checkpoints" / "step-000012")


def test_without_replicas_a_step_taken_again_names_the_flipped_node_and_a_spare_takes_its_place(
        run_root, tmp_path_factory):
    """full_shard on 2 nodes x 1 (no two ranks hold the same bits) + 1 hot spare, a step taken again every 5 steps
    (fault.sdc_recompute_interval, fsdp_jobs/runtime/recheck.py): a bit flipped after step 10's update on one rank
    makes that rank's first computation differ from its second; a third agrees with the second on every rank, so
    only the flipped rank moved and its node is named. The spare takes its place, the job goes on from step 10 and
    ends bit for bit where a run without the check does; the later checks all reproduce."""
    from tests.integration.test_memory_recovery import rank_record

    one_group = ("nodes=2", "gpus_per_node=1", "fsdp=full_shard", "train.global_batch_size=2",
                 "train.micro_batch_per_rank=1")
    ref = reference_job(tmp_path_factory, "sdc-full-shard", *one_group, *TRAINING)
    r = cli(f"run_root={run_root}", "name=rerun", *one_group, *TRAINING, "fault.sdc_recompute_interval=5",
            "cluster.spare_nodes=1", env={"FSDP_JOBS_TEST_CORRUPT_AT": "10:-1"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "rerun"
    [found] = events(run_dir, "sdc")
    assert found["step"] == 10 and found["agreed_step"] == 10 and found["named_by"] == "rerun", found
    [flipped], [named] = found["ranks"], found["nodes"]
    assert (f"silent data corruption: rank(s) {flipped} on {named} did not reproduce their own state when step 10 "
            f"was taken again, twice from the same state, and the others did: the corruption stayed in their state, "
            f"after the step's collectives; going on from step 10, and a hot spare takes the place of {named}") in out
    assert f"{named}: a step recheck named this node and a hot spare takes its place" in out, out[-4000:]
    assert "resumed from the in-memory snapshot of step 10" in out, out[-4000:]
    assert ("step recheck: 4 of the 4 steps taken again in this attempt reproduced on every rank "
            "(fault.sdc_recompute_interval=5, 0 spike(s); ") in out, out[-4000:]  # 15, 20, 25, 30: healthy
    trained = {rank_record(run_dir, rank)["node"] for rank in range(2)}
    assert named not in trained and len(trained) == 2, trained
    assert losses(run_dir) == losses(ref)
    assert_same_state(ref / "checkpoints" / "step-000030", run_dir / "checkpoints" / "step-000030")


def test_a_step_no_two_computations_of_which_agree_stops_the_job_at_the_state_before_it(run_root):
    """full_shard on 2 nodes x 1, a step taken again every 5 steps, and from step 9 on no computation reproduces
    another on any rank (FSDP_JOBS_TEST_UNREPRODUCIBLE_FROM_STEP: as kernels that are not deterministic). Step 10's
    three computations differ on every rank: no node is named and none excluded; the job stops (exit 1) before
    step 10 with the state of step 9 kept as a checkpoint, and its record, `status` and the incident say so."""
    one_group = ("nodes=2", "gpus_per_node=1", "fsdp=full_shard", "train.global_batch_size=2",
                 "train.micro_batch_per_rank=1")
    r = cli(f"run_root={run_root}", "name=unrepro", *one_group, *TRAINING, "fault.sdc_recompute_interval=5",
            env={"FSDP_JOBS_TEST_UNREPRODUCIBLE_FROM_STEP": "9"})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-4000:]
    run_dir = run_root / "unrepro"
    [found] = events(run_dir, "sdc")
    assert (found["step"], found["agreed_step"], found["ranks"], found["nodes"], found["how"]) == (
        10, 9, "all", [], "rerun-irreproducible"), found
    assert ("silent data corruption: every rank did not reproduce its own state in any two of three computations of "
            "step 10 from the same state") in out, out[-4000:]
    assert "stopped before step 10, the state of step 9 kept" in out, out[-4000:]
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000009"]
    status = json.loads(cli("status", "unrepro", "--run-root", str(run_root)).stdout)
    assert status["state"] == "FAILED" and status["train"]["step"] == 9, status
    assert not status["train"].get("bad_nodes") and not status["train"].get("exclude"), status


def test_a_loss_spike_without_replicas_has_the_next_two_steps_taken_again(run_root):
    """full_shard on 2 nodes x 1 with the product's defaults (no step recheck interval): step 12's loss is made
    1000 times as large (FSDP_JOBS_TEST_SPIKE_AT_STEP), far above 10 x the median of the steps logged before it
    (fault.sdc_spike_factor, fsdp_jobs/runtime/sentinel.py). The vote carries the spike to every rank after step 13,
    the next two steps (14 and 15) are each taken twice and compared, both reproduce, and the incident is said and
    on the timeline. No other step is a spike: the sentinel's own false positives would show here."""
    one_group = ("nodes=2", "gpus_per_node=1", "fsdp=full_shard", "train.global_batch_size=2",
                 "train.micro_batch_per_rank=1")
    r = cli(f"run_root={run_root}", "name=spike", *one_group, *TRAINING, env={"FSDP_JOBS_TEST_SPIKE_AT_STEP": "12"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    run_dir = run_root / "spike"
    [spike] = events(run_dir, "spike")
    assert spike["step"] == 12 and spike["checks"] == "recheck" and spike["factor"] == 10.0, spike
    assert ("a loss or gradient-norm spike at step 12: above 10 x the median of the last 32 logged steps before "
            "it, or as many as this attempt logged (fault.sdc_spike_factor); the next 2 steps are each taken twice "
            "and compared") in out, out[-4000:]
    assert ("step recheck: 2 of the 2 steps taken again in this attempt reproduced on every rank "
            "(fault.sdc_recompute_interval=0, 1 spike(s); ") in out, out[-4000:]
    assert not events(run_dir, "sdc")
