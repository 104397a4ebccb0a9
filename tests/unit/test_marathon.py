"""The chaos marathon's own parts (launchers/chaos/marathon.py), without a job: the seeded schedule, the
damage it does to a checkpoint, the metrics it reads by offset, and its table. The marathon against a
real job: tests/integration/test_chaos_marathon.py."""

from __future__ import annotations

import json
import random
import time
import zlib

import pytest

from fsdp_jobs.planning.chaos_kinds import MARATHON_ON_RANKS, ChaosKind
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.records import ChaosIncident
from fsdp_jobs.launchers.chaos import marathon

KINDS = MARATHON_ON_RANKS
KILL_NODE, CUT_NODE = ChaosKind.KILL_NODE, ChaosKind.CUT_NODE


def test_the_schedule_is_seeded_deals_every_kind_each_round_and_stays_between_the_checkpoints():
    a = marathon.schedule(7, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)
    assert a == marathon.schedule(7, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)  # same seed, same faults
    assert a != marathon.schedule(8, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)
    for r in range(0, 28, 4):  # each round of 4 holds each kind once
        assert sorted(f.kind for f in a[r:r + 4]) == sorted(KINDS)
    steps = [f.at_step for f in a]
    gap = (3200 - 21 - 21) / 30
    assert steps == sorted(steps) and steps[0] == 21 and steps[-1] == 21 + round(29 * gap)
    assert 3200 - 21 - steps[-1] >= int(gap)  # as many steps after the last fault as between two: room to recover
    assert all(0 <= f.target < (2 if f.kind == "slow-node" else 4) for f in a)


def test_a_schedule_the_steps_cannot_hold_is_refused_with_the_steps_it_needs():
    with pytest.raises(UserError) as e:
        marathon.schedule(0, 30, KINDS, world=4, nodes=2, steps=80, interval=20)
    assert "30 faults need train.steps >= 102" in str(e.value) and "this job has 80" in str(e.value)
    with pytest.raises(UserError):
        marathon.schedule(0, 2, KINDS, world=4, nodes=2, steps=1000, interval=0)  # no checkpoint to come back to


def test_restarts_needed_counts_every_fault_but_a_slow_node():
    faults = marathon.schedule(3, 8, KINDS, world=4, nodes=2, steps=1000, interval=20)
    restarts, hangs = marathon.restarts_needed(faults)
    assert restarts == 6 and hangs == 2  # two rounds of four kinds


@pytest.mark.parametrize("seed", range(6))
def test_damage_changes_a_shard_so_its_size_or_its_crc_tells(tmp_path, seed):
    ckpt = tmp_path / "step-000020"
    ckpt.mkdir()
    before = {}
    for r in range(2):
        (ckpt / f"__{r}_0.distcp").write_bytes(bytes(range(256)) * 40)
        before[f"__{r}_0.distcp"] = (10240, zlib.crc32(bytes(range(256)) * 40))
    said = marathon.damage_shard(ckpt, random.Random(seed))
    after = {p.name: (p.stat().st_size, zlib.crc32(p.read_bytes())) for p in ckpt.iterdir()}
    changed = [n for n in before if after[n] != before[n]]
    assert len(changed) == 1 and changed[0] in said, said


def test_progress_reads_new_rows_only_and_leaves_a_half_written_line_for_later(tmp_path):
    from fsdp_jobs.rundir.layout import RunDir

    path = RunDir(tmp_path).metrics_file
    path.write_text(json.dumps({"step": 1, "time": 1.0, "restart": 0}) + "\n" + '{"step": 2, "ti')
    p = marathon.Progress(tmp_path)
    assert [r.step for r in p.poll()] == [1]
    with open(path, "a") as f:
        f.write('me": 2.0, "restart": 0}\n' + json.dumps({"step": 3, "time": 3.0, "restart": 1}) + "\n")
    assert [r.step for r in p.poll()] == [2, 3] and p.last().restart == 1


def test_the_table_has_a_row_per_incident_and_a_dash_for_what_did_not_happen():
    rows = marathon.table([ChaosIncident(n=1, kind="kill-rank", target="rank 3", injected_at=0.0, step=40,
                                         detected_s=0.1, recovered_s=4.2, steps_lost=12, evidence="x", source="memory"),
                           ChaosIncident(n=2, kind="slow-node", target="node1", injected_at=0.0, step=90,
                                         evidence="not detected")])
    assert rows[2] == "| 1 | kill-rank | rank 3 | 40 | 0.1 s | 4.2 s | 12 | memory | x |"
    assert rows[3] == "| 2 | slow-node | node1 | 90 | - | - | - | - | not detected |"


def test_a_damaged_checkpoint_a_restart_from_memory_never_read_is_no_failure_of_the_marathon():
    """corrupt-checkpoint damages the newest checkpoint and kills a rank: with the state in memory the restart
    reads no checkpoint, so nothing can detect the damage yet (a later restart from disk sets it aside). A
    restart from disk that did not notice it still fails the marathon."""
    damaged = dict(n=1, kind="corrupt-checkpoint", target="rank 1", injected_at=0.0, step=40, recovered_s=3.0)
    assert marathon.unread(ChaosIncident(**damaged, source="memory+peers"))
    assert not marathon.unread(ChaosIncident(**damaged, source="disk"))
    assert not marathon.unread(ChaosIncident(**{**damaged, "kind": "kill-rank"}, source="memory"))


def test_a_bad_fault_count_is_one_line_and_exit_2(tmp_path):
    from tests.conftest import cli

    for count in ("0", "1001"):
        r = cli("chaos", "anything", "marathon", "--faults", count, "--run-root", str(tmp_path))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "between 1 and 1000" in r.stderr, r.stderr
    r = cli("chaos", "anything", "marathon", "--margin", "0", "--run-root", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--margin=0: must be an integer >= 1" in r.stderr, r.stderr


def test_kill_node_and_cut_node_spare_node0_which_holds_the_rendezvous_store():
    faults = marathon.schedule(1, 40, (*KINDS, KILL_NODE, CUT_NODE), world=3, nodes=3, steps=2000, interval=20)
    for kind in (KILL_NODE, CUT_NODE):
        assert {f.target for f in faults if f.kind == kind} == {1, 2}, kind
    restarts, after_hangs = marathon.restarts_needed(faults)  # a cut is found as a hang: it counts as one
    assert after_hangs == sum(f.kind in ("hang-rank", "cut-node") for f in faults) and restarts == 40 - sum(
        f.kind == "slow-node" for f in faults)


def test_a_node_index_is_named_as_the_run_names_its_nodes(tmp_path):
    """chaos slow-node N, slow-link N and the marathon take a node index: nodeN where the run's nodes are so
    named (cluster=local, Docker), whatever rank the rendezvous gave it; on SLURM, whose nodes are its hosts,
    the N-th in natural order (found on the 4-node SLURM marathon: 'no running rank on node2')."""
    from fsdp_jobs.rundir.layout import RunDir
    from fsdp_jobs.launchers.chaos import inject

    def ranks(run_dir, nodes):
        for rank, node in enumerate(nodes):
            path = RunDir(run_dir).rank_file(rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"rank": rank, "pid": 100 + rank, "node": node, "host": node, "uid": 0,
                                        "node_rank": rank, "restart": 0, "world_size": 4, "time": 1.0, "v": 1}))

    ranks(tmp_path / "local", ["node1", "node0", "node2"])  # node1 took node_rank 0 at the rendezvous
    assert [inject.node_name(tmp_path / "local", i) for i in range(3)] == ["node0", "node1", "node2"]
    ranks(tmp_path / "slurm", ["n10", "n2", "n9", "n1"])
    assert [inject.node_name(tmp_path / "slurm", i) for i in range(5)] == ["n1", "n2", "n9", "n10", "node4"]


def test_cut_node_is_dealt_only_to_a_job_that_cannot_go_on_without_the_node():
    docker = (*KINDS, KILL_NODE, CUT_NODE)
    assert marathon.kinds_for(docker, 3, 3) == docker
    assert "cut-node" not in marathon.kinds_for(docker, 3, 2)  # elastic: it would finish on two, not bitwise
    assert marathon.kinds_for(docker, 1, 1) == ("kill-rank", "hang-rank", "corrupt-checkpoint")


FAKE_RANK_SAVE = """
import os, sys, time
from pathlib import Path
tmp, final = Path(sys.argv[1]), Path(sys.argv[2])
time.sleep(0.6)  # the save under way: its last shard, its manifest, then the commit's rename
(tmp / "manifest.json").write_text("{}")
os.rename(tmp, final)
time.sleep(600)
"""


def committed_step(root, step: int, tmp: bool = False):
    d = root / (f".tmp-step-{step:06d}-a1" if tmp else f"step-{step:06d}")
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"m")
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * 8)
    if not tmp:
        (d / "manifest.json").write_text("{}")
    return d


def test_corrupt_checkpoint_waits_for_a_save_under_way_and_damages_the_checkpoint_the_restart_will_meet(tmp_path):
    """A rank of the run (a stand-in process, by its environment, as launchers/chaos/inject.py finds ranks) commits
    step 40 0.6 s after the fault is dealt: the fault waits for that commit and damages step 40, not step 20,
    which the restart would never load (a CI marathon's corrupt-checkpoint fault went undetected so)."""
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    committed_step(root, 20)
    tmp = committed_step(root, 40, tmp=True)
    env = {**os.environ, "FSDP_JOBS_RUN_DIR": str(run_dir), "RANK": "0", "LOCAL_RANK": "0", "FSDP_JOBS_NODE": "node0"}
    rank = subprocess.Popen([sys.executable, "-c", FAKE_RANK_SAVE, str(tmp), str(root / "step-000040")], env=env)
    try:
        time.sleep(0.2)  # the stand-in has started and is mid-save
        what = marathon.corrupt_newest_and_kill(run_dir, 0, random.Random(3))
        assert what.startswith("step-000040: ") and what.endswith("rank 0 killed"), what
        assert rank.wait(timeout=10) == -9
    finally:
        rank.kill()
    assert (root / "step-000020" / "__0_0.distcp").read_bytes() == bytes(range(256)) * 8  # left alone
    assert (root / "step-000040" / "__0_0.distcp").read_bytes() != bytes(range(256)) * 8


def prepared_run(tmp_path, *overrides: str):
    """A run dir as a submission writes it (job.yaml, plan.json), through the planning path itself."""
    from pathlib import Path

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.status import Run

    cfg, job = compose([f"run_root={tmp_path}", "name=m", *overrides])
    plan = make_plan(cfg)
    runs.prepare(Path(plan.run_dir), job, plan.to_dict())
    return Run(Path(plan.run_dir), {})


DEALT = (*KINDS, KILL_NODE)  # what a backend with nodes of its own deals (its TRAITS.marathon)


def test_kinds_and_margin_deal_one_schedule_whatever_the_checkpoint_interval(tmp_path):
    """bench interval runs one fault schedule against several checkpoint intervals: --kinds kill-rank
    --margin 20 deals the same faults at the same steps to interval=10, 50, 200 and auto."""
    plans = [marathon.plan_for(DEALT, prepared_run(tmp_path / every, "train.steps=1000", "cluster.max_restarts=9",
                                                      f"checkpoint.interval={every}"), 6, 1, ("kill-rank",), 20)
             for every in ("10", "50", "200", "auto")]
    assert all(p == plans[0] for p in plans) and {f.kind for f in plans[0]} == {"kill-rank"}
    assert plans[0][0].at_step == 21 and plans[0][-1].at_step <= 1000 - 21
    auto = marathon.plan_for(DEALT, prepared_run(tmp_path / "a", "train.steps=1000", "cluster.max_restarts=9", "checkpoint.interval=auto"),
                             6, 1, ("kill-rank",))
    assert auto == plans[0]  # auto's default margin: AUTO_MARGIN (20) steps
    fixed = marathon.plan_for(DEALT, prepared_run(tmp_path / "f", "train.steps=1000", "cluster.max_restarts=9", "checkpoint.interval=50"),
                              6, 1, ("kill-rank",))
    assert fixed[0].at_step == 51  # a fixed interval's default margin is the interval


@pytest.mark.parametrize("kinds, needle", [(("bogus",), "this backend deals kill-rank"),
                                           (("cut-node",), "this backend deals"),
                                           (("kill-node",), "none of them can be dealt to a job of 1 nodes")])
def test_kinds_a_backend_cannot_deal_are_refused_in_one_line(tmp_path, kinds, needle):
    run = prepared_run(tmp_path, "nodes=1", "train.steps=1000")
    with pytest.raises(UserError) as e:
        marathon.plan_for(DEALT, run, 4, 0, kinds)
    assert needle in str(e.value) and "\n" not in str(e.value) and "--kinds" in str(e.value)
