"""What every rank runs under torchrun, top to bottom: world -> mesh -> model -> shard -> resume ->
train -> checkpoint -> exit. Started as `python -m fsdp_jobs.runtime RUN_DIR`."""

from __future__ import annotations

import gc
import json
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf

from fsdp_jobs import faults, runs
from fsdp_jobs.checkpoints import step_dir
from fsdp_jobs.plan import STRATEGY_TABLE, compute_dtype, micro_batch
from fsdp_jobs.runtime.checkpoint import CheckpointManager, TrainState
from fsdp_jobs.runtime.data import build_dataset
from fsdp_jobs.runtime.mesh import World, build_mesh, init_process_group, read_world
from fsdp_jobs.runtime.metrics import MetricsWriter, flops_per_token, log, peak_memory_gb
from fsdp_jobs.runtime.prefetch import BatchPrefetcher
from fsdp_jobs.runtime.shard import build_meta_model, dtype_of, init_devices, materialize, shard_model
from fsdp_jobs.runtime.signals import StopFlag
from fsdp_jobs.runtime.outputs import load_pretrained_weights, logits_of

# test-only fault injection: the training step raises from this step on (a job that cannot progress)
FAIL_AT_STEP_ENV = "FSDP_JOBS_TEST_FAIL_AT_STEP"


def lr_lambda(train: dict[str, Any]):  # type: ignore[no-untyped-def]
    warmup, total, floor, kind = train["warmup_steps"], train["steps"], train["min_lr_ratio"], train["lr_schedule"]

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
    d = run_dir / "ranks"
    d.mkdir(exist_ok=True)
    info = {"rank": world.rank, "pid": os.getpid(), "uid": os.getuid(), "host": socket.gethostname(),
            "node_rank": world.node_rank,
            "node": os.environ.get("FSDP_JOBS_NODE") or os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "restart": world.restart, "world_size": world.world_size, "time": time.time()}
    runs.write_atomic(d / f"rank-{world.rank}.json", json.dumps(info) + "\n")


class StopFileWatcher:
    """Rank 0 looks for the launcher's stop-request file in a thread, so a slow shared file system
    never stalls the step loop (and with it every other rank)."""

    def __init__(self, run_dir: Path, enabled: bool, period_s: float = 0.5) -> None:
        self.seen = threading.Event()
        if enabled:
            threading.Thread(target=self._poll, args=(run_dir, period_s), daemon=True, name="stop-file").start()

    def _poll(self, run_dir: Path, period_s: float) -> None:
        while not self.seen.is_set():
            if runs.stop_requested(run_dir):
                self.seen.set()
            time.sleep(period_s)


class StopVote:
    """"Has any rank been told to stop?", agreed without stalling the host: each step issues a
    non-blocking all-reduce of the local flag; the next step reads it (by then long finished, so on
    GPU the host waits for the previous step only, and the device queue never drains). All ranks
    read the same step's vote, so they stop at the same step, one step after the signal."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.pending = device, None
        if device.type == "cuda":  # one pinned slot and one event, reused: result() runs before cast()
            self.host, self.event = torch.empty(1, pin_memory=True), torch.cuda.Event()

    def cast(self, local: bool) -> None:
        # torch.full is a fill kernel; torch.tensor(..., device=cuda) would be a synchronous copy
        flag = torch.full((1,), 1.0 if local else 0.0, device=self.device)
        work = dist.all_reduce(flag, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # orders the current stream after the reduce; does not block the host
            self.host.copy_(flag, non_blocking=True)
            self.event.record()
            self.pending = (self.event, self.host)
        else:
            self.pending = (work, flag)

    def result(self) -> bool:
        if self.pending is None:
            return False
        done, value = self.pending
        self.pending = None
        if isinstance(done, torch.cuda.Event):
            done.synchronize()
        else:
            done.wait()
        return bool(value.item() > 0)


def mfu_peak_flops(job: dict[str, Any], device: torch.device) -> float:
    """The accelerator's peak at the dtype the matmuls actually run in (bf16 vs fp32/TF32)."""
    cl = job["cluster"]
    dtype = compute_dtype(OmegaConf.create(job), device.type)
    if dtype in ("bfloat16", "float16"):
        return cl["peak_tflops"] * 1e12
    return (cl.get("peak_tflops_fp32") or cl["peak_tflops"] / 2) * 1e12


def train(run_dir: Path, stop: StopFlag) -> int:
    job = runs.load_job(run_dir)
    tcfg, ccfg = job["train"], job["checkpoint"]
    world = read_world(job["cluster"]["device"])
    offload = bool(job["fsdp"].get("cpu_offload"))
    # CPU offload: the grad-norm all-reduce runs on host tensors, so the default group needs gloo too
    init_process_group(world, cpu_collectives=offload)
    if world.device.type == "cuda":
        # fp32 matmuls (float32 compute, the fp32 parts of mixed precision) on tensor cores; the
        # fp32_precision API, not allow_tf32: torch refuses a mix of the two, and inductor reads only this
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    write_rank_file(run_dir, world)
    rank = world.rank
    # TORCHELASTIC_RESTART_COUNT is per agent: a node whose workers were stopped for a re-rendezvous
    # (another node's rank died) does not count it (env-notes pitfall 6). The job's attempt number
    # is the largest count of any node: agree on it once, so metrics and logs say the same everywhere
    restarts = torch.tensor([world.restart], device=world.device)
    dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
    world.restart = int(restarts.item())
    if offload and world.device.type == "cpu":
        log(rank, "fsdp.cpu_offload=true: no effect on CPU (the state is in host memory already)")
    elif offload and "OMP_NUM_THREADS" not in job["cluster"]["env"]:
        # the optimizer step and the gradient norm run on host tensors: give each rank its share of the
        # cores it may use (torchrun's default, OMP_NUM_THREADS=1, would leave them on one core each)
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world.local_world_size))

    mesh = build_mesh(job, world)
    mesh_shape = dict(zip(mesh.mesh_dim_names or (), mesh.mesh.shape))
    log(rank, f"world {world.world_size} = {world.nodes} nodes x {world.local_world_size}, "
              f"{job['fsdp']['strategy']} mesh {mesh_shape}, device {world.device.type}, "
              f"restart {world.restart}")
    log(rank, f"node {world.node_rank} host {socket.gethostname()} "
              f"({os.environ.get('SLURMD_NODENAME') or os.environ.get('FSDP_JOBS_NODE', '')})", all_ranks=world.local_rank == 0)

    torch.manual_seed(tcfg["seed"])
    model = build_meta_model(job["model"])
    model.to(dtype_of(job["model"]["dtype"]))
    reshard = job["fsdp"]["reshard_after_forward"]
    reshard = STRATEGY_TABLE[job["fsdp"]["strategy"]][1] if reshard is None else bool(reshard)
    shard_model(model, mesh, job["fsdp"], reshard, world.device, compile_blocks=bool(tcfg.get("compile")))

    attempt = [f"{int(time.time())}-{os.getpid()}"]
    dist.broadcast_object_list(attempt, src=0)  # one name for this attempt's checkpoint dirs on every rank
    ckpt = CheckpointManager(run_dir, ccfg["keep_last"], {"config_hash": runs.job_hash(job)}, rank, attempt[0],
                             async_save=ccfg["async_save"], log=lambda m: log(rank, m), overlap_staging=True)
    resume_from = ckpt.find_latest() if ccfg["resume"] else None
    # a checkpoint overwrites every parameter: only a fresh start pays for the seeded init
    param_device, buffer_device = init_devices(job["fsdp"], world.device)
    t_init = time.perf_counter()
    materialize(model, param_device, tcfg["seed"], job["fsdp"]["mixed_precision"].get("buffer_dtype"),
                init_params=resume_from is None, buffer_device=buffer_device)
    log(rank, f"parameters {'initialised' if resume_from is None else 'allocated'} on {param_device} "
              f"in {time.perf_counter() - t_init:.2f}s")
    if resume_from is None and job["model"].get("pretrained"):  # model=hf: local weights replace the init
        load_pretrained_weights(model, job["model"]["pretrained"], rank)
    n_params = sum(p.numel() for p in model.parameters())

    optimizer = torch.optim.AdamW(model.parameters(), lr=tcfg["lr"], betas=tuple(tcfg["betas"]),
                                  weight_decay=tcfg["weight_decay"], foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg))
    state = TrainState(model, optimizer, scheduler)

    resumed = ckpt.load(state, resume_from)

    dataset = build_dataset(job["data"], tcfg["seed"], job["model"]["vocab_size"])
    micro, accum = micro_batch(OmegaConf.create(tcfg), world.world_size)
    per_rank = micro * accum
    global_batch = per_rank * world.world_size
    seq_len = job["data"]["seq_len"]
    fpt = flops_per_token(n_params, job["model"]["n_layers"], job["model"]["dim"], seq_len)
    peak = mfu_peak_flops(job, world.device)
    if world.device.type == "cuda":  # the peak is configured, not detected: say what it is measured against
        log(rank, f"MFU against {peak / 1e12:g} TFLOPS per GPU (cluster.peak_tflops, peak_tflops_fp32) on "
                  f"{torch.cuda.get_device_name(world.device)}")
    total = tcfg["steps"]
    metrics = MetricsWriter(run_dir / runs.METRICS_FILE, rank == 0, total, tcfg["log_interval"])
    fail_at = faults.step(FAIL_AT_STEP_ENV)
    if rank == 0:
        runs.write_state(run_dir, status="running", step=state.step, resumed_from=str(resumed) if resumed else None)
    log(rank, f"training steps {state.step + 1}..{total}: {n_params:,} params, global batch {global_batch} "
              f"({per_rank}/rank{f' = {accum} micro batches of {micro}' if accum > 1 else ''}) x {seq_len} "
              f"tokens, data position {state.samples_seen}")

    stop_file = StopFileWatcher(run_dir, enabled=rank == 0)
    batches = BatchPrefetcher(dataset, rank, per_rank, global_batch, pin=world.device.type == "cuda")
    vote = StopVote(world.device)
    # per-step values stay on the device until the next log/checkpoint step (one host sync there)
    window: list[tuple[torch.Tensor, Any, dict[str, Any]]] = []
    t_window = time.perf_counter()

    def flush() -> None:
        """Agree on the buffered losses (one all-reduce, one host sync) and write their lines."""
        nonlocal window, t_window
        if not window:
            return
        losses = torch.stack([w[0] for w in window])
        dist.all_reduce(losses)
        norms = [w[1].full_tensor() if hasattr(w[1], "full_tensor") else w[1] for w in window]
        norm_values = torch.stack(norms).float().tolist() if norms[0] is not None else [None] * len(window)
        loss_values = (losses / world.world_size).tolist()
        dt = (time.perf_counter() - t_window) / len(window)  # host and device agree only over a window
        tokens_per_s = global_batch * seq_len / dt
        mem = peak_memory_gb(world.device)
        for (_, _, rec), loss_value, norm_value in zip(window, loss_values, norm_values):
            metrics.write({"step": rec["step"], "loss": loss_value, "lr": rec["lr"], "grad_norm": norm_value,
                           "tokens_per_s": tokens_per_s, "mfu": tokens_per_s / world.world_size * fpt / peak,
                           "peak_mem_gb": mem, "step_time_s": dt, "sample_start": rec["sample_start"],
                           "world_size": world.world_size, "restart": world.restart, "attempt": attempt[0],
                           "time": rec["time"]})
        window, t_window = [], time.perf_counter()

    stopped_by = None
    while state.step < total:
        position = state.samples_seen
        inputs, targets = batches.get(position)
        inputs, targets = inputs.to(world.device, non_blocking=True), targets.to(world.device, non_blocking=True)
        if fail_at and state.step + 1 >= fail_at:
            raise RuntimeError(f"test fault injection: step {state.step + 1} raises ({FAIL_AT_STEP_ENV})")
        step_loss = None
        for i in range(accum):  # same rows per rank as without accumulation, in micro-batch slices
            rows = slice(i * micro, (i + 1) * micro)
            logits = logits_of(model(inputs[rows]))  # a tensor, or an HF output object
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets[rows].flatten())
            (loss / accum if accum > 1 else loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        assert step_loss is not None
        grad_norm = None
        if tcfg["grad_clip"]:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"])
        ckpt.wait_staging()  # an async save's host copy overlapped this forward/backward; done before the update
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.samples_seen += global_batch
        window.append((step_loss.float() / accum, grad_norm, {"step": state.step, "lr": scheduler.get_last_lr()[0],
                                                              "sample_start": position, "time": time.time()}))

        stopping = vote.result()  # last step's vote: already finished, so no stall
        vote.cast(stop.set or stop_file.seen.is_set())
        checkpoint_now = bool(ccfg["interval"]) and state.step % ccfg["interval"] == 0 and state.step < total
        if stopping or checkpoint_now or state.step % tcfg["log_interval"] == 0 or state.step == total:
            flush()
        if stopping:
            stopped_by = "signal"
            why = stop.received.name if stop.received else "stop-request file" if stop_file.seen.is_set() \
                else "by another rank"
            log(rank, f"stop requested ({why}): "
                      f"checkpointing at step {state.step}")
            ckpt.save(state, mesh_shape, world.world_size)
            ckpt.wait()
            break
        if checkpoint_now:
            ckpt.save(state, mesh_shape, world.world_size)
    vote.result()  # every rank cast the same number of votes: drain the last one
    batches.close()

    if stopped_by is None and ccfg["save_final"]:
        ckpt.save(state, mesh_shape, world.world_size)
    ckpt.wait()
    if stopped_by is None:
        save_probe(run_dir, model, dataset, state.step, world)  # after the final commit: it may OOM
    ckpt.close()
    metrics.close()
    if rank == 0:
        runs.write_state(run_dir, status="preempted" if stopped_by else "completed", step=state.step,
                    checkpoint=str(step_dir(ckpt.root, state.step)))
        log(rank, f"{'stopped' if stopped_by else 'done'} at step {state.step}")
    return 0


PROBE_TOKENS = 16  # positions per probe sequence: enough to check an export, small at any vocab size


@torch.no_grad()
def save_probe(run_dir: Path, model: torch.nn.Module, dataset: Any, step: int, world: World) -> None:
    """Logits of the final sharded model on a small fixed batch (2 x PROBE_TOKENS): what an exported
    plain model must reproduce. A forward under FSDP is collective, so every rank runs it; only
    rank 0 copies its result to the host and writes probe.pt."""
    inputs = torch.stack([dataset[i][:PROBE_TOKENS] for i in range(2)]).to(world.device)
    logits = logits_of(model(inputs))
    if world.rank == 0:
        tmp = run_dir / ".probe.pt.tmp"
        torch.save({"step": step, "inputs": inputs.cpu(), "logits": logits.float().cpu()}, tmp)
        os.replace(tmp, run_dir / "probe.pt")


def shutdown(code: int) -> None:
    """Leave without the FSDP2+gloo abort at interpreter exit (env-notes pitfall 2): collect the
    objects gloo's thread still references, destroy the group, then skip interpreter teardown."""
    gc.collect()
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
