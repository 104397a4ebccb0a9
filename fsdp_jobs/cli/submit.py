"""The one submission path: a single run is a sweep of one member.

    prepare   compose, plan, backend.check and backend.dryrun for EVERY member before anything is written;
              a bad member is one UserError naming it (a sweep's) or the key (a single run's)
    notes     printed once each, the same way for a single run and a sweep
    submit    lock each run dir, write it (runs.prepare), hand the group to the backend, record every
              member in the journal (fsdp_jobs/rundir/journal.py)

fsdp_jobs/__main__.py (one run) and fsdp_jobs/cli/sweep.py (-m: expansion, naming, skipping, the summary)
only decide what the members are and how to report them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

import yaml

from fsdp_jobs.planning import backends, secret_env
from fsdp_jobs.rundir import checkpoints, data_identity, journal, runs
from fsdp_jobs.rundir import script_progress
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only, never imported at run time: no hydra on the node side, no import cycle
    from fsdp_jobs.planning.config import JobConfig
    from fsdp_jobs.planning.plan import Plan


@dataclass
class Member:
    """One run to submit: a single run's, or one point of a sweep."""

    name: Optional[str]  # None for a single run until planned (then the plan's name)
    overrides: list[str]  # everything it is composed from
    params: dict[str, str] = field(default_factory=dict)  # swept key -> this member's value (sweeps only)
    cfg: Optional[JobConfig] = None
    job: dict[str, Any] = field(default_factory=dict)
    plan: Optional[Plan] = None
    backend: Any = None
    dryrun: Any = None
    skip: str = ""  # why it is not submitted (a sweep's completed or still active member)
    secrets: dict[str, str] = field(default_factory=dict)  # held in memory only (fsdp_jobs/planning/secret_env.py)


def record_refusal(m: Member, e: UserError) -> None:
    """A real submission of a run that exists, refused before it started: the journal keeps it, so that
    `status` does not show the run's earlier outcome as if it were this command's. Best effort: the
    refusal itself is what the user must see."""
    cfg = m.cfg
    if cfg is None or cfg.get("dry_run"):
        return
    run_dir = Path(str(cfg.run_root)).expanduser() / str(cfg.get("name") or "")
    if not cfg.get("name") or not RunDir(run_dir).launches_file.is_file():
        return
    try:
        journal.record_refusal(run_dir.resolve(), refusal_text(m, e))
    except (UserError, OSError):
        pass


def refusal_text(m: Member, e: UserError) -> str:
    """The refusal as the journal keeps it: never a secret (a secret-looking key's value is left out, and any
    value passed for one, or already taken as one, is masked wherever the text repeats it)."""
    text = f"{e.key}: {e.allowed}" if secret_env.looks_secret(str(e.key)) else str(e)
    passed = {o: o.split("=", 1)[1] for o in m.overrides if "=" in o and secret_env.looks_secret(o.split("=", 1)[0])}
    return secret_env.mask(text, {**passed, **m.secrets}).replace("\n", " ").strip()


def take_composed(m: Member, composed: Any, sweep: Optional[str] = None) -> list[str]:
    """A composed member's config and job record (`sweep` places it under <run_root>/<sweep>/<name>), its
    secrets taken out: the record as its run dir keeps it (--cfg job prints it). Returns the notes about secrets."""
    if isinstance(composed, UserError):
        raise composed
    m.cfg, m.job = composed
    if sweep is not None:
        m.cfg.name, m.job["name"] = m.name, m.name
        m.cfg.run_root = m.job["run_root"] = str(Path(m.cfg.run_root).expanduser() / sweep)
        m.cfg.sweep = m.job["sweep"] = sweep  # backends whose storage is elsewhere (a PVC) keep members apart by it
    m.secrets, secret_notes = secret_env.take(m.cfg, m.job, backends.secret_store(m.cfg.cluster.backend))
    return secret_notes


def plan_member(m: Member, composed: Any, sweep: Optional[str] = None, skip_existing: Any = None) -> None:
    """Plan a composed member and ask its backend for the dry run (and, unless dry_run=true, its checks).
    `sweep` places it under <run_root>/<sweep>/<name>; `skip_existing(m)` says why not to submit it."""
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.cli.rundir_checks import plan_run

    secret_notes = take_composed(m, composed, sweep)
    m.plan = plan_run(m.cfg)  # pure planning, then what the run dir and input files allow
    m.plan.notes.extend(secret_notes)
    m.name = m.plan.name
    m.backend = launcher.get(m.plan.backend)  # after planning: a bad override never pays for a backend import
    if not m.cfg.dry_run:
        m.skip = skip_existing(m) if skip_existing else ""
        if not m.skip:
            m.backend.check(m.plan, m.cfg)  # refusals that need the backend (is it there? is the run busy?)
    if not m.skip:
        m.dryrun = m.backend.dryrun(m.plan, m.cfg)  # exactly what submit() will hand to the backend


def print_notes(members: list[Member]) -> None:
    """Each plan note once, on stderr: warnings as such, the rest as notes."""
    for note in dict.fromkeys(n for m in members if m.plan for n in m.plan.notes):
        print(f"fsdp-jobs: {note if note.startswith('warning:') else 'note: ' + note}", file=sys.stderr)


def render_dry_run(plan: Plan, launch_text: str) -> str:
    head = yaml.safe_dump({"plan": plan.to_dict()}, sort_keys=False)
    return f"{head}# launch commands ({plan.backend})\n{launch_text.rstrip()}\n"


def start_over(m: Member) -> None:
    """checkpoint.resume=false on a run with checkpoints: they are moved aside (under the run's lock, before
    anything is written), so the new attempt neither loads nor prunes them, and nothing is deleted; so are
    the records of its earlier progress (metrics, goodput timeline, W&B run, state), so the new curve is its own."""
    if m.cfg is None or m.cfg.checkpoint.resume:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = checkpoints.move_all_aside(Path(m.plan.run_dir), stamp)
    if moved is not None:
        print(f"fsdp-jobs: {m.plan.name}: checkpoint.resume=false: its earlier checkpoints moved to {moved}",
              flush=True)
    records = runs.move_progress_aside(Path(m.plan.run_dir), stamp)
    if records:
        print(f"fsdp-jobs: {m.plan.name}: checkpoint.resume=false: its earlier records moved to "
              f"{', '.join(p.name for p in records)}", flush=True)


def record_data(m: Member) -> None:
    """The token file's identity, which the run's next resume compares (fsdp_jobs/cli/rundir_checks.py
    check_same_data). A file gone since planning is left to the job to report."""
    from fsdp_jobs.cli.rundir_checks import data_now

    try:
        now = data_now(m.cfg)
    except UserError:
        return
    if now is not None:
        data_identity.record(Path(m.plan.run_dir), now)


def announce(m: Member) -> None:
    """The line a single run prints once its run dir is written, before the backend takes over."""
    plan = m.plan
    verb = f"resuming from {plan.resume_from}" if plan.resume_from else "starting"
    code = script_progress.user_code(m.job)
    if code is not None:  # the script shards and checkpoints its own way: the built-in plan is not what runs
        newest = None if plan.resume_from else script_progress.progress(Path(plan.run_dir), m.job).newest
        found = f", its newest checkpoint {newest.path} ({newest.layout})" if newest else ""
        print(f"fsdp-jobs: {verb} run {plan.name}: {code} on {plan.nodes} nodes x {plan.gpus_per_node} ranks, "
              f"run dir {plan.run_dir}{found}", flush=True)
        return
    mesh = " x ".join(f"{k} {v}" for k, v in plan.mesh.items())
    print(f"fsdp-jobs: {verb} run {plan.name}: {plan.nodes} nodes x {plan.gpus_per_node} ranks, "
          f"{plan.strategy} (mesh {mesh}), run dir {plan.run_dir}", flush=True)


def record(sweep: Optional[str], m: Member, job_id: str) -> None:
    """Into the user's journal; a journal we cannot write only warns: the job is out."""
    try:
        journal.record(sweep=sweep, member=m.name, overrides=[secret_env.mask(o, m.secrets) for o in m.overrides],
                       params={k: secret_env.mask(v, m.secrets) for k, v in m.params.items()}, backend=m.backend.name,
                       job_id=job_id, run_dir=m.plan.run_dir, config_hash=runs.job_hash(m.job))
    except Exception as e:  # noqa: BLE001  a journal we cannot write must not hide that the job went out
        print(f"fsdp-jobs: warning: could not record {m.name} in the journal {journal.where()}: {e}", file=sys.stderr)


def _busy(sweep: Optional[str], m: Member, holder: Optional[int]) -> UserError:
    if sweep is None:
        return UserError("name", m.name, f"that run is being launched/run by pid {holder} right now; wait for it "
                                         "or choose another name")
    return UserError("", None, f"sweep {sweep}, member {m.name}: its run is being launched by pid {holder} right now")


def _unwritable(sweep: Optional[str], group: list[Member], e: OSError) -> UserError:
    run_dir = Path(group[0].plan.run_dir)
    if sweep is None:
        return UserError("run_root", group[0].cfg.run_root, f"cannot create the run dir {run_dir}: {e.strerror or e}")
    return UserError("run_root", str(run_dir.parent.parent), f"cannot write the run dirs of sweep {sweep}: "
                                                             f"{e.strerror or e}")


def pass_secrets(group: list[Member]) -> None:
    """Into this process's environment, which every backend hands on without writing it (secret_env.py).
    Members submitted together share one environment, so they must agree on each value."""
    for m in group:
        for name, value in m.secrets.items():
            if group[0].secrets.get(name) != value:
                raise UserError(f"cluster.env.{name}", secret_env.MASK, f"members {group[0].name} and {m.name} are "
                                "submitted together (one job array) with different values of this secret")
        os.environ.update(m.secrets)


def write_run_dirs(sweep: Optional[str], group: list[Member], locks: list[runs.RunLock]) -> None:
    """Take each member's lock and write its run dir as every submission does; the caller releases the locks.
    Also a backend whose own submission path writes the run dir first (it says so in its module)."""
    try:
        for m, lock in zip(group, locks):
            if not lock.acquire():
                raise _busy(sweep, m, lock.holder())
            start_over(m)
            runs.prepare(Path(m.plan.run_dir), m.job, m.plan.to_dict())
            record_data(m)
    except OSError as e:  # an unwritable run_root
        raise _unwritable(sweep, group, e) from None


def submit_group(sweep: Optional[str], group: list[Member]) -> list[tuple[Member, Any]]:
    """Lock, write and submit members that go out together (one backend, one group_key), then record them.
    The locks keep a second launcher off these run dirs; an attached backend holds them while it runs."""
    locks = [runs.RunLock(Path(m.plan.run_dir)) for m in group]
    try:
        write_run_dirs(sweep, group, locks)
        pass_secrets(group)
        if sweep is None:  # a single run: the backend reports its submission itself
            announce(group[0])
            submitted = [group[0].backend.submit(group[0].dryrun)]
        else:  # quietly: the sweep prints one line per member
            submitted = group[0].backend.submit_group([m.dryrun for m in group])
    finally:
        for lock in locks:
            lock.release()
    for m, s in zip(group, submitted):
        record(sweep, m, s.job_id)
    return list(zip(group, submitted))
