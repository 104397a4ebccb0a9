"""What every rank runs under torchrun, top to bottom: world -> mesh -> model -> shard -> resume ->
train -> checkpoint -> exit. Started as `python -m fsdp_jobs.runtime RUN_DIR`."""

from __future__ import annotations

import gc
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf

from fsdp_jobs import runs
from fsdp_jobs.plan import STRATEGY_TABLE, per_rank_batch_size
from fsdp_jobs.runtime.checkpoint import CheckpointManager, TrainState
from fsdp_jobs.runtime.data import build_dataset, rank_batch
from fsdp_jobs.runtime.mesh import World, build_mesh, init_process_group, read_world
from fsdp_jobs.runtime.metrics import MetricsWriter, flops_per_token, log, peak_memory_gb
from fsdp_jobs.runtime.shard import build_meta_model, dtype_of, materialize, shard_model
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


def train(run_dir: Path, stop: StopFlag) -> int:
    job = runs.load_job(run_dir)
    tcfg, ccfg = job["train"], job["checkpoint"]
    world = read_world(job["cluster"]["device"])
    init_process_group(world)
    write_rank_file(run_dir, world)
    rank = world.rank

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
    shard_model(model, mesh, job["fsdp"], reshard, world.device)

    attempt = [f"{int(time.time())}-{os.getpid()}"]
    dist.broadcast_object_list(attempt, src=0)  # one name for this attempt's checkpoint dirs on every rank
    ckpt = CheckpointManager(run_dir, ccfg["keep_last"], {"config_hash": runs.job_hash(job)}, rank, attempt[0],
                             async_save=ccfg["async_save"], log=lambda m: log(rank, m))
    resume_from = ckpt.find_latest() if ccfg["resume"] else None
    # a checkpoint overwrites every parameter: only a fresh start pays for the seeded init
    materialize(model, world.device, tcfg["seed"], job["fsdp"]["mixed_precision"].get("buffer_dtype"),
                init_params=resume_from is None)
    if resume_from is None and job["model"].get("pretrained"):  # model=hf: local weights replace the init
        load_pretrained_weights(model, job["model"]["pretrained"], rank)
    n_params = sum(p.numel() for p in model.parameters())

    optimizer = torch.optim.AdamW(model.parameters(), lr=tcfg["lr"], betas=tuple(tcfg["betas"]),
                                  weight_decay=tcfg["weight_decay"], foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg))
    state = TrainState(model, optimizer, scheduler)

    resumed = ckpt.load(state, resume_from)

    dataset = build_dataset(job["data"], tcfg["seed"], job["model"]["vocab_size"])
    per_rank = per_rank_batch_size(OmegaConf.create(tcfg), world.world_size)
    global_batch = per_rank * world.world_size
    seq_len = job["data"]["seq_len"]
    fpt = flops_per_token(n_params, job["model"]["n_layers"], job["model"]["dim"], seq_len)
    peak = job["cluster"]["peak_tflops"] * 1e12
    total = tcfg["steps"]
    metrics = MetricsWriter(run_dir / runs.METRICS_FILE, rank == 0, total, tcfg["log_interval"])
    fail_at = int(os.environ.get(FAIL_AT_STEP_ENV, "0") or 0)
    if rank == 0:
        runs.write_state(run_dir, status="running", step=state.step, resumed_from=str(resumed) if resumed else None)
    log(rank, f"training steps {state.step + 1}..{total}: {n_params:,} params, global batch {global_batch} "
              f"({per_rank}/rank) x {seq_len} tokens, data position {state.samples_seen}")

    stopped_by = None
    while state.step < total:
        t0 = time.perf_counter()
        position = state.samples_seen
        inputs, targets = rank_batch(dataset, position, rank, per_rank)
        inputs, targets = inputs.to(world.device), targets.to(world.device)
        if fail_at and state.step + 1 >= fail_at:
            raise RuntimeError(f"test fault injection: step {state.step + 1} raises ({FAIL_AT_STEP_ENV})")
        logits = logits_of(model(inputs))  # a tensor, or an HF output object
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        grad_norm = None
        if tcfg["grad_clip"]:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.samples_seen += global_batch

        # one all-reduce per step carries the mean loss and "has any rank been told to stop?"
        stopping = stop.set or (rank == 0 and runs.stop_requested(run_dir))
        flag = torch.tensor(1.0 if stopping else 0.0, device=world.device)
        sync = torch.stack([loss.detach().float(), flag])  # stays on the device: one sync, after the reduce
        dist.all_reduce(sync)
        dt = time.perf_counter() - t0
        tokens_per_s = global_batch * seq_len / dt
        metrics.write({
            "step": state.step, "loss": sync[0].item() / world.world_size, "lr": scheduler.get_last_lr()[0],
            "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if grad_norm is not None else None,
            "tokens_per_s": tokens_per_s, "mfu": tokens_per_s / world.world_size * fpt / peak,
            "peak_mem_gb": peak_memory_gb(world.device), "step_time_s": dt, "sample_start": position,
            "world_size": world.world_size, "restart": world.restart, "attempt": attempt[0], "time": time.time(),
        })
        if sync[1].item() > 0:
            stopped_by = "signal"
            why = stop.received.name if stop.received else "stop-request file" if stopping else "by another rank"
            log(rank, f"stop requested ({why}): "
                      f"checkpointing at step {state.step}")
            ckpt.save(state, mesh_shape, world.world_size)
            ckpt.wait()
            break
        if ccfg["interval"] and state.step % ccfg["interval"] == 0 and state.step < total:
            ckpt.save(state, mesh_shape, world.world_size)

    if stopped_by is None and ccfg["save_final"]:
        ckpt.save(state, mesh_shape, world.world_size)
    if stopped_by is None:
        save_probe(run_dir, model, dataset, state.step, world)
    ckpt.wait()
    metrics.close()
    if rank == 0:
        runs.write_state(run_dir, status="preempted" if stopped_by else "completed", step=state.step,
                    checkpoint=str(ckpt.root / f"step-{state.step:06d}"))
        log(rank, f"{'stopped' if stopped_by else 'done'} at step {state.step}")
    return 0


@torch.no_grad()
def save_probe(run_dir: Path, model: torch.nn.Module, dataset: Any, step: int, world: World) -> None:
    """Logits of the final sharded model on a fixed batch (rank 0 writes probe.pt): what an exported
    plain model must reproduce. A forward under FSDP is collective, so every rank runs it."""
    inputs = torch.stack([dataset[i][:-1] for i in range(2)]).to(world.device)
    logits = logits_of(model(inputs)).float().cpu()
    if world.rank == 0:
        tmp = run_dir / ".probe.pt.tmp"
        torch.save({"step": step, "inputs": inputs.cpu(), "logits": logits}, tmp)
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
