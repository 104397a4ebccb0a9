"""The checkpoint manager in one process (DCP without a process group): an async save is committed
as soon as its background write ends, old checkpoints are pruned off the caller's thread, and
staging buffers are reused from one save to the next."""

from __future__ import annotations

import time
import warnings

import pytest
import torch

from fsdp_jobs.rundir.checkpoints import committed_checkpoints
from fsdp_jobs.runtime.checkpoint import CheckpointManager, TrainState

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def make_state() -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    return TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_async_save_commits_when_written_without_waiting_for_the_next_save(tmp_path):
    state = make_state()
    log: list[str] = []
    ckpt = CheckpointManager(tmp_path, keep_last=1, manifest_extra={}, rank=0, attempt="a", async_save=True,
                             log=log.append)
    state.step = 1
    assert ckpt.save(state, {"shard": 1}, 1) is None  # returned before the write finished
    deadline = time.monotonic() + 60
    # nobody calls wait() or save(): the commit, and its log line just after the rename, must happen on their own
    while not (committed_checkpoints(tmp_path) and any("committed" in m for m in log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [s for s, _ in committed_checkpoints(tmp_path)] == [1]
    assert any("committed step-000001 (background save)" in m for m in log)

    cache = ckpt._stager._state_dict_stager._cached_storage_mapping
    staged_before = len(cache)
    state.step = 2
    ckpt.save(state, {"shard": 1}, 1)
    staged_after = len(cache)
    ckpt.close()  # waits for the write, the commit and the pruning thread
    assert [s for s, _ in committed_checkpoints(tmp_path)] == [2]  # keep_last=1 pruned step 1
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # nothing half-deleted or left over
    # the same host buffers were refilled, not allocated again
    assert staged_after == staged_before > 0


def test_sync_save_commits_before_returning(tmp_path):
    state = make_state()
    ckpt = CheckpointManager(tmp_path, keep_last=2, manifest_extra={"x": 1}, rank=0, attempt="a")
    state.step = 5
    final = ckpt.save(state, {"shard": 1}, 1)
    assert final is not None and [s for s, _ in committed_checkpoints(tmp_path)] == [5]
    ckpt.close()


def test_overlapped_staging_snapshots_the_state_before_the_next_update(tmp_path):
    import torch.distributed.checkpoint as dcp

    state = make_state()
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    ckpt = CheckpointManager(tmp_path, keep_last=1, manifest_extra={}, rank=0, attempt="a", async_save=True,
                             log=lambda m: None, overlap_staging=True)
    state.step = 1
    ckpt.save(state, {"shard": 1}, 1)
    ckpt.wait_staging()  # what the trainer calls before optimizer.step()
    with torch.no_grad():  # the next update, while the write may still be running
        for p in state.model.parameters():
            p.add_(1.0)
    ckpt.close()
    saved = {k: torch.empty_like(v) for k, v in before.items()}
    dcp.load({"model": saved}, checkpoint_id=str(committed_checkpoints(tmp_path)[-1][1]))
    assert all(torch.equal(saved[k], before[k]) for k in before)


def test_saves_that_reuse_their_plan_write_what_an_unplanned_save_writes(tmp_path):
    """Saves reuse DCP's plan (checkpoint.py `_same_plan`: the coordinator no longer gathers every rank's plan
    at every save). Each save is bitwise what DCP's default save writes of the same state, also when another
    state of another shape is saved between two (torch keeps one cache per planner class: a changed plan
    must be planned again, not written under the old one's names and sizes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import SavePlanner

    from fsdp_jobs.bench.chaos import state_difference

    small, other = make_state(), TrainState(torch.nn.Linear(8, 3), None, None)
    other.objects = {"model": other.objects["model"]}  # a model alone: another plan
    managers = {name: CheckpointManager(tmp_path / name, keep_last=5, manifest_extra={}, rank=0, attempt="a",
                                        log=lambda m: None) for name in ("small", "other")}
    for step, (name, state) in enumerate([("small", small), ("other", other), ("small", small)] * 2, start=1):
        with torch.no_grad():
            for p in state.model.parameters():
                p.add_(0.5 * step)
        state.step = step
        saved = managers[name].save(state, {"shard": 1}, 1)
        plain = tmp_path / f"plain-{step}"
        dcp.save(state.state_dict(), checkpoint_id=str(plain), planner=DefaultSavePlanner())
        assert saved is not None and state_difference(saved, plain) is None, step
    assert SavePlanner._cached_save_plan  # the plan was reused, not planned anew each time
    [m.close() for m in managers.values()]
