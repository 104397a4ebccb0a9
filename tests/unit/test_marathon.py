"""The chaos marathon's own parts (launchers/marathon.py), without a job: the seeded schedule, the
damage it does to a checkpoint, the metrics it reads by offset, and its table. The marathon against a
real job: tests/integration/test_chaos_marathon.py."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir.records import ChaosIncident
from launchers import marathon

KINDS = marathon.BASE_KINDS


def test_the_schedule_is_seeded_deals_every_kind_each_round_and_stays_between_the_checkpoints():
    a = marathon.schedule(7, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)
    assert a == marathon.schedule(7, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)  # same seed, same faults
    assert a != marathon.schedule(8, 30, KINDS, world=4, nodes=2, steps=3200, interval=20)
    for r in range(0, 28, 4):  # each round of 4 holds each kind once
        assert sorted(f.kind for f in a[r:r + 4]) == sorted(KINDS)
    steps = [f.at_step for f in a]
    assert steps == sorted(steps) and steps[0] == 21 and steps[-1] == 3200 - 21
    assert all(0 <= f.target < (2 if f.kind == "slow-node" else 4) for f in a)


def test_a_schedule_the_steps_cannot_hold_is_refused_with_the_steps_it_needs():
    with pytest.raises(UserError) as e:
        marathon.schedule(0, 30, KINDS, world=4, nodes=2, steps=80, interval=20)
    assert "30 faults need train.steps >= 100" in str(e.value) and "this job has 80" in str(e.value)
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
                                         detected_s=0.1, recovered_s=4.2, steps_lost=12, evidence="x"),
                           ChaosIncident(n=2, kind="slow-node", target="node1", injected_at=0.0, step=90,
                                         evidence="not detected")])
    assert rows[2] == "| 1 | kill-rank | rank 3 | 40 | 0.1 s | 4.2 s | 12 | x |"
    assert rows[3] == "| 2 | slow-node | node1 | 90 | - | - | - | not detected |"


def test_a_bad_fault_count_is_one_line_and_exit_2(tmp_path):
    from tests.conftest import cli

    for count in ("0", "1001"):
        r = cli("chaos", "anything", "marathon", "--faults", count, "--run-root", str(tmp_path))
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "between 1 and 1000" in r.stderr, r.stderr


def test_kill_node_and_cut_node_spare_node0_which_holds_the_rendezvous_store():
    faults = marathon.schedule(1, 40, (*KINDS, "kill-node", "cut-node"), world=3, nodes=3, steps=2000, interval=20)
    for kind in ("kill-node", "cut-node"):
        assert {f.target for f in faults if f.kind == kind} == {1, 2}, kind
    restarts, after_hangs = marathon.restarts_needed(faults)  # a cut is found as a hang: it counts as one
    assert after_hangs == sum(f.kind in ("hang-rank", "cut-node") for f in faults) and restarts == 40 - sum(
        f.kind == "slow-node" for f in faults)


def test_a_node_index_is_named_as_the_run_names_its_nodes(tmp_path):
    """chaos slow-node N, slow-link N and the marathon take a node index: nodeN where the run's nodes are so
    named (cluster=local, Docker), whatever rank the rendezvous gave it; on SLURM, whose nodes are its hosts,
    the N-th in natural order (found on the 4-node SLURM marathon: 'no running rank on node2')."""
    from fsdp_jobs.rundir.layout import RunDir
    from launchers import chaos

    def ranks(run_dir, nodes):
        for rank, node in enumerate(nodes):
            path = RunDir(run_dir).rank_file(rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"rank": rank, "pid": 100 + rank, "node": node, "host": node, "uid": 0,
                                        "node_rank": rank, "restart": 0, "world_size": 4, "time": 1.0, "v": 1}))

    ranks(tmp_path / "local", ["node1", "node0", "node2"])  # node1 took node_rank 0 at the rendezvous
    assert [chaos.node_name(tmp_path / "local", i) for i in range(3)] == ["node0", "node1", "node2"]
    ranks(tmp_path / "slurm", ["n10", "n2", "n9", "n1"])
    assert [chaos.node_name(tmp_path / "slurm", i) for i in range(5)] == ["n1", "n2", "n9", "n10", "node4"]


def test_cut_node_is_dealt_only_to_a_job_that_cannot_go_on_without_the_node():
    docker = (*KINDS, "kill-node", "cut-node")
    assert marathon.kinds_for(docker, 3, 3) == docker
    assert "cut-node" not in marathon.kinds_for(docker, 3, 2)  # elastic: it would finish on two, not bitwise
    assert marathon.kinds_for(docker, 1, 1) == ("kill-rank", "hang-rank", "corrupt-checkpoint")
