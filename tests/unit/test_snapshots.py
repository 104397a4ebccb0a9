"""In-memory snapshots (fsdp_jobs/runtime/snapshots.py): the choice of where each rank's state comes from, and
the slots a killed writer leaves behind. The real jobs that recover from them: tests/integration/test_memory_recovery.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from fsdp_jobs.runtime import snapshots
from fsdp_jobs.runtime.checkpoint import TrainState
from fsdp_jobs.runtime.snapshots import Held, SnapshotStore, choose, shard_of

HSDP = {"replicate": 2, "shard": 2}


def held(owner: int, *steps: int, mesh: dict[str, int] = HSDP) -> list[Held]:
    return [Held(f"/m/r{owner}-{i}.snap", owner, s, shard_of(owner, mesh), 100) for i, s in enumerate(steps)]


def test_every_rank_resumes_from_its_own_nodes_newest_snapshot():
    plan = choose([held(r, 14, 15) for r in range(4)], [shard_of(r, HSDP) for r in range(4)], disk_step=10)
    assert plan is not None and plan.step == 15
    assert plan.sources == {0: None, 1: None, 2: None, 3: None}
    assert {r: h.owner for r, h in plan.files.items()} == {0: 0, 1: 1, 2: 2, 3: 3}


def test_a_rank_killed_mid_copy_sends_everyone_back_to_the_snapshot_before():
    """Rank 3 died writing step 15 (its slots hold 13 and 14). Without a replica of its shard, everyone
    resumes at 14; under HSDP rank 1 holds the same shard at 15 and sends it."""
    flat = {"shard": 4}
    slots = [held(0, 14, 15, mesh=flat), held(1, 14, 15, mesh=flat), held(2, 14, 15, mesh=flat), held(3, 14, 13, mesh=flat)]
    assert choose(slots, [0, 1, 2, 3], disk_step=10).step == 14
    slots = [held(0, 14, 15), held(1, 14, 15), held(2, 14, 15), held(3, 14, 13)]
    plan = choose(slots, [0, 1, 0, 1], disk_step=10)
    assert plan.step == 15 and plan.sources[3] == 1


def test_a_node_that_lost_its_memory_takes_its_shards_from_the_other_replica_group():
    """Node 1 (ranks 2, 3) was replaced: nothing in its memory. Under HSDP rank 2 holds rank 0's shard and
    rank 3 rank 1's: each receives it from that peer, nothing from disk."""
    plan = choose([held(0, 14, 15), held(1, 14, 15), [], []], [0, 1, 0, 1], disk_step=10)
    assert plan is not None and plan.step == 15
    assert plan.sources == {0: None, 1: None, 2: 0, 3: 1}


def test_without_a_replica_a_lost_node_sends_the_job_to_disk():
    flat = {"shard": 4}
    plan = choose([held(0, 15, mesh=flat), held(1, 15, mesh=flat), [], []], [0, 1, 2, 3], disk_step=10)
    assert plan is None


def test_under_full_shard_a_lost_nodes_ranks_take_their_state_from_the_next_nodes_buddy_copies():
    """full_shard over 2 nodes: node 0 keeps buddy copies of node 1's ranks (fsdp_jobs/runtime/buddies.py), one
    snapshot behind its own. Node 1 replaced: every rank resumes at the newest step the copies cover, node 0's
    ranks from their own slots, node 1's receiving the copies, each from the rank that holds that shard's copy
    (not its own slot, which is another shard)."""
    flat = {"shard": 4}

    def buddy(owner: int, *steps: int) -> list[Held]:
        return [Held(f"/m/b{owner}-{i}.snap", owner, s, owner, 100) for i, s in enumerate(steps)]

    node0 = [*held(0, 14, 15, mesh=flat), *held(1, 14, 15, mesh=flat), *buddy(2, 13, 14), *buddy(3, 13, 14)]
    plan = choose([node0, node0, [], []], [0, 1, 2, 3], disk_step=10)
    assert plan is not None and plan.step == 14
    assert plan.sources == {0: None, 1: None, 2: 0, 3: 1}
    assert plan.files[0].path == "/m/r0-0.snap" and plan.files[1].path == "/m/r1-0.snap"
    assert plan.sent[2].path == "/m/b2-1.snap" and plan.sent[3].path == "/m/b3-1.snap"
    assert choose([node0, node0, [], []], [0, 1, 2, 3], disk_step=15) is None  # the copies are older than the disk


def test_memory_older_than_the_newest_checkpoint_is_not_used():
    assert choose([held(r, 8, 9) for r in range(4)], [0, 1, 0, 1], disk_step=10) is None
    assert choose([held(r, 9, 10) for r in range(4)], [0, 1, 0, 1], disk_step=10).step == 10


def test_the_same_node_holding_another_ranks_file_serves_it_without_the_network():
    """Ranks renumbered by the rendezvous (pitfall 6): rank 2 now runs where rank 0's file is."""
    plan = choose([held(2, 15), held(3, 15), held(0, 15), held(1, 15)], [0, 1, 0, 1], disk_step=None)
    assert plan is not None and plan.sources == {0: None, 1: None, 2: None, 3: None}
    assert plan.files[0].owner == 2 and plan.files[2].owner == 0


def small_state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return TrainState(model, opt, sched)


def train(state: TrainState, steps: int) -> None:
    for _ in range(steps):
        state.model(torch.randn(4, 8)).sum().backward()
        state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad()
        state.step += 1
        state.samples_seen += 4


def test_a_snapshot_restores_model_optimizer_schedule_position_and_rng_exactly(tmp_path):
    a, b = small_state(0), small_state(1)
    train(a, 3)
    store = SnapshotStore(tmp_path, {"run": "x"})
    tensors, skeleton = snapshots.capture(a)
    rng = torch.get_rng_state()
    path = store.write(0, a.step, 0, tensors, skeleton)
    torch.randn(100)  # the RNG moves on, as a new process's would be elsewhere
    step, got, skel = snapshots.decode(path.read_bytes())
    snapshots.apply(b, got, skel)
    assert (step, b.step, b.samples_seen, b.scheduler.last_epoch) == (3, 3, 12, 3)
    assert torch.equal(torch.get_rng_state(), rng)
    assert b.optimizer.state_dict()["param_groups"] == a.optimizer.state_dict()["param_groups"]
    assert type(b.optimizer.param_groups[0]["betas"]) is tuple  # a checkpoint saved after it holds the same keys
    train(b, 2)
    torch.set_rng_state(rng)
    train(a, 2)  # the same RNG draws, the same moments: the same weights, bit for bit
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)


def test_a_writer_killed_mid_copy_leaves_the_other_slot_whole(tmp_path, monkeypatch):
    state = small_state(0)
    store = SnapshotStore(tmp_path, {"run": "x"})
    for _ in range(2):
        train(state, 1)
        store.write(0, state.step, 0, *snapshots.capture(state))
    train(state, 1)
    tensors, skeleton = snapshots.capture(state)

    class Killed(Exception):
        pass

    copied = []
    copy_tensors = snapshots.copy_tensors

    def dies_half_way(places, some):  # called for each half of the tensors: stop after the first, as a SIGKILL would
        if copied:
            raise Killed
        copied.append(len(some))
        copy_tensors(places, some)

    monkeypatch.setattr(snapshots, "copy_tensors", dies_half_way)
    with pytest.raises(Killed):
        store.write(0, state.step, 0, tensors, skeleton)
    monkeypatch.undo()
    assert copied == [len(tensors) // 2]  # half the tensors were copied over the older slot's
    assert [h.step for h in store.held()] == [2]
    step, _, _ = snapshots.decode(Path(store.held()[0].path).read_bytes())
    assert step == 2


def test_a_flipped_bit_in_memory_fails_the_checksum(tmp_path):
    """Any one bit of the tensors' region (first byte, a middle one, the last word) or of the skeleton."""
    state = small_state(0)
    train(state, 1)
    store = SnapshotStore(tmp_path, {"run": "x"})
    path = store.write(0, 1, 0, *snapshots.capture(state))
    clean = path.read_bytes()
    at, end = snapshots.read_header(path)["meta"]
    for where, bit in [(snapshots.HEADER, 0), (snapshots.HEADER + 5, 4), ((snapshots.HEADER + at) // 2, 7),
                       (at - 1, 7), (at + 3, 1), (end - 2, 0)]:
        data = bytearray(clean)
        data[where] ^= 1 << bit
        with pytest.raises(ValueError, match="fails its checksum"):
            snapshots.decode(bytes(data))
    assert snapshots.decode(clean)[0] == 1


def test_another_runs_snapshots_are_not_held(tmp_path):
    state = small_state(0)
    SnapshotStore(tmp_path, {"run": "old"}).write(0, 5, 0, *snapshots.capture(state))
    assert SnapshotStore(tmp_path, {"run": "new"}).held() == []
    assert [h.step for h in SnapshotStore(tmp_path, {"run": "old"}).held()] == [5]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs: node memory that fills up, as a full /dev/shm does (root: CI runs as root)."""
    mnt = tmp_path / "shm"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_node_memory_costs_the_snapshots_not_the_rank(small_tmpfs):
    """A sparse slot written through its mapping on a full tmpfs is a SIGBUS that kills the rank mid-copy; the
    slot's pages are taken before the copy, so a full /dev/shm is one line and the step goes on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)  # 257 KB of weights, three times that with AdamW's moments: over 256 KiB
    opt = torch.optim.AdamW(model.parameters())
    state = TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    said: list[str] = []
    snaps = snapshots.MemorySnapshots(small_tmpfs, 0, 1, {"shard": 1}, 1, {"run": "x"}, log=said.append)
    for _ in range(3):
        state.model(torch.randn(4, 256)).sum().backward()
        state.optimizer.step()
        state.step += 1
        assert snaps.due(state.step)
        snaps.save(state)
    assert len(said) == 1 and "in-memory snapshots stop on rank 0 at step 1: No space left on device" in said[0], said
    assert snaps.store is not None and snaps.store.held() == []


def _buddy_exchange(rank: int, root: str, init: str) -> None:
    """One of two ranks (each its own node): write a snapshot, exchange it in 1,000-byte messages, keep the other's."""
    import torch.distributed as dist

    from fsdp_jobs.runtime import buddies

    buddies.CHUNK = 1000  # many messages, the last a short one
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)
        state = small_state(rank)
        train(state, rank + 1)
        store = SnapshotStore(Path(root) / f"node{rank}", {"run": "x"})
        store.dir.mkdir()
        pair = buddies.BuddyCopies(rank, 2, 1, store)
        for step in (1, 2):
            pair.send(store.write(rank, step, rank, *snapshots.capture(state)))
            pair.wait()
        assert pair.failed is None and pair.unkept == 0
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # two processes that import torch: seconds, not for the quick loop
def test_a_buddy_copy_arrives_whole_in_many_messages_and_is_committed_like_a_snapshot(tmp_path):
    """Two ranks on two nodes exchange their snapshots (fsdp_jobs/runtime/buddies.py) in 1,000-byte messages: each
    node then holds the other's newest two, byte for byte what the other wrote, and recovery lists them."""
    import torch.multiprocessing as mp

    mp.spawn(_buddy_exchange, args=(str(tmp_path), f"file://{tmp_path}/rendezvous"), nprocs=2)
    for rank, other in ((0, 1), (1, 0)):
        mine, theirs = tmp_path / f"node{rank}", tmp_path / f"node{other}"
        held = sorted((h.owner, h.step, Path(h.path).name) for h in SnapshotStore(mine, {"run": "x"}).held())
        assert held == sorted([(rank, 1, f"r{rank}-0.snap"), (rank, 2, f"r{rank}-1.snap"),
                               (other, 1, f"b{other}-0.snap"), (other, 2, f"b{other}-1.snap")]), held
        for slot in (0, 1):
            copy = (mine / f"b{other}-{slot}.snap").read_bytes()
            original = (theirs / f"r{other}-{slot}.snap").read_bytes()
            end = SnapshotStore.committed_size(theirs / f"r{other}-{slot}.snap")
            assert copy[:end] == original[:end]
            snapshots.decode(copy)  # its checksum holds


def test_buddy_pairs_form_in_rounds_of_pairs_that_share_no_node():
    from fsdp_jobs.runtime.buddies import pair_order

    for nodes in (2, 3, 4, 7, 1024):
        rounds: dict[int, list[tuple[int, int]]] = {}
        for left in range(nodes if nodes > 2 else 1):
            rounds.setdefault(pair_order(left, nodes)[0], []).append((left, (left + 1) % nodes))
        assert len(rounds) <= (3 if nodes % 2 else 2)
        for pairs in rounds.values():
            ends = [n for pair in pairs for n in pair]
            assert len(ends) == len(set(ends)), (nodes, pairs)  # no node in two pairs of one round


def test_a_snapshot_waiting_for_its_replica_check_is_pending_until_committed(tmp_path):
    """Saved with commit=False (a replica check of its step rides the vote: fsdp_jobs/runtime/sdc.py), a snapshot
    is pending: a restart uses it only where another rank committed its step (`choose`), and the next write may
    take its slot, never the committed one before it."""
    state = small_state(0)
    store = SnapshotStore(tmp_path, {"run": "x"})
    train(state, 1)
    store.write(0, state.step, 0, *snapshots.capture(state))
    train(state, 1)
    path = store.write(0, state.step, 0, *snapshots.capture(state), commit=False)
    seen = sorted((h.step, h.pending) for h in SnapshotStore(tmp_path, {"run": "x"}).held())  # as a restart sees it
    assert seen == [(1, False), (2, True)]
    assert store.older_slot(0) == path and SnapshotStore(tmp_path, {"run": "x"}).older_slot(0) == path
    assert snapshots.decode(path.read_bytes())[0] == 2  # whole: its checksum holds
    store.vouch(path, state.step)
    assert sorted((h.step, h.pending, h.vouched) for h in SnapshotStore(tmp_path, {"run": "x"}).held()) == \
        [(1, False, False), (2, False, True)]


def test_a_snapshot_waiting_for_its_check_is_used_only_where_another_rank_committed_its_step():
    """Rank 3 was killed after writing step 8 but before reading the vote that carried step 8's replica check: its
    slot is pending. The other ranks read that vote and committed theirs: the check agreed, rank 3's fingerprint in
    it, so rank 3's pending 8 is good and the job resumes at 8. Where no rank committed 8 (nobody read the vote),
    8 was never vouched for: 7. Where rank 0 did not (killed between the vote and its rows, written right before
    its commit), a resume after 8 would lose 8's rows: 7 (the marathon's kill of rank 0 once logged step 21, then
    23)."""
    from fsdp_jobs.runtime.snapshots import Held, choose

    def held(rank: int, step: int, pending: bool = False) -> Held:
        return Held(f"/m/r{rank}-{step % 2}.snap", rank, step, rank % 2, 100, pending, vouched=not pending)

    shards = [0, 1, 0, 1]
    some_read_it = [[held(r, 7), held(r, 8, pending=r == 3)] for r in range(4)]
    plan = choose(some_read_it, shards, None)
    assert plan is not None and plan.step == 8 and plan.files[3].pending and plan.sources[3] is None
    nobody_did = [[held(r, 7), held(r, 8, pending=True)] for r in range(4)]
    assert choose(nobody_did, shards, None).step == 7
    rank_0_did_not = [[held(r, 7), held(r, 8, pending=r == 0)] for r in range(4)]
    assert choose(rank_0_did_not, shards, None).step == 7  # 8's metrics rows were never written: 8 is redone


@pytest.mark.parametrize("check_ms, check_every", [(None, 0), (0.5, 1), (2.3, 3), (0.0, 1), (9.5, 12)])
def test_auto_spaces_the_replica_check_by_what_it_costs_and_the_snapshots_by_theirs(monkeypatch, check_ms,
                                                                                    check_every):
    """memory_interval=auto: snapshots at most 2% of the step time, and (fault.sdc_check_interval=auto, issue #47)
    the replica check at most 1%, its own interval: a 100 ms step and a 1 ms snapshot make a snapshot every step; a
    check the trainer timed at 2.3 ms (its launch and its verdict's read; CHECK_UNTIMED more for what it costs the
    next step) every 3rd step. The steps a check touched are not step times. Without a check (full_shard,
    sdc_check_interval=0) the snapshots alone, fewer steps timed."""
    clock = [0.0]
    monkeypatch.setattr(snapshots.time, "perf_counter", lambda: clock[0])
    said, recorded = [], []
    snaps = snapshots.MemorySnapshots(None, 0, 1, {"shard": 1}, "auto", {}, log=said.append, record=recorded.append)
    if check_ms is not None:
        snaps.time_checks()
    check_s = (check_ms or 0.0) / 1000
    step = 0
    while snaps.auto:
        step += 1
        checked, after = snaps.measuring_checks(step), snaps.measuring_checks(step - 1)
        clock[0] += 0.100 + 0.001 + (check_s / 2 if checked or after else 0.0)  # the launch; the read
        snaps.measure(step, 0.001, checked, check_s if after else None)
    assert step == (snapshots.MEASURE_CHECKED if check_ms is not None else snapshots.AUTO_MEASURE)
    assert (snaps.every, snaps.check_every) == (1, check_every)
    assert recorded[0]["steps"] == 1 and recorded[0]["step_s"] == pytest.approx(0.1)
    assert recorded[0].get("check_steps", 0) == check_every
    assert ("the replica check every" in said[0]) == (check_ms is not None), said


def test_the_check_comes_at_a_multiple_of_the_snapshot_interval(monkeypatch):
    """A 5 ms snapshot (every 3rd step at 2% of a 100 ms step) and a 3 ms check (every 4th at 1%, with CHECK_UNTIMED):
    checks every 6th step, so that each check keeps a snapshot its rollback can return to."""
    clock = [0.0]
    monkeypatch.setattr(snapshots.time, "perf_counter", lambda: clock[0])
    snaps = snapshots.MemorySnapshots(None, 0, 1, {"shard": 1}, "auto", {}, log=lambda m: None)
    snaps.time_checks()
    for step in range(1, snapshots.MEASURE_CHECKED + 1):
        checked, after = snaps.measuring_checks(step), snaps.measuring_checks(step - 1)
        clock[0] += 0.100 + 0.005 + (0.003 if checked else 0.0)
        snaps.measure(step, 0.005, checked, 0.003 if after else None)
    assert (snaps.every, snaps.check_every) == (3, 6)


def test_the_newest_vouched_snapshot_is_kept_while_unchecked_ones_come_after_it(tmp_path):
    """Checks every 3rd snapshot: the slot a check vouched for is written over only once a newer one is vouched for;
    the unchecked snapshots between take turns in the other slot. A job checking every snapshot, or none, keeps the
    newest two."""
    state = small_state(0)
    store = SnapshotStore(tmp_path, {"run": "x"})

    def snapshot(checked: bool) -> None:
        train(state, 1)
        path = store.write(0, state.step, 0, *snapshots.capture(state), commit=not checked)
        if checked:
            store.vouch(path, state.step)

    def seen() -> list[tuple[int, bool]]:
        return sorted((h.step, h.vouched) for h in SnapshotStore(tmp_path, {"run": "x"}).held())

    expected = {1: [(1, False)], 2: [(1, False), (2, False)], 3: [(2, False), (3, True)], 4: [(3, True), (4, False)],
                5: [(3, True), (5, False)], 6: [(3, True), (6, True)], 7: [(6, True), (7, False)],
                8: [(6, True), (8, False)], 9: [(6, True), (9, True)]}
    for step in range(1, 10):
        snapshot(checked=step % 3 == 0)
        assert seen() == expected[step], step
    restarted = SnapshotStore(tmp_path, {"run": "x"})
    assert snapshots.read_header(restarted.older_slot(0))["step"] == 6  # 9 is kept, as a restart sees it
    train(state, 1)
    restarted.write(0, state.step, 0, *snapshots.capture(state))
    assert seen() == [(9, True), (10, False)]
    for kind, checked in (("every", True), ("none", False)):
        store = SnapshotStore(tmp_path / kind, {"run": "x"})
        (tmp_path / kind).mkdir()
        for _ in range(3):
            snapshot(checked)
        assert sorted(h.step for h in store.held()) == [state.step - 1, state.step]


def test_a_resume_from_an_unchecked_snapshot_is_agreed_only_to_the_check_before_it():
    """Checks at 10 and 15, snapshots every 5 and at 17 unchecked: a crash resumes at 17 (the newest), and a
    mismatch after it rolls back to 15, not 17 (`RestorePlan.agreed`; the trainer's fit starts from it)."""
    shards = [0, 1, 0, 1]

    def held(rank: int, step: int, vouched: bool) -> Held:
        return Held(f"/m/r{rank}-{step % 3}.snap", rank, step, rank % 2, 100, vouched=vouched)

    slots = [[held(r, 15, True), held(r, 10, True), held(r, 17, False)] for r in range(4)]
    plan = choose(slots, shards, disk_step=None)
    assert (plan.step, plan.agreed) == (17, 15)
    assert choose(slots, shards, disk_step=16).agreed == 16  # a checkpoint is checked before it is saved
    unchecked = [[held(r, 17, False)] for r in range(4)]
    assert choose(unchecked, shards, disk_step=None).agreed == 0  # nothing vouched, nothing saved: the start
    assert choose([[held(r, 15, True)] for r in range(4)], shards, disk_step=None).agreed == 15


def test_a_lost_node_takes_unchecked_state_only_where_two_replicas_hold_it_alike():
    """Checks at 15, unchecked snapshots at 17. With two replica groups and node 1 (ranks 2, 3) lost, rank 0's 17 is
    the only copy of its shard, and may hold a flipped bit the next check would have found: copied onto rank 2, the
    two replicas would agree on it. So the job goes back to 15, which a check vouched for; without checks (`checked`
    False) to 17. With three groups two replicas hold 17: alike, it is copied; apart, neither is. The same holds
    for a replica's file on the rank's own node (no_shard on one node)."""
    def held(rank: int, step: int, vouched: bool, sums: tuple = (1, 2), shard: int = -1) -> Held:
        return Held(f"/m/r{rank}-{step % 2}.snap", rank, step, rank % 2 if shard < 0 else shard, 100, vouched=vouched,
                    sums=sums)

    slots = [[held(r, 15, True), held(r, 17, False)] for r in range(2)] + [[], []]
    plan = choose(slots, [0, 1, 0, 1], disk_step=None, checked=True)
    assert (plan.step, plan.sources, plan.agreed) == (15, {0: None, 1: None, 2: 0, 3: 1}, 15)
    assert choose(slots, [0, 1, 0, 1], disk_step=None).step == 17
    whole = [[held(r, 15, True), held(r, 17, False)] for r in range(4)]
    assert choose(whole, [0, 1, 0, 1], disk_step=None, checked=True).step == 17  # each from its own memory
    three = [[held(r, 15, True, shard=0), held(r, 17, False, shard=0)] for r in range(2)] + [[]]
    assert choose(three, [0, 0, 0], disk_step=None, checked=True).sources == {0: None, 1: None, 2: 0}
    three[1][1] = held(1, 17, False, sums=(9, 9), shard=0)
    assert choose(three, [0, 0, 0], disk_step=None, checked=True).step == 15
    one_node = [[held(0, 15, True, shard=0), held(0, 17, False, shard=0), held(1, 15, True, shard=0)]] * 2
    plan = choose(one_node, [0, 0], disk_step=None, checked=True)  # rank 1 was killed mid-copy of 17
    assert plan.step == 15 and plan.files[1].owner == 1
