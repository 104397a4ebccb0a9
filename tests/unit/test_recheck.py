"""The step recheck where no replicas are compared (fsdp_jobs/runtime/recheck.py): who three computations of a step
name, and a step taken again from the kept copy reproducing the first bit for bit. The jobs that catch a flipped
bit with it: tests/integration/test_sdc.py."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_jobs.runtime.recheck import StepRecheck, judge
from fsdp_jobs.runtime.sdc import describe, flip_a_bit
from tests.unit.test_snapshots import small_state, train

A, B, C = (1, 1), (2, 2), (3, 3)


def test_the_computations_that_agree_on_every_rank_are_trusted_and_the_odd_one_names_the_ranks_it_moved():
    assert judge([[A, A], [B, B], [C, C]]) is None  # every rank reproduced its own
    flipped_after_the_update = judge([[B, A, A], [B, B, B], [C, C, C]])  # the first computation was the odd one
    assert (flipped_after_the_update.ranks, flipped_after_the_update.how) == ([0], "rerun")
    assert flipped_after_the_update.names_nodes and flipped_after_the_update.prints == [B, B, C]  # the odd one's
    during_the_check = judge([[A, A, A], [B, C, B], [C, C, C]])  # the check's own computation was the odd one
    assert (during_the_check.ranks, during_the_check.how) == ([1], "rerun")
    reached_every_rank = judge([[A, B, B], [B, C, C], [C, A, A]])  # through the step's collectives
    assert (reached_every_rank.ranks, reached_every_rank.how) == ([0, 1, 2], "rerun-unresolved")
    assert not reached_every_rank.names_nodes
    reproduces = judge([[A, B, C], [B, B, B], [C, C, C]])  # no two computations alike on rank 0
    assert (reproduces.ranks, reproduces.how) == ([0], "rerun-repeated") and reproduces.names_nodes
    everywhere = judge([[A, B, C], [B, C, A], [C, A, B]])  # nondeterministic kernels look like this
    assert (everywhere.ranks, everywhere.how) == ([0, 1, 2], "rerun-irreproducible") and not everywhere.names_nodes


def test_a_step_taken_again_from_the_kept_copy_reproduces_the_first_and_a_flip_in_one_computation_is_found(tmp_path):
    """One rank (a world of one: every rank is the rank that moved, so no node is named). The step draws its
    batch from the random generator and updates AdamW and the schedule: each computation starts from the same
    kept state. (Plain tensors: the optimizer's load copies them. With DTensors it keeps them, and a restore that
    did not copy them again would start the third computation from the second's moments: the integration test with
    a flip finds three different computations then.)"""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        state, reference = small_state(0), small_state(0)
        torch.manual_seed(7)  # the batches (train draws them from the generator), the same on both sides
        train(reference, 4)
        torch.manual_seed(7)
        train(state, 2)
        recheck = StepRecheck(every=3, enabled=True, device=torch.device("cpu"))
        assert [s for s in range(1, 10) if recheck.due(s)] == [3, 6, 9]
        recheck.keep(state, state.model)
        train(state, 1)
        _, found = recheck.confirm(state, state.model, lambda: train(state, 1))
        assert found is None and (recheck.checked, recheck.reproduced) == (1, 1)
        assert state.step == 3

        recheck.keep(state, state.model)
        train(state, 1)
        flip_a_bit(state.model)  # the first computation's result corrupted after its update
        calls = []
        _, found = recheck.confirm(state, state.model, lambda: calls.append(train(state, 1)))
        assert len(calls) == 2 and found is not None and (found.how, found.ranks, found.step) == ("rerun-unresolved",
                                                                                                  [0], 4)
        assert all(torch.equal(a, b) for a, b in
                   zip(state.model.state_dict().values(), reference.model.state_dict().values()))
        assert describe(found, []).startswith("silent data corruption: every rank did not reproduce its own state in "
                                              "one of three computations of step 4")
    finally:
        dist.destroy_process_group()


def test_the_first_step_is_taken_again_without_the_moments_it_made_and_a_damaged_copy_is_never_used(tmp_path):
    """The optimizer makes a parameter's moments in its first update (the first step; a layer unfrozen later): a
    second computation of that step starts without them again. The copy is put back into the same tensors (nothing new on the device), and one that host memory
    changed after it was made fails the rank rather than seed a computation."""
    import pytest

    from fsdp_jobs.runtime.recheck import CopyDamaged

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        state = small_state(0)
        recheck = StepRecheck(every=1, enabled=True, device=torch.device("cpu"))
        recheck.keep(state, state.model)
        train(state, 1)
        places = [p.data_ptr() for p in state.model.parameters()]
        _, found = recheck.confirm(state, state.model, lambda: train(state, 1))
        assert found is None and state.step == 1
        moments = [v.data_ptr() for per in state.optimizer.state.values() for v in per.values()]
        assert [p.data_ptr() for p in state.model.parameters()] == places
        recheck.keep(state, state.model)
        train(state, 1)
        _, found = recheck.confirm(state, state.model, lambda: train(state, 1))
        assert found is None and state.step == 2
        assert [v.data_ptr() for per in state.optimizer.state.values() for v in per.values()] == moments
        recheck.keep(state, state.model)
        train(state, 1)
        unfrozen = small_state(1)
        for p in unfrozen.model[1].parameters():  # a layer trained from here on: its first update in a checked step
            p.requires_grad_(False)
        train(unfrozen, 1)
        for p in unfrozen.model[1].parameters():
            p.requires_grad_(True)
        assert len(unfrozen.optimizer.state) == 2
        recheck.keep(unfrozen, unfrozen.model)
        train(unfrozen, 1)
        _, found = recheck.confirm(unfrozen, unfrozen.model, lambda: train(unfrozen, 1))
        assert found is None and len(unfrozen.optimizer.state) == 4
        recheck.keep(state, state.model)
        train(state, 1)
        recheck.kept.host[0].view(-1).view(torch.int32)[0] ^= 1 << 20  # host memory flips a bit of the copy
        with pytest.raises(CopyDamaged, match="no longer reads back as the state it was made of on this rank"):
            recheck.put_back(state, state.model)
    finally:
        dist.destroy_process_group()
