"""What planning needs from outside the config, read from disk: the input files (fsdp_jobs/planning/inputs.py)
and the run dir (its newest committed checkpoint, the model its checkpoints were saved from). Kept out
of fsdp_jobs/planning/plan.py so that make_plan stays pure; plan_run() does both, in the order the checks have
always run: every config-only check first, then the input files, then the run dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

from fsdp_jobs.rundir.checkpoints import newest_checkpoint, none_usable, set_aside_checkpoints
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.inputs import check_inputs
from fsdp_jobs.planning.plan import ExistingRun, Plan, make_plan
from fsdp_jobs.rundir.layout import RunDir

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

MODEL_IDENTITY_KEYS = ("_target_", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                       "tie_embeddings", "kwargs")


def check_same_model(run_dir: Path, model: Any) -> None:
    """Resuming loads the run's checkpoints: refuse a model they cannot hold, before anything runs."""
    import yaml

    from fsdp_jobs.rundir import runs

    try:
        saved = (runs.load_job(run_dir) or {}).get("model", {})
    except (OSError, yaml.YAMLError):
        return
    for key in MODEL_IDENTITY_KEYS:
        if key in saved and saved[key] != model[key]:
            raise UserError(f"model.{key}", model[key],
                            f"run {run_dir.name} has checkpoints of a model with model.{key}={saved[key]!r}; "
                            f"keep model.{key}={saved[key]!r} to resume it, or start anew: another name=, or "
                            "checkpoint.resume=false (its checkpoints are then moved aside, not deleted)")


def read_existing_run(cfg: JobConfig, run_name: str) -> ExistingRun:
    """Check the job's input files and the run dir `run_name` under cfg.run_root; raises UserError for
    one the job cannot use (a missing token file, checkpoints it would mix with or cannot load)."""
    notes = check_inputs(cfg)  # the token file, test fault variables
    run_dir = (Path(cfg.run_root).expanduser() / run_name).resolve()
    resume = newest_checkpoint(run_dir)
    if resume is not None and not cfg.checkpoint.resume:
        # starting over: submit moves them aside first (submit.start_over), so new ones never mix with them
        notes.append(f"checkpoint.resume=false: run {run_name}'s checkpoints (newest {resume.name}) are moved to "
                     f"{RunDir(run_dir).checkpoints_before_dir('<time>').name} and it starts from step 0")
        resume = None
    elif resume is not None:
        check_same_model(run_dir, cfg.model)
    aside = set_aside_checkpoints(run_dir)
    if resume is None and aside and cfg.checkpoint.resume:  # the ranks would stop on them (NoUsableCheckpoint)
        raise UserError("checkpoint.resume", True, f"run {run_name} has {none_usable(aside)}")
    return ExistingRun(run_dir=str(run_dir), resume_from=str(resume) if resume else None, notes=notes)


def plan_run(cfg: JobConfig, name: Optional[str] = None) -> Plan:
    """make_plan with the facts of the run dir: what the CLI, sweeps and benchmarks launch from."""
    config_only = make_plan(cfg, name)  # every check of the config alone comes first, as it always has
    return make_plan(cfg, config_only.name, read_existing_run(cfg, config_only.name))
