"""What `torchx run ... fsdp_jobs.job OVERRIDES...` does before TorchX submits the app: the CLI's own path
(fsdp_jobs/cli/submit.py: compose, plan, the backend's dry run, the run dir written under its lock, the
journal), with the TorchX app in the place of a backend's submission.

TorchX calls its component for `torchx run --dryrun` too, and cannot tell it why: the run dir is written then
as well, its launch recorded as handed to TorchX; `fsdp-jobs status` then says that no node has started.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fsdp_jobs.planning.errors import UserError, die
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.records import LaunchRecord
from fsdp_jobs.launchers.base import JobState, Run
from fsdp_jobs.launchers.torchx.backend import BACKEND, Resources, TorchXRequest
from fsdp_jobs.launchers.torchx.config import NAME

if TYPE_CHECKING:  # types only: the CLI's submission path is imported when the component runs
    from fsdp_jobs.cli.submit import Member


def refuse_options(overrides: list[str]) -> None:
    """The component plans one run of cluster=torchx: the scheduler is `torchx run -s`'s, a sweep is the CLI's."""
    for o in overrides:
        if o.startswith("-"):
            raise UserError("", o, f"the {NAME} component takes key=value overrides, one run per `torchx run` (a "
                                   "sweep: python -m fsdp_jobs -m ... with another cluster=)")
        if o.split("=", 1)[0].lstrip("+~") == "cluster":
            raise UserError("cluster", o.split("=", 1)[-1], f"the {NAME} component plans cluster={NAME}; the "
                                                            "scheduler is torchx run's -s")


def refuse_active(run_dir: Path, name: str) -> None:
    """The run's newest launch still queued or running, in its own backend's word: two jobs must not share a run."""
    from fsdp_jobs.cli import launcher

    run = Run.load(run_dir)
    backend = run.launch.get("backend")
    if not backend:
        return
    try:
        status = launcher.get(str(backend)).describe(run)
    except (UserError, ValueError, OSError):  # a backend that cannot say: the launch lock still guards the run
        return
    if status.state in (JobState.PENDING, JobState.RUNNING):
        raise UserError("name", name, f"run already has {backend} job {run.launch.get('job_id')} {status.detail}; "
                                      f"cancel it (fsdp-jobs cancel {name}) or choose another name")


def write(m: Member) -> None:
    """The run dir, as a submission writes it (submit.write_run_dirs), the user's code (script=, module=), and
    a launch handed to TorchX, whose app id the first node records (launchers/torchx/node.py)."""
    from fsdp_jobs.cli import submit
    from fsdp_jobs.launchers.snapshot import take_user_code

    run_dir = Path(m.plan.run_dir)
    locks = [runs.RunLock(run_dir)]
    try:
        submit.write_run_dirs(None, [m], locks)
        if m.dryrun.request.user_dir:
            take_user_code(m.cfg, Path(m.dryrun.request.user_dir))
        runs.record_launch(run_dir, LaunchRecord(backend=NAME, job_id="", nodes=m.plan.nodes,
                                                 gpus_per_node=m.plan.gpus_per_node))
    finally:
        locks[0].release()


def prepare(overrides: list[str], resources: Resources) -> TorchXRequest:
    """Plan and write the run as `python -m fsdp_jobs cluster=torchx OVERRIDES` would have; the request whose
    app TorchX submits. Bad input: one line and exit 2 (a dry_run=true: the plan, exit 0), as the CLI."""
    from fsdp_jobs.cli import submit
    from fsdp_jobs.planning.compose import compose_many

    os.umask(runs.OWNER_ONLY_UMASK)  # before anything is written: run dirs and the journal are the owner's
    m = submit.Member(None, [f"cluster={NAME}", *overrides])
    try:
        refuse_options(overrides)
        BACKEND.component = True  # this process submits through TorchX: the backend's check lets it
        submit.plan_member(m, compose_many([m.overrides])[0])
        submit.print_notes([m])
        if m.cfg.dry_run:
            sys.stdout.write(submit.render_dry_run(m.plan, m.dryrun.text))
            raise SystemExit(0)
        refuse_active(Path(m.plan.run_dir), m.plan.name)
        write(m)
    except UserError as e:
        submit.record_refusal(m, e)
        die(e)
    submit.pass_secrets([m])  # into `torchx run`'s environment, which its local schedulers and sbatch hand on
    with contextlib.redirect_stdout(sys.stderr):  # TorchX prints the app handle on stdout, for scripts to read
        submit.announce(m)
    submit.record(None, m, "")
    request: TorchXRequest = m.dryrun.request
    request.resources = resources
    return request
