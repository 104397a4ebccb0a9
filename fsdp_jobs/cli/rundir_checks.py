"""What planning needs from outside the config, read from disk: the input files (fsdp_jobs/planning/inputs.py)
and the run dir (its newest committed checkpoint, the model its checkpoints were saved from). Kept out
of fsdp_jobs/planning/plan.py so that make_plan stays pure; plan_run() does both, in the order the checks have
always run: every config-only check first, then the input files, then the run dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

from fsdp_jobs.rundir import data_identity, runs
from fsdp_jobs.rundir.checkpoints import is_committed, newest_checkpoint, none_usable, set_aside_checkpoints
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.inputs import check_inputs, host_token_file
from fsdp_jobs.planning.plan import ExistingRun, Plan, make_plan
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import DataIdentity

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig

MODEL_IDENTITY_KEYS = ("_target_", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                       "tie_embeddings", "kwargs")


def check_same_model(run_dir: Path, model: Any) -> None:
    """Resuming loads the run's checkpoints: refuse a model they cannot hold, before anything runs."""
    import yaml

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


def data_now(cfg: JobConfig) -> Optional[DataIdentity]:
    """The identity of the token file the job will read (data_identity.take), where this machine sees it."""
    path = host_token_file(cfg)
    if path is None:
        return None
    try:
        return data_identity.take(path)
    except OSError as e:
        raise UserError("data.path", cfg.data.path, f"cannot be read: {e.strerror or e}") from None


def check_same_data(cfg: JobConfig, run_dir: Path, run_name: str, resume: Path) -> list[str]:
    """A resume continues at its checkpoint's data position: refuse one whose token file changed since the run
    was submitted (path, size, sampled content, mtime), unless data.allow_changed=true (then a note)."""
    before = data_identity.read(run_dir)
    now = data_now(cfg) if before is not None else None
    changed = "; ".join(data_identity.changes(before, now)) if before is not None and now is not None else ""
    if not changed:
        return []
    where = f"run {run_name} resumes from {resume.name} at its data position, but its data changed since it was submitted"
    if not cfg.data.allow_changed:
        raise UserError("data.path", cfg.data.path, f"{where} ({changed}); data.allow_changed=true goes on in the "
                        "new data from that position, checkpoint.resume=false starts over, or another name= starts "
                        "another run")
    return [f"data.allow_changed=true: {where} ({changed}); the new data's identity is recorded at submission"]


def check_progress_kept(cfg: JobConfig, run_dir: Path, run_name: str) -> None:
    """A run that recorded training but has no checkpoint left (checkpoints/ removed, or never saved) would
    start again from step 0 and append a second curve to its records: refuse, saying how to go on."""
    if cfg.script or cfg.module:  # a user's script keeps its checkpoints where it likes (not necessarily here)
        return
    trained = runs.trained_to(run_dir)
    # a sweep skips a member that completed or still runs (cli/sweep.py _existing asks its backend: a member
    # whose ranks run on a cluster's nodes says running, its lock on no machine here); a lock held: the run is
    # running now, which the launch refuses in its own words
    if trained is None or runs.RunLock(run_dir).held() or (cfg.sweep and (
            runs.completed_at(run_dir, cfg.train.steps) or runs.read_state(run_dir).status == "running")):
        return
    rd = RunDir(run_dir)
    earlier = [p.name for p in sorted(run_dir.glob(rd.checkpoints_before_dir("*").name))
               if p.is_dir() and any(map(is_committed, p.iterdir()))]
    back = f" (this run's earlier ones: rename {earlier[-1]} back to {rd.checkpoints_dir.name})" if earlier else ""
    weights = "; model.pretrained=DIR loads other weights on a fresh start" if cfg.model.name == "hf" else ""
    raise UserError("checkpoint.resume", True,
                    f"run {run_name} trained to step {trained[0]} ({trained[1].name}) but no checkpoint is left in "
                    f"{rd.checkpoints_dir}, so it would start again from step 0 into the same records; start over "
                    "with checkpoint.resume=false (its records of that training are first renamed NAME-before-<time>, "
                    f"never deleted), or resume from elsewhere: put a committed step-N/ in {rd.checkpoints_dir}"
                    f"{back}{weights}")


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
        notes += check_same_data(cfg, run_dir, run_name, resume)
    aside = set_aside_checkpoints(run_dir)
    if resume is None and aside and cfg.checkpoint.resume:  # the ranks would stop on them (NoUsableCheckpoint)
        raise UserError("checkpoint.resume", True, f"run {run_name} has {none_usable(aside)}")
    if resume is None and cfg.checkpoint.resume:
        check_progress_kept(cfg, run_dir, run_name)
    elif not cfg.checkpoint.resume and runs.trained_to(run_dir):
        notes.append(f"checkpoint.resume=false: run {run_name}'s records of its earlier training are moved aside "
                     f"too ({RunDir.before(RunDir(run_dir).metrics_file, '<time>').name}, ...): the new curve is its own")
    return ExistingRun(run_dir=str(run_dir), resume_from=str(resume) if resume else None, notes=notes)


def plan_run(cfg: JobConfig, name: Optional[str] = None) -> Plan:
    """make_plan with the facts of the run dir: what the CLI, sweeps and benchmarks launch from."""
    config_only = make_plan(cfg, name)  # every check of the config alone comes first, as it always has
    return make_plan(cfg, config_only.name, read_existing_run(cfg, config_only.name))
