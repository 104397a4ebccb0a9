"""The small in-job API for your own training script (`script=train.py`), driven by the composed config:

    import fsdp_jobs.job

    job = fsdp_jobs.job.init()                 # process group, device, the configured mesh (HSDP by node)
    model = job.shard(MyModel())               # the configured FSDP2 policy (wrap, precision, offload, AC)
    opt = torch.optim.AdamW(model.parameters())
    step = job.checkpoint.load(model=model, optim=opt)     # newest committed checkpoint, or 0
    while step < total:
        ...; step += 1
        job.log(step=step, loss=loss.item())  # metrics.jsonl + the progress line (rank 0)
        if job.should_stop():                  # preemption / time limit / cancel, agreed by all ranks (one call late)
            job.checkpoint.save(step, model=model, optim=opt)
            break
        if step % 50 == 0:
            job.checkpoint.save(step, model=model, optim=opt)

Everything here reuses the built-in trainer's pieces (fsdp_jobs/runtime): the mesh rule, the sharding
policy, the atomic DCP CheckpointManager (keep-last, async), the stop signals and the stop-request
file, the metrics writer; and it writes state.json as the trainer does, so the SLURM node task
requeues a stopped script and not a finished one: the script needs no other code to be preemption-safe.
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh

from fsdp_jobs import runs
from fsdp_jobs.plan import STRATEGY_TABLE
from fsdp_jobs.runtime.checkpoint import CheckpointManager
from fsdp_jobs.runtime.mesh import World, build_mesh, init_process_group, read_world
from fsdp_jobs.runtime.metrics import MetricsWriter, log
from fsdp_jobs.runtime.signals import StopFlag

RUN_DIR_ENV = "FSDP_JOBS_RUN_DIR"  # set by every launcher (launchers/common.py rank_env)


CUDA_RNG_KEY = "rng.cuda"  # DCP's flattened name of the CUDA generator's state (absent from older checkpoints)


def _checkpoint_has(path: Path, key: str) -> bool:
    """Whether the DCP checkpoint at `path` holds `key` (read from its metadata file, nothing else)."""
    from torch.distributed.checkpoint import FileSystemReader

    return key in FileSystemReader(str(path)).read_metadata().state_dict_metadata


class _Objects(Stateful):
    """Any stateful objects under names, as DCP sees them: modules and optimizers through the
    distributed state-dict API (sharded, reshardable), anything else by its state_dict().

    `cuda_rng`: the CUDA device whose generator is saved (and restored) beside the CPU one, None when
    the job runs on the CPU or (loading) when the checkpoint has none: saved on the CPU, or older."""

    def __init__(self, step: int, objects: dict[str, Any], cuda_rng: Optional[torch.device] = None) -> None:
        self.step, self.samples_seen, self.objects = step, 0, objects  # samples_seen: CheckpointManager's manifest
        self.cuda_rng = cuda_rng
        models = [o for o in objects.values() if isinstance(o, nn.Module)]
        self.model = models[0] if len(models) == 1 else None

    def _model_for(self, name: str) -> nn.Module:
        if self.model is None:
            raise ValueError(f"checkpoint object {name!r} is an optimizer: pass exactly one model beside it")
        return self.model

    def state_dict(self) -> dict[str, Any]:
        # the torch RNG continues where it was (dropout, sampling); rank 0's stream, as the trainer keeps it:
        # ranks seeded alike (train.seed) share it. On GPU dropout and random ops draw from the CUDA
        # generator: its state (a small CPU byte tensor) is kept the same way
        rng = {"torch": torch.get_rng_state()}
        if self.cuda_rng is not None:
            rng["cuda"] = torch.cuda.get_rng_state(self.cuda_rng)
        out: dict[str, Any] = {"progress": {"step": self.step}, "rng": rng}
        for name, obj in self.objects.items():
            if isinstance(obj, nn.Module):
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
            if isinstance(obj, nn.Module):
                set_model_state_dict(obj, sd[name])
            elif isinstance(obj, torch.optim.Optimizer):
                set_optimizer_state_dict(self._model_for(name), obj, sd[name])
            else:
                obj.load_state_dict(sd[name])
        self.step = int(sd["progress"]["step"])
        torch.set_rng_state(sd["rng"]["torch"])
        if self.cuda_rng is not None and "cuda" in sd["rng"]:
            torch.cuda.set_rng_state(sd["rng"]["cuda"], self.cuda_rng)


class Checkpoints:
    """`job.checkpoint`: atomic, sharded DCP checkpoints of any stateful objects in the run dir
    (checkpoint.keep_last, checkpoint.async_save, checkpoint.resume from the job config). Collective:
    every rank calls save/load with the same step and objects."""

    def __init__(self, job: "Job") -> None:
        self._job = job
        c = job.config["checkpoint"]
        attempt = [f"{int(time.time())}-{os.getpid()}"]
        dist.broadcast_object_list(attempt, src=0)  # one name for this attempt's temporary dirs on every rank
        self.manager = CheckpointManager(job.run_dir, c["keep_last"], {"config_hash": runs.job_hash(job.config),
                                                                       "script": True},
                                         job.rank, attempt[0], async_save=c["async_save"],
                                         log=lambda m: log(job.rank, m))

    def load(self, **objects: Any) -> int:
        """Load the newest committed checkpoint into the objects (in place); returns its step, 0 if none
        (or checkpoint.resume=false)."""
        if not self._job.config["checkpoint"]["resume"]:
            return 0
        path = self.manager.find_latest()
        if path is None:
            return 0
        # DCP loads exactly the keys asked for, and a missing one is an error: ask for the CUDA RNG only
        # if the checkpoint has it (one saved on the CPU, or before it was kept, has not)
        cuda_rng = self._cuda_rng()
        if cuda_rng is not None and not _checkpoint_has(path, CUDA_RNG_KEY):
            cuda_rng = None
        state = _Objects(0, objects, cuda_rng)
        if self.manager.load(state, path) is None:  # type: ignore[arg-type]
            return 0
        self._job.step = state.step
        return state.step

    def save(self, step: int, **objects: Any) -> None:
        """Save the objects as checkpoint step-N (in the background with checkpoint.async_save); it becomes
        visible only once complete, and older ones beyond checkpoint.keep_last are deleted."""
        self.manager.save(_Objects(step, objects, self._cuda_rng()), self._job.mesh_shape,  # type: ignore[arg-type]
                          self._job.world.world_size)
        self._job.step = step
        if self._job.stopping:
            self.manager.wait()  # the process is about to exit: the checkpoint must be committed first
            self._job._record("preempted")

    def wait(self) -> None:
        """Finish a background save (collective)."""
        self.manager.wait()

    def _cuda_rng(self) -> Optional[torch.device]:
        return self._job.device if self._job.device.type == "cuda" else None


class Job:
    """What `init()` returns: the run's config and world, and the helpers."""

    def __init__(self, run_dir: Path, config: dict[str, Any], world: World, mesh: DeviceMesh) -> None:
        self.run_dir, self.config, self.world, self.mesh = run_dir, config, world, mesh
        self.device: torch.device = world.device
        self.rank, self.world_size, self.local_rank = world.rank, world.world_size, world.local_rank
        self.mesh_shape = dict(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
        self.step = 0
        self.stopping = False
        self._stop = StopFlag()
        # the trainer's stop machinery: rank 0 looks for the stop-request file in a thread (a slow shared
        # file system never stalls the step), and the ranks vote without a host sync (see should_stop)
        from fsdp_jobs.runtime.train import StopFileWatcher, StopVote

        self._stop_file = StopFileWatcher(run_dir, enabled=self.rank == 0)
        self._vote = StopVote(self.device)
        self._voted = False  # what this rank put in the vote now in flight
        self._metrics = MetricsWriter(run_dir / runs.METRICS_FILE, self.rank == 0, config["train"]["steps"],
                                      config["train"]["log_interval"])
        self._attempt = ""
        self.checkpoint = Checkpoints(self)
        self._attempt = self.checkpoint.manager.attempt

    def shard(self, model: nn.Module, seed: Optional[int] = None) -> nn.Module:
        """Apply the configured FSDP2 policy (fsdp.*: wrap classes, mixed precision, offload, activation
        checkpointing, reshard) over the job's mesh. A model built on the meta device is materialised
        here and initialised from train.seed (the same values whatever the world size); its buffers
        keep their values if they were made on a real device, and those made on meta must be rebuilt
        by the model's `init_buffers(device)` (else this refuses: they would hold garbage)."""
        from fsdp_jobs.runtime.shard import init_devices, materialize, shard_model

        f = self.config["fsdp"]
        reshard = f["reshard_after_forward"]
        reshard = STRATEGY_TABLE[f["strategy"]][1] if reshard is None else bool(reshard)
        on_meta = any(p.is_meta for p in model.parameters())
        if not on_meta and self.device.type == "cuda":
            model.to(self.device)
        shard_model(model, self.mesh, f, reshard, self.device)
        if on_meta:  # with CPU offload on GPU the parameters are born on the host (as in the trainer)
            param_device, buffer_device = init_devices(f, self.device)
            materialize(model, param_device, self.config["train"]["seed"] if seed is None else seed,
                        f["mixed_precision"].get("buffer_dtype"), buffer_device=buffer_device)
        return model

    def should_stop(self) -> bool:
        """Collective, call it at a step boundary on every rank, as often on each: has any rank been
        signalled (SLURM's preemption/time-limit signal, SIGTERM from a cancel or Ctrl-C), or has the
        launcher left a stop request? Then save a checkpoint and leave the loop: the run is recorded
        as preempted and requeued where the backend does that.

        Every rank gets the same answer at the same call, but one call late: a call starts a
        non-blocking vote and returns the previous call's (as the built-in trainer's loop does), so
        on GPU the host never waits for the device and the step queue never drains. A stop seen
        during call N (or before it) is reported by call N+1; the first call returns False. Once it
        has returned True it keeps returning True, with no more collectives."""
        if self.stopping:
            return True
        if self._vote.result():  # the previous call's vote: long finished, so no stall
            self.stopping = True
            why = self._stop.received.name if self._stop.received else \
                "stop request" if self._voted or self._stop_file.seen.is_set() else "another rank"
            log(self.rank, f"stop requested ({why}) at step {self.step}")
            self._record("preempted")
            return True
        self._voted = self._stop.set or self._stop_file.seen.is_set()
        self._vote.cast(self._voted)
        return False

    def log(self, **metrics: Any) -> None:
        """One line in metrics.jsonl (rank 0; other ranks' calls are ignored) and the progress line every
        train.log_interval steps. Pass step=N (else the last checkpoint/log step + 1 is used)."""
        step = int(metrics.pop("step", self.step + 1))
        self.step = step
        record = {"step": step, **{k: float(v) if isinstance(v, torch.Tensor) else v for k, v in metrics.items()},
                  "world_size": self.world_size, "restart": self.world.restart, "attempt": self._attempt,
                  "time": time.time()}
        self._metrics.write(record)

    def _record(self, status: str) -> None:
        if self.rank == 0:
            runs.write_state(self.run_dir, status=status, step=self.step)

    def close(self) -> None:
        """Leave cleanly (also run at exit): finish a background save, free what gloo's thread holds, destroy
        the process group (torch 2.13's FSDP2 + gloo aborts at interpreter exit otherwise)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self._metrics.close()
        if dist.is_initialized():
            self._vote.result()  # every rank cast as many votes (should_stop is collective): drain the last
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()


_JOB: Optional[Job] = None


def init(run_dir: Optional[str] = None) -> Job:
    """Start the job on this rank (under torchrun): read the run's job config, init the process group
    (nccl on GPU, gloo on CPU), bind the device, build the configured mesh from the actual world. Returns
    the same Job when called again."""
    global _JOB
    if _JOB is not None:
        return _JOB
    where = run_dir or os.environ.get(RUN_DIR_ENV)
    if not where:
        raise RuntimeError(f"fsdp_jobs.job.init(): no run dir; launch the script with `python -m fsdp_jobs "
                           f"script=...` (which sets {RUN_DIR_ENV}) or pass init(run_dir=...)")
    path = Path(where)
    config = runs.load_job(path)
    world = read_world(config["cluster"]["device"])
    # CPU offload: the grad-norm all-reduce runs on host tensors, so the default group needs gloo too
    init_process_group(world, cpu_collectives=bool(config["fsdp"].get("cpu_offload")))
    from fsdp_jobs.runtime.train import write_rank_file

    write_rank_file(path, world)  # pid, host, restart of this rank, for tools (and tests that kill ranks)
    mesh = build_mesh(config, world)
    _JOB = Job(path, config, world, mesh)
    shape = _JOB.mesh_shape
    log(world.rank, f"fsdp_jobs.job: world {world.world_size} = {world.nodes} nodes x {world.local_world_size}, "
                    f"{config['fsdp']['strategy']} mesh {shape}, device {world.device.type}, restart {world.restart}")
    log(world.rank, f"node {world.node_rank} host {socket.gethostname()}", all_ranks=world.local_rank == 0)
    _JOB._record("running")
    atexit.register(_JOB.close)
    return _JOB
