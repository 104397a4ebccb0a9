"""What `status`, the end-of-job summary, the banner and `goodput` say of a script= / module= run (its step and
checkpoints: fsdp_jobs/rundir/script_progress.py, never the built-in trainer's plan), and of any run that
failed: the first failing rank of its last attempt, with its exit code and exception (fsdp_jobs/rundir/failures.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from fsdp_jobs.rundir import failures, runs, script_progress
from fsdp_jobs.rundir.layout import RunDir

NOT_TRACKED_SHORT = "step and checkpoints not tracked (the script reports none through fsdp_jobs.job, and no " \
                    "checkpoint-N, save_state or DCP folder was found)"


def job_record(run_dir: Path) -> dict[str, Any]:
    """The run's job record, or {} where it cannot be read (status still answers)."""
    try:
        job = runs.load_job(run_dir)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return {}
    return job if isinstance(job, dict) else {}


def status_fields(run_dir: Path, failed: bool, since: float) -> tuple[dict[str, Any], list[str]]:
    """`status`'s keys for a script= / module= run ("script": what runs, its step and checkpoints, or why they
    are not tracked; "checkpoint": its newest where fsdp_jobs.job wrote none) and for a failed run ("failure":
    the first failing rank since `since`, the newest launch), and what its detail line adds."""
    out: dict[str, Any] = {}
    said: list[str] = []
    job = job_record(run_dir)
    code = script_progress.user_code(job)
    if code:
        p = script_progress.progress(run_dir, job)
        out["script"] = {"runs": code, **p.to_json()}
        if p.newest is not None:
            out["checkpoint"] = str(p.newest.path)
        said.append(script_progress.describe_newest(p) if p.tracked else NOT_TRACKED_SHORT)
    cause = failures.cause(run_dir, since) if failed else None
    if cause:
        out["failure"] = cause
        said.append(f"first failure: {cause}")
    return out, said


def summary_lines(run_dir: Path) -> Optional[list[str]]:
    """The end-of-job summary's step, checkpoint and metrics lines of a script= / module= run (None for the
    built-in trainer's): what the script reported or wrote, or that it is not tracked."""
    job = job_record(run_dir)
    if not script_progress.user_code(job):
        return None
    p = script_progress.progress(run_dir, job)
    lines = [f"  step:         {p.step} ({p.step_from})"] if p.step is not None else []
    newest = p.newest
    if newest is not None:
        lines.append(f"  checkpoint:   {newest.path} ({newest.layout}, {len(p.checkpoints)} found)")
    elif not p.tracked:
        lines.append(f"  progress:     {script_progress.NOT_TRACKED}")
    metrics = RunDir(run_dir).metrics_file
    if metrics.is_file():
        lines.append(f"  metrics:      {metrics}")
    return lines


def failure_lines(run_dir: Path, status: int) -> list[str]:
    """The summary's line naming what failed a run that exited `status` (the failure records hold this
    submission's only)."""
    cause = failures.cause(run_dir) if status else None
    return [f"  failed:       {cause}"] if cause else []


def no_goodput(run_dir: Path) -> Optional[str]:
    """Why a script= / module= run has no goodput accounting, or None: the accounting needs the steps the
    ranks report (fsdp_jobs.job), and a plain script reports none."""
    code = script_progress.user_code(job_record(run_dir))
    if code is None:
        return None
    return (f"runs its own {code}, which has reported no steps through fsdp_jobs.job, and the goodput accounting "
            f"counts those: its {RunDir(run_dir).goodput_file.name} holds only its nodes' starts and ends; "
            "`fsdp-jobs status` shows its step and checkpoints where fsdp-jobs recognises them")
