"""`python -m fsdp_jobs.bench chaos [--faults 30] [--seed 0] [--steps N] [-- OVERRIDES...]`: the chaos marathon
as a benchmark. An uninterrupted run first, then the same job again with `fsdp-jobs chaos RUN marathon` injecting
a seeded schedule of mixed faults into it (launchers/chaos/marathon.py); prints JSON: every incident (kind, step,
detected and recovered after, steps lost), the job's goodput, both wall times, and whether the two final
checkpoints are equal bit for bit (model, optimizer, scheduler, RNG and progress, consolidated in this process).

The job: 2 simulated nodes x 2 ranks on this machine (the default cluster), a small model stepping about 20 times
a second, checkpoint.interval=auto (it counts only the failures that cost checkpointed work: with every recovery
from memory it saves once early, to measure a save, and then as rarely as the prior MTBF says; `-- checkpoint.interval=20`
is the marathon of earlier sessions, the last override winning), short hang timeouts and enough restarts. OVERRIDES
after `--` are added to both runs (another backend's cluster=NAME, nodes=3 gpus_per_node=1, ...)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import checkpoints, runs
from fsdp_jobs.rundir.layout import RunDir

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.dim=64", "model.n_layers=2", "model.ffn_dim=128", "model.vocab_size=128", "data.seq_len=32"]
STEPS_PER_FAULT = 100  # ~5 s of training at ~20 steps/s between faults, beyond the faults' own time


def job_args(faults: int, seed: int, steps: Optional[int], overrides: list[str]) -> list[str]:
    """The job both runs are: room for the schedule's restarts and hangs, and steps for its faults."""
    return [f"train.steps={steps or STEPS_PER_FAULT * faults + 200}", "checkpoint.interval=auto",
            "checkpoint.keep_last=3", f"train.seed={seed}", "train.log_interval=1", "fault.hang_timeout_s=10",
            # a rank stopped inside a save is a hang after startup_timeout_s (saves may take long; 300 s by
            # default): a save of this small job takes a fraction of a second, so 45 s
            "fault.startup_timeout_s=45",
            f"fault.max_hang_restarts={faults}", f"cluster.max_restarts={faults + 5}", *SMALL, *overrides]


def _cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fsdp_jobs", *args], cwd=REPO, text=True,
                            stdin=subprocess.DEVNULL, **kw)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else None
    if items is None:
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


def state_difference(a: Path, b: Path) -> Optional[str]:
    """None when two committed checkpoints hold the same state bit for bit; else the first key that differs."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        flat = []
        for i, ckpt in enumerate((a, b)):
            dcp_to_torch_save(str(ckpt), f"{tmp}/{i}.pt")
            flat.append(_flatten(torch.load(f"{tmp}/{i}.pt", weights_only=False)))
    if flat[0].keys() != flat[1].keys():
        return f"keys: {sorted(set(flat[0]) ^ set(flat[1]))[:3]}"
    for k, va in flat[0].items():
        vb = flat[1][k]
        same = torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb
        if not same:
            return k
    return None


def _state(run_dir: Path) -> str:
    """What `fsdp-jobs status RUN` says of the run now, asked as a user asks it (UNKNOWN before it has a job
    record, or when the command answers no state)."""
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs", "status", str(run_dir)], cwd=REPO, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL)
    try:
        return str(json.loads(r.stdout).get("state", "UNKNOWN")) if r.returncode == 0 else "UNKNOWN"
    except (ValueError, AttributeError):
        return "UNKNOWN"


def _ended(run_dir: Path, timeout: float = 3600) -> str:
    """The run's final state: a backend that submits and returns (a scheduler's) ends later than its command."""
    deadline = time.time() + timeout
    while _state(run_dir) in ("PENDING", "RUNNING") and time.time() < deadline:
        time.sleep(2)
    return _state(run_dir)


def _marathon(root: Path, args: list[str], faults: int, seed: int) -> tuple[int, int, list[str], float]:
    """(job exit, marathon exit, marathon lines, job wall s) of the job run under the marathon."""
    began = time.time()
    with open(root / "chaos.out", "w") as out:  # what the job's command said: a failure is read there
        job = _cli(f"run_root={root}", "name=chaos", *args, stdout=out, stderr=subprocess.STDOUT)
    metrics = RunDir(root / "chaos").metrics_file
    while not metrics.exists() and (job.poll() is None or _state(root / "chaos") in ("PENDING", "RUNNING")):
        time.sleep(0.2)
    m = _cli("chaos", "chaos", "marathon", "--faults", str(faults), "--seed", str(seed), "--run-root", str(root),
             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = [line.rstrip("\n") for line in m.stdout or []]
    marathon_rc = m.wait()
    job_rc = job.wait()
    _ended(root / "chaos")
    return job_rc, marathon_rc, lines, time.time() - began


def bench_chaos(faults: int, seed: int, steps: Optional[int], overrides: list[str], keep: Optional[Path]) -> dict[str, Any]:
    from fsdp_jobs.rundir import goodput

    args = job_args(faults, seed, steps, overrides)
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        began = time.time()
        with open(root / "ref.out", "w") as out:
            ref_rc = _cli(f"run_root={root}", "name=ref", *args, stdout=out, stderr=subprocess.STDOUT).wait()
        ref_state = _ended(root / "ref")
        ref_wall = time.time() - began
        job_rc, marathon_rc, lines, wall = _marathon(root, args, faults, seed)
        incidents = runs.read_jsonl(RunDir(root / "chaos").chaos_incidents_file)
        final_ref, final = (checkpoints.newest_checkpoint(root / n) for n in ("ref", "chaos"))
        same = (state_difference(final_ref, final) if final_ref and final and final_ref.name == final.name
                else f"final checkpoints {final_ref and final_ref.name} vs {final and final.name}")
        report = goodput.of_run(root / "chaos") or {}
        said = {f"{name}_last_line": last_line(root / out) for name, out, rc in (("reference", "ref.out", ref_rc),
                                                                                 ("job", "chaos.out", job_rc)) if rc}
    return {"benchmark": "chaos", "faults": faults, "seed": seed, "job": args, "reference_exit": ref_rc, "reference_state": ref_state,
            "reference_wall_s": round(ref_wall, 1), "job_exit": job_rc, "marathon_exit": marathon_rc,
            "job_wall_s": round(wall, 1), "final_checkpoint": final.name if final else None,
            "bitwise_equal_to_uninterrupted": same is None, "first_difference": same,
            "incidents": incidents, "goodput": report.get("total"), "attempts": len(report.get("attempts", [])),
            "table": [line for line in lines if line.startswith("|")],
            "kept": str(keep) if keep else None, **said}


def last_line(path: Path) -> str:
    """The last line a failed command printed (its reason, by the product's rule), for the benchmark's JSON."""
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1][:300] if lines else ""
