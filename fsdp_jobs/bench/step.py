"""`bench step`: the orchestrated job's step time next to a hand-written FSDP2 loop (CPU, or `--device cuda`)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.bench.common import BENCH_MODEL, REPO, model_config, run_workers, spread


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
                               capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise SystemExit(f"orchestrated job failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            lines = [json.loads(x) for x in RunDir(Path(tmp) / f"job{i}").metrics_file.read_text().splitlines()]
            stamps = [x["time"] for x in lines]  # host time at the end of each step
            job_steps = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
            job_medians.append(statistics.median(job_steps))
            job_means.append(statistics.fmean(job_steps))  # what throughput is made of: every N-th step counts
            hand = run_workers("loop", ranks, {"model": model, "train": train, "seq_len": seq_len, "steps": steps})
            hand_medians.append(statistics.median(hand["step_times"][warmup + 1:]))
            hand_means.append(statistics.fmean(hand["step_times"][warmup + 1:]))
    ratios = [h / j for h, j in zip(hand_medians, job_medians)]
    return {"benchmark": "step", "ranks": ranks, "model": model, "batch_per_rank": batch, "seq_len": seq_len,
            "steps": steps, "repeats": repeats, "job_step_s": [round(x, 5) for x in job_medians],
            "hand_step_s": [round(x, 5) for x in hand_medians],
            "job_step_s_median": round(statistics.median(job_medians), 5),
            "hand_step_s_median": round(statistics.median(hand_medians), 5),
            "ratio_hand_over_job": round(statistics.median(hand_medians) / statistics.median(job_medians), 4),
            "ratio_per_pair": spread(ratios),
            # the mean step time beside the median: the median hides what happens every N steps (the log
            # step's flush, stop votes, checkpoints), the mean is what tokens/s is made of
            "job_step_s_mean": round(statistics.median(job_means), 5),
            "hand_step_s_mean": round(statistics.median(hand_means), 5),
            "ratio_hand_over_job_mean": round(statistics.median(hand_means) / statistics.median(job_means), 4),
            "goal": ">= 0.99"}


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
    cluster.device=cuda) and workers.hand_loop_cuda, alternated. Both are timed per window of
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
                               capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise SystemExit(f"orchestrated job failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            run_dir = Path(tmp) / f"job{i}"
            lines = [json.loads(x) for x in RunDir(run_dir).metrics_file.read_text().splitlines()]
            job_cfg = runs.load_job(run_dir)
            hand = run_workers("loop", ranks, {"model": model, "train": train, "seq_len": seq_len, "steps": steps,
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
            "ratio_per_pair": spread([h / j for h, j in zip(hand_medians, job_medians)]),
            "job_step_s_mean": round(statistics.median(job_means), 5),
            "hand_step_s_mean": round(statistics.median(hand_means), 5),
            "ratio_hand_over_job_mean": round(statistics.median(hand_means) / statistics.median(job_means), 4),
            "peak_mem_ratio_job_over_hand": round(per_run[mid]["job"]["peak_mem_gb"]
                                                  / per_run[hmid]["hand"]["peak_mem_gb"], 4),
            "note": "step times are per-window means (one host sync per window, as the job's metrics record); "
                    "peak_mem_gb is torch.cuda.max_memory_allocated / 2**30 since the process started; "
                    "tokens_per_s and mfu from the mean step",
            "goal": ">= 0.99"}
