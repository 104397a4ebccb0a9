"""`python -m fsdp_jobs.bench interval [--faults 6] [--seed 1] [--steps 1000] [--intervals 10,50,200,auto]
[--repeats 3] [-- OVERRIDES...]`: checkpoint.interval=auto against fixed intervals on one seeded fault schedule.

Each round runs the same job once per interval, in turn (this machine is noisy: the intervals of one round
run side by side), each under `fsdp-jobs chaos RUN marathon --kinds kill-rank --margin 20`: the chaos
marathon's seeded schedule of SIGKILLed ranks, at the same steps whatever the interval. Kill-rank alone: a
failure whose cost is the work since the last checkpoint, which is what the interval trades against the
time saves block (a hang adds its detection time, a slow node costs no checkpointed work). Prints JSON:
per interval and round the goodput (effective %, wall time, checkpoint and lost seconds, lost steps) and
auto's last choice with its inputs; per interval the medians; and, round by round, auto's effective % minus
each fixed one's and each fixed one's interval cost (checkpoint + lost seconds) minus auto's.

The faults' steps are spread evenly (the marathon's schedule); their phase against a fixed interval decides
its lost work, so pick --faults so that the steps are not all just after a multiple of a fixed interval (6
faults in 1,000 steps fall at 21, 181, 340, 500, 660, 819: one step after a checkpoint of interval 10, which
a memoryless failure would not do; 7 fall at 21, 158, 295, 432, 568, 705, 842)."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.bench.chaos import SMALL, _cli, _ended
from fsdp_jobs.planning.chaos_kinds import ChaosKind
from fsdp_jobs.rundir.layout import RunDir

MARGIN = 20  # steps free of faults at each end: the schedule is the same for every interval


def job_args(faults: int, seed: int, steps: int, every: str, overrides: list[str]) -> list[str]:
    return [f"train.steps={steps}", f"checkpoint.interval={every}", "checkpoint.keep_last=2", f"train.seed={seed}",
            "train.log_interval=1", f"cluster.max_restarts={faults + 3}", *SMALL, *overrides]


def one_run(root: Path, name: str, args: list[str], faults: int, seed: int) -> dict[str, Any]:
    """The job under the marathon; its goodput and, for auto, its last choice."""
    from fsdp_jobs.rundir import goodput

    job = _cli(f"run_root={root}", f"name={name}", *args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    metrics = RunDir(root / name).metrics_file
    while not metrics.exists() and job.poll() is None:
        time.sleep(0.2)
    marathon = _cli("chaos", name, "marathon", "--faults", str(faults), "--seed", str(seed), "--kinds",
                    ChaosKind.KILL_RANK.value, "--margin", str(MARGIN), "--run-root", str(root), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
    lines = [line.rstrip("\n") for line in marathon.stdout or []]
    marathon_rc, job_rc = marathon.wait(), job.wait()
    state = _ended(root / name)
    total = (goodput.of_run(root / name) or {}).get("total", {})
    parts = total.get("parts_s", {})
    return {"job_exit": job_rc, "marathon_exit": marathon_rc, "state": state,
            "effective_pct": total.get("effective_pct"), "wall_s": total.get("wall_s"),
            "checkpoint_s": parts.get("checkpoint"), "lost_s": parts.get("lost"), "lost_steps": total.get("lost_steps"),
            # what the interval trades: time blocked by saves against work computed again after a failure (the
            # restarts' own start-up and recovery are the same faults whatever the interval, and noisy here)
            "interval_cost_s": round(parts.get("checkpoint", 0.0) + parts.get("lost", 0.0), 3),
            "faults_at": next((ln for ln in lines if ln.startswith("marathon: ") and " at steps " in ln), None),
            "auto_last_choice": total.get("checkpoint_interval")}


def bench_interval(faults: int, seed: int, steps: int, intervals: list[str], repeats: int,
                   overrides: list[str], keep: Path | None = None) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-interval-") as tmp:
        root = keep or Path(tmp)
        for r in range(repeats):
            order = intervals if r % 2 == 0 else intervals[::-1]  # alternate which runs first
            runs = {every: one_run(root, f"r{r}-{every}", job_args(faults, seed, steps, every, overrides), faults, seed)
                    for every in order}
            rounds.append({every: runs[every] for every in intervals})
    ok = all(run["state"] == "SUCCEEDED" and run["marathon_exit"] == 0 for rnd in rounds for run in rnd.values())
    medians = {every: {k: statistics.median(rnd[every][k] for rnd in rounds)
                       for k in ("effective_pct", "interval_cost_s", "wall_s", "checkpoint_s", "lost_s", "lost_steps")}
               for every in intervals}
    fixed = [every for every in intervals if every != "auto"]
    margins = {every: [round(rnd["auto"]["effective_pct"] - rnd[every]["effective_pct"], 1) for rnd in rounds]
               for every in fixed} if "auto" in intervals else {}
    saved = {every: [round(rnd[every]["interval_cost_s"] - rnd["auto"]["interval_cost_s"], 2) for rnd in rounds]
             for every in fixed} if "auto" in intervals else {}
    return {"benchmark": "interval", "faults": faults, "seed": seed, "steps": steps, "repeats": repeats,
            "job": job_args(faults, seed, steps, "N", overrides), "every_run_succeeded": ok,
            "median": medians, "auto_minus_fixed_effective_pct_by_round": margins,
            "fixed_minus_auto_interval_cost_s_by_round": saved, "rounds": rounds}
