"""Sharded, atomic, resumable checkpoints with torch.distributed.checkpoint (DCP), in the layout
fsdp_jobs/rundir/checkpoints.py owns (a temporary directory per attempt while written, renamed once committed).

Each save goes to a fresh directory (DCP's "overwrite" leaves an old metadata file beside new data if it
dies mid-save: fsdp_jobs/ARCHITECTURE.md, pitfall 3). Rank 0 writes the manifest after every rank finished, then
renames the directory into place: a reader sees a whole checkpoint or none.

No rank waits for rank 0's file work: DCP's save returns on rank 0 (its coordinator) only after it
gathered every rank's write results and wrote its metadata file, so rank 0 alone can commit, and the others
go on training meanwhile. An async save is committed by rank 0 the moment its background write
ends (not at the next save), and old checkpoints are pruned in a thread of their own.

Integrity: right after the write, every rank reads back the files it wrote (from the page cache, in
parallel: each holds 1/world of the checkpoint) for their sizes and CRC-32s, which rank 0 gathers into the
manifest. Before a resume, rank 0 checks every size and DCP's metadata, and every rank the CRC-32 of its
share of the files; a checkpoint that fails, or fails to load, is set aside (renamed, never deleted) and
the one before it is tried. When checkpoints were set aside and none is left, the job stops
(NoUsableCheckpoint), unless starting over redoes at most checkpoint.start_over_max_steps steps: then it starts
over from step 0, and says so. A resume never quietly starts over.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

from fsdp_jobs.rundir import checkpoints as layout
from fsdp_jobs.rundir import runs
from fsdp_jobs.planning import faults

# test-only fault injection: "STEP" makes rank 0 SIGKILL itself in the middle of saving that step
# (after the shards are on disk, before the commit), on the first attempt only
CRASH_IN_SAVE_ENV = "FSDP_JOBS_TEST_CRASH_IN_SAVE"


class NoUsableCheckpoint(RuntimeError):
    """Every checkpoint of the run failed its check or its load (each set aside, with the reason)."""


class StateObjects(Stateful):
    """Named stateful objects plus step and RNG (and, for the built-in loop, the data position), as
    DCP sees them: modules and optimizers through the distributed state-dict API (sharded,
    reshardable), anything else by its state_dict(). The built-in loop's are TrainState's;
    fsdp_jobs.job's are whatever the script passes.

    `data_position`: whether samples_seen is saved (the built-in loop's; a script's checkpoint has
    none, and DCP refuses a key the checkpoint lacks). `cuda_rng`: the CUDA device whose generator is
    saved (and restored) beside the CPU one, None when the job runs on the CPU, when (loading) the
    checkpoint has none (saved on the CPU, or older), and in the built-in loop (it never kept it)."""

    def __init__(self, objects: dict[str, Any], step: int = 0, data_position: bool = False,
                 cuda_rng: Optional[torch.device] = None) -> None:
        self.objects, self.step, self.samples_seen = objects, step, 0  # samples_seen: also the manifest's
        self.data_position, self.cuda_rng = data_position, cuda_rng
        models = [o for o in objects.values() if isinstance(o, torch.nn.Module)]
        self.model = models[0] if len(models) == 1 else None

    def _model_for(self, name: str) -> torch.nn.Module:
        if self.model is None:
            raise ValueError(f"checkpoint object {name!r} is an optimizer: pass exactly one model beside it")
        return self.model

    def state_dict(self) -> dict[str, Any]:
        # the torch RNG continues where it was (dropout, sampling): rank 0's stream is enough, every rank's
        # is the same (seeded from train.seed). On GPU dropout and random ops draw from the CUDA
        # generator: its state (a small CPU byte tensor) is kept the same way
        rng = {"torch": torch.get_rng_state()}
        if self.cuda_rng is not None:
            rng["cuda"] = torch.cuda.get_rng_state(self.cuda_rng)
        progress = {"step": self.step, **({"samples_seen": self.samples_seen} if self.data_position else {})}
        out: dict[str, Any] = {"progress": progress, "rng": rng}
        for name, obj in self.objects.items():
            if isinstance(obj, torch.nn.Module):
                out[name] = get_model_state_dict(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                out[name] = get_optimizer_state_dict(self._model_for(name), obj)
            elif hasattr(obj, "state_dict"):
                out[name] = obj.state_dict()
            else:
                raise TypeError(f"checkpoint object {name!r} ({type(obj).__name__}) has no state_dict()")
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        for name, obj in self.objects.items():
            if isinstance(obj, torch.nn.Module):
                set_model_state_dict(obj, sd[name])
            elif isinstance(obj, torch.optim.Optimizer):
                set_optimizer_state_dict(self._model_for(name), obj, sd[name])
            else:
                obj.load_state_dict(sd[name])
        self.step = int(sd["progress"]["step"])
        if self.data_position:
            self.samples_seen = int(sd["progress"]["samples_seen"])
        torch.set_rng_state(sd["rng"]["torch"])
        if self.cuda_rng is not None and "cuda" in sd["rng"]:
            torch.cuda.set_rng_state(sd["rng"]["cuda"], self.cuda_rng)


class TrainState(StateObjects):
    """The built-in loop's state: model + optimizer + scheduler + data position + RNG + step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
        super().__init__({"model": model, "optim": optimizer, "scheduler": scheduler}, data_position=True)
        self.optimizer, self.scheduler = optimizer, scheduler


class CheckpointManager:
    def __init__(self, run_dir: Path, keep_last: int, manifest_extra: dict[str, Any], rank: int,
                 attempt: str, async_save: bool = False, log: Callable[[str], None] = print,
                 overlap_staging: bool = False, start_over_max_steps: int = 0) -> None:
        self.run_dir, self.root = run_dir, layout.root_of(run_dir)
        # when every checkpoint fails its checks: start over from step 0 if that redoes at most this many
        # steps (a job whose only checkpoints are damaged is no worse off than one that never saved), else stop
        self.start_over_max_steps = start_over_max_steps
        self.keep_last, self.extra, self.rank, self.attempt = keep_last, manifest_extra, rank, attempt
        self.async_save, self.log = async_save, log
        self.pending: Optional[tuple[Any, threading.Event, Path]] = None
        self._async_group: Any = None
        self._stager: Optional[DefaultStager] = None
        # async saves only: copy the state to host memory in the background too. The caller must then
        # call wait_staging() before anything changes the state (the next optimizer step)
        self.overlap_staging = overlap_staging
        self._staging: Any = None
        self._pruner: Optional[threading.Thread] = None
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ load
    def find_latest(self) -> Optional[Path]:
        """The newest committed checkpoint that passes its checks, the same on every rank (collective):
        rank 0 lists and checks sizes (ranks listing a shared directory on their own can disagree: NFS
        attribute caching, and would mix shards), every rank the CRC-32s of its share of the files. One that
        fails is set aside and the one before is tried. None on a run with no checkpoint."""
        while True:
            choice: list[Optional[str]] = [None, None]  # (checkpoint to try, why none is usable)
            if self.rank == 0:
                choice = self._newest_passing_sizes()
            if dist.is_initialized():
                dist.broadcast_object_list(choice, src=0)
            if choice[1]:
                raise NoUsableCheckpoint(choice[1])
            if choice[0] is None:
                return None
            path = Path(choice[0])
            world = dist.get_world_size() if dist.is_initialized() else 1
            whys: list[Optional[str]] = [layout.check_sums(path, layout.listed_files(path)[self.rank::world])]
            if dist.is_initialized():
                gathered: list[Optional[str]] = [None] * world
                dist.all_gather_object(gathered, whys[0])
                whys = gathered
            why = next((w for w in whys if w), None)
            if why is None:
                return path
            if self.rank == 0:
                self._set_aside(path, why)

    def _newest_passing_sizes(self) -> list[Optional[str]]:
        """Rank 0: [the newest committed checkpoint whose sizes and metadata pass, None] (those that fail are
        set aside on the way), or [None, why none is usable] when the run has set some aside and none is left."""
        for p in layout.uncommitted_entries(self.root):
            self.log(f"checkpoint: skipping incomplete {p.name} (no manifest: its writer died mid-save)")
        for _, path in reversed(layout.committed_checkpoints(self.run_dir)):
            why = layout.check_sizes(path)
            if why is None:
                return [str(path), None]
            self._set_aside(path, why)
        aside = layout.set_aside_checkpoints(self.run_dir)
        if not aside:
            return [None, None]
        redo = max(layout.step_of(p.with_suffix("")) or 0 for p in aside)
        if redo <= self.start_over_max_steps:
            self.log(f"checkpoint: every checkpoint of the run is unusable ({', '.join(p.name for p in aside)}): "
                     f"starting over from step 0, {redo} steps to redo (checkpoint.start_over_max_steps="
                     f"{self.start_over_max_steps})")
            return [None, None]
        why = layout.none_usable(aside)
        if self.start_over_max_steps:
            why += (f"; starting over would redo {redo} steps, more than checkpoint.start_over_max_steps="
                    f"{self.start_over_max_steps}")
        runs.write_state(self.run_dir, status="failed", reason=why)
        return [None, why]

    def _set_aside(self, path: Path, why: str) -> None:
        """Rank 0: rename it out of the way, and say so in one line."""
        dest = layout.set_aside(path, why)
        self.log(f"checkpoint: {path.name} is unusable ({why}): set aside as {dest.name}; trying the one before")

    def load(self, state: StateObjects, path: Optional[Path]) -> Optional[Path]:
        """Load checkpoint `path` (from find_latest, the same on every rank) into `state`; one that fails to
        load (on every rank: DCP's load is collective) is set aside and the one before is loaded instead."""
        while path is not None:
            try:
                return self._load(state, path)
            except NoUsableCheckpoint:
                raise
            except (Exception, CheckpointException) as e:  # DCP's is a BaseException; any failure: the checkpoint's
                first = first_error_line(e)
                if self.rank == 0:
                    self._set_aside(path, f"failed to load: {first}")
                if dist.is_initialized():
                    dist.barrier()
                path = self.find_latest()
        return None

    def _load(self, state: StateObjects, path: Path) -> Path:
        t0 = time.perf_counter()
        sd = state.state_dict()
        with layout.quiet_dcp_logs():  # a failure is one line of ours (load), not DCP's tracebacks
            dcp.load(sd, checkpoint_id=str(path))
        state.load_state_dict(sd)
        manifest = layout.read_manifest(path)
        self.log(f"checkpoint: resumed from {path.name} (step {state.step}, saved at world size "
                 f"{manifest.get('world_size')}) in {time.perf_counter() - t0:.2f}s")
        return path

    # ------------------------------------------------------------------ save
    def save(self, state: StateObjects, mesh_shape: dict[str, int], world_size: int) -> Optional[Path]:
        """Collective: every rank calls it at the same step."""
        self.wait()
        final = layout.step_dir(self.root, state.step)
        exists = [final.exists()]
        if dist.is_initialized():
            dist.broadcast_object_list(exists, src=0)  # one answer for all ranks
        if exists[0]:  # already committed (resumed exactly here): never overwrite
            return final
        tmp = layout.tmp_dir(self.root, state.step, self.attempt)
        manifest = {"step": state.step, "samples_seen": state.samples_seen, "world_size": world_size,
                    "mesh": mesh_shape, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **self.extra}
        t0 = time.perf_counter()
        sd = state.state_dict()
        if self.async_save:
            # its own gloo group: the background thread's collectives must not interleave with the
            # training loop's on the default group
            if self._async_group is None and dist.is_initialized():
                self._async_group = dist.new_group(backend="gloo")
            on_gpu = any(t.is_cuda for t in _tensors(sd))
            if self._stager is None:
                # one stager for the whole run: it keeps the host copies (pinned on GPU, so the
                # device-to-host copy runs at full speed) and refills them at every save; save()
                # waited for the previous upload first, so nothing still reads them
                self._stager = DefaultStager(StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False,
                                                            use_async_staging=self.overlap_staging,
                                                            use_non_blocking_copy=on_gpu))
            # the staging stream does not wait for the compute stream: let the last optimizer step's
            # kernels finish before it reads the parameters (asked of the state's tensors, not of the
            # host: a CPU run on a GPU host would create a context on cuda:0 here)
            if self.overlap_staging and on_gpu:
                torch.cuda.current_stream().synchronize()
            # An explicit writer with no copy-ahead: the default one, seeing CUDA on the host, would sync
            # a CUDA stream from DCP's upload thread, which never set the device, so cuda:0's: a context
            # there from every rank of the node. The state is in host memory by then anyway.
            writer = FileSystemWriter(str(tmp), per_thread_copy_ahead=0)
            future = dcp.async_save(sd, checkpoint_id=str(tmp), storage_writer=writer, planner=_same_plan(),
                                    process_group=self._async_group, async_stager=self._stager)
            if not hasattr(future, "add_done_callback"):  # AsyncSaveResponse (background staging)
                self._staging = future.staging_completion
                future = future.upload_completion
            committed = threading.Event()
            future.add_done_callback(lambda f: self._commit_when_written(f, tmp, final, manifest, committed))
            self.pending = (future, committed, final, tmp, state.step)
            self.log(f"checkpoint: step {state.step} saving in the background "
                     f"(training blocked {time.perf_counter() - t0:.2f}s)")
            return None
        try:
            dcp.save(sd, checkpoint_id=str(tmp), planner=_same_plan())
        except (Exception, CheckpointException) as e:  # raised on every rank alike (DCP gathers the failures)
            self._save_failed(tmp, state.step, e)
            return None
        manifest["files"] = self._file_sums(tmp, None)
        if not self._commit(tmp, final, manifest):
            return None
        self.log(f"checkpoint: saved {final.name} in {time.perf_counter() - t0:.2f}s")
        return final

    def _save_failed(self, tmp: Path, step: int, e: BaseException) -> None:
        """A save that failed (a full disk, a lost file server) costs that checkpoint, not the job: its files
        are removed (rank 0; they may be what filled the disk), the committed ones stay, training goes on and
        the next interval saves again. Anything but storage (a peer that died mid-save: gloo's or NCCL's error)
        is raised: going on would only fail at the next collective, later and with a vaguer cause."""
        if not storage_failure(e):
            raise e
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            self.log(f"checkpoint: step {step} not saved ({first_error_line(e)}); training goes on, the next "
                     "checkpoint.interval tries again, the committed checkpoints are intact")

    def wait_staging(self) -> None:
        """Block until a background copy of the state to host memory has finished (overlap_staging)."""
        if self._staging is not None:
            staging, self._staging = self._staging, None
            staging.result()

    def wait(self) -> None:
        """Block until the background save has been written and committed (not a collective)."""
        self.wait_staging()
        if self.pending is None:
            return
        future, committed, final, tmp, step = self.pending
        self.pending = None
        try:
            future.result()
        except (Exception, CheckpointException) as e:  # what the background write raised, on every rank
            self._save_failed(tmp, step, e)
        committed.wait()

    def close(self) -> None:
        """End of the run: finish the background save and the pruning."""
        self.wait()
        if self._pruner is not None:
            self._pruner.join()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _commit_when_written(self, future: Any, tmp: Path, final: Path, manifest: dict[str, Any],
                             committed: threading.Event) -> None:
        """Runs in DCP's background thread as soon as the write ends."""
        try:
            if future.exception() is None:  # DCP's save raises on every rank alike: all gather the sums, or none
                manifest["files"] = self._file_sums(tmp, self._async_group)
                self._commit(tmp, final, manifest)
                if self.rank == 0:
                    self.log(f"checkpoint: committed {final.name} (background save)")
        finally:
            committed.set()

    def _file_sums(self, tmp: Path, group: Any) -> dict[str, list[int]]:
        """On rank 0, [size, CRC-32] of every file of the checkpoint written to `tmp` ({} on the others): each
        rank reads back the files it wrote (DCP names them by its rank in `group`), rank 0 gathers them
        (a collective on `group`) and adds DCP's metadata. A file that cannot be read back is [-1, 0]."""
        me = dist.get_rank(group) if dist.is_initialized() else 0
        try:
            mine = layout.sums(tmp, layout.rank_files(tmp, me))
        except OSError:
            mine = {f"__{me}_": [-1, 0]}
        gathered: Optional[list[Any]] = [mine]
        if dist.is_initialized():
            gathered = [None] * dist.get_world_size(group) if self.rank == 0 else None
            dist.gather_object(mine, gathered, dst=0, group=group)
        if self.rank != 0:
            return {}
        files = {name: sums for part in gathered or [] for name, sums in (part or {}).items()}
        files[layout.DCP_METADATA_FILE] = layout.file_sum(tmp / layout.DCP_METADATA_FILE)
        return files

    def _commit(self, tmp: Path, final: Path, manifest: dict[str, Any]) -> bool:
        """Rank 0 only, nobody waits: DCP returned, so every rank's shards and DCP's metadata are written.
        Whether it committed (the other ranks answer True: they never know, and need not)."""
        if self.rank != 0:
            return True
        unread = [name for name, (size, _) in manifest.get("files", {}).items() if size < 0]
        if unread:  # never commit what could not be read back: the save failed; the older checkpoints stand
            self._save_failed(tmp, manifest["step"], OSError(f"its files could not be read back: {', '.join(unread)[:200]}"))
            return False
        crash_step = faults.step(CRASH_IN_SAVE_ENV)
        if crash_step and crash_step == manifest["step"] and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            self.log(f"checkpoint: test fault injection: killing rank 0 mid-save at step {manifest['step']}")
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            layout.commit(tmp, manifest, final)
        except OSError as e:  # the manifest could not be written (a full disk): not committed
            self._save_failed(tmp, manifest["step"], e)
            return False
        # deleting big old checkpoints takes seconds on a shared file system: not on this thread
        if self._pruner is not None:
            self._pruner.join()
        self._pruner = threading.Thread(target=self._prune, name="checkpoint-prune", daemon=True)
        self._pruner.start()
        return True

    def _prune(self) -> None:
        layout.prune(self.run_dir, self.keep_last)


class PlainTensorPlanner(DefaultSavePlanner):
    """DCP's default planner, writing each shard as a plain tensor. A tensor subclass that wraps one (train.float8's
    weights: torchao's WeightWithDynamicFloat8CastTensor) would be pickled as its class, which torch.load with
    weights_only (DCP's reader, export) refuses in any process that has not imported torchao: a checkpoint
    that only loads with the float8 code, not after the user drops train.float8 as its refusal says."""

    def resolve_data(self, write_item: Any) -> Any:
        data = super().resolve_data(write_item)
        if isinstance(data, torch.Tensor) and is_traceable_wrapper_subclass(data):
            inner, _ = data.__tensor_flatten__()
            if len(inner) == 1:
                return getattr(data, inner[0])
        return data


def _same_plan() -> DefaultSavePlanner:
    """The planner, told to reuse its plans: every save of a process writes the same shards under the
    same names, so after the first each rank sends the coordinator an empty plan and the coordinator reuses its
    global plan and metadata (torch compares each local plan with the one it cached, and plans again when one
    changed). The files are bitwise those of an uncached save (tests/unit/test_checkpoint_manager.py)."""
    return PlainTensorPlanner(enable_plan_caching=True)


def storage_failure(e: BaseException) -> bool:
    """Did the save fail for its storage (an OSError: a full disk, a lost file server) on every rank that
    failed? DCP gathers each rank's exception into one CheckpointException, raised on every rank alike."""
    if isinstance(e, CheckpointException):
        caught = [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        return bool(caught) and all(isinstance(x, OSError) for x in caught)
    return isinstance(e, OSError)


def first_error_line(e: BaseException) -> str:
    """What went wrong, in a line: DCP's CheckpointException wraps each rank's traceback; its last line
    names the error (e.g. "_pickle.UnpicklingError: invalid load key")."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if isinstance(e, CheckpointException):
        named = [ln for ln in lines if re.match(r"^[A-Za-z_.]+(Error|Exception): ", ln)]
        return (named[-1] if named else lines[-1] if lines else type(e).__name__)[:200]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []

