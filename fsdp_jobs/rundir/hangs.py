"""The hang records (RunDir.hangs_file): what each node's hang watchdog (launchers/node/watchdog.py) declared, one line per node
per hang, and the summary `fsdp-jobs status` shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import HangRecord

SAME_HANG_S = 30.0  # the nodes of one job declare the same hang within about a tick of each other


def record(run_dir: Path, entry: HangRecord) -> None:
    with open(RunDir(run_dir).hangs_file, "a") as f:
        f.write(json.dumps(entry.to_json()) + "\n")


def read(run_dir: Path) -> list[HangRecord]:
    """Every record, oldest first (a damaged line, or one that is not a hang record, is skipped)."""
    return [r for r in map(HangRecord.from_dict, runs.read_jsonl(RunDir(run_dir).hangs_file)) if r is not None]


def culprit(first: dict[str, Any]) -> str:
    """A hang's culprit in words: the rank that stopped first, or, where none had stopped (every heartbeat thread
    still beating, no process stopped: a peer or a link that does not answer, a collective that never
    completes), the rank that advanced least recently, claimed as no more than that; or the node that left the
    rendezvous round while the others waited for it."""
    if first.get("left"):
        return f"{first.get('node')} left the rendezvous (its agent stopped beating: cut off or gone)"
    rank_on = f"rank {first.get('rank')} on {first.get('node')}"
    return f"no rank known to be stopped (least recent: {rank_on})" if first.get("waiting") else f"{rank_on} stopped first"


def summary(run_dir: Path) -> Optional[dict[str, Any]]:
    """How many hangs, and the newest one as the node holding the rank that stopped first saw it (it has
    that rank's stack and frame); None if the run never hung."""
    entries = read(run_dir)
    if not entries:
        return None
    hangs, last = 0, -1e18
    for e in entries:  # one hang = the records of its nodes, close together in time
        if e.time - last > SAME_HANG_S:
            hangs += 1
        last = e.time
    newest = [e for e in entries if last - e.time <= SAME_HANG_S]
    best = max(newest, key=lambda e: (bool(e.first_stopped.get("left")), not e.first_stopped.get("waiting"),
                                      e.first_stopped.get("frame") is not None, e.node == e.first_stopped.get("node")))
    c = best.first_stopped
    step = best.step if c.get("left") else c.get("step")  # a node that left: the step its peers stalled at
    return {"hangs": hangs, "rank": c.get("rank"), "node": c.get("node"), "step": step,
            "state": c.get("state"), "frame": c.get("frame"), "stacks": best.dir, "time": best.time,
            "stalled_s": best.stalled_s, "timeout_s": best.timeout_s, "waiting": bool(c.get("waiting")),
            "left": bool(c.get("left"))}
