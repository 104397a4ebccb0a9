"""One rank of a job, top to bottom: bring-up (process group, device, mesh) -> build (model, shard,
optimizer, schedule) -> resume -> the step loop (train_step, the stop vote, the checkpoint policy:
every checkpoint.interval steps, at the end, on preemption) -> finish.

`Trainer.run` is the built-in loop (`python -m fsdp_jobs.runtime RUN_DIR`, fsdp_jobs/runtime/train.py);
fsdp_jobs.job drives the same Trainer's bring-up, sharding, stop vote and checkpoints from a user's own loop.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional, TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdp_jobs.planning import faults
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.checkpoints import committed_checkpoints, newest_checkpoint, step_dir
from fsdp_jobs.planning.cluster_config import CPU_PEAK_TFLOPS, ClusterConfig
from fsdp_jobs.planning.plan import compute_dtype, micro_batch, replica_groups, reshard_after_forward
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import MetricsRow, RankRecord
from fsdp_jobs.rundir import events, liveness
from fsdp_jobs.runtime import float8, heartbeat, interval
from fsdp_jobs.runtime.checkpoint import CheckpointManager, StateObjects, TrainState
from fsdp_jobs.runtime.data import build_dataset
from fsdp_jobs.runtime.mesh import World, build_mesh, init_process_group, read_world
from fsdp_jobs.runtime.metrics import MetricsWriter, flops_per_token, log, peak_memory_gb
from fsdp_jobs.runtime.local_update import ShardLocalAdamW, clip_grad_norm
from fsdp_jobs.runtime.outputs import load_pretrained_weights, logits_of
from fsdp_jobs.runtime.prefetch import BatchPrefetcher
from fsdp_jobs.runtime.recheck import StepRecheck
from fsdp_jobs.runtime.sentinel import SpikeSentinel
from fsdp_jobs.runtime.replicas import JOINING, NoReplicas, open_replicas
from fsdp_jobs.runtime.shard import (adamw_implementation, build_meta_model, dtype_of, init_devices, materialize,
                                     shard_model)
from fsdp_jobs.runtime.signals import StopFlag
from fsdp_jobs.runtime.sdc import (AGREED, CORRUPT_AT_ENV, ROLLED_BACK, CorruptRequests, Mismatch, ReplicaAgreement,
                                  corrupt_target, describe, flip_a_bit, respond, set_aside_newer, settle,
                                  state_tensors, stop_unnamed)
from fsdp_jobs.runtime.snapshots import MemorySnapshots, RestorePlan
from fsdp_jobs.runtime.stopping import NONFINITE, STOP_FILE, StopFileWatcher, StopVote, stop_reason
from fsdp_jobs.runtime.timeline import MAIN_STARTED, Timeline
from fsdp_jobs.runtime.trackers import Trackers

if TYPE_CHECKING:  # types only: the config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig, TrainConfig

# test-only fault injection: the training step raises from this step on (a job that cannot progress)
FAIL_AT_STEP_ENV = "FSDP_JOBS_TEST_FAIL_AT_STEP"
NONFINITE_AT_STEP_ENV = "FSDP_JOBS_TEST_NONFINITE_AT_STEP"
OOM_AT_STEP_ENV = "FSDP_JOBS_TEST_OOM_AT_STEP"
REJOIN_DELAY_ENV = "FSDP_JOBS_TEST_REJOIN_DELAY_S"
# test-only pacing: tests that wait on the clock (a controller restart, a time limit) need a job that keeps
# stepping, not one that steps as fast as it can; on CI's 2 cores the steps' CPU slowed every other test
STEP_PAUSE_ENV = "FSDP_JOBS_TEST_STEP_PAUSE_MS"
UNREPRODUCIBLE_ENV = "FSDP_JOBS_TEST_UNREPRODUCIBLE_FROM_STEP"
SPIKE_AT_STEP_ENV = "FSDP_JOBS_TEST_SPIKE_AT_STEP"  # that step's loss x 1000 in the first attempt (the sentinel)
MAX_ROLLBACKS = 2  # train.on_nonfinite=rollback: a third non-finite step in one attempt stops the job
PROBE_TOKENS = 16  # positions per probe sequence: enough to check an export, small at any vocab size


def lr_lambda(train: TrainConfig) -> Callable[[int], float]:
    warmup, total, floor, kind = train.warmup_steps, train.steps, train.min_lr_ratio, train.lr_schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return floor + (1 - floor) * (1 - progress)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def write_rank_file(run_dir: Path, world: World) -> None:
    RunDir(run_dir).ranks_dir.mkdir(exist_ok=True)
    info = RankRecord(rank=world.job_rank, pid=os.getpid(), uid=os.getuid(), host=socket.gethostname(),
                      node_rank=world.node_rank,
                      node=os.environ.get("FSDP_JOBS_NODE") or socket.gethostname(),  # set by launchers/node/wrapper.py
                      restart=world.restart, world_size=world.world_size, time=time.time(),
                      replica_group=world.group if world.groups > 1 else None)
    runs.write_atomic(RunDir(run_dir).rank_file(world.job_rank), json.dumps(info.to_json()) + "\n")


def note_node_changes(run_dir: Path, world: World) -> None:
    """Collective. Rank 0 names the nodes that left the job since the attempt before, or joined it (a node
    cut off from the others is dropped by their next rendezvous with nothing of its own to say: this is
    where the job says which), and keeps this attempt's nodes for the next one (RunDir.world_file). One
    gather of a name per rank, once per attempt."""
    names: list[Any] = [None] * world.world_size
    dist.all_gather_object(names, os.environ.get("FSDP_JOBS_NODE") or socket.gethostname())
    if world.job_rank != 0:
        return
    nodes = sorted(set(names))
    launched = runs.last_launch(run_dir).get("unix")  # a new launch (a resubmission) compares with nothing
    line = runs.node_changes(runs.read_world(run_dir), nodes, launched if isinstance(launched, (int, float)) else None)
    if line:
        print(f"fsdp-jobs: {line}", flush=True)
    try:
        runs.write_world(run_dir, world.restart, nodes)
    except OSError as e:  # a note for the next attempt must never cost this one
        print(f"fsdp-jobs: could not record this attempt's nodes: {e}", flush=True)


def mfu_peak_flops(cfg: JobConfig, device: torch.device) -> float:
    """The accelerator's peak at the dtype the matmuls actually run in (bf16 vs fp32/TF32)."""
    cl = cfg.cluster
    if cl.get("peak_tflops") is None:  # the device's default (fsdp_jobs/planning/cluster_config.py)
        if device.type == "cpu":
            return (cl.get("peak_tflops_fp32") or CPU_PEAK_TFLOPS) * 1e12
        cl = {**cl, "peak_tflops": ClusterConfig.peak_tflops}
    dtype = compute_dtype(cfg, device.type)
    if dtype in ("bfloat16", "float16"):
        return cl["peak_tflops"] * 1e12
    return (cl.get("peak_tflops_fp32") or cl["peak_tflops"] / 2) * 1e12


class MetricsWindow:
    """Per-step values stay on the device until the next log/checkpoint step: then one all-reduce and
    one host sync agree on the buffered losses, and their metrics lines are written. Each record says
    how many ranks took part in its step (`world_size`: fewer while a replica group is missing) and
    whether this rank writes it (`writer`: one group of a replica job writes each step's line).

    The losses are all-reduced in a vector of `slots` (train.log_interval) places, each step's at its own place
    (step - 1) % slots: how a collective sums an element depends on the vector's length and the element's
    place in it, so every step's logged loss is the same bits whatever windows a run's restarts and snapshots
    cut its steps into (a run resumed at any step logs what an uninterrupted one does)."""

    def __init__(self, metrics: MetricsWriter, world: World, attempt: str, tokens_per_rank_step: int,
                 flops_per_token: float, peak_flops: float, slots: int = 1,
                 sentinel: Optional[SpikeSentinel] = None) -> None:
        """`sentinel`: told every flushed step's loss and gradient norm (the same on every rank)."""
        self.metrics, self.world, self.attempt, self.slots = metrics, world, attempt, max(1, slots)
        self.sentinel = sentinel
        self.tokens_per_rank_step, self.fpt, self.peak = tokens_per_rank_step, flops_per_token, peak_flops
        self.window: list[tuple[torch.Tensor, Any, dict[str, Any]]] = []
        self.t_window = time.perf_counter()

    def append(self, loss: torch.Tensor, grad_norm: Any, record: dict[str, Any]) -> None:
        self.window.append((loss, grad_norm, record))

    def flush(self) -> None:
        if not self.window:
            return
        world, window = self.world, self.window
        slots = max(self.slots, len(window))
        places = [(w[2]["step"] - 1) % slots for w in window]
        if len(set(places)) < len(places):  # more steps than places (cannot happen: a flush every slots steps)
            places = list(range(len(window)))
        summed = torch.zeros(slots, dtype=window[0][0].dtype, device=window[0][0].device)
        summed[torch.tensor(places, device=summed.device)] = torch.stack([w[0] for w in window])
        dist.all_reduce(summed)
        losses = summed[torch.tensor(places, device=summed.device)]
        norms = [w[1].full_tensor() if hasattr(w[1], "full_tensor") else w[1] for w in window]
        norm_values = torch.stack(norms).float().tolist() if norms[0] is not None else [None] * len(window)
        loss_values = (losses / world.world_size).tolist()
        if self.sentinel is not None:
            self.sentinel.logged(loss_values, norm_values)
        dt = (time.perf_counter() - self.t_window) / len(window)  # host and device agree only over a window
        mem = peak_memory_gb(world.device)
        for (_, _, rec), loss_value, norm_value in zip(window, loss_values, norm_values):
            if not rec["writer"]:
                continue
            ranks = rec["world_size"]
            tokens_per_s = self.tokens_per_rank_step * ranks / dt
            mfu = tokens_per_s / ranks * self.fpt / self.peak
            self.metrics.write(MetricsRow(step=rec["step"], loss=loss_value, lr=rec["lr"], grad_norm=norm_value,
                                          tokens_per_s=tokens_per_s, mfu=mfu,
                                          peak_mem_gb=mem, step_time_s=dt, sample_start=rec["sample_start"],
                                          world_size=ranks, restart=world.restart, attempt=self.attempt,
                                          time=rec["time"]))
        self.window, self.t_window = [], time.perf_counter()


class Trainer:
    """See the module docstring. The phases are methods, called in the order they are defined."""

    world: World
    mesh: Any
    mesh_shape: dict[str, int]
    stop: StopFlag
    stop_file: StopFileWatcher
    vote: StopVote
    ckpt: CheckpointManager
    state: TrainState
    replicas: NoReplicas
    snapshots: MemorySnapshots

    def __init__(self, run_dir: Path, cfg: JobConfig) -> None:
        """`cfg`: the job record as fsdp_jobs/planning/config.py rank_config reads it (plain dataclasses: the loop reads
        train.* and checkpoint.* at every step)."""
        self.run_dir, self.cfg = run_dir, cfg
        self.tcfg, self.ccfg = cfg.train, cfg.checkpoint
        self.heartbeat: Optional[heartbeat.Heartbeat] = None
        self.joining = False  # fault_tolerance=replica: other groups train already; recover from them
        self.poisoned = False  # test fault injection: the current batch makes the loss NaN
        self.unreproducible_from = 0  # test fault injection: no step from this one on reproduces (UNREPRODUCIBLE_ENV)
        self.spike_at = 0  # test fault injection: this step's loss (and gradients) 1000 times as large (SPIKE_AT_STEP_ENV)
        self.nonfinite: Optional[torch.Tensor] = None  # the last step's loss or grad norm was not finite (device)
        self.rollbacks = 0  # train.on_nonfinite=rollback, in this attempt
        self.auto: Optional[interval.Planner] = None  # checkpoint.interval=auto's, opened by prepare_loop
        self.next_save: Optional[int] = None  # its step of the next checkpoint, agreed by the ranks
        self.loop_start = 0
        self.memory_plan: Optional[RestorePlan] = None  # where each rank's state comes from, when memory covers it
        self.source = "start"  # where this attempt's state came from: start, disk, memory (own or peers')
        self.agreed_at_resume = 0  # from memory: the newest step at or before it a check agreed on (0: the start)
        self.timeline = Timeline(run_dir, enabled=False, restart=0)  # bring_up opens rank 0's (the goodput timeline)
        # build() makes the job's; a user's script (fsdp_jobs.job) votes with none
        self.agreement = ReplicaAgreement({}, 0, 0, torch.device("cpu"))
        self.recheck = StepRecheck(0, False, torch.device("cpu"))
        self.sentinel = SpikeSentinel(0, "none")
        self.spike: Optional[torch.Tensor] = None  # the last step was a loss or grad-norm spike (device; sentinel)
        self.voted_step = 0  # the step of the vote cast last: the one a spike it carries is at
        self.sdc_end: Optional[tuple[int, str]] = None  # how an attempt a check named nodes in ends: exit status, why
        self.named: Optional[Mismatch] = None  # what the step recheck found, where it named nodes

    def run(self, stop: StopFlag) -> int:
        """The built-in loop, start to exit."""
        self.bring_up()
        ended = self.preflight() if self.cfg.preflight else None
        if ended is not None:
            return ended
        self.tune_for_training()
        self.build()
        self.timeline.event("built")
        self.resume()
        self.join()
        if self.state.step:  # a failure before this attempt's first step happened at the step it resumed at, as the
            self.beat(self.state.step)  # attempt before's at that step did: one failure repeated, not a new one
        self.timeline.event("loaded", step=self.state.step, attempt=self.ckpt.attempt, restart=self.world.restart,
                            source=self.source)
        self.prepare_loop()
        self.timeline.loop(self.state.step)
        stopped = self.fit(stop)
        if stopped == "sdc":  # a replica disagreed: the attempt ends, its state newer than the agreed one set aside
            self.metrics.close()
            self.replicas.close()
            self.timeline.event("end", why=self.sdc_end[1], step=self.state.step)
            return self.sdc_end[0]
        self.finish(stopped)
        why = {None: "completed", "nonfinite": "failed: a non-finite loss"}.get(stopped, "preempted")
        self.timeline.event("end", why=why, step=self.state.step)
        return 0

    def config_hash(self) -> str:
        """The hash of the job record as written, as the sweep journal records it (fsdp_jobs/cli/submit.py): not of the
        typed view, whose defaults fill in what an older job record lacks."""
        return runs.job_hash(runs.load_job(self.run_dir))

    # ------------------------------------------------------------------ bring-up (also fsdp_jobs.job's)
    def bring_up(self) -> None:
        """Process group on the world torchrun started, this rank's record, the configured mesh."""
        world = read_world(self.cfg.cluster.device, replica_groups(self.cfg))
        if self.cfg.fault.sdc_recompute_interval and world.device.type == "cuda":  # the step recheck's computations
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # bitwise alike: read as cuBLAS starts
        # the goodput timeline is rank 0's; of a replica job, the first group's
        self.timeline = Timeline(self.run_dir, enabled=world.job_rank == 0, restart=world.restart)
        began = time.time()
        # first: the node's watchdog (launchers/node/watchdog.py) follows this rank from here on
        self.heartbeat = heartbeat.start(self.run_dir, self.cfg, world.job_rank, world.local_rank, world.restart)
        # CPU offload: the grad-norm all-reduce runs on host tensors, so the default group needs gloo too
        init_process_group(world, timeout_s=float(self.tcfg.collective_timeout_s),
                           cpu_collectives=self.cfg.fsdp.cpu_offload)
        # TORCHELASTIC_RESTART_COUNT is per agent: a node whose workers were stopped for a re-rendezvous
        # (another node's rank died) does not count it (fsdp_jobs/ARCHITECTURE.md, pitfall 6). The job's attempt number
        # is the largest count of any node: agree on it once, here, so metrics and logs say the same
        # everywhere, the built-in loop's and a fsdp_jobs.job script's alike (else a script logs restart 0
        # after a restart when rank 0's node had only re-rendezvoused)
        restarts = torch.tensor([world.restart], device=world.device)
        dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
        world.restart = int(restarts.item())
        if self.heartbeat is not None:
            self.heartbeat.attempt(world.restart)
        write_rank_file(self.run_dir, world)  # pid, host, restart of this rank, for tools (and tests that kill ranks)
        if world.groups == 1:  # a replica group's comings and goings are its quorum's (fsdp_jobs/runtime/replicas.py)
            note_node_changes(self.run_dir, world)
        self.use(world, build_mesh(self.cfg, world))
        self.replicas = open_replicas(self.run_dir, self.cfg, world)
        self.timeline.event("process_group", began=began)

    def preflight(self) -> Optional[int]:
        """preflight=true|only: every node checked before any step (fsdp_jobs/runtime/preflight.py). None: go on
        training; else the ranks' exit status: 0 after preflight=only, or a named node (the state record says
        failed, and launchers/node/wrapper.py exits non-zero), REPLACED_EXIT when hot spares replace it."""
        from fsdp_jobs.runtime.preflight import PASSED, REPLACED, REPLACED_EXIT, run_preflight

        self.beat_phase("preflight")
        outcome = run_preflight(self.run_dir, self.cfg, self.world)
        ok = outcome == PASSED
        self.timeline.event("preflight", ok=ok)
        if ok and self.cfg.preflight == "only" and self.world.rank == 0:
            runs.write_state(self.run_dir, status="completed", stage="preflight", step=runs.read_state(
                self.run_dir).step, reason="preflight=only: every node passed")
        if ok and self.cfg.preflight != "only":
            return None
        why = {PASSED: "completed: preflight=only", REPLACED: "failed: preflight named a node; hot spares replace it"}
        self.timeline.event("end", why=why.get(outcome, "failed: preflight named a node"), step=0)  # the attempt ends
        return REPLACED_EXIT if outcome == REPLACED else 0

    def use(self, world: World, mesh: Any) -> None:
        """Take a world and mesh brought up already (bring_up, or a test's one-rank group)."""
        self.world, self.mesh = world, mesh
        self.mesh_shape = dict(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
        self.replicas = NoReplicas(world)

    def tune_for_training(self) -> None:
        """The built-in loop's settings beyond bring-up (a user's script makes its own), and its banner."""
        world, rank, offload = self.world, self.world.rank, self.cfg.fsdp.cpu_offload
        if world.device.type == "cuda":
            # fp32 matmuls (float32 compute, the fp32 parts of mixed precision) on tensor cores; the
            # fp32_precision API, not allow_tf32: torch refuses a mix of the two, and inductor reads only this
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            torch.backends.cudnn.conv.fp32_precision = "tf32"
        if offload and world.device.type == "cpu":
            log(rank, "fsdp.cpu_offload=true: no effect on CPU (the state is in host memory already)")
        elif offload and "OMP_NUM_THREADS" not in self.cfg.cluster.env:
            # the optimizer step and the gradient norm run on host tensors: give each rank its share of the
            # cores it may use (torchrun's default, OMP_NUM_THREADS=1, would leave them on one core each)
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world.local_world_size))
        group = f"replica group {world.group} of {world.groups}: " if world.groups > 1 else ""
        log(rank, f"{group}world {world.world_size} = {world.nodes} nodes x {world.local_world_size}, "
                  f"{self.cfg.fsdp.strategy} mesh {self.mesh_shape}, device {world.device.type}, "
                  f"restart {world.restart}")
        log(rank, f"node {world.node_rank} host {socket.gethostname()} "
                  f"({os.environ.get('FSDP_JOBS_NODE', '')})",
            all_ranks=world.local_rank == 0)

    def shard(self, model: torch.nn.Module, compile_blocks: bool = False) -> None:
        """The configured FSDP2 policy over the mesh (reshard_after_forward as the plan decides it), after
        train.float8's conversion (which must come before sharding and compiling)."""
        fsdp, tcfg = self.cfg.fsdp, self.cfg.train
        if tcfg.float8:
            swapped = float8.convert(model, tcfg.float8_recipe, self.world.device)
            eager = "" if tcfg.compile else "; without train.compile=true its casts run eagerly, often slower than bfloat16"
            log(self.world.rank, f"train.float8: {swapped} linear layers compute in float8 ({tcfg.float8_recipe} "
                                 f"scaling{', emulated: ' + float8.EMULATE_ENV if float8.emulated() else ''}{eager})")
        shard_model(model, self.mesh, fsdp, reshard_after_forward(fsdp), self.world.device,
                    compile_blocks=compile_blocks)
        self.replicas.attach(model)  # fault_tolerance=replica: gradients averaged across the groups too

    def open_checkpoints(self, manifest_extra: dict[str, Any], overlap_staging: bool) -> CheckpointManager:
        attempt = [f"{int(time.time())}-{os.getpid()}"]
        dist.broadcast_object_list(attempt, src=0)  # one name for this attempt's checkpoint dirs on every rank
        rank = self.world.rank
        self.ckpt = CheckpointManager(self.run_dir, self.ccfg.keep_last, manifest_extra, rank, attempt[0],
                                      async_save=self.ccfg.async_save, log=lambda m: log(rank, m),
                                      overlap_staging=overlap_staging,
                                      start_over_max_steps=self.ccfg.start_over_max_steps)
        return self.ckpt

    # ------------------------------------------------------------------ build and resume
    def build(self) -> None:
        """Model on meta -> sharded -> materialised (a checkpoint overwrites every parameter: only a
        fresh start pays for the seeded init) -> optimizer and schedule."""
        cfg, tcfg, rank = self.cfg, self.tcfg, self.world.rank
        torch.manual_seed(tcfg.seed)
        model = build_meta_model(cfg.model)
        model.to(dtype_of(cfg.model.dtype))
        self.shard(model, compile_blocks=tcfg.compile)
        self.open_checkpoints({"config_hash": self.config_hash()}, overlap_staging=True)
        joining = self.joins_a_running_job()  # replica groups: every group up first, or join one training
        self.snapshots = self.open_snapshots()
        self.agreement = ReplicaAgreement(self.mesh_shape, self.cfg.fault.sdc_check_interval,
                                          self.snapshots.interval(), self.world.device)
        self.snapshots.checked = self.agreement.enabled
        if self.agreement.enabled and self.agreement.auto and not self.agreement.every:
            self.snapshots.time_checks()  # memory_interval=auto chooses the check's interval too
        # where no replicas are compared, a step taken again now and then (fsdp_jobs/runtime/recheck.py)
        self.recheck = StepRecheck(self.cfg.fault.sdc_recompute_interval,
                                   not self.agreement.enabled and not self.replicas.enabled, self.world.device)
        if self.recheck.every and self.world.device.type == "cuda":  # its computations must be bitwise alike
            torch.use_deterministic_algorithms(True, warn_only=True)  # (cuBLAS's workspace: bring_up)
        self.sentinel = SpikeSentinel(self.cfg.fault.sdc_spike_factor, self.spike_checks())
        resuming = self.ccfg.resume and not joining
        self.memory_plan = self.snapshots.plan_restore(self.disk_step()) if resuming else None
        self.resume_from = self.ckpt.find_latest() if resuming and self.memory_plan is None else None
        fresh = self.resume_from is None and self.memory_plan is None
        param_device, buffer_device = init_devices(cfg.fsdp, self.world.device)
        t_init = time.perf_counter()
        materialize(model, param_device, tcfg.seed, cfg.fsdp.mixed_precision.buffer_dtype,
                    init_params=fresh, buffer_device=buffer_device)
        log(rank, f"parameters {'initialised' if fresh else 'allocated'} on {param_device} "
                  f"in {time.perf_counter() - t_init:.2f}s")
        if fresh and cfg.model.pretrained:  # model=hf: local weights replace the init
            load_pretrained_weights(model, cfg.model.pretrained, rank)
        self.model, self.n_params = model, sum(p.numel() for p in model.parameters())
        optimizer = ShardLocalAdamW(model.parameters(), lr=tcfg.lr, betas=tuple(tcfg.betas),
                                    weight_decay=tcfg.weight_decay, **adamw_implementation(param_device))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg))
        self.state = TrainState(model, optimizer, scheduler)

    def open_snapshots(self) -> MemorySnapshots:
        """checkpoint.memory_interval's snapshots, in this node's memory (fsdp_jobs/runtime/snapshots.py). Not with
        replica groups: a group that fails recovers live from the others (fsdp_jobs/runtime/replicas.py)."""
        world = self.world
        node = os.environ.get("FSDP_JOBS_NODE") or socket.gethostname()
        directory = None
        if world.groups == 1 and self.ccfg.memory_interval not in (0, "0"):
            directory = liveness.local_dir(self.run_dir, node) / "snapshots"
            liveness.make_local_dir(directory)
        job = RunDir(self.run_dir).job_file.stat()  # a rerun under the same name is another run
        identity = {"config": self.config_hash(), "run": f"{job.st_ino}-{job.st_mtime_ns}"}
        return MemorySnapshots(directory, world.rank, world.world_size, self.mesh_shape, self.ccfg.memory_interval,
                               identity, log=lambda m: log(world.rank, m),
                               record=lambda choice: self.timeline.event("memory_interval", **choice),
                               local_world_size=world.local_world_size,
                               timeout_s=float(self.tcfg.collective_timeout_s))

    def disk_step(self) -> Optional[int]:
        """Rank 0's newest committed checkpoint's step (named, not checked: memory only has to be as new)."""
        saved = committed_checkpoints(self.run_dir) if self.world.rank == 0 else []
        return saved[-1][0] if saved else None

    def resume(self) -> None:
        """The state from memory where the plan covers every rank, else from the newest checkpoint, else fresh."""
        self.beat_phase("load")
        if self.memory_plan is not None and self.restore_from_memory(self.memory_plan):
            return
        self.resumed = self.ckpt.load(self.state, self.resume_from)
        self.source = "disk" if self.resumed else "start"
        if self.snapshots.enabled:  # memory did not cover every rank: its newer snapshots are a lost future, and no
            self.snapshots.after_restore(self.state.step, self.world.local_rank)  # longer vouch for pending ones

    def restore_from_memory(self, plan: RestorePlan) -> bool:
        """Collective. True: every rank has the plan's step. False: the checkpoint is to be loaded instead
        (the snapshots are discarded: the next restart must not choose them again)."""
        began, rank = time.perf_counter(), self.world.rank
        sources = self.snapshots.restore(self.state, plan)
        if sources is None:
            self.snapshots.discard()
            self.resume_from = self.ckpt.find_latest() if self.ccfg.resume else None
            if self.resume_from is None:  # the parameters were only allocated: a restart starts afresh
                raise RuntimeError("the in-memory snapshots were unusable and the run has no checkpoint: restarting")
            return False
        self.snapshots.after_restore(self.state.step, self.world.local_rank)
        self.resumed, self.source = None, "memory" if "peer" not in sources else "memory+peers"
        self.agreed_at_resume = plan.agreed
        said = f"ranks from their own node's memory: {sources.get('memory', 0)}, from a peer's: {sources.get('peer', 0)}"
        log(rank, f"resumed from the in-memory snapshot of step {plan.step} ({said}; no checkpoint read) in "
                  f"{time.perf_counter() - began:.2f}s")
        return True

    def join(self, state: Optional[StateObjects] = None, reload: Optional[Callable[[], Optional[Path]]] = None,
             warm_up: Optional[Callable[[], None]] = None) -> None:
        """fault_tolerance=replica: this group's first quorum, at the step it loaded (the job's start, when
        every group loads the same checkpoint) or at step 0 (joining groups that train: the quorum has it
        recover their state live). Without replica groups, nothing. `state` (the built-in loop's TrainState,
        or fsdp_jobs.job's objects), `reload` (loads the newest checkpoint into it: where the groups it was to
        join are gone) and `warm_up` (a throw-away step) default to the built-in loop's.

        The group's server heartbeats the lighthouse from the moment its Manager is made, and a quorum waits
        for a group that heartbeats but has not asked yet (up to the lighthouse's join timeout): at the job's
        start every group makes its Manager, then waits for the others to have one, so the first quorum
        holds them all (made after that wait, the first group to ask trained alone for 5 steps in a test);
        a group joining groups that train makes it last, right before its first quorum (made earlier, a group
        that came back 3 s after a kill once held the others 10 s)."""
        replicas, ft = self.replicas, self.cfg.fault_tolerance  # an older job record's: the schema's defaults
        if not replicas.enabled:
            return
        if state is None:
            state, warm_up = self.state, self.warm_up_step
            reload = lambda: self.ckpt.load(self.state, self.ckpt.find_latest() if self.ccfg.resume else None)  # noqa: E731
        assert reload is not None
        rank = self.world.rank
        if not self.joining:  # the job's start: every group's server up, so the first quorum holds them all
            replicas.open(state.state_dict, state.load_state_dict, state.step, self.mesh)
            self.beat_phase(JOINING)  # only now: a group that saw it earlier asked a lighthouse that knew no other
            replicas.others_training(float(ft.join_timeout_s), phases={JOINING, "step"})
        else:  # the others wait for this group's first step in their all-reduces: not a cold one
            self.beat_phase(JOINING)
            delay = faults.step(REJOIN_DELAY_ENV)  # test fault injection: a group slow to come back
            if delay:
                log(rank, f"replica group {self.world.group}: rejoining in {delay} s ({REJOIN_DELAY_ENV})")
                time.sleep(delay)
            if warm_up is not None:
                replicas.warm_up(warm_up)
            replicas.open(state.state_dict, state.load_state_dict, state.step, self.mesh)
        t0 = time.perf_counter()
        replicas.join()
        if replicas.healed is not None:
            log(rank, f"replica group {self.world.group}: recovered live from a peer at step {state.step} in "
                      f"{time.perf_counter() - t0:.2f}s (model, optimizer, data position; no checkpoint read)")
        elif self.joining:  # the groups it saw training are gone: the newest checkpoint after all
            self.resumed = reload()
            if self.resumed is None:  # torchrun restarts this group, which then starts afresh as they did
                raise RuntimeError(f"replica group {self.world.group} joined groups that were training, but they "
                                   "were gone at its first quorum and the run has no checkpoint yet")
            replicas.manager.load_state_dict({"step": state.step, "batches_committed": 0})

    def joins_a_running_job(self) -> bool:
        """fault_tolerance=replica, before anything is loaded: wait for every replica group to be up (the
        job's start), or find another one training (then this group recovers from it: join())."""
        if self.replicas.enabled:
            self.beat_phase("start")
            self.joining = self.replicas.others_training(float(self.cfg.fault_tolerance.join_timeout_s))
        return self.joining

    def warm_up_step(self) -> None:
        """One step on a micro batch of made-up tokens, before this group joins groups that train (their
        all-reduces wait for its first real step): the first step's one-time costs (FSDP's lazy init, the
        optimizer's state and first kernels: 0.16 s against 0.003 s later for the tiny model) paid now. The
        weights and optimizer state it leaves are overwritten by the live recovery that follows (or a
        checkpoint: join())."""
        micro, _ = micro_batch(self.tcfg, self.world.job_world_size)
        seq_len, vocab = self.cfg.data.seq_len, self.cfg.model.vocab_size
        tokens = torch.randint(0, vocab, (micro, seq_len + 1), generator=torch.Generator().manual_seed(0))
        tokens = tokens.to(self.world.device)
        logits = logits_of(self.model(tokens[:, :-1]))
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
        self.state.optimizer.step()
        self.state.optimizer.zero_grad(set_to_none=True)

    def prepare_loop(self) -> None:
        """Data, batch shape, metrics; the run is recorded as running."""
        cfg, tcfg, world, state = self.cfg, self.tcfg, self.world, self.state
        self.dataset = build_dataset(cfg.data, tcfg.seed, cfg.model.vocab_size)
        # a replica job's batch is the whole job's, each group taking its ranks' slices (world.job_rank)
        self.micro, self.accum = micro_batch(tcfg, world.job_world_size)
        self.per_rank = self.micro * self.accum
        self.global_batch = self.per_rank * world.job_world_size
        seq_len = cfg.data.seq_len
        fpt = flops_per_token(self.n_params, cfg.model.n_layers, cfg.model.dim, seq_len)
        peak = mfu_peak_flops(cfg, world.device)
        if world.device.type == "cuda":  # the peak is configured, not detected: say what it is measured against
            log(world.rank, f"MFU against {peak / 1e12:g} TFLOPS per GPU (cluster.peak_tflops, peak_tflops_fp32) on "
                            f"{torch.cuda.get_device_name(world.device)}")
        # each group's rank 0 writes the lines of the steps its group writes (Replicas.writer); TensorBoard and
        # W&B hold one writer per run: the first group's
        self.metrics = MetricsWriter(RunDir(self.run_dir).metrics_file, world.rank == 0, tcfg.steps,
                                     tcfg.log_interval, Trackers(self.run_dir, cfg) if world.group == 0 else None)
        self.metrics.start(state.step + 1)  # TensorBoard/W&B: the steps after the resumed one replace earlier ones
        self.window_args = (self.per_rank * seq_len, fpt, peak)  # fit() opens the window when the steps start
        self.open_auto_interval()
        self.fail_at = faults.step(FAIL_AT_STEP_ENV)
        self.oom_at = faults.step(OOM_AT_STEP_ENV)
        self.corrupt_at = corrupt_target(faults.name(CORRUPT_AT_ENV), world)
        self.corrupt_requests = CorruptRequests()
        self.pause_s = faults.step(STEP_PAUSE_ENV) / 1000
        self.unreproducible_from = faults.step(UNREPRODUCIBLE_ENV)
        self.spike_at = faults.step(SPIKE_AT_STEP_ENV) if world.restart == 0 else 0
        poison_step = faults.step(NONFINITE_AT_STEP_ENV)  # the data position that step takes from scratch
        self.poison_position = (poison_step - 1) * self.global_batch if poison_step else None
        if world.rank == 0 and self.replicas.writer:
            runs.write_state(self.run_dir, status="running", step=state.step,
                             resumed_from=str(self.resumed) if self.resumed else
                             f"in-memory snapshot of step {state.step}" if self.source.startswith("memory") else None)
        accum = f" = {self.accum} micro batches of {self.micro}" if self.accum > 1 else ""
        log(world.rank, f"training steps {state.step + 1}..{tcfg.steps}: {self.n_params:,} params, global batch "
                        f"{self.global_batch} ({self.per_rank}/rank{accum}) x {seq_len} "
                        f"tokens, data position {state.samples_seen}")

    # ------------------------------------------------------------------ the step loop
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[tuple[torch.Tensor, Any]]:
        """Forward/backward over the micro batches, clip, update: (mean loss on the device, grad norm).
        None: a replica job's step that did not commit (fsdp_jobs/runtime/replicas.py), nothing updated."""
        state, micro, accum = self.state, self.micro, self.accum
        step_loss: Optional[torch.Tensor] = None
        for i in range(accum):  # same rows per rank as without accumulation, in micro-batch slices
            rows = slice(i * micro, (i + 1) * micro)
            logits = logits_of(self.model(inputs[rows]))  # a tensor, or an HF output object
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets[rows].flatten())
            if self.poisoned:  # test fault injection: this batch makes the loss NaN (NONFINITE_AT_STEP_ENV)
                loss = loss * float("nan")
            if self.unreproducible_from and state.step + 1 >= self.unreproducible_from:  # test fault injection
                loss = loss * (1 + int.from_bytes(os.urandom(2), "little") * 1e-9)  # (UNREPRODUCIBLE_ENV)
            if state.step + 1 == self.spike_at:  # test fault injection (SPIKE_AT_STEP_ENV)
                loss = loss * 1000
            (loss / accum if accum > 1 else loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        assert step_loss is not None
        step_loss = self.replicas.average(step_loss)  # a replica job's loss: over every group of the step
        grad_norm = None
        if self.tcfg.grad_clip:
            grad_norm = clip_grad_norm(self.model.parameters(), self.tcfg.grad_clip)
        self.ckpt.wait_staging()  # an async save's host copy overlapped this forward/backward; done before the update
        if not self.replicas.commit():  # a replica group failed during the step: taken again at the next quorum
            state.optimizer.zero_grad(set_to_none=True)
            return None
        state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.samples_seen += self.global_batch
        if self.corrupt_at == (state.step, self.world.rank) and self.world.restart == 0:
            flip_a_bit(self.model)  # test fault injection (CORRUPT_AT_ENV): one bit of this rank's state, once
            self.corrupt_at = None
        bit = self.corrupt_requests.take()  # `fsdp-jobs chaos RUN corrupt-rank R --bit K`
        if bit is not None:
            flip_a_bit(self.model, bit)
            log(self.world.rank, f"chaos: flipped bit {bit} of this rank's first parameter shard after step {state.step}",
                all_ranks=True)
        # on the device, no host sync: the stop vote carries it (fsdp_jobs/runtime/stopping.py NONFINITE)
        # (a DTensor grad norm's local part: any rank's non-finite gradient shows in its own; no collective)
        local_norm = grad_norm.to_local() if hasattr(grad_norm, "to_local") else grad_norm
        self.nonfinite = ~torch.isfinite(step_loss) if local_norm is None else ~(
            torch.isfinite(step_loss) & torch.isfinite(local_norm))
        mean_loss = step_loss.float() / accum
        # a DTensor's local norm is this rank's part: the sentinel compares the job's, a plain tensor, only
        self.spike = self.sentinel.flag(mean_loss, grad_norm if local_norm is grad_norm else None)
        return mean_loss, grad_norm

    def watch_for_stop(self, stop: StopFlag) -> None:
        """Start the stop machinery: the local flag (signals), rank 0's stop request watcher, the vote."""
        self.stop = stop
        self.stop_file = StopFileWatcher(self.run_dir, enabled=self.world.rank == 0)
        shards = self.agreement.shards  # the replica check rides the vote (fsdp_jobs/runtime/sdc.py)
        self.vote = StopVote(self.world.device, shards, self.world.rank % shards if shards else 0)
        self.early_vote: Optional[int] = None  # a vote read at a step's start for the check it carried

    def stop_agreed(self) -> int:
        """The previous cast's vote: already finished, so no stall. The same answer on every rank: 0 to go on,
        else why to stop (fsdp_jobs/runtime/stopping.py stop_reason). The local flag learns of an agreed stop,
        so that a rank stopped for another rank's signal lingers at exit (StopFlag.linger)."""
        code, self.early_vote = (self.vote.result(), None) if self.early_vote is None else (self.early_vote, None)
        if code and code != NONFINITE:
            self.stop.agreed(signalled=code != STOP_FILE)
        if self.vote.spiked:  # once: the next read (another stop_agreed in this step) clears it
            self.vote.spiked = False
            line = self.sentinel.agreed(self.voted_step)
            if self.world.rank == 0 and line:
                log(0, line)
                self.timeline.event("spike", step=self.voted_step, factor=self.sentinel.factor,
                                    checks=self.sentinel.checks)
        return code

    def spike_checks(self) -> str:
        """What follows a spike (fsdp_jobs/runtime/sentinel.py): the replica check where replicas are compared, else
        the step recheck where its steps are bitwise alike (CPU; a GPU's deterministic kernels), else nothing."""
        if self.agreement.enabled:
            return "replicas"
        if not self.replicas.enabled and (self.world.device.type != "cuda" or self.recheck.every):
            return "recheck"
        return "none"

    def cast_stop_vote(self) -> bool:
        """Vote on whether this rank was told to stop (a signal, or the stop request); returns the vote."""
        code = self.stop.received.value if self.stop.received else STOP_FILE if self.stop_file.seen.is_set() else 0
        riding = self.agreement.riding(self.state.step) if self.agreement.enabled else None  # (a script: no state)
        self.vote.cast(code, self.nonfinite, riding, self.spike)
        if self.sentinel.enabled:  # (a script's job has no state, and no sentinel)
            self.voted_step = self.state.step
        return bool(code)

    def checkpoint_due(self) -> bool:
        """checkpoint.interval steps passed, or auto's agreed step came (the final step is checkpoint.save_final's)."""
        every, step = self.ccfg.interval, self.state.step
        if self.auto is not None:
            self.auto.stepped(time.time())
            if self.next_save is None and step - self.loop_start >= interval.WARMUP_STEPS:
                self.choose_interval()
            return self.next_save is not None and step >= self.next_save and step < self.tcfg.steps
        return bool(every) and step % every == 0 and step < self.tcfg.steps

    def open_auto_interval(self) -> None:
        """checkpoint.interval=auto: rank 0 reads the run's goodput timeline once per attempt for its failures
        and saves so far (fsdp_jobs/runtime/interval.py); the first choice comes after WARMUP_STEPS steps."""
        if self.ccfg.interval != "auto":
            return
        past = interval.History()
        if self.world.rank == 0:
            timeline = [e.to_json() for e in events.read_events(RunDir(self.run_dir).goodput_file)]
            past = interval.history(timeline, self.timeline.pid)
        prior = interval.prior_mtbf_s(self.ccfg.mtbf_hours, self.world.nodes)
        self.auto, self.loop_start = interval.Planner(past, prior, MAIN_STARTED), self.state.step

    def choose_interval(self) -> None:
        """Collective: rank 0 chooses the steps to the next checkpoint and every rank takes its number."""
        assert self.auto is not None
        choice = self.auto.choose(time.time()) if self.world.rank == 0 else None
        steps = torch.tensor([choice.steps if choice else 0], dtype=torch.int64, device=self.world.device)
        dist.broadcast(steps, src=0)
        self.next_save = self.state.step + int(steps.item())
        if choice is not None:
            self.timeline.event("interval", step=self.state.step, next=self.next_save, **choice.to_json())
            if choice.steps != self.auto.said:  # a line when the interval changes, not at every save
                self.auto.said = choice.steps
                log(0, interval.describe(choice.to_json()))

    def save_checkpoint(self, state: StateObjects, wait: bool = False) -> float:
        """Collective. `wait`: the process is about to exit, the checkpoint must be committed first. Returns
        the seconds the caller was blocked."""
        self.beat_phase("save", timed=not self.ccfg.async_save)
        began = time.time()
        self.ckpt.save(state, self.mesh_shape, self.world.world_size)
        if wait:
            self.ckpt.wait()
        self.timeline.save(state.step, began)
        self.beat(state.step)
        return time.time() - began

    def beat(self, step: int) -> None:
        """Progress for the hang watchdog (fsdp_jobs/runtime/heartbeat.py): no I/O, no sync."""
        if self.heartbeat is not None:
            self.heartbeat.advance(step)

    def beat_phase(self, name: str, timed: bool = False) -> None:
        if self.heartbeat is not None:
            self.heartbeat.phase(name, timed)

    def fit(self, stop: StopFlag) -> Optional[str]:
        """Steps until train.steps or an agreed stop; returns "signal" if stopped."""
        state, world, total = self.state, self.world, self.tcfg.steps
        self.watch_for_stop(stop)
        batches = BatchPrefetcher(self.dataset, world.job_rank, self.per_rank, self.global_batch,
                                  pin=world.device.type == "cuda")
        self.window = MetricsWindow(self.metrics, world, self.ckpt.attempt, *self.window_args,
                                    slots=self.tcfg.log_interval, sentinel=self.sentinel)
        replicas = self.replicas
        stopped_by = None
        # the state this attempt began from is agreed (a checkpoint, a vouched snapshot, the start), else the check's
        # before it (an unchecked snapshot's)
        self.agreement.agreed_step = self.agreed_at_resume if self.source.startswith("memory") else state.step
        began, tries = 0.0, 0  # a replica job may take a step again: when it was first begun, how often
        while state.step < total:
            verdict = self.settle_check(early=True)  # the step before's replica check, carried by its vote
            if verdict == ROLLED_BACK:  # two replicas disagreed: the steps since the agreed state, again
                continue
            if verdict != AGREED:
                stopped_by = "sdc"
                break
            began = began or time.time()
            replicas.begin_step()  # a replica job's quorum (a group behind the others recovers here)
            quorum_at, tries = time.time(), tries + 1
            position = state.samples_seen
            inputs, targets = batches.get(position)
            if self.pause_s:
                time.sleep(self.pause_s)  # test pacing (STEP_PAUSE_ENV): as if the data came slower
            inputs, targets = inputs.to(world.device, non_blocking=True), targets.to(world.device, non_blocking=True)
            self.inject_test_faults(position)
            stepped = self.checked_step(inputs, targets)
            if stepped is None:  # not committed: the same step again, with the groups then alive
                continue
            if stepped == "sdc":  # taken again, no computation reproduced: the attempt ends before its row
                stopped_by = "sdc"
                break
            if replicas.enabled and (tries > 1 or replicas.changed):  # goodput: waited for its quorum
                self.timeline.stall(state.step, quorum_at - began, replicas.participants)
            began, tries = 0.0, 0
            self.beat(state.step)
            self.append_row(*stepped, position)
            if self.named is not None:  # taken again, nodes named: this step's row, then the end
                self.end_named()
                stopped_by = "sdc"
                break
            checkpoint_now = self.checkpoint_due()  # before the check: what is kept (snapshot, checkpoint) is checked
            self.check_and_snapshot(checkpoint_now)
            stopping = self.stop_agreed()  # the step before's vote
            self.cast_stop_vote()  # this step's, its non-finite flag included
            if stopping != NONFINITE and (stopping or checkpoint_now or state.step == total):
                stopping = max(stopping, self.stop_agreed())  # before any save: never weights a NaN step made
                verdict = self.settle_check(early=False, stopping=bool(stopping))  # nor state the replicas did not agree on
                if verdict == ROLLED_BACK:
                    continue
                if verdict != AGREED:
                    stopped_by = "sdc"
                    break
            if stopping == NONFINITE:
                if self.after_nonfinite():
                    stopped_by = "nonfinite"
                    break
                continue
            self.write_rows(bool(stopping) or checkpoint_now or state.step % self.tcfg.log_interval == 0
                            or state.step == total)
            if stopping:
                stopped_by = "signal"
                why = stop.received.name if stop.received else stop_reason(stopping)
                log(world.rank, f"stop requested ({why}): checkpointing at step {state.step}")
                if replicas.writer:  # one group writes a replica job's checkpoints: they are all the same model
                    self.save_checkpoint(state, wait=True)
                break
            if checkpoint_now and replicas.writer:
                blocked = self.save_checkpoint(state)
                if self.auto is not None:  # checkpoint.interval=auto: weigh this save, choose again
                    self.auto.saved(blocked, time.time())
                    self.choose_interval()
        self.vote.result()  # every rank cast the same number of votes: drain the last one
        self.agreement.drop()  # and launched the same checks (a stop's step settled its own)
        batches.close()
        return stopped_by

    def checked_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> Any:
        """`train_step`, taken again where the step recheck is due (fsdp_jobs/runtime/recheck.py): its result (None:
        a replica job's step not committed), or "sdc" where no two computations of it agreed (the state before it
        kept, the attempt ended: `sdc_end`). Where nodes were named, `named` holds what named them."""
        recheck = self.recheck
        if not recheck.due(self.state.step + 1) and not self.sentinel.check_now("recheck"):
            return self.train_step(inputs, targets)
        recheck.keep(self.state, self.model)
        self.train_step(inputs, targets)  # the first computation: `confirm` compares the next with it
        stepped, found = recheck.confirm(self.state, self.model, lambda: self.train_step(inputs, targets))
        say = functools.partial(log, self.world.rank)
        if found is not None and found.how == "rerun-unresolved":  # trained on from the computations that agreed
            settle(found, self.world, self.timeline, say)
        elif found is not None and found.how == "rerun":  # the step's row first, then the end (`end_named`)
            self.named = found
        elif found is not None:  # no two alike: back to the state before the step, kept, and the attempt ends
            recheck.put_back(self.state, self.model)
            self.write_rows(True)  # the rows before the step
            found.agreed_step = self.keep_trusted_state()
            self.sdc_end = respond(found, self.run_dir, self.cfg, self.world, self.snapshots, self.timeline, say) \
                if found.names_nodes else stop_unnamed(found, self.run_dir, self.world, self.snapshots, self.timeline,
                                                       say)
            stepped = "sdc"
        recheck.release()
        return stepped

    def end_named(self) -> None:
        """Collective, after the step recheck named nodes: the step's rows written, its state (the computations
        that agreed) kept where whoever takes over goes on from, and the nodes replaced or the job stopped."""
        found = self.named
        assert found is not None
        self.write_rows(True)
        found.agreed_step = self.keep_trusted_state()
        say = functools.partial(log, self.world.rank)
        self.sdc_end = respond(found, self.run_dir, self.cfg, self.world, self.snapshots, self.timeline, say)

    def keep_trusted_state(self) -> int:
        """Collective: the current state kept where any restart resumes from it: a checkpoint, which outlives the
        nodes (a stopped job's, a replaced node's without buddy copies), and an in-memory snapshot for a restart
        on the same nodes; every earlier save finished first. Its step."""
        self.ckpt.wait()
        if self.snapshots.enabled:
            self.snapshots.save(self.state, self.world.restart)
        self.save_checkpoint(self.state, wait=True)
        self.ckpt.close()
        return self.state.step

    def append_row(self, loss: torch.Tensor, grad_norm: Any, position: int) -> None:
        """The step's metrics row, held on the device until written (`write_rows`)."""
        state, replicas = self.state, self.replicas
        self.window.append(loss, grad_norm, {"step": state.step, "lr": state.scheduler.get_last_lr()[0],
                                             "sample_start": position, "time": time.time(),
                                             "world_size": replicas.job_world_size(), "writer": replicas.writer})

    def write_rows(self, logged: bool) -> None:
        """The metrics rows of the steps since the last written, where this step's are `logged` (a replica group
        writes every step: one that dies loses no line), and the goodput timeline's window of them, at the
        flush's sync. A checked step's rows wait for its verdict (settle_check): no attempt reaches a step it
        has no row of."""
        if self.agreement.pending is not None:
            return
        if logged or self.replicas.enabled:
            self.window.flush()
        if logged:
            self.timeline.steps(self.state.step)

    def inject_test_faults(self, position: int) -> None:
        """The test variables' faults at the step about to be taken (fsdp_jobs/planning/faults.py)."""
        state, world = self.state, self.world
        if self.fail_at and state.step + 1 >= self.fail_at:
            raise RuntimeError(f"test fault injection: step {state.step + 1} raises ({FAIL_AT_STEP_ENV})")
        if self.oom_at == state.step + 1 and world.rank == world.world_size - 1 and world.restart == 0:
            exhaust_memory()  # test fault injection (OOM_AT_STEP_ENV): the kernel's OOM killer ends this rank
        self.poisoned = position == self.poison_position

    def check_and_snapshot(self, checkpoint_now: bool) -> None:
        """The replica check where due (fault.sdc_check_interval; a checkpoint's step and the last are always
        checked), launched and settled at the next step's start or before a save; and the in-memory snapshot where
        due, pending where checked: vouched for once the check agrees (fsdp_jobs/runtime/sdc.py)."""
        state = self.state
        keeping = checkpoint_now or state.step == self.tcfg.steps
        checking = self.agreement.due(state.step, keeping, self.snapshots.measuring_checks(state.step)) \
            or self.sentinel.check_now("replicas")
        # a checked step keeps a snapshot (a rollback's target); so does a checkpoint's: a recovery takes memory
        # only where it is no older than the newest checkpoint, so a rank killed just after a save between two
        # snapshots was reloaded from disk
        snapshot_due = self.snapshots.enabled and (self.snapshots.due(state.step) or checkpoint_now or checking)
        if checking:
            self.agreement.launch(state.step, state_tensors(self.model, state.optimizer))
        if snapshot_due:
            if not checking:  # the rows of the steps the snapshot keeps: a resume from it starts after them
                self.window.flush()  # (checked: flushed with the verdict, right before the snapshot is vouched for)
            self.snapshots.save(state, self.world.restart, commit=not checking, checked=checking,
                                check_s=self.agreement.took())
            if self.snapshots.check_every and not self.agreement.every:
                self.agreement.space(self.snapshots.check_every)

    def settle_check(self, early: bool, stopping: bool = False) -> str:
        """Where a replica check was launched (fsdp_jobs/runtime/sdc.py), its verdict from the vote that carried
        it: read here at a step's start (`early`; stop_agreed returns it later), else just read by stop_agreed;
        `stopping`: the step is kept for a stop, so it is checked now if it was not already.
        AGREED (the snapshot it vouched for committed; also where none was under way); ROLLED_BACK: two replicas
        disagreed, and this process went back to the agreed state to take the steps since again (the
        recomputation that tells which one is wrong); else "sdc": nodes were named, the state since the last
        agreed check set aside (`sdc_end`: how the attempt ends)."""
        if self.agreement.pending is None and stopping and self.agreement.enabled:  # a stop's checkpoint: checked
            self.agreement.launch(self.state.step, state_tensors(self.model, self.state.optimizer), gather=True)
        if self.agreement.pending is None:
            return AGREED
        began = time.perf_counter()
        if early:
            self.early_vote = self.stop_agreed()
        step, found = self.agreement.settle(self.vote.disagreed)
        self.window.flush()  # the checked steps' rows: none appears before its step is kept (or set aside)
        self.timeline.steps(step)
        self.agreement.read_took(time.perf_counter() - began)
        if (found is None or found.agreed_step == step) and self.vote.code != NONFINITE:  # agreed, finite
            self.snapshots.vouch()
        say = functools.partial(log, self.world.rank)
        if found is None:
            return AGREED
        if found.how == "unresolved":  # recomputed and agreed, no node to name: train on from the agreed state
            settle(found, self.world, self.timeline, say)
            return AGREED
        self.early_vote = None  # a stop is voted again (its flags stay set): the steps it came at are gone
        if found.how == "pair":  # no majority: recompute, in process; with nothing agreed to go back to, restart
            if self.roll_back_for(found):
                return ROLLED_BACK
            raise RuntimeError(f"{describe(found, ['their nodes'])}: no agreed state to recompute from")
        self.ckpt.close()  # a background save committed (then set aside) or not at all; the pruning done
        self.sdc_end = respond(found, self.run_dir, self.cfg, self.world, self.snapshots, self.timeline, say)
        return "sdc"

    def roll_back_for(self, found: Mismatch) -> bool:
        """Collective: the state newer than the last agreed check set aside, and this process back at the newest
        agreed state (its node's snapshot, else the newest checkpoint a check vouched for) with the recomputation
        to judge at `found.step`: in process, since a restart deals nodes and ranks anew (ARCHITECTURE pitfall
        28). False where neither covers every rank (the attempt then ends, and the restart resumes from what is
        left, unjudged: no node named)."""
        state, rank = self.state, self.world.rank
        self.ckpt.wait()  # a background save of an earlier step: committed before it is judged
        line, _ = set_aside_newer(found, self.run_dir, self.world, self.snapshots, self.timeline)
        plan = self.snapshots.plan_restore(self.disk_step())
        if plan is not None and self.snapshots.restore(state, plan) is not None:
            self.snapshots.after_restore(state.step, self.world.local_rank)
            source = "its in-memory snapshot"
        else:
            last = self.ckpt.find_latest()  # collective: the same answer on every rank
            if last is None:
                log(rank, f"{line}; no agreed state to recompute from: restarting")
                return False
            self.ckpt.load(state, last)
            self.snapshots.discard()
            source = last.name
        self.agreement.recompute(found, state.step)
        log(rank, f"{line}; every rank rolls back to step {state.step} ({source}) and takes the steps to "
                  f"{found.step} again: the replica that does not reproduce its own state is the corrupted one")
        return True

    def after_nonfinite(self) -> bool:
        """The vote says this step or the one before went non-finite. train.on_nonfinite=rollback: reload
        the newest checkpoint (each holds finite weights: fit() never saves after such a step) and skip the
        batches since; False: go on. Otherwise (stop, a third rollback, no checkpoint yet, replica groups,
        which would have to roll back together) record the job as failed and return True: the ranks then
        exit 0 so that no restart repeats it (launchers/node/wrapper.py reports the failure)."""
        state, rank, policy = self.state, self.world.rank, self.tcfg.on_nonfinite
        self.agreement.drop()  # a check of weights a rollback replaces, or a stop leaves unkept
        self.window.flush()  # the steps' rows, their non-finite loss included: what happened
        self.vote.result()  # this step's vote, if still pending: about weights a rollback replaces (a signal or
        # the stop request is voted again at the next step: the flags stay set)
        bad_at, position = state.step, state.samples_seen
        self.ckpt.wait()  # a background save of an earlier step (finite: it was checked before it began)
        rolls = policy == "rollback" and self.rollbacks < MAX_ROLLBACKS and not self.replicas.enabled
        last = self.ckpt.find_latest() if rolls else None  # collective (the same answer on every rank), checked
        if last is None:
            tried = f", after {self.rollbacks} rollbacks" if self.rollbacks else ""
            newest = newest_checkpoint(self.run_dir)  # only named: rank 0's line and record
            why = (f"the loss or gradient norm became non-finite by step {bad_at} (train.on_nonfinite={policy}"
                   f"{tried}); the newest checkpoint, {newest.name if newest else 'none'}, holds finite weights")
            if rank == 0:
                runs.write_state(self.run_dir, status="failed", reason=why, step=bad_at)
            log(rank, f"stopping: {why}")
            return True
        self.ckpt.load(state, last)
        self.snapshots.discard()  # they hold the steps this rollback undoes
        self.agreement.rolled_back_to(state.step)
        skipped, state.samples_seen = position - state.samples_seen, position
        self.rollbacks += 1
        log(rank, f"non-finite loss or gradient norm by step {bad_at}: rolled back to {last.name} (step {state.step}) "
                  f"and skipping the {skipped} samples since (train.on_nonfinite=rollback, {self.rollbacks} of "
                  f"{MAX_ROLLBACKS})")
        return False

    def finish(self, stopped_by: Optional[str]) -> None:
        """The final checkpoint and probe of a finished run, the run's record."""
        state, rank = self.state, self.world.rank
        writer = self.replicas.writer  # of a replica job, the group first in the last step's quorum
        self.beat_phase("finish")
        began = time.time()
        if stopped_by is None and self.ccfg.save_final and writer:
            self.save_checkpoint(state)
        self.ckpt.wait()
        self.timeline.save(state.step, began)  # the final save and the wait for a background one
        if stopped_by is None and writer:
            # after the final commit: it may OOM
            save_probe(self.run_dir, self.model, self.dataset, state.step, self.world)
        self.ckpt.close()
        self.snapshots.close()
        self.metrics.close()
        self.replicas.close()
        if rank == 0 and self.agreement.enabled:  # what the check did: a healthy run says so, not nothing
            log(rank, f"replica check: every shard's replicas agreed at {self.agreement.agreed} of the "
                      f"{self.agreement.checked} steps checked in this attempt")
        if rank == 0 and (self.recheck.every or self.recheck.checked):
            each = self.recheck.spent_s / max(self.recheck.checked, 1)
            log(rank, f"step recheck: {self.recheck.reproduced} of the {self.recheck.checked} steps taken again in "
                      f"this attempt reproduced on every rank (fault.sdc_recompute_interval={self.recheck.every}, "
                      f"{self.sentinel.spikes} spike(s); {each:.3f} s a check on this rank)")
        if rank == 0 and writer and stopped_by != "nonfinite":  # that one recorded its failure (after_nonfinite)
            saved = newest_checkpoint(self.run_dir)  # the final save may have failed (a full disk): say which
            if saved != step_dir(self.ckpt.root, state.step) and (self.ccfg.save_final or stopped_by):
                log(rank, f"the checkpoint of step {state.step} could not be saved; the newest is "
                          f"{saved.name if saved else 'none'}")
            runs.write_state(self.run_dir, status="preempted" if stopped_by else "completed", step=state.step,
                             checkpoint=str(saved) if saved else None)
            log(rank, f"{'stopped' if stopped_by else 'done'} at step {state.step}")


def exhaust_memory() -> None:
    """Test fault injection: touch 64 MiB after 64 MiB until the kernel's OOM killer (or a MemoryError) ends it."""
    hog = []
    while True:
        hog.append(b"\1" * (64 << 20))


@torch.no_grad()
def save_probe(run_dir: Path, model: torch.nn.Module, dataset: Any, step: int, world: World) -> None:
    """Logits of the final sharded model on a small fixed batch (2 x PROBE_TOKENS): what an exported
    plain model must reproduce. A forward under FSDP is collective, so every rank runs it; only
    rank 0 copies its result to the host and writes the probe (RunDir.probe_file)."""
    inputs = torch.stack([dataset[i][:PROBE_TOKENS] for i in range(2)]).to(world.device)
    logits = logits_of(model(inputs))
    if world.rank == 0:
        probe = RunDir(run_dir).probe_file
        tmp = probe.with_name(f".{probe.name}.tmp")
        torch.save({"step": step, "inputs": inputs.cpu(), "logits": logits.float().cpu()}, tmp)
        os.replace(tmp, probe)
