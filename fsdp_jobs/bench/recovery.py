"""`bench recovery` and `bench replica`: a killed rank's time to the next step, and its parts."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.bench.common import REPO, spread


def recovery_parts(run_dir: Path, killed_at: float) -> dict[str, float]:
    """SIGKILL of a rank -> the first step after it, cut at the restarted rank 0's timeline marks
    (fsdp_jobs/rundir/goodput.py): what torchrun and each start-up phase take."""
    from fsdp_jobs.rundir.events import read_timeline

    events, _ = read_timeline(run_dir)
    start = next(e for e in events if e["event"] == "start" and e["time"] > killed_at)
    mine = [e for e in events if e.get("pid") == start["pid"]]
    mark = {e["event"]: e for e in mine}
    first_step = next(m["time"] for m in runs.read_metrics(run_dir) if m["time"] > killed_at)
    cuts = [("torchrun: notice, stop the others, re-rendezvous, start", start["time"]),
            ("interpreter", start["main"]), ("imports", mark["process_group"]["began"]),
            ("process group + mesh", mark["process_group"]["time"]), ("build + materialize", mark["built"]["time"]),
            ("state load (memory or checkpoint)", mark["loaded"]["time"]), ("data, metrics", mark["loop"]["time"]),
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


def _kill_mid_interval(tmp: str, name: str, args: list[str], at_step: int) -> dict[str, Any]:
    """One 2x2 job: SIGKILL rank 3 once step `at_step` is in the metrics (checkpoints every 50 by default:
    half way to the first); the recovery's parts, the step it resumed at and the time to a new step."""
    run_dir = Path(tmp) / name
    proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name={name}", *args],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (RunDir(run_dir).metrics_file.exists() and len(runs.read_metrics(run_dir)) >= at_step):
        if proc.poll() is not None:
            raise SystemExit(f"recovery run {name} ended early ({proc.returncode})")
        time.sleep(0.01)
    pid = _rank_pid(run_dir, 3)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    done = max(int(m["step"]) for m in runs.read_metrics(run_dir) if m["time"] <= killed_at)
    if proc.wait(timeout=900) != 0:
        raise SystemExit(f"recovery run {name} failed ({proc.returncode})")
    from fsdp_jobs.rundir.events import read_timeline

    events, _ = read_timeline(run_dir)
    loaded = next(e for e in events if e["event"] == "loaded" and e["time"] > killed_at)
    new = next(m["time"] for m in runs.read_metrics(run_dir) if m["time"] > killed_at and m["step"] > done)
    return {"parts": recovery_parts(run_dir, killed_at), "new_step_s": round(new - killed_at, 3),
            "done_at_kill": done, "resumed_at": loaded["step"], "source": loaded.get("source")}


def bench_recovery(repeats: int) -> dict[str, Any]:
    """A 2x2 CPU job (the tiny default model, default checkpoint settings): SIGKILL rank 3 at step 25, half
    way to the first checkpoint; with in-memory snapshots (the default) and without
    (checkpoint.memory_interval=0), alternated. Per mode: the time to the first completed step after the
    kill and to the first step not done before it, the steps redone, and the parts, median of `repeats`."""
    modes = {"memory": [], "disk": ["checkpoint.memory_interval=0"]}
    args = ["train.steps=80", "train.log_interval=1"]
    found: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(repeats):
            for mode, extra in modes.items():
                found[mode].append(_kill_mid_interval(tmp, f"{mode}{i}", [*args, *extra], at_step=25))
    out: dict[str, Any] = {"benchmark": "recovery", "repeats": repeats,
                           "job": "2 nodes x 2 ranks, CPU, tiny model, default settings; SIGKILL of rank 3 at step 25"}
    for mode, runs_ in found.items():
        parts = [r["parts"] for r in runs_]
        out[mode] = {"kill_to_next_step_s": spread([sum(p.values()) for p in parts]),
                     "kill_to_new_step_s": spread([r["new_step_s"] for r in runs_]),
                     "steps_redone": [r["done_at_kill"] - r["resumed_at"] for r in runs_],
                     "sources": [r["source"] for r in runs_],
                     "parts_s_median": {k: round(statistics.median(p[k] for p in parts), 3) for k in parts[0]},
                     "parts_s_all": parts}
    out["disk_over_memory_new_step"] = round(statistics.median(r["new_step_s"] for r in found["disk"])
                                             / statistics.median(r["new_step_s"] for r in found["memory"]), 2)
    out["goal"] = "memory: kill_to_next_step_s median <= 1.0 s, steps_redone <= 1 (issue 46)"
    return out


def _replica_run(tmp: str, name: str, args: list[str], kill_rank: Optional[int]) -> tuple[list[dict[str, Any]], float]:
    """One local job (its metrics, and when `kill_rank` was SIGKILLed once step 20 was done; 0.0: no kill)."""
    run_dir = Path(tmp) / name
    proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name={name}", *args], cwd=REPO,
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
            "repeats": repeats, "step_s": {k: spread(v) for k, v in step_s.items()},
            "replica_over_none_step_time": round(rep / none, 3),
            "lost_to_a_kill_s": {k: spread(v) for k, v in lost.items()},
            "none_over_replica_lost": round(statistics.median(lost["none"]) / statistics.median(lost["replica"]), 2)}
