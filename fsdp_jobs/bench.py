"""Benchmarks that print JSON (never timed assertions in tests; these machines are noisy, so each
benchmark compares side by side in one run and reports ratios).

    python -m fsdp_jobs.bench step [--repeats 3] [--steps 60] [--ranks 2]
        median and mean step time of the orchestrated job (python -m fsdp_jobs on the default cluster,
        this machine) and of a minimal hand-written FSDP2 loop (bench_workers.hand_loop) with the same
        model, mesh and batch, alternated; ratio = hand / job (1.0 = no overhead).
    python -m fsdp_jobs.bench step --device cuda [--model llama3_1b] [--seq-len 2048] [--batch 4] [--ranks 1]
                                  [--peak-tflops 989]
        the same on this machine's GPUs (nodes=1, gpus_per_node=ranks, cluster.device=cuda): the job with
        its GPU defaults (bf16 compute, fp32 reduce) and the hand loop with the same, alternated; for both
        the step time (median and mean over sync windows, as the job's metrics record times itself),
        tokens/s, MFU (runtime.metrics.flops_per_token against the job's cluster.peak_tflops) and peak
        GPU memory (torch.cuda.max_memory_allocated).
    python -m fsdp_jobs.bench checkpoint [--ranks 2] [--repeats 3] [--dir DIR]
        the real save path (CheckpointManager on every rank: sync, and async's blocked and total time)
        next to a raw fsynced write of the same bytes by the same ranks.
    python -m fsdp_jobs.bench checkpoint-dcp [--mb 256] [--repeats 3] [--dir DIR]
        single-process DCP save/load bandwidth next to a raw write/read of the same bytes.
    python -m fsdp_jobs.bench dry-run [--repeats 9]
        wall time of `python -m fsdp_jobs dry_run=true` (a 4x8 job on backends.DRY_RUN_BENCH) next to
        `torchx run --dryrun -s <the same scheduler> dist.ddp -j 4x8`, alternated, and whether planning imported torch.
    python -m fsdp_jobs.bench dry-run-scale [--nodes 2,1024] [--repeats 5]
        every backend's dry run (each shape: backends.DRY_RUN_SHAPES) of an N x 8 llama3_70b job, the node counts
        alternated: median wall, bytes printed, and the ratio to the smallest count (goal: <= 2 at 1,024).
    python -m fsdp_jobs.bench rendezvous [--nodes 8,16,32,64,128] [--keep-alive 5] [--last-call 1]
        torchrun's c10d rendezvous (torch's own handler and TCPStore) with N simulated agents on loopback:
        a first round, a re-round after one is lost, store round trips, a fit and what it means at 1,024
        and 8,192 nodes (fsdp_jobs/bench_rendezvous.py).
    python -m fsdp_jobs.bench recovery [--repeats 3]
        a 2x2 CPU job's SIGKILL of one rank -> its next completed step, cut into torchrun's part and each
        start-up phase at the restarted rank 0's timeline marks (fsdp_jobs/cli/goodput.py).
    python -m fsdp_jobs.bench init [--ranks 4] [--model llama3_1b]
        per-shard init of a model at world size N on CPU next to a plain unsharded init.
    python -m fsdp_jobs.bench rundir-writes [--nodes 2] [--ranks 2] [--seconds 15] [--run-dir DIR]
        what a job in steady training writes into its run dir (inotify: files created, written, renamed
        into place; metrics, trackers and checkpoints left out: fsdp_jobs/rundir/writes.py), per node and
        second: a local job of NODES x RANKS started here, or the running job of --run-dir (any backend
        whose run dir this machine sees).
    python -m fsdp_jobs.bench chaos [--faults 30] [--seed 0] [--steps N] [--keep DIR] [-- OVERRIDES...]
        the chaos marathon (fsdp_jobs/bench_chaos.py): an uninterrupted 2x2 job, then the same job under
        `fsdp-jobs chaos RUN marathon`; every incident, the goodput, and whether the final checkpoints are
        equal bit for bit.
    python -m fsdp_jobs.bench scale [--nodes 16,64,256,1024,4096] [--gpus-per-node 8] [--attempts 100]
                                    [--metric-rows 1000000] [--members 1000] [--log-lines 200] [--repeats 3]
        status, list, goodput, the straggler report, logs --node K --tail 100, compare and a resume's
        checkpoint choice, timed on a synthetic run of N x G through the run-dir package
        (fsdp_jobs/bench_scale.py): the curve over N as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import checkpoints, runs
from fsdp_jobs.rundir.layout import RunDir


def _fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


BENCH_MODEL = {"_target_": "fsdp_jobs.models.llama.Transformer", "dim": 256, "n_layers": 4, "n_heads": 4,
               "ffn_dim": 768, "vocab_size": 2048, "max_seq_len": 256}


def _torchrun(which: str, ranks: int, args: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Run bench_workers WHICH on `ranks` processes (CPU, or one GPU each with args["device"] == "cuda");
    rank 0's JSON line."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "fsdp_jobs.bench_workers", which, json.dumps(args)]
    env = {**os.environ}
    if args.get("device") != "cuda":
        env["OMP_NUM_THREADS"] = "1"  # what the local launcher gives every CPU rank (launchers/common.py)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=_REPO)
    line = next((x for x in r.stdout.splitlines() if x.startswith("BENCH ")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"bench worker {which} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(line[len("BENCH "):])


_REPO = Path(__file__).resolve().parent.parent


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def bench_step(repeats: int, steps: int, ranks: int, warmup: int = 10) -> dict[str, Any]:
    model = {**BENCH_MODEL}
    seq_len, batch = 64, 4
    train = {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "grad_clip": 1.0, "batch_per_rank": batch}
    overrides = [f"model.{k}={v}" for k, v in model.items() if k != "_target_"] + [
        "nodes=1", f"gpus_per_node={ranks}", "fsdp=full_shard", f"train.steps={steps}", f"data.seq_len={seq_len}",
        f"train.batch_per_rank={batch}", "checkpoint.interval=0", "checkpoint.save_final=false",
        f"train.log_interval={max(1, steps // 3)}", "train.warmup_steps=0"]
    job_medians, hand_medians, job_means, hand_means = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        for i in range(repeats):  # alternated, so drift in the machine's load hits both alike
            r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name=job{i}", *overrides],
                               capture_output=True, text=True, cwd=_REPO, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise SystemExit(f"orchestrated job failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            lines = [json.loads(x) for x in RunDir(Path(tmp) / f"job{i}").metrics_file.read_text().splitlines()]
            stamps = [x["time"] for x in lines]  # host time at the end of each step
            job_steps = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
            job_medians.append(statistics.median(job_steps))
            job_means.append(statistics.fmean(job_steps))  # what throughput is made of: every N-th step counts
            hand = _torchrun("loop", ranks, {"model": model, "train": train, "seq_len": seq_len, "steps": steps})
            hand_medians.append(statistics.median(hand["step_times"][warmup + 1:]))
            hand_means.append(statistics.fmean(hand["step_times"][warmup + 1:]))
    ratios = [h / j for h, j in zip(hand_medians, job_medians)]
    return {"benchmark": "step", "ranks": ranks, "model": model, "batch_per_rank": batch, "seq_len": seq_len,
            "steps": steps, "repeats": repeats, "job_step_s": [round(x, 5) for x in job_medians],
            "hand_step_s": [round(x, 5) for x in hand_medians],
            "job_step_s_median": round(statistics.median(job_medians), 5),
            "hand_step_s_median": round(statistics.median(hand_medians), 5),
            "ratio_hand_over_job": round(statistics.median(hand_medians) / statistics.median(job_medians), 4),
            "ratio_per_pair": _spread(ratios),
            # the mean step time beside the median: the median hides what happens every N steps (the log
            # step's flush, stop votes, checkpoints), the mean is what tokens/s is made of
            "job_step_s_mean": round(statistics.median(job_means), 5),
            "hand_step_s_mean": round(statistics.median(hand_means), 5),
            "ratio_hand_over_job_mean": round(statistics.median(hand_means) / statistics.median(job_means), 4),
            "goal": ">= 0.99"}


def model_config(name: str) -> dict[str, Any]:
    """A model's shape from conf/model/NAME.yaml, as the job composes it (the class defaults to ours)."""
    import yaml

    cfg = yaml.safe_load((_REPO / "conf" / "model" / f"{name}.yaml").read_text())
    model = {k: v for k, v in cfg.items() if k not in ("defaults", "name")}
    model.setdefault("_target_", "fsdp_jobs.models.llama.Transformer")
    return model


def _side(step_s: list[float], tokens_per_step: int, fpt: float, peak_flops: float, world: int,
          peak_mem_gb: float) -> dict[str, Any]:
    """One side's numbers from its post-warmup per-step times; tokens/s and MFU from the mean step
    (what a run's throughput is made of), as the job's metrics compute them per window."""
    median, mean = statistics.median(step_s), statistics.fmean(step_s)
    tps = tokens_per_step / mean
    return {"step_s_median": round(median, 5), "step_s_mean": round(mean, 5), "tokens_per_s": round(tps, 1),
            "tokens_per_s_median_step": round(tokens_per_step / median, 1),
            "mfu": round(tps / world * fpt / peak_flops, 4), "peak_mem_gb": round(peak_mem_gb, 3)}


def bench_step_cuda(repeats: int, steps: int, ranks: int, model_name: str, seq_len: int, batch: int,
                    peak_tflops: float, window: int = 10, warmup: int = 10) -> dict[str, Any]:
    """`bench step` on this machine's GPUs: the job (the real CLI on the default cluster, this machine, with
    cluster.device=cuda) and bench_workers.hand_loop_cuda, alternated. Both are timed per window of
    `window` steps (the job's train.log_interval: its metrics record's step_time_s is the window's mean,
    measured at the window's one host sync); the first `warmup` steps (CUDA/NCCL/cuBLAS start-up, the
    allocator filling) are left out.
    peak_tflops goes to the job as cluster.peak_tflops: the default cluster's default is a CPU core's
    (launchers/local/config.py), which would make the job's own MFU meaningless on a GPU."""
    from fsdp_jobs.runtime.metrics import flops_per_token

    assert warmup % window == 0, "warmup must end at a window boundary"
    model = model_config(model_name)
    train = {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.0, "grad_clip": 1.0, "batch_per_rank": batch}
    overrides = ["cluster.device=cuda", "nodes=1", f"gpus_per_node={ranks}", f"model={model_name}", "fsdp=full_shard",
                 f"train.steps={steps}", f"data.seq_len={seq_len}", f"train.batch_per_rank={batch}",
                 f"train.lr={train['lr']}", "train.grad_clip=1.0", "checkpoint.interval=0",
                 "checkpoint.save_final=false", f"train.log_interval={window}", "train.warmup_steps=0",
                 f"cluster.peak_tflops={peak_tflops}"]
    tokens_per_step = batch * seq_len * ranks
    fpt = flops_per_token(0, model["n_layers"], model["dim"], seq_len)  # + 6 N below, N from the hand loop
    measured: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-step-cuda-") as tmp:
        for i in range(repeats):  # alternated, so drift (clocks, temperature) hits both alike
            r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name=job{i}", *overrides],
                               capture_output=True, text=True, cwd=_REPO, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise SystemExit(f"orchestrated job failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            run_dir = Path(tmp) / f"job{i}"
            lines = [json.loads(x) for x in RunDir(run_dir).metrics_file.read_text().splitlines()]
            job_cfg = runs.load_job(run_dir)
            hand = _torchrun("loop", ranks, {"model": model, "train": train, "seq_len": seq_len, "steps": steps,
                                             "device": "cuda", "window": window})
            measured.append({"job_lines": [x for x in lines if x["step"] > warmup], "job_peak_tflops":
                             float(job_cfg["cluster"]["peak_tflops"]), "hand": hand})
    n_params, world = measured[0]["hand"]["n_params"], measured[0]["hand"]["world_size"]
    fpt += 6 * n_params
    peak_flops = measured[0]["job_peak_tflops"] * 1e12  # bf16 compute: the job's MFU peak (trainer.py mfu_peak_flops)
    per_run = []
    for run in measured:
        job_steps = [x["step_time_s"] for x in run["job_lines"]]
        job = _side(job_steps, tokens_per_step, fpt, peak_flops, world, max(x["peak_mem_gb"] for x in run["job_lines"]))
        # the job's own figures beside ours, to show both count the same (medians over its windows)
        job["reported_tokens_per_s_median"] = round(statistics.median(x["tokens_per_s"] for x in run["job_lines"]), 1)
        job["reported_mfu_median"] = round(statistics.median(x["mfu"] for x in run["job_lines"]), 4)
        hand = _side(run["hand"]["step_times"][warmup:], tokens_per_step, fpt, peak_flops, world,
                     run["hand"]["peak_mem_gb"])
        per_run.append({"job": job, "hand": hand})
    job_medians = [r["job"]["step_s_median"] for r in per_run]
    hand_medians = [r["hand"]["step_s_median"] for r in per_run]
    job_means = [r["job"]["step_s_mean"] for r in per_run]
    hand_means = [r["hand"]["step_s_mean"] for r in per_run]
    # the repeat whose mean step time is the median of the repeats' stands for each side
    mid = sorted(range(len(per_run)), key=lambda k: job_means[k])[len(per_run) // 2]
    hmid = sorted(range(len(per_run)), key=lambda k: hand_means[k])[len(per_run) // 2]
    first = measured[0]["hand"]
    return {"benchmark": "step", "device": "cuda", "gpu": first["gpu"], "torch": first["torch"],
            "ranks": ranks, "model": model_name, "n_params": n_params, "batch_per_rank": batch, "seq_len": seq_len,
            "tokens_per_step": tokens_per_step, "steps": steps, "warmup_steps": warmup, "window_steps": window,
            "repeats": repeats, "precision": "bf16 params/compute, fp32 reduce, fp32 sharded params + AdamW",
            "flops_per_token": fpt, "peak_tflops": peak_flops / 1e12,
            "job": per_run[mid]["job"], "hand": per_run[hmid]["hand"],
            "per_repeat": per_run,
            "job_step_s": [round(x, 5) for x in job_medians], "hand_step_s": [round(x, 5) for x in hand_medians],
            "job_step_s_median": round(statistics.median(job_medians), 5),
            "hand_step_s_median": round(statistics.median(hand_medians), 5),
            "ratio_hand_over_job": round(statistics.median(hand_medians) / statistics.median(job_medians), 4),
            "ratio_per_pair": _spread([h / j for h, j in zip(hand_medians, job_medians)]),
            "job_step_s_mean": round(statistics.median(job_means), 5),
            "hand_step_s_mean": round(statistics.median(hand_means), 5),
            "ratio_hand_over_job_mean": round(statistics.median(hand_means) / statistics.median(job_means), 4),
            "peak_mem_ratio_job_over_hand": round(per_run[mid]["job"]["peak_mem_gb"]
                                                  / per_run[hmid]["hand"]["peak_mem_gb"], 4),
            "note": "step times are per-window means (one host sync per window, as the job's metrics record); "
                    "peak_mem_gb is torch.cuda.max_memory_allocated / 2**30 since the process started; "
                    "tokens_per_s and mfu from the mean step",
            "goal": ">= 0.99"}


def bench_checkpoint_real(ranks: int, repeats: int, directory: Path) -> dict[str, Any]:
    model = {**BENCH_MODEL, "dim": 512, "ffn_dim": 1536, "vocab_size": 8192}
    out = _torchrun("ckpt", ranks, {"model": model, "repeats": repeats, "dir": str(directory)})
    rows, nbytes = out["rows"], out["state_bytes"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "benchmark": "checkpoint", "ranks": ranks, "repeats": repeats, "directory": str(directory),
        "state_bytes": nbytes, "checkpoint_bytes": out["checkpoint_bytes"],
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "seconds_all": {k: [round(x, 4) for x in v] for k, v in rows.items()},
        "GB_per_s": {"sync_save": round(nbytes / med["sync_save"] / 1e9, 3),
                     "async_total": round(nbytes / med["async_total"] / 1e9, 3),
                     "raw_write": round(nbytes / med["raw_write"] / 1e9, 3)},
        "ratio_sync_save_over_raw_bandwidth": round(med["raw_write"] / med["sync_save"], 3),
        "ratio_async_blocked_over_sync_save": round(med["async_blocked"] / med["sync_save"], 3),
        "goal": "async blocked / sync save <= 0.1",
        "note": "sync_save and async_total include the commit (manifest, rename, fsync); raw_write fsyncs too",
    }


def bench_checkpoint(mb: int, repeats: int, directory: Path) -> dict[str, Any]:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # single process on purpose
    n_tensors = 16
    numel = mb * 1024 * 1024 // 4 // n_tensors
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(numel, generator=gen) for i in range(n_tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    raw = b"".join(t.numpy().tobytes() for t in state.values())
    rows: dict[str, list[float]] = {k: [] for k in ("dcp_save", "raw_write", "dcp_load", "raw_read")}
    for i in range(repeats):  # interleaved, so drift in the machine's load hits both sides alike
        ck = directory / f"dcp-{i}"
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=str(ck), no_dist=True)
        _fsync_tree(ck)
        rows["dcp_save"].append(time.perf_counter() - t0)

        rf = directory / f"raw-{i}.bin"
        t0 = time.perf_counter()
        with open(rf, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        rows["raw_write"].append(time.perf_counter() - t0)

        target = {k: torch.empty_like(v) for k, v in state.items()}
        t0 = time.perf_counter()
        dcp.load(target, checkpoint_id=str(ck), no_dist=True)
        rows["dcp_load"].append(time.perf_counter() - t0)
        assert all(torch.equal(target[k], state[k]) for k in state)

        t0 = time.perf_counter()
        with open(rf, "rb") as f:
            data = f.read()
        rows["raw_read"].append(time.perf_counter() - t0)
        assert len(data) == nbytes
        shutil.rmtree(ck)
        rf.unlink()
    med = {k: statistics.median(v) for k, v in rows.items()}
    gbps = {k: nbytes / v / 1e9 for k, v in med.items()}
    return {
        "benchmark": "checkpoint", "bytes": nbytes, "repeats": repeats, "directory": str(directory),
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "seconds_all": {k: [round(x, 4) for x in v] for k, v in rows.items()},
        "GB_per_s": {k: round(v, 3) for k, v in gbps.items()},
        "ratio_dcp_over_raw": {"save": round(gbps["dcp_save"] / gbps["raw_write"], 3),
                               "load": round(gbps["dcp_load"] / gbps["raw_read"], 3)},
        "note": "reads come from the page cache (the data was just written); saves include fsync",
    }


def bench_dry_run(repeats: int) -> dict[str, Any]:
    """Our dry run of a 4-node x 8-GPU job next to TorchX's dry run of the same shape on the scheduler
    of the same name (fsdp_jobs/planning/backends.py DRY_RUN_BENCH), both the commands users type (process start
    and exit included), alternated."""
    from fsdp_jobs.planning.backends import DRY_RUN_BENCH as backend

    job = ["dry_run=true", "run_root=/nonexistent-bench", f"cluster={backend}", "nodes=4", "gpus_per_node=8",
           "model=llama3_8b"]
    ours = [sys.executable, "-m", "fsdp_jobs", *job]
    torchx_args = ["run", "--dryrun", "-s", backend, "dist.ddp", "-j", "4x8", "-m", "fsdp_jobs.runtime"]
    torchx = [sys.executable, "-m", "torchx.cli.main", *torchx_args]
    walls, tx_walls = [], []
    for _ in range(repeats):
        for cmd, cwd, out in ((ours, _REPO, walls), (torchx, tempfile.gettempdir(), tx_walls)):
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL)
            out.append(time.perf_counter() - t0)
            if r.returncode != 0:
                raise SystemExit(f"{cmd[2]} dry run failed:\n{r.stderr[-3000:]}")
    # once more in-process: the time planning itself takes, and that it never imports torch
    code = ("import sys, time; t=time.perf_counter(); from fsdp_jobs.__main__ import main; "
            f"rc = main({job!r}); "
            "sys.stderr.write(repr(('torch' in sys.modules, time.perf_counter()-t))); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_REPO)
    if r.returncode != 0:
        raise SystemExit(f"dry run failed:\n{r.stderr[-3000:]}")
    torch_seen, inner = eval(r.stderr.strip().splitlines()[-1])  # noqa: S307 (our own repr)
    return {"benchmark": "dry-run", "repeats": repeats, "command": "python -m fsdp_jobs " + " ".join(job),
            "torchx_command": "torchx " + " ".join(torchx_args),
            "wall_s": _spread(walls), "torchx_wall_s": _spread(tx_walls),
            "ratio_ours_over_torchx": round(statistics.median(walls) / statistics.median(tx_walls), 3),
            "goal": "<= 1.0", "in_process_s": round(inner, 3), "torch_imported": torch_seen}


def bench_dry_run_scale(node_counts: list[int], repeats: int) -> dict[str, Any]:
    """`python -m fsdp_jobs dry_run=true nodes=N gpus_per_node=8 model=llama3_70b` on every backend and shape
    (backends.DRY_RUN_SHAPES), each node count alternated with the others: median wall (process start and
    exit included), what it printed, and each count's time over the smallest's."""
    from fsdp_jobs.planning.backends import DRY_RUN_SHAPES

    out = []
    for backend, shapes in DRY_RUN_SHAPES.items():
        for shape in shapes:
            walls: dict[int, list[float]] = {n: [] for n in node_counts}
            sizes: dict[int, int] = {}
            for _ in range(repeats):
                for n in node_counts:
                    cmd = [sys.executable, "-m", "fsdp_jobs", "dry_run=true", "run_root=/nonexistent-bench",
                           f"cluster={backend}", f"nodes={n}", "gpus_per_node=8", "model=llama3_70b", *shape]
                    t0 = time.perf_counter()
                    r = subprocess.run(cmd, capture_output=True, text=True, cwd=_REPO, stdin=subprocess.DEVNULL)
                    walls[n].append(time.perf_counter() - t0)
                    if r.returncode != 0:
                        raise SystemExit(f"dry run failed: {' '.join(cmd[3:])}\n{r.stderr[-2000:]}")
                    sizes[n] = len(r.stdout.encode())
            median = {n: statistics.median(w) for n, w in walls.items()}
            out.append({"backend": backend, "shape": " ".join(shape[1:] or shape), "wall_s": {
                n: round(m, 3) for n, m in median.items()}, "printed_bytes": sizes,
                "ratio_to_smallest": {n: round(m / median[node_counts[0]], 2) for n, m in median.items()}})
    return {"benchmark": "dry-run-scale", "repeats": repeats, "goal": "<= 2.0 at 1,024 nodes", "runs": out}


def recovery_parts(run_dir: Path, killed_at: float) -> dict[str, float]:
    """SIGKILL of a rank -> the first step after it, cut at the restarted rank 0's timeline marks
    (fsdp_jobs/cli/goodput.py): what torchrun and each start-up phase take."""
    from fsdp_jobs.cli import goodput

    events, _ = goodput.read_events(RunDir(run_dir).goodput_file)
    start = next(e for e in events if e["event"] == "start" and e["time"] > killed_at)
    mine = [e for e in events if e.get("pid") == start["pid"]]
    mark = {e["event"]: e for e in mine}
    first_step = next(m["time"] for m in runs.read_metrics(run_dir) if m["time"] > killed_at)
    cuts = [("torchrun: notice, stop the others, re-rendezvous, start", start["time"]),
            ("interpreter", start["main"]), ("imports", mark["process_group"]["began"]),
            ("process group + mesh", mark["process_group"]["time"]), ("build + materialize", mark["built"]["time"]),
            ("checkpoint load", mark["loaded"]["time"]), ("data, metrics", mark["loop"]["time"]),
            ("first step", first_step)]
    out, t = {}, killed_at
    for name, at in cuts:
        out[name], t = round(at - t, 3), at
    return out


def _rank_pid(run_dir: Path, rank: int) -> int:
    """The pid in `rank`'s rank record (written once it is up: the callers wait past a step first)."""
    record = runs.read_rank(RunDir(run_dir).rank_file(rank))
    if record is None:
        raise SystemExit(f"no readable rank record of rank {rank} in {run_dir}")
    return record.pid


def bench_recovery(repeats: int) -> dict[str, Any]:
    """A 2x2 CPU job (the tiny default model): SIGKILL rank 3 once a checkpoint is committed; the time to
    the first completed step after it, and its parts, median of `repeats` runs."""
    import signal

    totals, parts = [], []
    args = ["train.steps=60", "checkpoint.interval=10", "checkpoint.keep_last=10", "train.log_interval=1"]
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(repeats):
            run_dir = Path(tmp) / f"r{i}"
            proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name=r{i}", *args],
                                    cwd=_REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            while not checkpoints.has_manifest(checkpoints.step_dir(checkpoints.root_of(run_dir), 10)):
                if proc.poll() is not None:
                    raise SystemExit(f"recovery run {i} ended early ({proc.returncode})")
                time.sleep(0.05)
            pid = _rank_pid(run_dir, 3)
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"recovery run {i} failed ({proc.returncode})")
            split = recovery_parts(run_dir, killed_at)
            totals.append(sum(split.values()))
            parts.append(split)
    return {"benchmark": "recovery", "job": "2 nodes x 2 ranks, CPU, tiny model; SIGKILL of rank 3",
            "repeats": repeats, "kill_to_next_step_s": _spread(totals),
            "parts_s_median": {k: round(statistics.median(p[k] for p in parts), 3) for k in parts[0]},
            "parts_s_all": parts, "goal": "<= 2 s (issue #30)"}


def _replica_run(tmp: str, name: str, args: list[str], kill_rank: Optional[int]) -> tuple[list[dict[str, Any]], float]:
    """One local job (its metrics, and when `kill_rank` was SIGKILLed once step 20 was done; 0.0: no kill)."""
    run_dir = Path(tmp) / name
    proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name={name}", *args], cwd=_REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = 0.0
    if kill_rank is not None:
        while len(runs.read_metrics(run_dir)) < 20:
            if proc.poll() is not None:
                raise SystemExit(f"replica bench run {name} ended early ({proc.returncode})")
            time.sleep(0.02)
        pid = _rank_pid(run_dir, kill_rank)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
    if proc.wait(timeout=900) != 0:
        raise SystemExit(f"replica bench run {name} failed ({proc.returncode})")
    return runs.read_metrics(run_dir), killed_at


def _first_done(metrics: list[dict[str, Any]]) -> dict[int, float]:
    done: dict[int, float] = {}
    for m in metrics:
        done.setdefault(int(m["step"]), float(m["time"]))
    return done


def bench_replica(repeats: int, steps: int) -> dict[str, Any]:
    """fault_tolerance=replica against the same job without it, alternated `repeats` times (3 nodes x 1 rank,
    CPU, the tiny model): the median step time of each (steps 11..), and, with rank 2 (group 2) SIGKILLed
    after step 20, the time the others lost: from the kill to the first step not done before it, less a step
    (the replica job's wait for the lighthouse, fault_tolerance.heartbeat_timeout_s=1; the plain job's
    restart and redone steps)."""
    base = ["nodes=3", "gpus_per_node=1", f"train.steps={steps}", "checkpoint.interval=10", "train.log_interval=1",
            "checkpoint.keep_last=10"]
    replica = ["fault_tolerance=replica", "fault_tolerance.heartbeat_timeout_s=1"]
    step_s: dict[str, list[float]] = {"none": [], "replica": []}
    lost: dict[str, list[float]] = {"none": [], "replica": []}
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as tmp:
        for i in range(repeats):
            for mode, extra in (("none", []), ("replica", replica)):
                done = _first_done(_replica_run(tmp, f"{mode}{i}", [*base, *extra], None)[0])
                times = [done[s] for s in sorted(done) if s > 10]
                step_s[mode].append(statistics.median(b - a for a, b in zip(times, times[1:])))
                metrics, killed_at = _replica_run(tmp, f"{mode}-kill{i}", [*base, *extra], kill_rank=2)
                done = _first_done(metrics)
                at_kill = max(s for s, t in done.items() if t <= killed_at)
                lost[mode].append(done[at_kill + 1] - killed_at - step_s[mode][-1])
    none, rep = statistics.median(step_s["none"]), statistics.median(step_s["replica"])
    return {"benchmark": "replica", "job": "3 nodes x 1 rank, CPU, tiny model; SIGKILL of rank 2 after step 20",
            "repeats": repeats, "step_s": {k: _spread(v) for k, v in step_s.items()},
            "replica_over_none_step_time": round(rep / none, 3),
            "lost_to_a_kill_s": {k: _spread(v) for k, v in lost.items()},
            "none_over_replica_lost": round(statistics.median(lost["none"]) / statistics.median(lost["replica"]), 2)}


def bench_init(ranks: int, model_name: str) -> dict[str, Any]:
    """Per-shard init at world size `ranks` (slowest rank) next to one plain unsharded init."""
    model = model_config(model_name)
    sharded = _torchrun("init", ranks, {"model": model})
    code = ("import json, sys; from fsdp_jobs.bench_workers import plain_init; "
            "print(json.dumps(plain_init(json.loads(sys.argv[1]))))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(model)], capture_output=True, text=True, cwd=_REPO,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"plain init failed:\n{r.stderr[-3000:]}")
    plain = float(r.stdout.strip().splitlines()[-1])
    return {"benchmark": "init", "model": model_name, "world_size": ranks,
            "sharded_init_s": round(sharded["seconds"], 3), "plain_unsharded_init_s": round(plain, 3),
            "speedup": round(plain / sharded["seconds"], 3),
            "note": "all ranks share this machine's cores; on a cluster each rank has its own GPU"}


def bench_rundir_writes(nodes: int, ranks: int, seconds: float, run_dir: Optional[Path]) -> dict[str, Any]:
    """Bookkeeping writes into the run dir in steady training, per node and second."""
    from fsdp_jobs.rundir import writes

    if run_dir is not None:
        counted = writes.count(run_dir, seconds)
        return {"benchmark": "rundir-writes", "run_dir": str(run_dir), "nodes": nodes, **counted,
                "writes_per_node_per_s": round(counted["writes"] / nodes / seconds, 3), "goal": "<= 0.2"}
    with tempfile.TemporaryDirectory(prefix="bench-writes-") as tmp:
        run = Path(tmp) / "w"
        proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", "name=w", f"nodes={nodes}",
                                 f"gpus_per_node={ranks}", "train.steps=1000000", "checkpoint.interval=1000000"],
                                cwd=_REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            from fsdp_jobs.rundir.liveness import SETTLE_S

            first = None  # steady training: past start-up, and the liveness records settled (SETTLE_S)
            while first is None or time.time() - first < SETTLE_S + 5:
                rows = runs.read_metrics(run)
                first = first or (time.time() if rows else None)
                if proc.poll() is not None:
                    raise SystemExit(f"the job ended early ({proc.returncode})")
                time.sleep(0.5)
            result = bench_rundir_writes(nodes, ranks, seconds, run)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
    return {**result, "job": f"local, {nodes} nodes x {ranks} ranks, CPU, tiny model"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fsdp_jobs.bench")
    sub = p.add_subparsers(dest="which", required=True)
    st = sub.add_parser("step")
    st.add_argument("--repeats", type=int, default=3)
    st.add_argument("--steps", type=int, default=60)
    st.add_argument("--ranks", type=int, default=None,
                    help="ranks (GPUs with --device cuda); default 2 on CPU, 1 on cuda")
    st.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    st.add_argument("--model", default="llama3_1b", help="conf/model/NAME (--device cuda; CPU uses a small model)")
    st.add_argument("--seq-len", type=int, default=2048, help="--device cuda")
    st.add_argument("--batch", type=int, default=4, help="sequences per rank per step (--device cuda)")
    st.add_argument("--peak-tflops", type=float, default=989.0,
                    help="--device cuda: MFU's peak per GPU at bf16 (989: H100 SXM dense, cluster_config.py)")
    c = sub.add_parser("checkpoint")
    c.add_argument("--ranks", type=int, default=2)
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under ./runs)")
    cd = sub.add_parser("checkpoint-dcp")
    cd.add_argument("--mb", type=int, default=256)
    cd.add_argument("--repeats", type=int, default=3)
    cd.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under ./runs)")
    d = sub.add_parser("dry-run")
    d.add_argument("--repeats", type=int, default=9)
    ds = sub.add_parser("dry-run-scale")
    ds.add_argument("--nodes", default="2,1024", help="node counts, comma-separated")
    ds.add_argument("--repeats", type=int, default=5)
    rc = sub.add_parser("recovery")
    rc.add_argument("--repeats", type=int, default=3)
    rp = sub.add_parser("replica")
    rp.add_argument("--repeats", type=int, default=3)
    rp.add_argument("--steps", type=int, default=80)
    i = sub.add_parser("init")
    i.add_argument("--ranks", type=int, default=4)
    i.add_argument("--model", default="llama3_1b")
    w = sub.add_parser("rundir-writes")
    w.add_argument("--nodes", type=int, default=2)
    w.add_argument("--ranks", type=int, default=2, help="ranks per node")
    w.add_argument("--seconds", type=float, default=15.0)
    w.add_argument("--run-dir", type=Path, default=None, help="count a running job's run dir instead")
    ch = sub.add_parser("chaos")
    ch.add_argument("--faults", type=int, default=30)
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--steps", type=int, default=None, help="train.steps (default: 100 per fault + 200)")
    ch.add_argument("--keep", type=Path, default=None, help="run both jobs under this run root and keep it")
    ch.add_argument("overrides", nargs="*", help="after --: overrides for both runs")
    iv = sub.add_parser("interval", help="checkpoint.interval=auto against fixed intervals, one seeded fault schedule")
    iv.add_argument("--faults", type=int, default=6)
    iv.add_argument("--seed", type=int, default=1)
    iv.add_argument("--steps", type=int, default=1000)
    iv.add_argument("--intervals", default="10,50,200,auto")
    iv.add_argument("--repeats", type=int, default=3)
    iv.add_argument("--keep", type=Path, default=None, help="run the jobs under this run root and keep it")
    iv.add_argument("overrides", nargs="*", help="after --: overrides for every run")
    from fsdp_jobs import bench_rendezvous, bench_scale

    bench_scale.add_parser(sub)
    bench_rendezvous.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from fsdp_jobs import bench_rendezvous, bench_scale

    args = parser().parse_args(argv)
    if args.which == "scale":
        return bench_scale.run(args)
    if args.which == "rendezvous":
        return bench_rendezvous.run(args)
    if args.which == "dry-run-scale":
        counts = [int(n) for n in args.nodes.split(",")]
        print(json.dumps(bench_dry_run_scale(counts, args.repeats), indent=2))
        return 0
    if args.which == "chaos":
        from fsdp_jobs.bench_chaos import bench_chaos

        print(json.dumps(bench_chaos(args.faults, args.seed, args.steps, args.overrides, args.keep), indent=2))
        return 0
    if args.which == "interval":
        from fsdp_jobs.bench_interval import bench_interval

        print(json.dumps(bench_interval(args.faults, args.seed, args.steps, args.intervals.split(","), args.repeats,
                                        args.overrides, args.keep), indent=2))
        return 0
    if args.which in ("checkpoint", "checkpoint-dcp"):
        base = args.dir or Path("runs")
        base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=base, prefix="bench-") as tmp:
            if args.which == "checkpoint":
                result = bench_checkpoint_real(args.ranks, args.repeats, Path(tmp).resolve())
            else:
                result = bench_checkpoint(args.mb, args.repeats, Path(tmp))
    elif args.which == "step":
        if args.device == "cuda":
            result = bench_step_cuda(args.repeats, args.steps, args.ranks or 1, args.model, args.seq_len, args.batch,
                                     args.peak_tflops)
        else:
            result = bench_step(args.repeats, args.steps, args.ranks or 2)
    elif args.which == "init":
        result = bench_init(args.ranks, args.model)
    elif args.which == "recovery":
        result = bench_recovery(args.repeats)
    elif args.which == "replica":
        result = bench_replica(args.repeats, args.steps)
    elif args.which == "rundir-writes":
        result = bench_rundir_writes(args.nodes, args.ranks, args.seconds, args.run_dir)
    else:
        result = bench_dry_run(args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
