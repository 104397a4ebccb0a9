"""python -m fsdp_jobs [key=value ...]: compose -> plan -> launch (or print the plan with dry_run=true).

Reads top to bottom: every step that can fail on user input fails with one line and exit 2 before
anything is written. One run goes through the same path as a sweep's members (fsdp_jobs/cli/submit.py).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Optional

from fsdp_jobs.cli import submit
from fsdp_jobs.rundir import runs, streams
from fsdp_jobs.planning.compose import compose_many
from fsdp_jobs.planning import command_line
from fsdp_jobs.planning.errors import UserError, die
from fsdp_jobs.planning.plan import Plan

ACTING_COMMANDS = ("cancel", "scale", "chaos", "stacks")  # the control commands that act on a job, not only read it

USAGE = """usage: python -m fsdp_jobs [key=value ...]      (fsdp-jobs [key=value ...])

  python -m fsdp_jobs                                  2 simulated nodes x 2 ranks on this machine
  python -m fsdp_jobs nodes=3 gpus_per_node=8 model=llama3_8b dry_run=true
  python -m fsdp_jobs name=my-run train.steps=1000     the same name again resumes that run
  python -m fsdp_jobs -m nodes=2,4 train.lr=1e-4,3e-4 fsdp=glob(*shard)     a sweep (Hydra multirun)
  python -m fsdp_jobs preflight nodes=16 gpus_per_node=8  check every node (as preflight=only), train nothing

Groups: model=tiny|llama3_1b|llama3_8b|llama3_70b  fsdp=full_shard|shard_grad_op|hybrid_shard|
hybrid_shard_zero2|no_shard  cluster={backends}  data=synthetic|token_file.
Submitted runs: fsdp-jobs list | top | status RUN | logs RUN [-f] | stacks RUN | report RUN | cancel RUN | scale RUN nodes=N |
chaos RUN kill-node|stop-node N, chaos RUN marathon --faults N; sweeps: status|cancel SWEEP,
cancel SWEEP/MEMBER, compare SWEEP, plot RUN_OR_SWEEP... -o out.png. Every key: conf/ and
fsdp_jobs/planning/config.py. Export a checkpoint: python -m fsdp_jobs.export RUN_DIR."""


def summarize(plan: Plan, status: int) -> str:
    """The last lines of an attached launch: how it ended, then the run's status in the summary's words."""
    from fsdp_jobs.cli import status_text
    from fsdp_jobs.rundir.run_status import SUMMARY, read_status

    head = ending(Path(plan.run_dir), status)
    s = read_status(Path(plan.run_dir), SUMMARY)
    failed = bool(status) and not head.startswith("cancelled")  # a rank that died of its peers' stop is no failure
    return "\n".join(status_text.summary_lines(s, f"{head}: {plan.name}", failed))


def ending(run_dir: Path, status: int) -> str:
    """How the launch ended, in `status`'s word (the run's outcome, fsdp_jobs/rundir/outcome.py): a job stopped
    from outside (Ctrl-C, `fsdp-jobs cancel`) is cancelled, whether its ranks checkpointed or had not begun to step."""
    from fsdp_jobs.rundir.outcome import JobState, outcome

    if status == 0:
        return "finished"
    stopped = outcome(run_dir, runs.last_launch(run_dir).get("unix")).state == JobState.CANCELLED
    return f"cancelled (exit status {status})" if stopped else f"exited with status {status}"


def cli() -> int:
    """The command itself (python -m fsdp_jobs, fsdp-jobs)."""
    try:
        return main()
    except KeyboardInterrupt:  # Ctrl-C before a job started (while planning, submitting): nothing to stop
        print("fsdp-jobs: interrupted", file=sys.stderr)
        return 130
    finally:
        # Everything the command built (Hydra's and OmegaConf's nodes, the modules) lives until exit;
        # frozen, the interpreter's final collection does not walk it again, a sizable part of a dry run.
        gc.freeze()


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.umask(runs.OWNER_ONLY_UMASK)  # before anything is written: run dirs and the journal are the owner's
    from fsdp_jobs.cli import ctl

    if argv and argv[0] in ctl.COMMANDS:
        # `logs | head` ends quietly when head has read enough; a cancel, scale or chaos goes on to its end
        streams.follow_readers(end_when_gone=argv[0] not in ACTING_COMMANDS)
        return ctl.main(argv)
    streams.follow_readers()  # an attached job outlives its terminal, its `tee` and a full disk under `> out`
    if argv and argv[0] == "preflight":  # `fsdp-jobs preflight OVERRIDES`: the job's checks alone, submitted
        argv = [*argv[1:], "preflight=only"]  # as the job would be (README: Preflight); the last word wins
    if any(a in ("-h", "--help") for a in argv):
        from fsdp_jobs.planning import backends

        print(USAGE.replace("{backends}", "|".join(backends.names())))
        return 0
    try:  # Hydra's flags and hydra.* overrides: honoured where they mean the same here, else one line
        command = command_line.parse(argv)
    except UserError as e:
        die(e)
    argv = command.overrides
    if command.multirun or command.show_job:
        from fsdp_jobs.cli import sweep

        return sweep.show_jobs(argv, command.multirun) if command.show_job else sweep.main(argv)
    # Planning only allocates what lives until exit (the config, the plan, imported modules): the cyclic
    # collector finds nothing to free here, and pausing it saves its passes. It runs again before
    # anything long-lived (an attached job is supervised from this process for hours).
    gc.disable()
    member = submit.Member(None, argv)
    try:
        submit.plan_member(member, compose_many([argv])[0])
    except UserError as e:
        submit.record_refusal(member, e)
        die(e)
    finally:
        gc.enable()
    submit.print_notes([member])
    if member.cfg.dry_run:
        sys.stdout.write(submit.render_dry_run(member.plan, member.dryrun.text))
        return 0
    try:
        [(_, submitted)] = submit.submit_group(None, [member])
    except UserError as e:
        die(e)
    if submitted.exit_status is None:  # submitted; the backend said where to follow it
        return 0
    print(summarize(member.plan, submitted.exit_status), flush=True)
    return submitted.exit_status


if __name__ == "__main__":
    raise SystemExit(cli())
