"""The goodput timeline's events (goodput.jsonl; the accounting: fsdp_jobs/rundir/goodput.py): appended by the
node wrappers (node_start, node_end) and rank 0 (fsdp_jobs/runtime/timeline.py), a handful per attempt and
per checkpoint, never per step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import GoodputEvent

RANK_EVENTS = ("start", "process_group", "preflight", "built", "loaded", "loop", "steps", "save", "stall", "interval",
               "end")
NODE_EVENTS = ("node_start", "node_end")


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """One line appended to the timeline (never through a link: runs.open_append). Best effort: the
    timeline must never stop a job."""
    record = GoodputEvent(event=event, time=fields.pop("time") if "time" in fields else time.time(), pid=fields.pop("pid", None),
                          extra=fields)
    try:
        with runs.open_append(RunDir(run_dir).goodput_file) as f:
            f.write(json.dumps(record.to_json()) + "\n")
    except OSError:
        pass


def read_events(path: Path) -> list[GoodputEvent]:
    """The timeline's events, oldest first: a line cut by a kill, not JSON, or not an event is left out."""
    return [e for e in map(GoodputEvent.from_dict, runs.read_jsonl(path)) if e is not None]
