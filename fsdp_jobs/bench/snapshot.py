"""`bench snapshot`: what in-memory snapshots (fsdp_jobs/runtime/snapshots.py) cost a step, side by side."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fsdp_jobs.bench.common import REPO, spread
from fsdp_jobs.rundir.events import read_timeline
from fsdp_jobs.rundir.layout import RunDir


def _run(tmp: str, name: str, args: list[str]) -> Path:
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name={name}", *args],
                       capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"snapshot bench run {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return Path(tmp) / name


def _intervals(run_dir: Path, warmup: int) -> list[tuple[int, float]]:
    """(step, seconds from its row to the next one's) past `warmup`: host time at the end of each step, a row
    every step (log_interval=1); what a step kept did after its row (check, snapshot) is in its interval."""
    rows = [json.loads(x) for x in RunDir(run_dir).metrics_file.read_text().splitlines()]
    return [(a["step"], b["time"] - a["time"]) for a, b in zip(rows[warmup:], rows[warmup + 1:])]


def _step_times(tmp: str, name: str, args: list[str], warmup: int) -> list[float]:
    return [s for _, s in _intervals(_run(tmp, name, args), warmup)]


def check_cost_within(run_dir: Path, warmup: int) -> tuple[float, float]:
    """A job checking every 2nd step and keeping no snapshot: how much longer the interval after a checked step
    is than after an unchecked one (means), and the unchecked one. Within one job: the spread between whole jobs
    (several percent here) cancels; and all a check costs is in it (its launch, the larger vote, the verdict's
    read, what reading the state costs the next step's computation)."""
    spans = _intervals(run_dir, warmup)
    checked = statistics.mean(s for step, s in spans if step % 2 == 0)
    unchecked = statistics.mean(s for step, s in spans if step % 2)
    return checked - unchecked, unchecked


def auto_choice(run_dir: Path) -> dict[str, Any]:
    """memory_interval=auto's record: the interval it chose and what it measured (fsdp_jobs/rundir/goodput.py)."""
    return next((e for e in read_timeline(run_dir)[0] if e["event"] == "memory_interval"), {})


def bench_snapshot(repeats: int, steps: int, device: str, extra: list[str], warmup: int = 10) -> dict[str, Any]:
    """The default 2x2 job (or `extra`'s) with a snapshot after every step (checkpoint.memory_interval=1), the
    same without the replica agreement check before each (fault.sdc_check_interval=0: fsdp_jobs/runtime/sdc.py),
    and with neither; and the defaults (memory_interval=auto, the check every few snapshots) with the check and
    without; and a job with no snapshot checking every 2nd step (`check_cost_within`): alternated `repeats` times,
    median and mean step time of each and their ratios. On a GPU (`device`
    cuda) the same with cluster.device=cuda. A metrics row every step on every side (the snapshots flush them),
    no checkpoint but the last."""
    base = [f"train.steps={steps}", "train.log_interval=1", "checkpoint.interval=0", "checkpoint.save_final=false",
            *(["cluster.device=cuda"] if device == "cuda" else []), *extra]
    modes = {"every_step": ["checkpoint.memory_interval=1"],
             "every_step_unchecked": ["checkpoint.memory_interval=1", "fault.sdc_check_interval=0"],
             "off": ["checkpoint.memory_interval=0"],
             "default": [], "default_unchecked": ["fault.sdc_check_interval=0"],
             "check_every_2nd": ["checkpoint.memory_interval=0", "fault.sdc_check_interval=2"]}
    medians: dict[str, list[float]] = {m: [] for m in modes}
    means: dict[str, list[float]] = {m: [] for m in modes}  # what a job's throughput sees: every step, checked or not
    within: list[tuple[float, float]] = []
    chosen: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        for i in range(repeats):
            for mode, args in modes.items():
                run_dir = _run(tmp, f"{mode}{i}", [*base, *args])
                times = [s for _, s in _intervals(run_dir, warmup)]
                medians[mode].append(statistics.median(times))
                means[mode].append(statistics.mean(times))
                if mode == "check_every_2nd":
                    within.append(check_cost_within(run_dir, warmup))
                if mode == "default":
                    chosen.append(auto_choice(run_dir))

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(medians[a]) / statistics.median(medians[b]), 4)

    return {"benchmark": "snapshot", "job": base, "repeats": repeats,
            "step_s": {m: [round(x, 5) for x in v] for m, v in medians.items()},
            "every_step_over_off": ratio("every_step", "off"),
            "unchecked_over_off": ratio("every_step_unchecked", "off"),
            "check_over_unchecked": ratio("every_step", "every_step_unchecked"),
            "ratio_per_pair": spread([a / b for a, b in zip(medians["every_step"], medians["off"])]),
            "check_ratio_per_pair": spread([a / b for a, b in zip(medians["every_step"],
                                                                 medians["every_step_unchecked"])]),
            "default_check_over_unchecked": ratio("default", "default_unchecked"),
            "default_check_ratio_per_pair": spread([a / b for a, b in zip(medians["default"],
                                                                         medians["default_unchecked"])]),
            "default_over_off": ratio("default", "off"),
            # a check every few steps is on none of the median's steps: its cost shows in the mean step only
            "mean_step_s": {m: [round(x, 5) for x in v] for m, v in means.items()},
            "default_check_over_unchecked_mean": round(statistics.median(means["default"]) /
                                                       statistics.median(means["default_unchecked"]), 4),
            "default_check_mean_ratio_per_pair": spread([a / b for a, b in zip(means["default"],
                                                                              means["default_unchecked"])]),
            **check_share(within, chosen),
            "goal": "snapshots <= 1.05 on CPU, <= 1.01 on a GPU (issue 46); the check <= 1.01 (issue 47)"}


def bench_check(repeats: int, steps: int, device: str, extra: list[str], warmup: int = 10) -> dict[str, Any]:
    """The default job (or `extra`'s) with its default replica check and without (fault.sdc_check_interval=0), and
    nothing else, alternated `repeats` times: more pairs in the same time than `bench snapshot`, for a cost near
    the jobs' spread. Each run's mean step (what a job's throughput sees: checked steps and the others) and
    median; their ratios over the pairs; and auto's chosen intervals."""
    base = [f"train.steps={steps}", "train.log_interval=1", "checkpoint.interval=0", "checkpoint.save_final=false",
            *(["cluster.device=cuda"] if device == "cuda" else []), *extra]
    means: dict[str, list[float]] = {"default": [], "unchecked": []}
    medians: dict[str, list[float]] = {"default": [], "unchecked": []}
    chosen = []
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        for i in range(repeats):
            for mode, args in (("default", []), ("unchecked", ["fault.sdc_check_interval=0"])):
                run_dir = _run(tmp, f"{mode}{i}", [*base, *args])
                times = [t for _, t in _intervals(run_dir, warmup)]
                means[mode].append(statistics.mean(times))
                medians[mode].append(statistics.median(times))
                if mode == "default":
                    chosen.append(auto_choice(run_dir))
    pairs = [a / b for a, b in zip(means["default"], means["unchecked"])]
    return {"benchmark": "check", "job": base, "repeats": repeats,
            "mean_step_s": {m: [round(x, 5) for x in v] for m, v in means.items()},
            "median_step_s": {m: [round(x, 5) for x in v] for m, v in medians.items()},
            "check_over_unchecked_mean": round(statistics.median(means["default"]) /
                                               statistics.median(means["unchecked"]), 4),
            "check_over_unchecked_median": round(statistics.median(medians["default"]) /
                                                 statistics.median(medians["unchecked"]), 4),
            "mean_ratio_per_pair": spread(pairs), "mean_ratio_of_pair_means": round(statistics.mean(pairs), 4),
            "auto_intervals": [c.get("steps") for c in chosen], "auto_check_intervals": [c.get("check_steps")
                                                                                      for c in chosen],
            "goal": "the default check <= 1.01 (issue 47)"}


def check_share(within: list[tuple[float, float]], chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """The default check's cost from within jobs (`check_cost_within`), spread over the interval
    memory_interval=auto chose for it, against what auto timed of it (its launch and its verdict's read)."""
    if not within or not chosen:
        return {}
    check_s = statistics.median(c for c, _ in within)
    step_s = statistics.median(s for _, s in within)
    every = statistics.median(c.get("check_steps", c.get("steps", 1)) for c in chosen)
    return {"check_ms_within_job": [round(c * 1000, 3) for c, _ in within],
            "auto_measured_check_ms": [round(c["check_s"] * 1000, 3) for c in chosen if "check_s" in c],
            "auto_intervals": [c.get("steps") for c in chosen],
            "auto_check_intervals": [c.get("check_steps") for c in chosen],
            "default_check_cost_within_jobs": round(1 + check_s / (every * step_s), 4)}


def bench_recheck(repeats: int, steps: int, device: str, extra: list[str], warmup: int = 10) -> dict[str, Any]:
    """The default 2x2 job under full_shard (one group: no replicas to compare) with a step taken again every 10
    and every 100 steps (fault.sdc_recompute_interval: fsdp_jobs/runtime/recheck.py) and without, alternated
    `repeats` times: the mean step time of each (a checked step is slower, the others are not: a median would not
    see it) and their ratios to none."""
    base = ["fsdp=full_shard", f"train.steps={steps}", "train.log_interval=1", "checkpoint.interval=0",
            "checkpoint.save_final=false", *(["cluster.device=cuda"] if device == "cuda" else []), *extra]
    modes = {"off": [], "every_10": ["fault.sdc_recompute_interval=10"],
             "every_100": ["fault.sdc_recompute_interval=100"]}
    means: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-recheck-") as tmp:
        for i in range(repeats):
            for mode, args in modes.items():
                means[mode].append(statistics.mean(_step_times(tmp, f"{mode}{i}", [*base, *args], warmup)))
    return {"benchmark": "recheck", "job": base, "repeats": repeats,
            "mean_step_s": {m: [round(x, 5) for x in v] for m, v in means.items()},
            **{f"{m}_over_off": round(statistics.median(means[m]) / statistics.median(means["off"]), 4)
               for m in ("every_10", "every_100")},
            **{f"{m}_ratio_per_pair": spread([a / b for a, b in zip(means[m], means["off"])])
               for m in ("every_10", "every_100")}}
