"""fsdp-jobs list | status RUN | logs RUN [-f] [--node K] [--rank R] [--attempt A] [--grep TEXT] [--tail N]
         | cancel RUN | chaos RUN ACTION NODE
         | compare SWEEP | plot RUN_OR_SWEEP... -o out.png | goodput RUN_OR_SWEEP [--json]
                                                                (also: python -m fsdp_jobs.cli.ctl ...)

RUN is a run name (under run_root, default ./runs), a run dir, or a backend's job id; a sweep's member
is SWEEP/MEMBER. status and cancel also take a SWEEP (its id, from the journal, or its dir). Everything goes
through the backend interface (launchers/base.py): the run dir's newest launch record names the
backend, and that backend says what its job is doing. This module knows no backend by name, and it
only reads run dirs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from fsdp_jobs.cli import report, status_text
from fsdp_jobs.rundir import goodput, logs, script_progress
from fsdp_jobs.rundir.logs import LogFilter
from fsdp_jobs.planning import backends, input_rules
from fsdp_jobs.planning.chaos_kinds import CORRUPT_BITS, DEFAULT_BIT, MARATHON, RESUME, ChaosKind, actions
from fsdp_jobs.rundir import journal, runs
from fsdp_jobs.planning.errors import OneLineParser, UserError, die
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.run_status import (LIST, REPORT, STATUS, Reads, RunStatus, job_record, read_status,
                                        straggler_threshold)
from fsdp_jobs.rundir.status import JobState, JobStatus, Run

MAX_MARATHON_FAULTS = 1000
COMMANDS = ("list", "status", "logs", "cancel", "scale", "chaos", "compare", "plot", "goodput", "report", "stacks", "top")


def _backend(run: Any) -> Any:
    from fsdp_jobs.cli import launcher

    name = run.launch.get("backend")
    if not name:
        raise UserError("RUN", run.run_dir.name, f"{RunDir(run.run_dir).launches_file} records no launch "
                                                 "(missing or damaged); nothing to ask a backend about")
    try:
        return launcher.get(str(name))
    except ValueError as e:
        raise UserError("RUN", run.run_dir.name, str(e)) from None


def run_dirs(run_root: Path) -> list[Path]:
    return sorted(p for p in run_root.glob("*") if RunDir(p).job_file.is_file()) if run_root.is_dir() else []


def is_run(ref: str, run_root: Path) -> bool:
    """Does `ref` name a run dir, as a path or under the run root?"""
    return any(RunDir(d).job_file.is_file() for d in (Path(ref), run_root / ref))


def check_name(ref: str, run_root: Path, key: str = "RUN") -> None:
    """Refuse, before anything is read or done, a name that names no run, or every run: `fsdp-jobs cancel
    "$RUN"` with RUN unset found the run root itself, as a sweep of every run under it, and cancelled them all."""
    asked = "name one run (its name, run dir or job id), a SWEEP or SWEEP/MEMBER: `fsdp-jobs list` shows them"
    if report.names_nothing(ref):
        raise UserError(key, ref, f"names no run; {asked}")
    if not is_run(ref, run_root) and any(report.holds_run_root(d, run_root) for d in (Path(ref), run_root / ref)):
        raise UserError(key, ref, f"is the run root {run_root} or a folder above it, which holds every run; {asked}")


def find_run(ref: str, run_root: Path) -> Path:
    for candidate in (Path(ref), run_root / ref):
        if RunDir(candidate).job_file.is_file():
            return candidate.resolve()
    sweep, _, member = ref.partition("/")
    for m in (report.find_sweep(sweep, run_root) or []) if member else []:  # SWEEP/MEMBER from anywhere
        if m["member"] == member and RunDir(m["run_dir"]).job_file.is_file():
            return m["run_dir"]
    for run_dir in run_dirs(run_root):  # a backend's job id (a batch job, a compose project, ...)
        if any(str(r.get("job_id")) == ref for r in runs.launches(run_dir)):
            return run_dir.resolve()
    known = ", ".join(p.name for p in run_dirs(run_root)[:20]) or "none"
    raise UserError("RUN", ref, f"no such run or job under {run_root}; runs there: {known}")


def straggler_ratio(run_dir: Path) -> float:
    """The job's fault.straggler_ratio (the default for a run dir whose job record is older or unreadable)."""
    return straggler_threshold(job_record(run_dir))


def backend_word(run: Run) -> JobStatus:
    """The backend's word on the run's job (its state and its own description): the one place where the views
    (status, list, the report page) ask for it."""
    try:
        return _backend(run).describe(run)
    except UserError as e:
        return JobStatus(JobState.UNKNOWN, f"UNKNOWN ({e.allowed})")


def status_of(run_dir: Path, reads: Reads = STATUS) -> RunStatus:
    """A run's status for a view: the backend's word and what `reads` names of the run dir
    (fsdp_jobs/rundir/run_status.py), read once."""
    run = Run.load(run_dir)
    return read_status(run_dir, reads, backend_word(run), run.launch)


def run_status(run_dir: Path, accounted: bool = True) -> dict[str, Any]:
    """`fsdp-jobs status RUN`'s answer. `accounted=False` (list's row, which shows no goodput): without the
    goodput accounting, a read of the whole timeline (32,000 events for 100 attempts of 1,024 nodes)."""
    return status_text.status_json(status_of(run_dir, STATUS if accounted else LIST))


def scale_target(run_dir: Path, size: str) -> int:
    """The N of `scale RUN nodes=N`, within what the job's rendezvous admits (the job record: nodes, cluster.max_nodes)."""
    m = re.fullmatch(r"nodes=(\d{1,6})", size)
    job = runs.load_job(run_dir) or {}
    nodes, top = job.get("nodes"), (job.get("cluster") or {}).get("max_nodes")
    if not isinstance(nodes, int):
        raise UserError("RUN", run_dir.name, f"{RunDir(run_dir).job_file} names no node count; cannot scale it")
    top = top if isinstance(top, int) else nodes
    if top <= nodes:
        raise UserError("RUN", run_dir.name, "was submitted without cluster.max_nodes, so its rendezvous admits no "
                                             "more nodes; submit it with cluster.max_nodes=N to grow it later (the "
                                             "same name resumes from its newest checkpoint)")
    if m is None:
        raise UserError("scale", size, f"need nodes=N, N from {nodes + 1} to {top} (the job's cluster.max_nodes)")
    wanted = int(m.group(1))
    if not nodes < wanted <= top:
        raise UserError("nodes", wanted, f"must be from {nodes + 1} to {top}: {run_dir.name} started with "
                                         f"{nodes} nodes and cluster.max_nodes={top}")
    return wanted


def goodput_of(run_dir: Path) -> dict[str, Any]:
    """A run's goodput accounting, or one line naming the file that holds none."""
    gp = goodput.of_run(run_dir)
    if gp is None:
        path = RunDir(run_dir).goodput_file
        why = status_text.no_goodput(script_progress.user_code(job_record(run_dir)), path)
        if why:  # a plain script's run: nothing is missing or damaged
            raise UserError("RUN", run_dir.name, why)
        raise UserError("RUN", run_dir.name, f"{path} holds no attempt (missing or damaged; runs started before "
                                             "goodput was recorded have none)")
    return gp


def goodput_command(ref: str, root: Path, as_json: bool) -> None:
    members = None if is_run(ref, root) else report.find_sweep(ref, root)
    if members is None:
        gp = goodput_of(find_run(ref, root))
        lines = [*report.goodput_lines(gp), "", *report.goodput_bar_lines(gp)]
        if gp["damaged_lines"]:
            lines.append(f"({gp['damaged_lines']} damaged line(s) of {gp['file']} skipped)")
        print(json.dumps(gp, indent=2) if as_json else "\n".join(lines))
        return
    found = {m["member"]: goodput.of_run(Path(m["run_dir"])) for m in members}
    if as_json:
        print(json.dumps(found, indent=2))
        return
    print("\n".join(report.goodput_sweep_lines(found)))


def report_command(ref: str, root: Path, output: Optional[Path]) -> None:
    """`fsdp-jobs report RUN|SWEEP [-o FILE]`: the HTML page (fsdp_jobs/cli/html_report.py); by default
    RUN_DIR/report.html (a sweep: report.html in the current directory), its path printed."""
    from fsdp_jobs.cli import html_report

    members = None if is_run(ref, root) else report.find_sweep(ref, root)
    if members is None:
        run_dir = find_run(ref, root)
        text, path = html_report.render_run(status_of(run_dir, REPORT)), output or RunDir(run_dir).report_file
    else:
        text, path = html_report.render_sweep(ref, members), output or Path("report.html")
    html_report.write(path, text)
    print(path)


def stacks_command(backend: Any, run: Any, node: Optional[str], rank: Optional[str]) -> None:
    """`fsdp-jobs stacks RUN [--node K] [--rank R]`: every running rank's Python stacks into one file of the run
    dir (the backend's `stacks`: launchers/stacks.py), one line a rank (where its main thread is) and the
    file's path printed."""
    ranks = {logs.whole_number("--rank", rank, "need a rank: a whole number from 0")} if rank is not None else None
    stacks = capability(backend, "stacks")
    if backend.describe(run).state.value != "RUNNING":
        raise UserError("RUN", run.run_dir.name, "is not running: stacks are read from live ranks (a hang's are "
                                                 "kept in its hang record: `fsdp-jobs status`)")
    path, heads = stacks.collect(run, node, ranks)
    if not heads:
        raise UserError("--rank" if ranks else "--node" if node else "RUN", rank or node or run.run_dir.name,
                        "no running rank of it was found")
    print("\n".join([*heads, str(path)]))


def capability(backend: Any, what: str) -> Any:
    """The backend's capability object (launchers/capabilities.py) for `what`: scale, stacks, marathon, resume or
    a chaos kind's word, where its TRAITS declare it (fsdp_jobs/cli/launcher.py holds the two equal); else the one
    line naming the backends that have it."""
    if not backends.offers(backend.name, what):
        raise backends.lacking(backend.name, what)
    return backend.scaler if what == "scale" else backend.stacks if what == "stacks" else backend.faults


def top_command(ref: Optional[str], root: Path) -> None:
    """`fsdp-jobs top [RUN]` (fsdp_jobs/cli/top.py): live while stdout is a terminal, else one frame."""
    from fsdp_jobs.cli import top

    if ref is not None:
        one = [find_run(ref, root)]
        view = top.Top(lambda: one, straggler_ratio)
    else:
        view = top.Top(lambda: top.live_runs(run_dirs(root), time.time()), straggler_ratio)
    if sys.stdout.isatty():
        top.loop(view)
    else:
        print("\n".join(view.frame()))


def list_lines(run_root: Path) -> list[str]:
    lines = [status_text.LIST_HEADER, *(status_text.list_row(status_of(d, LIST)) for d in run_dirs(run_root))]
    sweeps = journal.sweeps()
    if sweeps:  # every sweep in the journal, wherever its run dirs are
        rows = []
        for sw in sweeps:  # the backend's word per member only: 1,000 full statuses would read 1,000 timelines
            states = Counter(member_state(m["run_dir"]) for m in report.find_sweep(sw["sweep"], run_root) or [])
            rows.append([sw["sweep"], str(sw["members"]), sw["backend"],
                         ", ".join(f"{n} {st}" for st, n in sorted(states.items())), sw["dir"]])
        lines += [""] + status_text.table(["SWEEP", "MEMBERS", "BACKEND", "STATES", "DIR"], rows)
    return lines


def member_state(run_dir: Path) -> str:
    """A run's state in the backend's word alone (what `list` counts per sweep member); "gone" for a member whose
    run dir was deleted (the journal still names it: `status SWEEP` says so)."""
    if not RunDir(run_dir).job_file.is_file():
        return JobState.UNKNOWN.value if Path(run_dir).exists() else "gone"
    return backend_word(Run.load(run_dir)).state.value


def member_statuses(members: list[dict[str, Any]]) -> list[tuple[str, Path, Optional[RunStatus]]]:
    """Each member's status (None: its run dir is gone)."""
    return [(m["member"], m["run_dir"], status_of(m["run_dir"]) if RunDir(m["run_dir"]).job_file.is_file() else None)
            for m in members]


def sweep_statuses(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`status SWEEP --json`: each member's status as `status` words it."""
    return [{**status_text.status_json(s), "member": member} if s else status_text.gone_json(member, run_dir)
            for member, run_dir, s in member_statuses(members)]


def cancel_sweep(members: list[dict[str, Any]]) -> list[str]:
    """Cancel every member whose job has not ended yet (an ended one has nothing to cancel)."""
    from fsdp_jobs.rundir.status import JobState, Run

    lines = []
    for s, m in zip(sweep_statuses(members), members):
        if JobState(s["state"]).terminal or s["detail"].endswith("is gone"):
            lines.append(f"{m['member']}: already {s['state']}")
            continue
        run = Run.load(m["run_dir"])
        lines.append(_backend(run).cancel(run))
    return lines


def parser() -> OneLineParser:
    """`fsdp-jobs list|status|logs|stacks|top|cancel|scale|chaos|goodput|report|compare|plot`."""
    p = OneLineParser(prog="fsdp-jobs", description="Follow and control submitted runs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    parsers = {"list": sub.add_parser("list", help="runs under the run root, with their state")}
    for name in ("status", "cancel", "logs", "scale", "chaos", "stacks"):
        parsers[name] = sub.add_parser(name)
        parsers[name].add_argument("run", help="run name, run dir, the backend's job id, SWEEP/MEMBER"
                                   + (" or SWEEP" if name in ("status", "cancel") else ""))
    parsers["logs"].add_argument("-f", "--follow", action="store_true", help="until the job ends")
    parsers["logs"].add_argument("--node", help="one node's lines: its index (0 = the backend's first node) or "
                                 "its name (node3, a host, a pod); where a backend keeps a log per node, only "
                                 "that one is read")
    parsers["logs"].add_argument("--rank", help="the lines that name this rank ([rank R], [rankR]:)")
    parsers["logs"].add_argument("--attempt", help="one attempt's lines: K = the ranks' K-th start (rank 0's K-th "
                                 "world line), 0 = before the first, -1 = the newest")
    parsers["logs"].add_argument("--grep", action="append", default=[], metavar="TEXT",
                                 help="lines holding TEXT (plain text, case-sensitive; repeat: any of them)")
    parsers["logs"].add_argument("--tail", metavar="N", help="the last N matching lines of each log, read from "
                                 "its end (with -f: then what is written)")
    parsers["stacks"].add_argument("--node", help="one node's ranks: its index (0 = the first) or its name")
    parsers["stacks"].add_argument("--rank", help="one rank")
    parsers["chaos"].add_argument("action", choices=actions(), help="; ".join(
        [*(f"{k}: {k.help}" for k in ChaosKind if k.by_hand), f"{RESUME}: undo", f"{MARATHON}: --faults N mixed "
         "faults, one at a time, and a table of each one's detection and recovery"]))
    parsers["chaos"].add_argument("node", type=int, nargs="?", default=0,
                                  help="node index (0 = the rendezvous host), or the rank for "
                                  + ", ".join(k.value for k in ChaosKind if k.on_rank))
    parsers["chaos"].add_argument("--rate", default="100mbit", help="slow-link: the node's send rate (tc's units: "
                                  "100mbit, 500kbit, 1gbit)")
    parsers["chaos"].add_argument("--bit", type=int, default=DEFAULT_BIT, help=f"corrupt-rank: which bit of the element "
                                  f"flips (0-{CORRUPT_BITS[-1]}; {DEFAULT_BIT}: a float32's high mantissa bit)")
    parsers["chaos"].add_argument("--faults", type=int, default=10, help="marathon: how many faults")
    parsers["chaos"].add_argument("--seed", type=int, default=0, help="marathon: the schedule's seed")
    parsers["chaos"].add_argument("--kinds", default="", help="marathon: only these kinds, comma-separated "
                                  "(default: every kind the backend deals)")
    parsers["chaos"].add_argument("--margin", type=int, help="marathon: steps kept free of faults at each end "
                                  "(default: checkpoint.interval; 20 for auto)")
    parsers["scale"].add_argument("size", metavar="nodes=N", help="the node count to grow the running job to "
                                  "(at most its cluster.max_nodes)")
    parsers["status"].add_argument("--json", action="store_true", help="a sweep's member statuses as JSON")
    parsers["goodput"] = sub.add_parser("goodput", help="where the wall time went: queued, start-up, steps, "
                                        "checkpoints, lost work, recovery, per attempt")
    parsers["goodput"].add_argument("run", help="run name, run dir, job id, SWEEP/MEMBER or SWEEP")
    parsers["goodput"].add_argument("--json", action="store_true", help="every part, per attempt, as JSON")
    parsers["compare"] = sub.add_parser("compare", help="a sweep's members: overrides, final loss, tokens/s, MFU")
    parsers["compare"].add_argument("sweep", help="sweep id (see fsdp-jobs list) or sweep dir")
    parsers["top"] = sub.add_parser("top", help="a live view of running jobs: per node step, compute, straggler "
                                    "ratio, age; q quits (one frame when not a terminal)")
    parsers["top"].add_argument("run", nargs="?", help="one run (default: every running run under the run root)")
    parsers["report"] = sub.add_parser("report", help="one self-contained HTML page of what happened to a run "
                                       "(curves, goodput timeline, incidents, nodes, config) or a sweep")
    parsers["report"].add_argument("run", help="run name, run dir, job id, SWEEP/MEMBER or SWEEP")
    parsers["report"].add_argument("-o", "--output", type=Path, default=None,
                                   help="the HTML file (default: RUN_DIR/report.html; a sweep: ./report.html)")
    parsers["plot"] = sub.add_parser("plot", help="PNG of loss and tokens/s over steps, one line per run")
    parsers["plot"].add_argument("refs", nargs="+", metavar="RUN_OR_SWEEP")
    parsers["plot"].add_argument("-o", "--output", type=Path, default=Path("runs.png"), help="PNG to write")
    for sp in parsers.values():
        sp.add_argument("--run-root", default=os.environ.get("FSDP_JOBS_RUN_ROOT", "runs"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    from fsdp_jobs.rundir.status import Run

    args = parser().parse_args(argv)
    root = Path(args.run_root)
    try:
        for ref in [getattr(args, "run", None), getattr(args, "sweep", None), *getattr(args, "refs", [])]:
            if ref is not None:  # `top` alone: every running run
                check_name(ref, root, "SWEEP" if args.cmd == "compare" else "RUN")
        if args.cmd == "chaos" and not input_rules.TC_RATE.fullmatch(args.rate):
            raise UserError("--rate", args.rate, "need a number and kbit, mbit or gbit (e.g. 100mbit)")
        if args.cmd == "chaos" and args.bit not in CORRUPT_BITS:
            raise UserError("--bit", args.bit, f"must be a bit from 0 to {CORRUPT_BITS[-1]}")
        if args.cmd == "chaos" and not 1 <= args.faults <= MAX_MARATHON_FAULTS:
            raise UserError("--faults", args.faults, f"must be between 1 and {MAX_MARATHON_FAULTS}")
        if args.cmd == "chaos" and args.margin is not None and args.margin < 1:
            raise UserError("--margin", args.margin, "must be an integer >= 1 (steps)")
        if args.cmd == "list":
            print("\n".join(list_lines(root)))
            return 0
        if args.cmd in ("compare", "plot"):
            return sweep_command(args, root)
        if args.cmd == "goodput":
            goodput_command(args.run, root, args.json)
            return 0
        if args.cmd == "report":
            report_command(args.run, root, args.output)
            return 0
        if args.cmd == "top":
            top_command(args.run, root)
            return 0
        # a run is found without the journal (a damaged journal must not stop `status RUN`)
        of_sweep = args.cmd in ("status", "cancel") and not is_run(args.run, root)
        members = report.find_sweep(args.run, root) if of_sweep else None
        if members is not None:
            if args.cmd == "cancel":
                print("\n".join(cancel_sweep(members)))
            elif args.json:
                print(json.dumps(sweep_statuses(members), indent=2, default=str))
            else:
                print("\n".join(status_text.sweep_status_lines(member_statuses(members))))
            return 0
        run_dir = find_run(args.run, root)
        if args.cmd == "status":
            print(json.dumps(run_status(run_dir), indent=2))
            return 0
        run = Run.load(run_dir)
        backend = _backend(run)
        if args.cmd == "logs":
            logs_command(backend, run, log_filter(args, run_dir), args.follow)
        elif args.cmd == "stacks":
            stacks_command(backend, run, args.node, args.rank)
        elif args.cmd == "cancel":
            print(backend.cancel(run))
        elif args.cmd == "scale":
            print(capability(backend, "scale").scale(run, scale_target(run_dir, args.size)))
        elif args.action == MARATHON:
            kinds = tuple(k for k in args.kinds.split(",") if k)
            return capability(backend, MARATHON).marathon(run, args.faults, args.seed, kinds, args.margin)
        elif args.action == RESUME:
            print(capability(backend, RESUME).resume(run))
        else:
            print(capability(backend, args.action).inject(run, ChaosKind(args.action), args.node, rate=args.rate,
                                                          bit=args.bit))
    except UserError as e:
        die(e)
    except KeyboardInterrupt:
        return 130
    except OSError as e:  # an unreadable run dir, a backend command that is not installed
        die(f"{getattr(e, 'filename', '') or ''}: {e.strerror or e}".lstrip(": "))
    return 0


def log_filter(args: argparse.Namespace, run_dir: Path) -> LogFilter:
    """`logs`' flags as a LogFilter, or one line naming the flag, its value and what is allowed."""
    where = LogFilter(node=args.node, grep=tuple(args.grep),
                      rank=logs.whole_number("--rank", args.rank, "need a rank: a whole number from 0"),
                      attempt=logs.whole_number("--attempt", args.attempt, "need a whole number: 0 (before the "
                                                "ranks first started), K (their K-th start), -1 (the newest)"),
                      tail=logs.whole_number("--tail", args.tail, f"need a line count from 1 to {logs.MAX_TAIL:,}"))
    return logs.check(where, args.follow, _job_record(run_dir))


def _job_record(run_dir: Path) -> Optional[dict[str, Any]]:
    import yaml

    try:
        return runs.load_job(run_dir)
    except (OSError, ValueError, yaml.YAMLError):
        return None  # no bounds on node and rank: the filters still apply


def waiting_line(seconds: float, status: Any) -> str:
    """What `logs -f` says on stderr when no line came for a while: the backend's own word (a scheduler's state and
    its reason, e.g. PENDING (Resources)), so a queued job or a slow first rendezvous is not silence."""
    return f"fsdp-jobs: no new log line for {seconds:.0f} s; the job is {status.detail or status.state.value}"


def logs_command(backend: Any, run: Any, where: LogFilter, follow: bool) -> None:
    def on_quiet(seconds: float, status: Any) -> None:
        print(waiting_line(seconds, status), file=sys.stderr, flush=True)

    lines = backend.log_iter(run, follow=follow, where=where, on_quiet=on_quiet)
    shown = 0
    for line in lines:
        print(line, flush=follow)
        shown += 1
    if not shown and where.active:
        print("fsdp-jobs: no line matched", file=sys.stderr)


def log_lines(run_dir: Path, where: LogFilter) -> list[str]:
    """`fsdp-jobs logs RUN_DIR` with filters, as a list (what `bench` times): the run's backend reads its logs
    (a tail, or a node of a backend with a log per node, reads only those ends or that file)."""
    from fsdp_jobs.rundir.status import Run

    run = Run.load(Path(run_dir))
    return list(_backend(run).log_iter(run, where=logs.check(where, job=_job_record(Path(run_dir)))))


def sweep_command(args: argparse.Namespace, root: Path) -> int:
    if args.cmd == "compare":
        members = report.find_sweep(args.sweep, root)
        if members is None:
            known = ", ".join(s["sweep"] for s in journal.sweeps()[-10:]) or "none"
            raise UserError("SWEEP", args.sweep, f"no such sweep in the journal or under {root}; sweeps: {known}")
        print("\n".join(report.compare(members)))
        return 0
    if args.output.suffix.lower() != ".png":  # before anything is read
        raise UserError("-o", str(args.output), "must name a .png file")
    named: list[tuple[str, Path]] = []
    for ref in args.refs:
        members = report.find_sweep(ref, root)
        if members is not None and not RunDir(root / ref).job_file.is_file():
            named += [(f"{ref}/{m['member']}", m["run_dir"]) for m in members]
        else:
            named.append((ref, find_run(ref, root)))
    drawn = report.plot(named, args.output)
    empty = [name for name, _ in named if name not in drawn]
    print(f"wrote {args.output}: {len(drawn)} run(s)" + (f"; no metrics yet: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
