"""`fsdp-jobs chaos RUN hang-rank R | slow-node N | resume`: faults a job must survive, on the ranks'
processes this machine can see (cluster=local, cluster=docker's containers, the one-machine SLURM cluster).

A rank process is found by its environment (FSDP_JOBS_RUN_DIR = this run dir, RANK = R): the proof that it
is this run's, whatever a file in the run dir says. hang-rank stops it (SIGSTOP: alive, but no progress,
as a deadlock or a dead GPU looks from outside); slow-node throttles a node's ranks with a stop/continue
duty cycle from a small background process; resume undoes both.

    python -m launchers.chaos throttle RUN_DIR NODE FRACTION     (the duty cycle itself; started by slow-node)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

THROTTLE_FILE = "chaos-throttle.json"
PERIOD_S = 0.2


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def rank_processes(run_dir: Path) -> dict[int, tuple[int, str]]:
    """{rank: (pid, node)} of this run's live rank processes on this machine."""
    mine = str(run_dir.resolve())
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        if env.get("FSDP_JOBS_RUN_DIR") and "RANK" in env and "LOCAL_RANK" in env:
            try:
                same = str(Path(env["FSDP_JOBS_RUN_DIR"]).resolve()) == mine
            except OSError:
                continue
            if same and env["RANK"].isdigit():
                found[int(env["RANK"])] = (int(entry.name), env.get("FSDP_JOBS_NODE", ""))
    return found


def hang_rank(run_dir: Path, rank: int) -> str:
    procs = rank_processes(run_dir)
    if rank not in procs:
        raise LookupError(f"no running rank {rank} of this run on this machine; ranks: "
                          + (", ".join(str(r) for r in sorted(procs)) or "none"))
    pid, node = procs[rank]
    os.kill(pid, signal.SIGSTOP)
    return f"stopped rank {rank} (pid {pid} on {node}): it is alive and makes no progress; undo: chaos RUN resume"


def slow_node(run_dir: Path, node: str, fraction: float = 0.6) -> str:
    pids = [pid for pid, n in rank_processes(run_dir).values() if n == node]
    if not pids:
        raise LookupError(f"no running rank on {node} of this run on this machine")
    stop_throttle(run_dir)
    p = subprocess.Popen([sys.executable, "-m", "launchers.chaos", "throttle", str(run_dir), node, str(fraction)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    (run_dir / THROTTLE_FILE).write_text(json.dumps({"pid": p.pid, "node": node, "fraction": fraction}) + "\n")
    return (f"throttling {node}'s {len(pids)} ranks: stopped {fraction:.0%} of every {PERIOD_S:g} s (pid {p.pid}); "
            "undo: chaos RUN resume")


def stop_throttle(run_dir: Path) -> Optional[int]:
    """Stop this run's throttler, if one runs (its command line names this run dir: proof it is ours)."""
    try:
        pid = int(json.loads((run_dir / THROTTLE_FILE).read_text())["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if b"launchers.chaos" in cmdline and str(run_dir).encode() in cmdline:
        os.kill(pid, signal.SIGTERM)
        (run_dir / THROTTLE_FILE).unlink(missing_ok=True)
        return pid
    return None


def resume(run_dir: Path) -> str:
    throttler = stop_throttle(run_dir)
    procs = rank_processes(run_dir)
    for pid, _ in procs.values():
        os.kill(pid, signal.SIGCONT)
    return (f"continued {len(procs)} ranks" + (f"; stopped the throttler (pid {throttler})" if throttler else ""))


def throttle(run_dir: Path, node: str, fraction: float) -> None:
    """Until SIGTERM: stop the node's ranks for `fraction` of each period, then let them run."""
    running = True

    def stop(_s: int, _f: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    pids: list[int] = []
    cycle = -1
    while running:
        cycle += 1
        if cycle % 10 == 0:  # look again every 2 s: restarted ranks have new pids (a /proc scan is not free)
            pids = [pid for pid, n in rank_processes(run_dir).values() if n == node]
        for sig, share in ((signal.SIGSTOP, fraction), (signal.SIGCONT, 1 - fraction)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            time.sleep(PERIOD_S * share)
    for pid, n in rank_processes(run_dir).values():
        if n == node:
            os.kill(pid, signal.SIGCONT)


if __name__ == "__main__":
    if sys.argv[1:2] == ["throttle"] and len(sys.argv) == 5:
        throttle(Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit("usage: python -m launchers.chaos throttle RUN_DIR NODE FRACTION")
