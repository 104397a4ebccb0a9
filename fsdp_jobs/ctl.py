"""fsdp-jobs list | status RUN | logs RUN [-f] | cancel RUN   (also: python -m fsdp_jobs.ctl ...)

RUN is a run name (under run_root, default ./runs), a run dir, or a SLURM job id. State comes from
the run dir (launches.jsonl, state.json, metrics.jsonl) and, for SLURM jobs, from SLURM itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs import runs
from fsdp_jobs.errors import UserError, die
from fsdp_jobs.plan import newest_checkpoint

COMMANDS = ("list", "status", "logs", "cancel")


def _sh(*cmd: str) -> str:
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip()


def slurm_state(job_id: str) -> str:
    """SLURM's own word: squeue while it is in the queue, sacct afterwards."""
    live = _sh("squeue", "-h", "-j", job_id, "-o", "%T %r %M")
    if live:
        return live.split()[0] + (f" ({live.split()[1]})" if len(live.split()) > 1 and live.split()[1] != "None" else "")
    done = _sh("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode,Elapsed")
    if done:
        state, code, elapsed = (done.splitlines()[-1].split("|") + ["", "", ""])[:3]
        return f"{state} (exit {code}, elapsed {elapsed})"
    return "UNKNOWN (not in squeue; no accounting record)"


def find_run(ref: str, run_root: Path) -> Path:
    for candidate in (Path(ref), run_root / ref):
        if (candidate / runs.JOB_FILE).is_file():
            return candidate.resolve()
    if ref.isdigit() and run_root.is_dir():
        for run_dir in sorted(run_root.iterdir()):
            if any(str(r.get("job_id")) == ref for r in runs.launches(run_dir)):
                return run_dir.resolve()
    known = ", ".join(sorted(p.name for p in run_root.glob("*") if (p / runs.JOB_FILE).is_file())[:20]) or "none"
    raise UserError("RUN", ref, f"no such run or job under {run_root}; runs there: {known}")


def last_launch(run_dir: Path) -> dict[str, Any]:
    return (runs.launches(run_dir) or [{}])[-1]


def run_status(run_dir: Path) -> dict[str, Any]:
    launch = last_launch(run_dir)
    out: dict[str, Any] = {"run": run_dir.name, "run_dir": str(run_dir), "backend": launch.get("backend")}
    if launch.get("backend") == "slurm":
        out["job_id"] = launch["job_id"]
        out["slurm_state"] = slurm_state(str(launch["job_id"]))
    elif launch.get("backend") == "local":
        lock = runs.RunLock(run_dir)
        running = not lock.acquire()
        if not running:
            lock.release()
        out["launcher_pid"] = lock.holder() if running else None
        out["local_state"] = "RUNNING" if running else "NOT RUNNING"
    out["train"] = runs.read_state(run_dir)
    metrics = runs.read_metrics(run_dir)
    if metrics:
        out["last_step"] = {k: metrics[-1].get(k) for k in ("step", "loss", "tokens_per_s", "world_size")}
    ckpt = newest_checkpoint(run_dir)
    out["checkpoint"] = str(ckpt) if ckpt else None
    return out


def log_files(run_dir: Path) -> list[Path]:
    launch = last_launch(run_dir)
    if launch.get("backend") == "slurm":
        return sorted(Path(launch["folder"]).glob("*_log.out"))
    return [run_dir / "logs" / "launcher.log"]


def cmd_logs(run_dir: Path, follow: bool, poll_s: float = 1.0) -> None:
    offsets: dict[Path, int] = {}
    while True:
        for f in log_files(run_dir):
            data = f.read_bytes() if f.exists() else b""
            start = offsets.get(f, 0)
            if len(data) > start:
                prefix = f"[{f.name}] " if len(log_files(run_dir)) > 1 else ""
                for line in data[start:].decode(errors="replace").splitlines():
                    print(prefix + line)
                offsets[f] = len(data)
        sys.stdout.flush()
        if not follow:
            return
        status = run_status(run_dir)
        if "slurm_state" in status and not status["slurm_state"].startswith(("PENDING", "RUNNING", "REQUEUED", "COMPLETING")):
            return
        time.sleep(poll_s)


def cmd_cancel(run_dir: Path) -> str:
    launch = last_launch(run_dir)
    if launch.get("backend") == "slurm":
        r = subprocess.run(["scancel", str(launch["job_id"])], capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise UserError("RUN", run_dir.name, f"scancel {launch['job_id']} failed: {r.stderr.strip()[:200]}")
        return f"cancelled SLURM job {launch['job_id']} ({run_dir.name})"
    status = run_status(run_dir)
    if status.get("launcher_pid"):
        os.kill(int(status["launcher_pid"]), signal.SIGTERM)  # the launcher stops the agents it started
        return f"asked local launcher pid {status['launcher_pid']} to stop ({run_dir.name})"
    return f"{run_dir.name} is not running"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="fsdp-jobs", description="Follow and control submitted runs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    parsers = {"list": sub.add_parser("list", help="runs under the run root, with their state")}
    for name in ("status", "cancel", "logs"):
        parsers[name] = sub.add_parser(name)
        parsers[name].add_argument("run", help="run name, run dir or SLURM job id")
    parsers["logs"].add_argument("-f", "--follow", action="store_true")
    for sp in parsers.values():
        sp.add_argument("--run-root", default=os.environ.get("FSDP_JOBS_RUN_ROOT", "runs"))
    args = p.parse_args(argv)
    root = Path(args.run_root)
    try:
        if args.cmd == "list":
            for run_dir in sorted(root.glob("*")):
                if (run_dir / runs.JOB_FILE).is_file():
                    s = run_status(run_dir)
                    state = s.get("slurm_state") or s.get("local_state") or "-"
                    print(f"{s['run']:<40} {s.get('backend') or '-':<6} {str(s.get('job_id', '')):<8} "
                          f"step {s.get('last_step', {}).get('step', 0):<7} {state}")
            return 0
        run_dir = find_run(args.run, root)
    except UserError as e:
        die(e)
    if args.cmd == "status":
        print(json.dumps(run_status(run_dir), indent=2))
    elif args.cmd == "logs":
        cmd_logs(run_dir, args.follow)
    else:
        try:
            print(cmd_cancel(run_dir))
        except UserError as e:
            die(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
