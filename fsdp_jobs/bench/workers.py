"""What `python -m fsdp_jobs.bench` runs on every rank under torchrun (one JSON argument, no flags:
torchrun prefix-matches flags after the module, fsdp_jobs/ARCHITECTURE.md pitfall 5). Rank 0 prints one JSON line.

    loop   the minimal hand-written FSDP2 loop the orchestrated job is compared with (on CPU and gloo, or
           with {"device": "cuda"} on one GPU per rank and NCCL, in the job's GPU precision)
    ckpt   the real save path (CheckpointManager, sync and async) next to a raw write of the same bytes
    init   per-shard initialisation of a model at this world size (max over ranks)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdp_jobs.rundir import checkpoints


def _meta_model(model_cfg: dict[str, Any]) -> torch.nn.Module:
    from fsdp_jobs.planning.config import job_config
    from fsdp_jobs.runtime.shard import build_meta_model

    return build_meta_model(job_config({"model": model_cfg}).model)  # through the schema, as the ranks read it


def _shard(model: torch.nn.Module, mesh: Any, mp_policy: Any = None) -> None:
    """fully_shard per block, then the root: the textbook FSDP2 recipe."""
    from torch.distributed.fsdp import fully_shard

    mp = {"mp_policy": mp_policy} if mp_policy is not None else {}  # None: FSDP2's default (no casts)
    for block in model.layers:
        fully_shard(block, mesh=mesh, **mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=False, **mp)


def hand_loop(args: dict[str, Any]) -> dict[str, Any]:
    """Forward, loss, backward, clip, AdamW step, zero_grad on one fixed batch: nothing else."""
    from torch.distributed.device_mesh import init_device_mesh

    if args.get("device") == "cuda":
        return hand_loop_cuda(args)
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = _meta_model(args["model"])
    _shard(model, mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        model.init_buffers(torch.device("cpu"))
    t = args["train"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                  weight_decay=t["weight_decay"], foreach=True)
    gen = torch.Generator().manual_seed(rank)
    rows = torch.randint(0, args["model"]["vocab_size"], (t["batch_per_rank"], args["seq_len"] + 1), generator=gen)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    times = []
    for _ in range(args["steps"]):
        t0 = time.perf_counter()
        _step(model, optimizer, inputs, targets, t["grad_clip"])
        times.append(time.perf_counter() - t0)
    return {"step_times": times}


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
          grad_clip: float) -> None:
    """Forward, loss, backward, clip, AdamW step, zero_grad: the whole hand-written step."""
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def hand_loop_cuda(args: dict[str, Any]) -> dict[str, Any]:
    """The same loop on this rank's GPU, with what the job uses there by default: bf16 compute, fp32
    gradient reduction (fsdp_jobs/planning/plan.py resolve_mixed_precision), fp32 sharded parameters and AdamW
    state. Timed as the job times itself (fsdp_jobs/runtime/trainer.py MetricsWindow): the host syncs
    with the GPU once per window of args["window"] steps, and each step of a window is the window's
    mean; a sync every step would stall the launch queue the job keeps full. Also the numbers the job
    computes its MFU from: the full parameter count and the peak of torch.cuda.max_memory_allocated."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fsdp_jobs.runtime.shard import adamw_implementation

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # as the trainer sets it (trainer.py tune_for_training)
    mesh = init_device_mesh("cuda", (world,))
    torch.manual_seed(0)
    model = _meta_model(args["model"])
    n_params = sum(p.numel() for p in model.parameters())
    _shard(model, mesh, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        model.init_buffers(device)
    t = args["train"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                  weight_decay=t["weight_decay"], **adamw_implementation(device))
    gen = torch.Generator(device=device).manual_seed(rank)
    rows = torch.randint(0, args["model"]["vocab_size"], (t["batch_per_rank"], args["seq_len"] + 1),
                         generator=gen, device=device)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    window = max(1, int(args["window"]))
    times: list[float] = []
    torch.cuda.synchronize(device)
    t0, in_window = time.perf_counter(), 0
    for step in range(1, args["steps"] + 1):
        _step(model, optimizer, inputs, targets, t["grad_clip"])
        in_window += 1
        if step % window == 0 or step == args["steps"]:
            torch.cuda.synchronize(device)
            dt = (time.perf_counter() - t0) / in_window
            times.extend([dt] * in_window)
            t0, in_window = time.perf_counter(), 0
    # since the process started, init included, as the job's peak_mem_gb (fsdp_jobs/runtime/metrics.py)
    peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 1024**3], device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"step_times": times, "n_params": n_params, "peak_mem_gb": peak.item(), "world_size": world,
            "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__}


def checkpoint_save(args: dict[str, Any]) -> dict[str, Any]:
    """Sync saves, async saves (blocked time, time to commit) and a raw write of each rank's bytes."""
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_jobs.runtime.checkpoint import CheckpointManager, TrainState
    from fsdp_jobs.runtime.shard import materialize

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    model = _meta_model(args["model"])
    _shard(model, mesh)
    materialize(model, torch.device("cpu"), 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    vocab = args["model"]["vocab_size"]
    model(torch.randint(0, vocab, (1, 8))).float().mean().backward()
    optimizer.step()  # AdamW's moments exist: the checkpoint holds what a real one holds
    state = TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
    root = Path(args["dir"])
    rows: dict[str, list[float]] = {"sync_save": [], "async_blocked": [], "async_total": [], "raw_write": []}
    quiet = lambda m: None  # noqa: E731
    local_bytes = sum(t.to_local().numel() * t.element_size() if hasattr(t, "to_local") else 0
                      for t in [*model.parameters(), *(v for s in optimizer.state.values() for v in s.values()
                                                       if isinstance(v, torch.Tensor) and v.dim())])
    for i in range(args["repeats"]):
        for mode in ("sync", "async"):
            run_dir = root / f"{mode}-{i}"
            ckpt = CheckpointManager(run_dir, 1, {}, rank, f"bench{i}", async_save=mode == "async", log=quiet,
                                     overlap_staging=True)
            state.step = i + 1
            dist.barrier()
            t0 = time.perf_counter()
            ckpt.save(state, {"shard": world}, world)
            blocked = time.perf_counter() - t0
            if mode == "sync":  # written and committed when save returns; the barrier: every rank's write
                dist.barrier()
                rows["sync_save"].append(time.perf_counter() - t0)
                ckpt.close()
                continue
            # what the trainer does next: a forward/backward (overlapping the background copy to
            # host memory), then it waits for that copy before the optimizer step: also blocked time
            model(torch.randint(0, vocab, (1, 8))).float().mean().backward()
            t1 = time.perf_counter()
            ckpt.wait_staging()
            blocked += time.perf_counter() - t1
            ckpt.close()  # written and committed (rank 0 commits; the others' writes ended with DCP's)
            dist.barrier()
            rows["async_blocked"].append(blocked)
            rows["async_total"].append(time.perf_counter() - t0)
        payload = os.urandom(1024) * (local_bytes // 1024 + 1)
        dist.barrier()
        t0 = time.perf_counter()
        with open(root / f"raw-{i}-{rank}.bin", "wb") as f:
            f.write(payload[:local_bytes])
            f.flush()
            os.fsync(f.fileno())
        dist.barrier()
        rows["raw_write"].append(time.perf_counter() - t0)
    total_bytes = torch.tensor([float(local_bytes)])
    dist.all_reduce(total_bytes)
    ckpt_bytes = sum(p.stat().st_size for p in checkpoints.root_of(root / "sync-0").rglob("*") if p.is_file())
    return {"rows": rows, "state_bytes": int(total_bytes.item()), "checkpoint_bytes": ckpt_bytes}


def init_time(args: dict[str, Any]) -> dict[str, Any]:
    """Wall time of `materialize` (allocate + per-shard init) at this world size, slowest rank."""
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_jobs.runtime.shard import materialize

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = _meta_model(args["model"])
    _shard(model, mesh)
    dist.barrier()
    t0 = time.perf_counter()
    materialize(model, torch.device("cpu"), 0)
    mine = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return {"seconds": mine.item(), "world_size": world}


def plain_init(model_cfg: dict[str, Any]) -> float:
    """The unsharded baseline: one process builds every full parameter on the CPU and fills it
    (what every rank used to do before keeping its slice)."""
    import zlib

    model = _meta_model(model_cfg)
    t0 = time.perf_counter()
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            model.init_parameter(name, p.data, gen)
    model.init_buffers(torch.device("cpu"))
    return time.perf_counter() - t0


WORKERS = {"loop": hand_loop, "ckpt": checkpoint_save, "init": init_time}


def main() -> None:
    which, args = sys.argv[1], json.loads(sys.argv[2])
    if args.get("device") == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    try:
        result = WORKERS[which](args)
        if dist.get_rank() == 0:
            print("BENCH " + json.dumps(result), flush=True)
    finally:
        import gc

        gc.collect()  # fsdp_jobs/ARCHITECTURE.md pitfall 2
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
