"""The small in-job API for your own training script (`script=train.py`), driven by the composed config:

    import fsdp_jobs.job

    job = fsdp_jobs.job.init()                 # process group, device, the configured mesh (HSDP by node)
    model = job.shard(MyModel())               # the configured FSDP2 policy (wrap, precision, offload, AC)
    opt = torch.optim.AdamW(model.parameters())
    step = job.checkpoint.load(model=model, optim=opt)     # newest committed checkpoint, or 0
    while step < total:
        ...; step += 1
        job.log(step=step, loss=loss.item())  # the metrics record + the progress line (rank 0)
        if job.should_stop():                  # preemption / time limit / cancel, agreed by all ranks (one call late)
            job.checkpoint.save(step, model=model, optim=opt)
            break
        if step % 50 == 0:
            job.checkpoint.save(step, model=model, optim=opt)

Everything here is the built-in trainer's (fsdp_jobs/runtime/trainer.py: Trainer): its bring-up and
mesh rule, the sharding policy, the atomic DCP CheckpointManager (keep-last, async), the stop signals,
the stop request and the stop vote, the metrics writer; and it writes the state record as the trainer
does, so a backend that requeues a job requeues a stopped script and not a finished one: the script needs no
other code to be preemption-safe.
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from fsdp_jobs.planning.config import rank_config
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import MetricsRow
from fsdp_jobs.runtime.checkpoint import StateObjects
from fsdp_jobs.runtime.mesh import World
from fsdp_jobs.runtime.metrics import MetricsWriter, log
from fsdp_jobs.runtime.signals import StopFlag
from fsdp_jobs.runtime.stopping import stop_reason
from fsdp_jobs.runtime.trackers import Trackers
from fsdp_jobs.runtime.trainer import Trainer

if TYPE_CHECKING:  # types only
    from fsdp_jobs.planning.config import JobConfig

RUN_DIR_ENV = "FSDP_JOBS_RUN_DIR"  # set by every launcher (launchers/common.py rank_env)


CUDA_RNG_KEY = "rng.cuda"  # DCP's flattened name of the CUDA generator's state (absent from older checkpoints)


def _checkpoint_has(path: Path, key: str) -> bool:
    """Whether the DCP checkpoint at `path` holds `key` (read from its metadata file, nothing else)."""
    from torch.distributed.checkpoint import FileSystemReader

    return key in FileSystemReader(str(path)).read_metadata().state_dict_metadata


def unwrapped(objects: dict[str, Any]) -> dict[str, Any]:
    """job.optimizer's wrapper stands for the optimizer it wraps (DCP's optimizer state-dict calls step() on
    an optimizer without state: that must not be a step of the job)."""
    return {k: v.optim if isinstance(v, Optimizer) else v for k, v in objects.items()}


class Checkpoints:
    """`job.checkpoint`: atomic, sharded DCP checkpoints of any stateful objects in the run dir
    (checkpoint.keep_last, checkpoint.async_save, checkpoint.resume from the job config). Collective:
    every rank calls save/load with the same step and objects."""

    def __init__(self, job: "Job") -> None:
        self._job = job
        self.manager = job._trainer.open_checkpoints({"config_hash": job._trainer.config_hash(), "script": True},
                                                     overlap_staging=False)

    def load(self, **objects: Any) -> int:
        """Load the newest committed checkpoint into the objects (in place); returns its step, 0 if none
        (or checkpoint.resume=false). With fault_tolerance=replica the objects are also what this replica
        group recovers live from the others when it joins them while they train (then nothing is read
        from disk), and again whenever it falls behind them (job.optimizer's zero_grad)."""
        trainer, objects = self._job._trainer, unwrapped(objects)
        joining = trainer.joins_a_running_job()
        state = self._load_newest(objects) if not joining else StateObjects(objects, 0, cuda_rng=self._cuda_rng())
        self._job._state = state
        trainer.join(state, reload=lambda: self._load_into(state))
        self._job.step = state.step
        return state.step

    def _load_newest(self, objects: dict[str, Any]) -> StateObjects:
        """The objects as StateObjects, the newest checkpoint loaded into them (if any, and asked for)."""
        state = StateObjects(objects, 0, cuda_rng=self._cuda_rng())
        self._load_into(state)
        return state

    def _load_into(self, state: StateObjects) -> Optional[Path]:
        """Load the newest checkpoint into `state` (checkpoint.resume allowing); its path, or None."""
        path = self.manager.find_latest() if self._job.config.checkpoint.resume else None
        if path is None:
            return None
        # DCP loads exactly the keys asked for, and a missing one is an error: ask for the CUDA RNG only
        # if the checkpoint has it (one saved on the CPU, or before it was kept, has not)
        if state.cuda_rng is not None and not _checkpoint_has(path, CUDA_RNG_KEY):
            state.cuda_rng = None
        self._job._trainer.beat_phase("load")
        return self.manager.load(state, path)

    def save(self, step: int, **objects: Any) -> None:
        """Save the objects as the checkpoint of step N (in the background with checkpoint.async_save); it becomes
        visible only once complete, and older ones beyond checkpoint.keep_last are deleted. With
        fault_tolerance=replica one replica group writes it (they hold the same model); the others return."""
        # stopping: the process is about to exit, the checkpoint must be committed first
        if self._job._trainer.replicas.writer:
            self._job._trainer.save_checkpoint(StateObjects(unwrapped(objects), step, cuda_rng=self._cuda_rng()),
                                               wait=self._job.stopping)
        self._job.step = step
        if self._job.stopping:
            self._job._record("preempted")

    def wait(self) -> None:
        """Finish a background save (collective)."""
        self.manager.wait()

    def _cuda_rng(self) -> Optional[torch.device]:
        return self._job.device if self._job.device.type == "cuda" else None


class Job:
    """What `init()` returns: the run's config and world, and the helpers."""

    def __init__(self, run_dir: Path, config: JobConfig, world: World, mesh: DeviceMesh,
                 trainer: Optional[Trainer] = None) -> None:
        self.run_dir, self.config, self.world, self.mesh = run_dir, config, world, mesh
        if trainer is None:  # brought up elsewhere (a test's one-rank group)
            trainer = Trainer(run_dir, config)
            trainer.use(world, mesh)
        self._trainer = trainer
        self.device: torch.device = world.device
        # the rank among all of the job's (what a rank's data slice is chosen by): with fault_tolerance=replica
        # torchrun's RANK and WORLD_SIZE are one replica group's, and these count every group's ranks
        self.rank, self.world_size, self.local_rank = world.job_rank, world.job_world_size, world.local_rank
        self.mesh_shape = dict(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
        self.step = 0  # the last step done: checkpoint.load sets it, job.optimizer's step() counts on
        self.stopping = False
        self._state: Optional[StateObjects] = None  # what checkpoint.load was given: a replica group recovers it
        # the trainer's stop machinery: rank 0 looks for the stop request in a thread (a slow shared
        # file system never stalls the step), and the ranks vote without a host sync (see should_stop)
        trainer.watch_for_stop(StopFlag())
        self._stop, self._stop_file, self._vote = trainer.stop, trainer.stop_file, trainer.vote
        self._voted = False  # what this rank put in the vote now in flight
        # TensorBoard/W&B open at the first job.log: this attempt's steps start there (runtime/trackers.py)
        # each replica group's rank 0 writes the lines of the steps its group writes (Replicas.writer); the
        # trackers hold one writer: the first group's
        self._metrics = MetricsWriter(RunDir(run_dir).metrics_file, world.rank == 0, config.train.steps,
                                      config.train.log_interval,
                                      Trackers(run_dir, config, close_at_exit=True) if world.group == 0 else None)
        self._attempt = ""
        self.checkpoint = Checkpoints(self)
        self._attempt = self.checkpoint.manager.attempt

    def shard(self, model: nn.Module, seed: Optional[int] = None) -> nn.Module:
        """Apply the configured FSDP2 policy (fsdp.*: wrap classes, mixed precision, offload, activation
        checkpointing, reshard) over the job's mesh. A model built on the meta device is materialised
        here and initialised from train.seed (the same values whatever the world size); its buffers
        keep their values if they were made on a real device, and those made on meta must be rebuilt
        by the model's `init_buffers(device)` (else this refuses: they would hold garbage)."""
        from fsdp_jobs.runtime.shard import init_devices, materialize

        f = self.config.fsdp
        on_meta = any(p.is_meta for p in model.parameters())
        if not on_meta and self.device.type == "cuda":
            model.to(self.device)
        self._trainer.shard(model)
        if on_meta:  # with CPU offload on GPU the parameters are born on the host (as in the trainer)
            param_device, buffer_device = init_devices(f, self.device)
            materialize(model, param_device, self.config.train.seed if seed is None else seed,
                        f.mixed_precision.buffer_dtype, buffer_device=buffer_device)
        return model

    def optimizer(self, optim: torch.optim.Optimizer) -> "Optimizer":
        """`optim` with the job's step around it: zero_grad() begins a step, step() ends it and counts it in
        job.step. Needed with fault_tolerance=replica (zero_grad: the step's quorum, where a group behind
        the others recovers the checkpoint.load objects live; step(): updates only if every group of the
        quorum finished the step, else returns False and the step is taken again); harmless without."""
        return Optimizer(self, optim)

    def should_stop(self) -> bool:
        """Collective, call it at a step boundary on every rank, as often on each: has any rank been
        signalled (the scheduler's preemption/time-limit signal, SIGTERM from a cancel or Ctrl-C), or has the
        launcher left a stop request? Then save a checkpoint and leave the loop: the run is recorded
        as preempted and requeued where the backend does that.

        Every rank gets the same answer at the same call, but one call late: a call starts a
        non-blocking vote and returns the previous call's (as the built-in trainer's loop does), so
        on GPU the host never waits for the device and the step queue never drains. A stop seen
        during call N (or before it) is reported by call N+1; the first call returns False. Once it
        has returned True it keeps returning True, with no more collectives."""
        if self.stopping:
            return True
        agreed = self._trainer.stop_agreed()  # the previous call's vote: long finished, so no stall
        if agreed:
            self.stopping = True
            why = self._stop.received.name if self._stop.received else \
                "stop request" if self._voted or self._stop_file.seen.is_set() else stop_reason(agreed)
            log(self.rank, f"stop requested ({why}) at step {self.step}")
            self._record("preempted")
            return True
        self._voted = self._trainer.cast_stop_vote()
        return False

    def log(self, **metrics: Any) -> None:
        """One line in the metrics record (rank 0; other ranks' calls are ignored), the progress line every
        train.log_interval steps, and its numbers in TensorBoard/W&B where configured (train.tensorboard,
        train.wandb). Pass step=N (else the last checkpoint/log step + 1 is used)."""
        step = int(metrics.pop("step", self.step + 1))
        self.step = step
        self._trainer.beat(step)
        record = MetricsRow(step=step, extra={k: float(v) if isinstance(v, torch.Tensor) else v
                                              for k, v in metrics.items()},
                            world_size=self._trainer.replicas.job_world_size(),  # of a replica job: the groups in the step
                            restart=self.world.restart, attempt=self._attempt, time=time.time())
        if self._trainer.replicas.writer:  # one replica group writes each step's line
            self._metrics.write(record)

    def heartbeat(self, step: Optional[int] = None) -> None:
        """Tell the node's hang watchdog this rank is making progress (job.log does it too). Cheap: no I/O,
        no sync; call it from a loop that logs rarely, or during long work of your own."""
        if step is not None:
            self.step = int(step)
        self._trainer.beat(self.step)

    def _record(self, status: str) -> None:
        if self.world.rank == 0 and self._trainer.replicas.writer:
            runs.write_state(self.run_dir, status=status, step=self.step)

    def _begin_step(self) -> None:
        """job.optimizer's zero_grad: a replica job's quorum; a group behind the others recovers here."""
        replicas = self._trainer.replicas
        replicas.begin_step()
        if replicas.healed is not None and self._state is not None:
            self.step = self._state.step
            log(self.world.rank, f"replica group {self.world.group}: recovered live from a peer at step {self.step}")

    def _commit(self) -> bool:
        return self._trainer.replicas.commit()

    def close(self) -> None:
        """Leave cleanly (also run at exit): finish a background save, free what gloo's thread holds, destroy
        the process group (torch 2.13's FSDP2 + gloo aborts at interpreter exit otherwise); then, stopped for
        another rank's signal, give this node's agent a moment to restart the rank (StopFlag.linger)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self._metrics.close()
        if dist.is_initialized():
            self._vote.result()  # every rank cast as many votes (should_stop is collective): drain the last
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        self._stop.linger()  # stopped for another rank's signal: its agent may be about to restart it
        sys.stdout.flush()


class Optimizer(torch.optim.Optimizer):
    """What job.optimizer(optim) returns: the optimizer, with the job's step around it (Job.optimizer).
    Everything else is the wrapped optimizer's; checkpoint.load/save take either."""

    def __init__(self, job: Job, optim: torch.optim.Optimizer) -> None:  # no super().__init__: it holds no params
        self._job, self.optim = job, optim

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Call it first in each step, before the forward."""
        self._job._begin_step()
        self.optim.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> bool:  # type: ignore[override]
        """Update the parameters, and count the step in job.step; False (nothing updated, job.step unchanged):
        a replica group failed during the step, which is then taken again."""
        assert closure is None, "job.optimizer takes no closure"
        if not self._job._commit():
            return False
        self.optim.step()
        self._job.step += 1
        if self._job._state is not None:  # what a peer sends a recovering group: the step too
            self._job._state.step = self._job.step
        return True

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optim.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)


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
    config = rank_config(runs.load_job(path))  # typed (fsdp_jobs/planning/config.py JobConfig): job.config.train.steps
    trainer = Trainer(path, config)
    trainer.bring_up()  # process group (nccl on GPU, gloo on CPU), device, this rank's record, the mesh
    world = trainer.world
    _JOB = Job(path, config, world, trainer.mesh, trainer)
    shape = _JOB.mesh_shape
    log(world.rank, f"fsdp_jobs.job: world {world.world_size} = {world.nodes} nodes x {world.local_world_size}, "
                    f"{config.fsdp.strategy} mesh {shape}, device {world.device.type}, restart {world.restart}")
    log(world.rank, f"node {world.node_rank} host {socket.gethostname()}", all_ranks=world.local_rank == 0)
    _JOB._record("running")
    atexit.register(_JOB.close)
    return _JOB
