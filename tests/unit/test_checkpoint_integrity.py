"""Checkpoint integrity in one process (DCP without a process group, as tests/unit/test_checkpoint_manager.py):
every committed checkpoint's manifest holds each file's size and CRC-32; before a resume a damaged one is
set aside (renamed, with the reason, never deleted) and the one before it is loaded; a checkpoint that
fails to load is set aside the same way; when none is left the job stops instead of starting over; and
pruning never deletes the newest sound checkpoint while the newer ones are damaged (issue 27)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from fsdp_jobs.rundir import checkpoints as layout
from fsdp_jobs.rundir import runs
from fsdp_jobs.runtime.checkpoint import CheckpointManager, NoUsableCheckpoint
from tests.conftest import cli
from tests.unit.test_checkpoint_manager import make_state

warnings.filterwarnings("ignore", message="torch.distributed is disabled")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def saved_run(tmp_path, steps=(4, 8), keep_last=5):
    """A run with a checkpoint at each of `steps`; the model's weights differ at each. Returns (the
    manager, the model's weights at each step, the log)."""
    state, log = make_state(), []
    ckpt = CheckpointManager(tmp_path, keep_last=keep_last, manifest_extra={}, rank=0, attempt="a", log=log.append)
    weights = {}
    for step in steps:
        with torch.no_grad():
            for p in state.model.parameters():
                p.add_(step)
        state.step = step
        ckpt.save(state, {"shard": 1}, 1)
        weights[step] = [p.detach().clone() for p in state.model.parameters()]
    ckpt.close()
    return ckpt, weights, log


def shard(ckpt_dir):
    return next(ckpt_dir.glob("__0_*.distcp"))


def flip_a_byte(path, at=100):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def resumed_weights(tmp_path):
    """A fresh job's resume: (the checkpoint it loaded, its model's weights, its log)."""
    state, log = make_state(), []
    ckpt = CheckpointManager(tmp_path, keep_last=5, manifest_extra={}, rank=0, attempt="b", log=log.append)
    loaded = ckpt.load(state, ckpt.find_latest())
    return loaded, [p.detach() for p in state.model.parameters()], log


def test_the_manifest_holds_every_files_size_and_crc(tmp_path):
    saved_run(tmp_path, steps=(4,))
    ckpt = layout.newest_checkpoint(tmp_path)
    files = layout.read_manifest(ckpt)["files"]
    on_disk = sorted(p.name for p in ckpt.iterdir() if p.name != layout.MANIFEST_FILE)
    assert sorted(files) == on_disk and layout.DCP_METADATA_FILE in files
    assert all(files[n] == layout.file_sum(ckpt / n) for n in on_disk)
    assert layout.check_sizes(ckpt) is None and layout.check_sums(ckpt, on_disk) is None


@pytest.mark.parametrize("damage, says", [
    (lambda c: (c / layout.DCP_METADATA_FILE).write_bytes(b"x" * (c / layout.DCP_METADATA_FILE).stat().st_size),
     ".metadata changed since it was saved"),  # the case: .metadata overwritten
    (lambda c: flip_a_byte(shard(c)), "changed since it was saved (CRC-32 differs)"),  # a bit rot in a shard
    (lambda c: shard(c).write_bytes(shard(c).read_bytes()[:-10]), "bytes, "),  # a truncated shard
    (lambda c: shard(c).unlink(), "is missing"),
])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_one_before_is_loaded(tmp_path, damage, says):
    _, weights, _ = saved_run(tmp_path)
    newest = layout.newest_checkpoint(tmp_path)
    damage(newest)
    loaded, got, log = resumed_weights(tmp_path)
    assert loaded is not None and layout.step_of(loaded) == 4
    assert all(torch.equal(a, b) for a, b in zip(got, weights[4]))  # bitwise what step 4 saved
    aside = layout.set_aside_checkpoints(tmp_path)
    assert [p.name for p in aside] == ["step-000008.unusable"]  # renamed, nothing deleted
    assert says in (aside[0] / layout.UNUSABLE_REASON_FILE).read_text()
    lines = [m for m in log if "unusable" in m]
    assert len(lines) == 1 and "step-000008" in lines[0] and says in lines[0]


def test_a_checkpoint_that_fails_to_load_is_set_aside_and_the_one_before_is_loaded(tmp_path):
    """A checkpoint saved before manifests held sums (nothing to check it by) that DCP cannot load."""
    _, weights, _ = saved_run(tmp_path)
    newest = layout.newest_checkpoint(tmp_path)
    manifest = layout.read_manifest(newest)
    del manifest["files"]
    (newest / layout.MANIFEST_FILE).write_text(json.dumps(manifest))
    (newest / layout.DCP_METADATA_FILE).write_bytes(b"not a pickle")
    loaded, got, log = resumed_weights(tmp_path)
    assert layout.step_of(loaded) == 4 and all(torch.equal(a, b) for a, b in zip(got, weights[4]))
    reason = (layout.set_aside_checkpoints(tmp_path)[0] / layout.UNUSABLE_REASON_FILE).read_text()
    assert reason.startswith("failed to load: ")


def test_with_every_checkpoint_damaged_the_job_stops_instead_of_starting_over(tmp_path):
    saved_run(tmp_path)
    for _, c in layout.committed_checkpoints(tmp_path):
        flip_a_byte(shard(c))
    with pytest.raises(NoUsableCheckpoint, match="no usable checkpoint: step-000004.unusable, step-000008.unusable"):
        resumed_weights(tmp_path)
    state = runs.read_state(tmp_path)
    assert state.status == "failed" and "checkpoint.resume=false" in (state.reason or "")
    with pytest.raises(NoUsableCheckpoint):  # the next attempt too: never a fresh start over them
        resumed_weights(tmp_path)
    assert len(list(layout.root_of(tmp_path).iterdir())) == 2  # both still there, set aside


def test_with_every_checkpoint_damaged_the_job_starts_over_when_that_redoes_few_enough_steps(tmp_path):
    """checkpoint.start_over_max_steps: the newest unusable checkpoint is step 8, so starting over redoes 8
    steps: allowed at 8 (a line says so, nothing is recorded as failed), refused at 7 with the bound named."""
    saved_run(tmp_path)
    for _, c in layout.committed_checkpoints(tmp_path):
        flip_a_byte(shard(c))
    log: list[str] = []
    ckpt = CheckpointManager(tmp_path, keep_last=5, manifest_extra={}, rank=0, attempt="b", log=log.append,
                             start_over_max_steps=8)
    assert ckpt.find_latest() is None
    assert ("checkpoint: every checkpoint of the run is unusable (step-000004.unusable, step-000008.unusable): "
            "starting over from step 0, 8 steps to redo (checkpoint.start_over_max_steps=8)") in log, log
    assert runs.read_state(tmp_path).status != "failed"
    ckpt = CheckpointManager(tmp_path, keep_last=5, manifest_extra={}, rank=0, attempt="c", log=log.append,
                             start_over_max_steps=7)
    with pytest.raises(NoUsableCheckpoint, match="would redo 8 steps, more than checkpoint.start_over_max_steps=7"):
        ckpt.find_latest()


def test_pruning_spares_the_newest_sound_checkpoint_while_the_newer_ones_are_damaged(tmp_path):
    ckpt, _, _ = saved_run(tmp_path, steps=(4, 8), keep_last=1)
    assert [s for s, _ in layout.committed_checkpoints(tmp_path)] == [8]
    saved_run(tmp_path, steps=(12,), keep_last=2)
    newest = layout.newest_checkpoint(tmp_path)
    shard(newest).write_bytes(b"")  # step 12 damaged: its size differs
    older = [p for _, p in layout.committed_checkpoints(tmp_path)][0]
    shard(older).write_bytes(b"")  # and step 8 too
    saved_run(tmp_path, steps=(16,), keep_last=1)  # keep_last=1 would leave only 16
    assert [s for s, _ in layout.committed_checkpoints(tmp_path)] == [16]
    (layout.newest_checkpoint(tmp_path) / layout.DCP_METADATA_FILE).write_bytes(b"")  # 16 damaged
    layout.prune(tmp_path, keep_last=1)
    assert [s for s, _ in layout.committed_checkpoints(tmp_path)] == [16]  # nothing sound older to spare


def test_pruning_keeps_the_sound_one_when_the_kept_one_is_damaged(tmp_path):
    saved_run(tmp_path, steps=(4, 8), keep_last=5)
    (layout.newest_checkpoint(tmp_path) / layout.DCP_METADATA_FILE).write_bytes(b"")
    layout.prune(tmp_path, keep_last=1)
    assert [s for s, _ in layout.committed_checkpoints(tmp_path)] == [4, 8]  # 4 is the newest sound one
    layout.prune(tmp_path, keep_last=2)
    assert [s for s, _ in layout.committed_checkpoints(tmp_path)] == [4, 8]


def test_export_of_a_damaged_checkpoint_is_one_line_without_torchs_tracebacks(tmp_path, capfd):
    """The issue's third case: export printed its one good line after two screens of DCP's tracebacks."""
    from fsdp_jobs import export

    saved_run(tmp_path, steps=(4, 8))
    good, bad = (p for _, p in layout.committed_checkpoints(tmp_path))
    flip_a_byte(shard(bad))
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        export.main([str(bad), "-o", str(tmp_path / "out.pt")])
    assert e.value.code == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is damaged (__0_0.distcp changed since it was saved (CRC-32 differs))" in err[0], err
    # one saved before manifests held sums: DCP's own failure, still one line (a process of its own: pytest's
    # logging capture would hide the tracebacks DCP logs through the root logger)
    manifest = layout.read_manifest(good)
    del manifest["files"]
    (good / layout.MANIFEST_FILE).write_text(json.dumps(manifest))
    (good / layout.DCP_METADATA_FILE).write_bytes(b"\0" * 64)
    r = cli(str(good), "-o", str(tmp_path / "out.pt"), module="fsdp_jobs.export")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "cannot be read" in err[0], err
    assert not (tmp_path / "out.pt").exists()


def test_only_a_storage_failure_is_survived_by_a_save():
    """A full disk or a lost file server costs a checkpoint (training goes on); a peer that died mid-save
    (gloo's RuntimeError, raised alike by DCP's gather) fails the rank at once, as any step would."""
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    from fsdp_jobs.runtime.checkpoint import storage_failure

    def wrapped(e: BaseException):
        try:
            raise e
        except BaseException as caught:
            return _wrap_exception(caught)

    full = OSError(28, "No space left on device")
    assert storage_failure(full)
    assert storage_failure(CheckpointException("save", {0: wrapped(full), 1: wrapped(OSError(5, "EIO"))}))
    peer = RuntimeError("Connection reset by peer")
    assert not storage_failure(peer)
    assert not storage_failure(CheckpointException("save", {0: wrapped(full), 1: wrapped(peer)}))
    assert not storage_failure(CheckpointException("save", {}))
