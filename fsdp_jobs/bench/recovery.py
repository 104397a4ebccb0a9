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

from fsdp_jobs.rundir import checkpoints, runs
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
    totals, parts = [], []
    args = ["train.steps=60", "checkpoint.interval=10", "checkpoint.keep_last=10", "train.log_interval=1"]
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(repeats):
            run_dir = Path(tmp) / f"r{i}"
            proc = subprocess.Popen([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp}", f"name=r{i}", *args],
                                    cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
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
            "repeats": repeats, "kill_to_next_step_s": spread(totals),
            "parts_s_median": {k: round(statistics.median(p[k] for p in parts), 3) for k in parts[0]},
            "parts_s_all": parts, "goal": "<= 2 s (issue #30)"}


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
