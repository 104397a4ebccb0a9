"""python -m fsdp_jobs [key=value ...]: compose -> plan -> launch (or print the plan with dry_run=true).

Reads top to bottom: every step that can fail on user input fails with one line and exit 2 before
anything is written.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Optional

import yaml

from fsdp_jobs.compose import compose
from fsdp_jobs.errors import UserError, die
from fsdp_jobs.checkpoints import newest_checkpoint
from fsdp_jobs.plan import Plan
from fsdp_jobs.rundir_checks import plan_run
from fsdp_jobs import runs

USAGE = """usage: python -m fsdp_jobs [key=value ...]      (fsdp-jobs [key=value ...])

  python -m fsdp_jobs                                  2 simulated nodes x 2 ranks on this machine
  python -m fsdp_jobs nodes=3 gpus_per_node=8 model=llama3_8b dry_run=true
  python -m fsdp_jobs name=my-run train.steps=1000     the same name again resumes that run
  python -m fsdp_jobs -m cluster=slurm train.lr=1e-4,3e-4 fsdp=glob(*shard)   a sweep (Hydra multirun)

Groups: model=tiny|llama3_1b|llama3_8b|llama3_70b  fsdp=full_shard|shard_grad_op|hybrid_shard|
hybrid_shard_zero2|no_shard  cluster=local|slurm|docker|kubernetes  data=synthetic|token_file.
Submitted runs: fsdp-jobs list | status RUN | logs RUN [-f] | cancel RUN | chaos RUN kill-node|stop-node N; sweeps: status|cancel SWEEP,
cancel SWEEP/MEMBER, compare SWEEP, plot RUN_OR_SWEEP... -o out.png. Every key: conf/ and
fsdp_jobs/config.py. Export a checkpoint: python -m fsdp_jobs.export RUN_DIR."""


def render_dry_run(plan: Plan, launch_text: str) -> str:
    head = yaml.safe_dump({"plan": plan.to_dict()}, sort_keys=False)
    return f"{head}# launch commands ({plan.backend})\n{launch_text.rstrip()}\n"


def summarize(plan: Plan, status: int) -> str:
    run_dir = Path(plan.run_dir)
    metrics = runs.read_metrics(run_dir)
    ckpt = newest_checkpoint(run_dir)
    lines = [f"{'finished' if status == 0 else f'exited with status {status}'}: {plan.name}",
             f"  run dir:      {run_dir}",
             f"  checkpoint:   {ckpt or 'none yet'}",
             f"  metrics:      {run_dir / runs.METRICS_FILE}"]
    if metrics and "loss" in metrics[0] and "loss" in metrics[-1]:  # a user's script may log no loss
        first, last = metrics[0], metrics[-1]
        lines.append(f"  loss:         {first['loss']:.4f} (step {first['step']}) -> "
                     f"{last['loss']:.4f} (step {last['step']})")
    lines.append(f"  logs:         {run_dir / 'logs' / 'launcher.log'}")
    return "\n".join(lines)


def record_submission(plan: Plan, job: dict, overrides: list[str], job_id: str) -> None:
    """Into the user's journal (fsdp_jobs/journal.py); a journal we cannot write only warns: the job is out."""
    from fsdp_jobs import journal

    try:
        journal.record(sweep=None, member=plan.name, overrides=overrides, params={}, backend=plan.backend,
                       job_id=job_id, run_dir=plan.run_dir, config_hash=runs.job_hash(job))
    except Exception as e:  # noqa: BLE001
        print(f"fsdp-jobs: warning: could not record the run in {journal.path()}: {e}", file=sys.stderr)


def cli() -> int:
    """The command itself (python -m fsdp_jobs, fsdp-jobs)."""
    try:
        return main()
    finally:
        # Everything the command built (Hydra's and OmegaConf's nodes, the modules) lives until exit;
        # frozen, the interpreter's final collection does not walk it again: 45 ms of a 0.35 s dry run.
        gc.freeze()


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from fsdp_jobs import ctl

    if argv and argv[0] in ctl.COMMANDS:
        return ctl.main(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if any(a in ("-m", "--multirun") for a in argv):
        from fsdp_jobs import sweep

        return sweep.main(argv)
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        die(UserError("", flags[0], f"unknown option {flags[0]!r}; overrides are key=value (try --help)"))
    # Planning only allocates what lives until exit (the config, the plan, imported modules): the cyclic
    # collector finds nothing to free here, and pausing it saves about 10 ms. It runs again before
    # anything long-lived (an attached job is supervised from this process for hours).
    gc.disable()
    try:
        cfg, job = compose(argv)
        plan = plan_run(cfg)
        import launchers  # after planning: a bad override never pays for a backend import

        backend = launchers.get(plan.backend)
        if not cfg.dry_run:
            backend.check(plan, cfg)  # refusals that need the backend (is it there? is the run busy?)
        request = backend.dryrun(plan, cfg)  # exactly what submit() will hand to the backend
    except UserError as e:
        die(e)
    finally:
        gc.enable()
    for note in plan.notes:
        print(f"fsdp-jobs: {note if note.startswith('warning:') else 'note: ' + note}", file=sys.stderr)
    if cfg.dry_run:
        sys.stdout.write(render_dry_run(plan, request.text))
        return 0

    run_dir = Path(plan.run_dir)
    lock = runs.RunLock(run_dir)
    try:
        acquired = lock.acquire()
    except OSError as e:
        die(UserError("run_root", cfg.run_root, f"cannot create the run dir {run_dir}: {e.strerror}"))
    if not acquired:
        die(UserError("name", plan.name, f"that run is being launched/run by pid {lock.holder()} "
                                         "right now; wait for it or choose another name"))
    try:
        runs.prepare(run_dir, job, plan.to_dict())
        verb = f"resuming from {plan.resume_from}" if plan.resume_from else "starting"
        mesh = " x ".join(f"{k} {v}" for k, v in plan.mesh.items())
        print(f"fsdp-jobs: {verb} run {plan.name}: {plan.nodes} nodes x {plan.gpus_per_node} ranks, "
              f"{plan.strategy} (mesh {mesh}), run dir {run_dir}", flush=True)
        submitted = backend.submit(request)
    except UserError as e:
        die(e)
    finally:
        lock.release()
    record_submission(plan, job, argv, submitted.job_id)
    if submitted.exit_status is None:  # submitted; the backend said where to follow it
        return 0
    print(summarize(plan, submitted.exit_status), flush=True)
    return submitted.exit_status


if __name__ == "__main__":
    raise SystemExit(cli())
