"""The command line of `python -m fsdp_jobs`, read once: overrides, and what a Hydra user types out of habit.

The job is composed with Hydra (fsdp_jobs/planning/compose.py), but this project plans, launches and sweeps
it itself: Hydra's app runner, its launcher and sweeper plugins, its output and working directories and
its logging never run. An override of theirs would be taken without effect (a launcher plugin's partition
while the job trains on this machine, a run dir nobody uses) or end in a traceback. So each of Hydra's
flags and every `hydra.*` override either does here exactly what it does in a Hydra app (-m, --multirun
and hydra.mode=MULTIRUN sweep; --cfg job prints the composed job record) or is refused in one line that
names what this project uses instead: `parse` is the one rule, before anything is composed.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, NoReturn, Optional

from fsdp_jobs.planning.errors import UserError


@dataclass
class Command:
    """What the command line asks for."""

    overrides: list[str]  # key=value, as Hydra's grammar reads them
    multirun: bool = False  # -m, --multirun, hydra.mode=MULTIRUN: a sweep (fsdp_jobs/cli/sweep.py)
    show_job: bool = False  # --cfg job: print the composed job record, run nothing


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError("", None, f"{message} (try --help)")


def _conf_groups() -> str:
    from fsdp_jobs.planning.compose import CONF_DIR

    return ", ".join(f"{p.name}=" for p in sorted(CONF_DIR.iterdir()) if p.is_dir())


# Hydra's own flags (hydra/_internal/utils.py get_args_parser) that have no equivalent here: what to use
# instead. -h/--help is this project's usage, answered before the command line is read.
REFUSED_FLAGS: dict[tuple[str, ...], str] = {
    ("--hydra-help",): "Hydra's app help does not apply; this command's is --help",
    ("--version",): "Hydra's version does not apply; this project's: pip show fsdp-jobs",
    ("-p", "--package"): "--cfg job prints the whole composed job record; no package of it",
    ("-sc", "--shell-completion"): "no shell completion; the keys and presets: --help",
    ("-cp", "--config-path"): "the job is composed from this project's conf/ alone: choose its presets with {groups} "
                              "and set any key with key=value",
    ("-cn", "--config-name"): "the job is composed from this project's conf/ alone: choose its presets with {groups} "
                              "and set any key with key=value",
    ("-cd", "--config-dir"): "the job is composed from this project's conf/ alone: choose its presets with {groups} "
                             "and set any key with key=value",
    ("--experimental-rerun",): "the same name= again resumes that run from its newest checkpoint",
    ("-i", "--info"): "dry_run=true prints the plan and the exact launch commands; --cfg job the composed job record",
}


VALUE_FLAGS = ("--package", "--config-path", "--config-name", "--config-dir", "--experimental-rerun")


def _parser() -> _Parser:
    p = _Parser(prog="fsdp-jobs", add_help=False, allow_abbrev=False)
    p.add_argument("overrides", nargs="*")
    p.add_argument("-m", "--multirun", action="store_true")
    p.add_argument("-r", "--run", action="store_true")
    p.add_argument("-c", "--cfg")
    p.add_argument("--resolve", action="store_true")
    for flags in REFUSED_FLAGS:  # the value of one that takes a value (in Hydra) is named in the refusal
        if flags[-1] in VALUE_FLAGS:
            p.add_argument(*flags, dest=f"refused:{flags[-1]}")
        else:
            p.add_argument(*flags, action="store_const", const=True, dest=f"refused:{flags[-1]}")
    return p


def _launcher_hint(key: str, value: Optional[str]) -> str:
    """hydra.launcher.<k>=v as this project spells it, where one key means the same (a launcher plugin's
    partition is cluster.partition; its nodes, nodes)."""
    from fsdp_jobs.planning import backends
    from fsdp_jobs.planning.config import JobConfig

    leaf = key.split(".", 2)[2] if key.count(".") >= 2 else ""
    leaf = {"timeout_min": "time_min", "max_num_timeout": "max_timeouts", "tasks_per_node": "gpus_per_node"}.get(leaf, leaf)
    if not leaf or value is None:
        return ""
    if leaf in {f.name for f in dataclasses.fields(JobConfig)} - {"cluster"}:
        return f" (here: {leaf}={value})"
    if any(leaf in {f.name for f in dataclasses.fields(backends.schema(n))} for n in backends.names()):
        return f" (here: cluster.{leaf}={value})"
    return ""


def _instead(key: str, value: Optional[str]) -> str:
    """What this project uses instead of the Hydra setting `key` (dotted, hydra/launcher as hydra.launcher)."""
    from fsdp_jobs.planning import backends

    rules: list[tuple[str, str]] = [
        ("hydra.launcher", f"Hydra's launchers do not run here: a job goes out through cluster=({'|'.join(backends.names())}) "
                           f"and that backend's cluster.* keys{_launcher_hint(key, value)}"),
        ("hydra.sweeper", "Hydra's sweepers do not run here: sweep the keys themselves with -m KEY=a,b "
                          "(or choice(), glob(), range())"
                          + (f", here -m {key.split('.', 3)[3]}={value}" if key.startswith("hydra.sweeper.params.")
                             and value is not None else "")),
        ("hydra.sweep.subdir", "a sweep's members are named after their swept values: <run_root>/<sweep>/<member>, "
                               "the sweep named by name="),
        ("hydra.sweep", "a sweep's runs go under run_root= (<run_root>/<sweep>/<member>), the sweep named by name="),
        ("hydra.run", "a run's directory is <run_root>/<name>: set run_root= and name="),
        ("hydra.job.chdir", "the ranks always start in the run dir (<run_root>/<name>); this command does not change "
                            "its own"),
        ("hydra.job.name", "name= names the run (and a sweep)"),
        ("hydra.job.env_set", "+cluster.env.NAME=value sets an environment variable of every rank"),
        ("hydra.job.env_copy", "+cluster.env.NAME=value sets an environment variable of every rank"),
        ("hydra.output_subdir", "Hydra writes no output folder here: the run dir keeps the composed job record "
                                "(--cfg job prints it) and its logs"),
        ("hydra.runtime", "hydra.runtime.* is what Hydra records about a run it starts, never set by an override"),
        ("hydra.searchpath", "the job is composed from this project's conf/ alone: choose its presets with "
                             f"{_conf_groups()} and set any key with key=value"),
        ("hydra.mode", "allowed: hydra.mode=RUN (one run) or hydra.mode=MULTIRUN (a sweep, as -m)"),
    ]
    logging = ("Hydra's logging does not run here: the job writes its own lines, kept in the run dir "
               "(fsdp-jobs logs RUN); rank 0 reports every train.log_interval steps")
    rules += [(k, logging) for k in ("hydra.verbose", "hydra.job_logging", "hydra.hydra_logging")]
    for prefix, text in rules:
        if key == prefix or key.startswith(prefix + "."):
            return text
    return "Hydra's own settings (hydra.*) do not apply: this project composes the job with Hydra and runs it " \
           "itself (python -m fsdp_jobs --help)"


def _hydra_key(override: str) -> Optional[str]:
    """The dotted key of a hydra.* override (+hydra.x=1, ~hydra.x, hydra/launcher=y: hydra.launcher), or of a
    group placed into Hydra's own package (model@hydra.x=tiny: hydra.x), else None."""
    key, _, package = override.split("=", 1)[0].lstrip("+~").partition("@")
    for path in (package, key.replace("/", ".")):
        if path == "hydra" or path.startswith("hydra."):
            return path
    return None


def _take(override: str, cmd: Command, args: argparse.Namespace) -> bool:
    """Apply a hydra.* override to cmd, or refuse it. False: not one of Hydra's (an override of the job)."""
    key = _hydra_key(override)
    if key is None:
        return False
    typed, _, value = override.partition("=")
    if typed == "hydra.mode" and value in ("RUN", "MULTIRUN"):  # what -m and --run say, as Hydra reads them
        flag = "--run" if args.run and value == "MULTIRUN" else "-m" if args.multirun and value == "RUN" else ""
        if flag:
            raise UserError(typed, value, f"contradicts {flag}")
        cmd.multirun = value == "MULTIRUN"
        return True
    raise UserError(typed, value if "=" in override else None, _instead(key, value if "=" in override else None))


def parse(argv: list[str]) -> Command:
    """The command line read once: a Command, or a UserError in one line for anything it cannot honour."""
    args, extra = _parser().parse_known_intermixed_args(argv)
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        raise UserError("", unknown[0], f"unknown option {unknown[0]!r}; overrides are key=value (try --help)")
    for flags, text in REFUSED_FLAGS.items():
        given = getattr(args, f"refused:{flags[-1]}")
        if given is not None:
            raise UserError(flags[-1], None if given is True else given, text.replace("{groups}", _conf_groups()))
    if args.multirun and args.run:
        raise UserError("--run", None, "contradicts -m: one run, or a sweep")
    if args.cfg not in (None, "job"):
        raise UserError("--cfg", args.cfg, "allowed: --cfg job (the composed job record); Hydra's own config "
                                           "does not apply here")
    if args.resolve and args.cfg is None:
        raise UserError("--resolve", None, "goes with --cfg job, whose record is always resolved")
    cmd = Command([], multirun=args.multirun, show_job=args.cfg == "job")
    cmd.overrides = [o for o in [*args.overrides, *extra] if not _take(o, cmd, args)]
    return cmd


def job_record_text(job: dict[str, Any]) -> str:
    """The composed job record as --cfg job prints it: the YAML a run dir keeps."""
    import yaml

    return yaml.safe_dump(job, sort_keys=False)
