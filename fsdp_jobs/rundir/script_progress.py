"""How far a script= or module= run got, read from its run dir: the step and the checkpoints of training that
is not the built-in trainer's, for `status` and the end-of-job summary (README: "HF Trainer and Accelerate").

A script reports them through fsdp_jobs.job (its metrics record and the trainer's checkpoints/step-N), or
fsdp-jobs recognises the layouts the common libraries write:

  HF Trainer     checkpoint-N/ holding trainer_state.json (the step: its global_step)
  Accelerate     an accelerator.save_state folder, holding random_states_0.pkl (the step: the number that
                 ends its name, as in step_N)
  DCP            a folder holding .metadata (torch.distributed.checkpoint; folders side by side in one step_N,
                 a model's and an optimizer's, are one checkpoint; the step: the number that ends its name)

searched in the run dir (the ranks' working directory) and the folders the script's arguments name
(--output_dir, --project-dir, ...), MAX_DEPTH levels deep and at most MAX_ENTRIES entries, so a script
that writes many small files costs `status` little. Anything else is "not tracked", never an error: the
script owns its checkpoints and its resume. No torch: `status` reads this.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.checkpoints import DCP_METADATA_FILE, committed_checkpoints
from fsdp_jobs.rundir.layout import RunDir

MAX_DEPTH = 4  # run dir / output dir / checkpoint_N / pytorch_model_fsdp_0 / .metadata: Accelerate's deepest
MAX_ENTRIES = 20_000
HF_TRAINER, ACCELERATE, DCP, JOB_API = "HF Trainer", "Accelerate", "DCP", "fsdp_jobs.job"
HF_STATE_FILE = "trainer_state.json"  # written last into an HF Trainer's checkpoint-N
ACCELERATE_MARK = "random_states_0.pkl"  # written by every accelerator.save_state, after the model and optimizer
_HF_DIR = re.compile(r"checkpoint-(\d+)")
_TRAILING_NUMBER = re.compile(r"(\d+)$")
_OUTPUT_FLAG = re.compile(r"--?(output|project|checkpoints?|ckpt|save)[-_]?dir")
_SET_ASIDE = RunDir(Path(".")).checkpoints_before_dir("").name  # a start over's: no longer the run's
NOT_TRACKED = ("not tracked: the script reports no step through fsdp_jobs.job and fsdp-jobs found no checkpoint "
               "folder it recognises (HF Trainer's checkpoint-N, Accelerate's save_state, a DCP folder) in the "
               "run dir or the folders its --output_dir/--project_dir arguments name")


@dataclass(frozen=True)
class Found:
    """One checkpoint the script wrote."""

    path: Path
    step: Optional[int]
    layout: str  # HF_TRAINER, ACCELERATE, DCP or JOB_API


@dataclass(frozen=True)
class Progress:
    step: Optional[int]
    step_from: str  # where the step was read ("" without one)
    checkpoints: tuple[Found, ...]  # oldest first

    @property
    def tracked(self) -> bool:
        return self.step is not None or bool(self.checkpoints)

    @property
    def newest(self) -> Optional[Found]:
        return self.checkpoints[-1] if self.checkpoints else None

    def to_json(self) -> dict[str, Any]:
        if not self.tracked:
            return {"tracked": False, "why": NOT_TRACKED}
        newest = self.newest
        return {"tracked": True, "step": self.step, "step_from": self.step_from,
                "checkpoint": str(newest.path) if newest else None, "layout": newest.layout if newest else None,
                "checkpoints": [str(c.path) for c in self.checkpoints]}


def user_code(job: Mapping[str, Any]) -> Optional[str]:
    """`script train.py` or `module mypkg.train` for a job record that runs the user's own training, else None."""
    if job.get("script"):
        return f"script {Path(str(job['script'])).name}"
    if job.get("module"):
        return f"module {job['module']}"
    return None


def progress(run_dir: Path, job: Mapping[str, Any]) -> Progress:
    """The step and checkpoints of a script= / module= run (its job record `job`)."""
    rows = runs.read_metrics_tail(run_dir, 1)  # fsdp_jobs.job.log's newest row
    ours = [Found(path, step, JOB_API) for step, path in committed_checkpoints(run_dir)]
    found = sorted(ours + recognised(run_dir, job), key=_order)
    step = rows[-1].get("step") if rows and isinstance(rows[-1].get("step"), int) else None
    if step is not None:
        return Progress(step, "the metrics record (fsdp_jobs.job.log)", tuple(found))
    stepped = [c for c in found if c.step is not None]
    if not stepped:
        return Progress(None, "", tuple(found))
    newest = max(stepped, key=_order)
    return Progress(newest.step, _step_source(newest), tuple(found))


def recognised(run_dir: Path, job: Mapping[str, Any]) -> list[Found]:
    """Every checkpoint of a recognised layout under the run dir and the script's output folders (one inside
    another counts once: the outer, as an HF checkpoint-N holding FSDP's DCP folders)."""
    candidates: dict[Path, Found] = {}
    for root in search_roots(run_dir, job):
        for folder, names in _walk(root, _skipped(run_dir)):
            found = _classify(root, folder, names)
            if found is not None:
                candidates.setdefault(found.path, found)
    paths = set(candidates)
    return [f for p, f in candidates.items() if not any(a in paths for a in p.parents)]


def search_roots(run_dir: Path, job: Mapping[str, Any]) -> list[Path]:
    """The run dir, then each folder the script's arguments name as its output (relative: to the run dir,
    where the ranks run), outside the run dir."""
    roots = [run_dir.resolve()]
    args = [str(a) for a in job.get("script_args") or []]
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if not _OUTPUT_FLAG.fullmatch(flag) or not value:
            continue
        path = (run_dir / Path(value).expanduser()).resolve()
        if path.is_dir() and path not in roots and roots[0] not in path.parents:
            roots.append(path)
    return roots


def _skipped(run_dir: Path) -> set[Path]:
    """The run dir's own folders: the job's records, the copy of the script, and fsdp_jobs.job's checkpoints
    (read by their own rules above)."""
    rd = RunDir(run_dir.resolve())
    return {rd.checkpoints_dir, rd.script_dir, rd.code_dir, rd.logs_dir, rd.ranks_dir, rd.liveness_dir,
            rd.stacks_dir, rd.export_dir, rd.tensorboard_dir, rd.wandb_dir, rd.history_dir}


def _walk(root: Path, skipped: set[Path]) -> Iterator[tuple[Path, list[str]]]:
    """(folder, its entry names) under `root`, breadth first, MAX_DEPTH deep, MAX_ENTRIES entries at most;
    hidden folders, links and the run dir's own folders left out; an unreadable folder skipped."""
    level, budget = [root], MAX_ENTRIES
    for _ in range(MAX_DEPTH + 1):
        below: list[Path] = []
        for folder in level:
            try:
                with os.scandir(folder) as it:  # a folder of a million files is read no further than the budget
                    entries = list(itertools.islice(it, budget))
            except OSError:
                continue
            budget -= len(entries)
            yield folder, [e.name for e in entries]
            if budget <= 0:
                return
            below += [Path(e.path) for e in entries if _descend(e, skipped)]
        level = below


def _descend(entry: os.DirEntry, skipped: set[Path]) -> bool:
    try:
        is_dir = entry.is_dir(follow_symlinks=False)
    except OSError:
        return False
    return (is_dir and not entry.name.startswith(".") and Path(entry.path) not in skipped
            and not entry.name.startswith(_SET_ASIDE))


def _classify(root: Path, folder: Path, names: list[str]) -> Optional[Found]:
    m = _HF_DIR.fullmatch(folder.name)
    if m and HF_STATE_FILE in names:
        return Found(folder, _global_step(folder / HF_STATE_FILE, int(m.group(1))), HF_TRAINER)
    if ACCELERATE_MARK in names:
        return Found(folder, _trailing_number(folder.name), ACCELERATE)
    if DCP_METADATA_FILE in names:  # written last by torch.distributed.checkpoint
        # a model's and an optimizer's DCP folder side by side in step_N/: step_N is the checkpoint
        parent = folder.parent
        if parent != root and _trailing_number(folder.name) is None and _trailing_number(parent.name) is not None:
            return Found(parent, _trailing_number(parent.name), DCP)
        return Found(folder, _trailing_number(folder.name), DCP)
    return None


def _global_step(path: Path, default: int) -> int:
    try:
        step = json.loads(path.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return default
    return step if isinstance(step, int) else default


def _trailing_number(name: str) -> Optional[int]:
    m = _TRAILING_NUMBER.search(name)
    return int(m.group(1)) if m and "epoch" not in name.lower() else None


def _order(f: Found) -> tuple[int, float]:
    try:
        mtime = f.path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return (f.step if f.step is not None else -1, mtime)


def _step_source(f: Found) -> str:
    if f.layout == HF_TRAINER:
        return f"global_step in {f.path.name}/{HF_STATE_FILE}"
    if f.layout == JOB_API:
        return f"its checkpoint {f.path.name}"
    return f"the number ending {f.path.name}'s name"
