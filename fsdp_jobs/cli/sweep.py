"""python -m fsdp_jobs -m key=a,b ...: a Hydra multirun sweep, submitted without waiting for it.

1. expand  Hydra's own override grammar (a,b lists, range(), choice(), glob() over a config group)
           -> one override list per member, named after its swept values: <run_root>/<sweep>/<member>
2. check   compose, plan, backend.check and backend.dryrun for EVERY member first; one bad member
           stops the sweep with one line naming it, before anything is written or submitted
3. submit  completed members are skipped, members still queued or running are left alone, the rest
           go out grouped by the backend's group_key (a job array per resource shape where the backend has them); every
           submission is recorded in the journal. Attached backends (local) run them one at a time.

Hydra's own launchers cannot do this: hydra-submitit-launcher blocks until every job ends. Planning,
checking and submitting are the single run's own steps (fsdp_jobs/cli/submit.py): a run is a sweep of one.
"""

from __future__ import annotations

import hashlib
import re
import sys
from itertools import product
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.rundir import runs
from fsdp_jobs.planning.errors import UserError, die
from fsdp_jobs.planning.input_rules import check_name
from fsdp_jobs.cli.submit import Member, plan_member, print_notes, render_dry_run, submit_group, take_composed
from fsdp_jobs.planning.command_line import job_record_text
from fsdp_jobs.rundir.layout import RunDir

# they name or place the sweep itself, the same for every member
UNSWEEPABLE = ("name", "run_root", "dry_run", "sweep")
NAME_MAX = 100


def _plain_key(key: str) -> str:
    return key.lstrip("+~").split("@", 1)[0]


def expand(overrides: list[str]) -> list[tuple[list[str], dict[str, str]]]:
    """The cartesian product of the sweep, in command order: (override list, swept values) per member."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException, OverrideParseException

    from fsdp_jobs.planning.compose import CONF_DIR
    from fsdp_jobs.planning.validation import register_schemas

    register_schemas()
    axes: dict[str, list[tuple[str, Optional[str], Optional[str]]]] = {}  # per key: (line, swept key, value)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="fsdp_jobs"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())  # for glob()
        for arg in overrides:
            try:
                o = parser.parse_overrides([arg])[0]  # (the plural hands glob() the config loader)
            except (OverrideParseException, HydraException) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise UserError(arg.split("=", 1)[0], arg.partition("=")[2], f"bad override: {first}") from None
            key = o.get_key_element()
            axes.pop(key, None)  # a key given twice: the later one counts, as in a single run
            if not o.is_sweep_override():
                axes[key] = [(arg, None, None)]
                continue
            if _plain_key(key) in UNSWEEPABLE:
                raise UserError(_plain_key(key), arg.partition("=")[2], "cannot be swept: it names or places "
                                "the whole sweep (name= is the sweep id; members are named after their values)")
            if not o.is_discrete_sweep():
                raise UserError(key, arg.partition("=")[2], "allowed sweeps: a,b,c lists, range(), choice(), "
                                "glob() (interval() needs an optimizer, not a grid)")
            values = list(o.sweep_string_iterator())
            if isinstance(o.value(), Glob):  # the schemas registered in the group are not choices
                values = [v for v in values if not v.endswith("_schema")]
            if not values:
                raise UserError(key, arg.partition("=")[2], "the sweep has no values")
            axes[key] = [(f"{key}={v}", _plain_key(key), v) for v in values]
    return [([line for line, _, _ in combo], {k: v for _, k, v in combo if k is not None})
            for combo in product(*axes.values())]


def _labels(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix that tells the swept keys apart: train.lr -> lr."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            label = ".".join(parts[-n:])
            if not any(other != key and (other == label or other.endswith("." + label)) for other in keys):
                break
        out[key] = label
    return out


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _clean(text: str) -> str:
    """A member name in the alphabet every name keeps to (fsdp_jobs/planning/input_rules.py NAME_RE): no ':' (it
    would split PYTHONPATH and a container volume spec), no brackets."""
    text = re.sub(r"[^A-Za-z0-9._+\-=,@]", "_", text)
    return "_" + text[1:] if text[:1] in (".", "-", "+", "=", ",", "@") else text


def member_names(params: list[dict[str, str]]) -> list[str]:
    """Stable names from the swept values, keys sorted (the order on the command line does not matter):
    {"train.lr": "0.001", "nodes": "2"} -> "lr=0.001,nodes=2". Unique, plain directory names."""
    keys = sorted({k for p in params for k in p})
    labels = _labels(keys)
    names = []
    for p in params:
        exact = ",".join(f"{k}={p[k]}" for k in keys if k in p)
        name = _clean(",".join(f"{labels[k]}={p[k]}" for k in keys if k in p)) or "default"
        if len(name) > NAME_MAX:
            name = f"{name[:NAME_MAX - 9]}-{_short_hash(exact)}"
        names.append(name)
    for i, name in enumerate(names):  # cleaning can make two names equal ("a/b" and "a_b")
        if names.count(name) > 1:
            exact = ",".join(f"{k}={params[i][k]}" for k in keys if k in params[i])
            names[i] = f"{name}-{_short_hash(exact)}"
    return names


def sweep_id(overrides: list[str], members: list[tuple[list[str], dict[str, str]]]) -> str:
    """name= if given, else derived from the command: the same command (in any order) gives the same id,
    so running it again finds the same run dirs."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "name"]
    if given:
        return given[-1]
    keys = sorted({k for _, p in members for k in p})
    label = _clean("-".join(_labels(keys)[k].split(".")[-1] for k in keys))[:40] or "sweep"
    command = "\0".join(sorted(o for o in overrides if o.split("=", 1)[0] != "dry_run"))
    return f"{label}-{_short_hash(command)}"


def _existing(member: Member) -> str:
    """Why an existing run must not be submitted again: it completed, or its job is still queued/running."""
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.rundir.status import JobState, Run

    run_dir = Path(member.plan.run_dir)
    if not RunDir(run_dir).job_file.is_file():
        return ""
    step = runs.completed_at(run_dir, member.cfg.train.steps)
    if step is not None:
        return f"completed at step {step}"
    run = Run.load(run_dir)
    if run.launch.get("backend"):
        status = launcher.get(str(run.launch["backend"])).describe(run)
        if status.state in (JobState.PENDING, JobState.RUNNING):
            return f"{status.state.value.lower()} as {run.launch['backend']} job {run.launch.get('job_id')}"
    return ""


def compose_members(overrides: list[str]) -> tuple[str, list[Member], list[Any]]:
    """Step 1 and the members' configs: (sweep id, members, each one's composed config), or a UserError
    naming the bad member."""
    from fsdp_jobs.planning.compose import compose_many

    combos = expand(overrides)
    sid = sweep_id(overrides, combos)
    check_name("name", sid)  # it is the sweep's directory under run_root, and a job name
    names = member_names([p for _, p in combos])
    lists = [[o for o in member_overrides if o.split("=", 1)[0] != "name"] for member_overrides, _ in combos]
    members = [Member(name, member_overrides, params)
               for name, member_overrides, (_, params) in zip(names, lists, combos)]
    composed_all = compose_many(lists)
    for i, (m, composed) in enumerate(zip(members, composed_all)):  # every member's config before any backend
        if isinstance(composed, UserError):
            raise UserError("", None, f"sweep {sid}, member {i + 1} of {len(combos)} ({m.name}): {composed}")
    return sid, members, composed_all


def prepare_members(overrides: list[str]) -> tuple[str, list[Member]]:
    """Steps 1 and 2: every member composed, planned and dry-run, or a UserError naming the bad one."""
    sid, members, composed_all = compose_members(overrides)
    for i, (m, composed) in enumerate(zip(members, composed_all)):
        try:
            plan_member(m, composed, sweep=sid, skip_existing=_existing)
        except UserError as e:
            raise UserError("", None, f"sweep {sid}, member {i + 1} of {len(members)} ({m.name}): {e}") from None
    return sid, members


def show_jobs(overrides: list[str], multirun: bool) -> int:
    """--cfg job (Hydra's): the composed job record of the run, or of every member with -m, as its run dir
    will keep it; nothing is planned, written or submitted."""
    from fsdp_jobs.planning.compose import compose_many

    try:
        sid, members, composed_all = (compose_members(overrides) if multirun else
                                      (None, [Member(None, overrides)], compose_many([overrides])))
        for m, composed in zip(members, composed_all):
            take_composed(m, composed, sid)
    except UserError as e:
        die(e)
    for m in members:
        sys.stdout.write((f"# ---- sweep {sid}, member {m.name}\n" if sid else "") + job_record_text(m.job))
    return 0


def _groups(members: list[Member]) -> list[list[Member]]:
    """Members the backend can submit together (same backend, same group_key), in sweep order."""
    groups: dict[Any, list[Member]] = {}
    for i, m in enumerate(members):
        key = m.backend.group_key(m.dryrun)
        groups.setdefault((m.backend.name, key) if key is not None else i, []).append(m)
    return list(groups.values())


def _line(m: Member, width: int, what: str) -> str:
    return f"  {m.name:<{width}}  {m.plan.backend:<8} {what}"


def dry_run(sid: str, members: list[Member]) -> int:
    for m in members:
        sys.stdout.write(f"# ---- sweep {sid}, member {m.name}\n{render_dry_run(m.plan, m.dryrun.text)}")
    groups = _groups(members)
    for group in groups:
        text = group[0].backend.group_text([m.dryrun for m in group])
        if text:
            sys.stdout.write(f"# ---- sweep {sid}: {', '.join(m.name for m in group)} go out together as\n"
                             f"{text.rstrip()}\n")
    print(f"# sweep {sid}: {len(members)} members in {len(groups)} submission(s): "
          + "; ".join(", ".join(m.name for m in g) for g in groups))
    return 0


def main(overrides: list[str]) -> int:
    """python -m fsdp_jobs -m OVERRIDES (the command line read by fsdp_jobs/planning/command_line.py): returns
    the exit status."""
    try:
        sid, members = prepare_members(overrides)
    except UserError as e:
        die(e)
    print_notes(members)
    if members[0].cfg.dry_run:
        return dry_run(sid, [m for m in members if m.dryrun])

    todo = [m for m in members if not m.skip]
    sweep_dir = Path(members[0].plan.run_dir).parent
    width = max(len(m.name) for m in members)
    print(f"fsdp-jobs: sweep {sid}: {len(members)} members, {len(todo)} to submit, "
          f"{len(members) - len(todo)} skipped; run dirs under {sweep_dir}", flush=True)
    for m in members:
        if m.skip:
            print(_line(m, width, f"skipped: {m.skip}"), flush=True)
    done: list[tuple[Member, Any]] = []
    for group in _groups(todo):
        try:
            out = submit_group(sid, group)
        except UserError as e:
            sent = f"; {len(done)} member(s) went out before it: fsdp-jobs status {sid}" if done else ""
            die(f"{e}{sent}")
        done += out
        for m, s in out:
            verb = "resumed" if m.plan.resume_from else "submitted"
            if s.exit_status is None:
                print(_line(m, width, f"{verb:<9} job {s.job_id:<14} {m.plan.run_dir}"), flush=True)
            else:  # an attached backend: the member has already run
                print(_line(m, width, f"exited {s.exit_status:<3} {m.plan.run_dir}"), flush=True)
        if any(s.exit_status == 130 for _, s in out):  # Ctrl-C: stop the sweep, not just this member
            break
    attached = [(m, s) for m, s in done if s.exit_status is not None]
    if attached:
        from fsdp_jobs.cli.status_text import Compared, compare_lines
        from fsdp_jobs.rundir.run_status import Read, read_status

        rows = [Compared(m.name, read_status(Path(m.plan.run_dir), {Read.STEADY}), exit=s.exit_status)
                for m, s in attached]
        table = compare_lines(rows, with_exit=True, with_goodput=False)
        print(f"fsdp-jobs: sweep {sid} finished:\n" + "\n".join(table), flush=True)
    print(f"  status: fsdp-jobs status {sid}    compare: fsdp-jobs compare {sid}    cancel: fsdp-jobs cancel {sid}",
          flush=True)
    failed = [s.exit_status for _, s in attached if s.exit_status]
    return failed[0] if failed else 0
