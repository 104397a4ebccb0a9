"""`python -m fsdp_jobs.bench records`: today's run-dir readers (the standard library's json, then the records'
hand-written checks, fsdp_jobs/rundir/records.py) against msgspec's decoder, on the same synthetic run of N x G
that `bench scale` builds (1 M metrics rows, 100 attempts in the goodput timeline, a sweep of 1,000 members).

In this process, alternated within each round, median of the rounds:

    metrics, every row       runs.read_metrics (what the trackers and `report` read)
    metrics, newest rows     the 22 newest rows of the record, once per sweep member (`compare`'s tails)
    goodput timeline         events.read_timeline (`status` reads all of it)

each with today's json.loads, with msgspec.json.decode in its place ("msgspec json": today's checks
unchanged; a line msgspec refuses goes to json.loads, which reads the NaN and Infinity that json.dumps writes
for a diverged loss), and, for every metrics row, msgspec's typed decode into a Struct of MetricsRow's
fields ("msgspec struct": the checks done by the decoder).

Then which lines of a metrics record of damaged lines each reader keeps, and how: any difference from
today's is a behaviour a user would see (`status`'s step, `report`'s curve). And end to end, each a process:
`python -m fsdp_jobs status RUN` and `compare SWEEP`, with today's readers and with msgspec's decoder in
fsdp_jobs/rundir/runs.py (the metrics reader, the launch and state records) or in every reader of
fsdp_jobs/rundir, through the same start-up (runpy) so that only the decoder differs.

msgspec is no dependency of fsdp-jobs: without it, this benchmark says so in one line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from fsdp_jobs.bench import scale
from fsdp_jobs.rundir import events, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import MetricsRow

TAIL_ROWS = 22  # compare's steady tail of a finished member: its WINDOW + 1 rows (fsdp_jobs/cli/report.py)

# json.loads' stand-in: msgspec's decoder first, the standard library's for what msgspec refuses (NaN, Infinity,
# numbers beyond a float, text that was not UTF-8), so a line reads as it read before or fails as it failed
SHIM = """
import json as _json, msgspec as _msgspec
class _Json:
    _decode = staticmethod(_msgspec.json.decode)
    def __getattr__(self, name):
        return getattr(_json, name)
    def loads(self, text, *args, **kwargs):
        try:
            return self._decode(text)
        except (_msgspec.DecodeError, ValueError):
            return _json.loads(text, *args, **kwargs)
"""
RUNDIR_READERS = ("runs", "events", "liveness", "journal", "checkpoints", "script_progress", "data_identity")
# the start-up of every end-to-end variant, alike but for `patch`: the readers imported (by every variant, so
# that only the decoder differs), then `python -m fsdp_jobs ARGV` through runpy
BOOT = ("import sys, runpy\nimport " + ", ".join(f"fsdp_jobs.rundir.{m}" for m in RUNDIR_READERS)
        + "\n{patch}\nsys.argv[0] = 'fsdp_jobs'\nrunpy.run_module('fsdp_jobs', run_name='__main__')\n")
VARIANTS = {  # name -> the modules of fsdp_jobs/rundir whose json.loads is msgspec's
    "today": (),
    "msgspec in rundir/runs.py": ("runs",),
    "msgspec in every rundir reader": RUNDIR_READERS,
}
# a metrics record as kills, users and versions leave it: (what the line is, its bytes)
DAMAGED = (("well-formed", b'{"step": 1, "loss": 2.5, "v": 1}'),
           ("a diverged loss (json.dumps writes NaN)", b'{"step": 2, "loss": NaN}'),
           ("an infinite grad norm", b'{"step": 3, "grad_norm": Infinity}'),
           ("an int where a float goes", b'{"step": 4, "loss": 2}'),
           ("a user's own metric (fsdp_jobs.job.log)", b'{"step": 5, "my_metric": 0.5}'),
           ("a newer version's key", b'{"step": 6, "v": 2, "later": 1}'),
           ("a float beyond float64", b'{"step": 7, "loss": 1e999}'),
           ("text that is not UTF-8", b'{"step": 8, "attempt": "\xff"}'),
           ("a key twice", b'{"step": 9, "step": 10}'),
           ("a string where a float goes", b'{"step": 11, "loss": "x"}'),
           ("a bool step", b'{"step": true}'),
           ("a float step", b'{"step": 12.0}'),
           ("cut short by a kill", b'{"step": 13, "lo'),
           ("not an object", b"[14]"),
           ("blank", b""))


def missing() -> Optional[str]:
    """The one line to print when msgspec is not installed here, else None."""
    if importlib.util.find_spec("msgspec") is None:
        return "fsdp-jobs bench records: needs msgspec, which is not installed here: pip install msgspec"
    return None


def shim() -> Any:
    """The json stand-in SHIM defines, made in this process."""
    scope: dict[str, Any] = {}
    exec(SHIM, scope)
    return scope["_Json"]()


@contextmanager
def decoder(modules: tuple[str, ...]) -> Iterator[None]:
    """msgspec's decoder as `json` in these modules of fsdp_jobs/rundir while in the block."""
    found = [importlib.import_module(f"fsdp_jobs.rundir.{m}") for m in modules]
    before = [m.json for m in found]
    stand_in = shim()
    for m in found:
        m.json = stand_in
    try:
        yield
    finally:
        for m, was in zip(found, before):
            m.json = was


def metrics_struct() -> Any:
    """A msgspec Struct with MetricsRow's fields (its `extra`, a user's own metrics, has no place in one)."""
    import msgspec

    hints = typing.get_type_hints(MetricsRow)
    fields = [(f.name, hints[f.name], f.default) for f in MetricsRow.__dataclass_fields__.values() if f.name != "extra"]
    return msgspec.defstruct("MetricsStruct", [(n, t) for n, t, d in fields if n == "step"]
                             + [(n, t, d) for n, t, d in fields if n != "step"])


def struct_rows(path: Path) -> list[dict[str, Any]]:
    """Every metrics row through msgspec's typed decode, as the objects written (fields left at None out); a
    line it refuses is skipped, as today's reader skips what does not parse."""
    import msgspec

    decode = msgspec.json.Decoder(metrics_struct()).decode
    asdict, out = msgspec.structs.asdict, []
    for line in path.read_bytes().splitlines():
        try:
            row = asdict(decode(line))
        except (msgspec.DecodeError, ValueError):  # ValueError: text that is not UTF-8
            continue
        out.append({k: v for k, v in row.items() if v is not None})
    return out


def readers(run_dir: Path, members: int) -> dict[str, Callable[[], Any]]:
    """Each reader with today's json and with msgspec's (the same code, msgspec as its json; or the Struct)."""
    rd = RunDir(run_dir)
    reads = {"metrics, every row": lambda: runs.read_metrics(run_dir),
             f"metrics, {TAIL_ROWS} newest rows x {members}":
                 lambda: [list(itertools.islice(runs.metrics_newest_first(run_dir), TAIL_ROWS)) for _ in range(members)],
             "goodput timeline": lambda: events.read_timeline(run_dir)}
    out: dict[str, Callable[[], Any]] = {}
    for name, read in reads.items():
        out[f"{name}: today"] = read
        out[f"{name}: msgspec json"] = lambda read=read: _with_msgspec(read)
    out["metrics, every row: msgspec struct"] = lambda: struct_rows(rd.metrics_file)
    return out


def _with_msgspec(read: Callable[[], Any]) -> Any:
    with decoder(RUNDIR_READERS):
        return read()


def in_process(run_dir: Path, members: int, repeats: int) -> dict[str, Any]:
    """Each reader's median seconds, and whether each msgspec variant read exactly what today's read."""
    seconds, digests = scale.timed_rounds(readers(run_dir, members), repeats, keep=_digest)
    same = {}
    for name in digests:
        reading, _, variant = name.partition(": ")
        if variant != "today":
            same[name] = digests[name] == digests[f"{reading}: today"]
    return {"seconds": seconds, "same_as_today": same}


def _written(row: Any) -> str:
    """A row as JSON text: an int read back as a float (2 -> 2.0) differs, as a user sees it."""
    return json.dumps(row, sort_keys=True, default=str)


def _digest(rows: Any) -> str:
    """What a reader read, as a digest of its rows' JSON text (a million rows need not be kept to compare)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(_written(row).encode(errors="surrogatepass") + b"\n")
    return h.hexdigest()


def damaged_lines(root: Path) -> dict[str, Any]:
    """Each line of DAMAGED alone as a metrics record: what each reader reads of it (the row as written, or
    None: skipped), and the lines where a msgspec reader reads otherwise than today's."""
    metrics = RunDir(root / "damaged").metrics_file
    metrics.parent.mkdir(parents=True, exist_ok=True)
    read: dict[str, dict[str, Optional[str]]] = {"today": {}, "msgspec json": {}, "msgspec struct": {}}
    for what, line in DAMAGED:
        metrics.write_bytes(line + b"\n")
        today = runs.read_metrics(metrics.parent)
        with decoder(("runs",)):
            via_msgspec = runs.read_metrics(metrics.parent)
        for name, rows in (("today", today), ("msgspec json", via_msgspec), ("msgspec struct", struct_rows(metrics))):
            read[name][what] = _written(rows[0]) if rows else None
    return {"read": read, "differs_from_today": {name: [what for what, row in rows.items() if row != read["today"][what]]
                                                 for name, rows in read.items() if name != "today"}}


def end_to_end(root: Path, run_dir: Path, sweep: str, repeats: int) -> dict[str, Any]:
    """`status RUN` and `compare SWEEP`, each a process, with each VARIANT's decoder, alternated: the wall time
    a user waits, and the process's CPU time (user + system), which other work on a shared machine moves less."""
    calls: dict[str, Callable[[], str]] = {}
    cpu: dict[str, list[float]] = {}
    for command in (("status", str(run_dir)), ("compare", sweep)):
        for variant, modules in VARIANTS.items():
            patch = SHIM + "".join(f"fsdp_jobs.rundir.{m}.json = _Json()\n" for m in modules) if modules else ""
            argv = [sys.executable, "-c", BOOT.format(patch=patch), *command, f"--run-root={root}"]
            name = f"{command[0]}: {variant}"
            calls[name] = lambda argv=argv, spent=cpu.setdefault(name, []): _output(argv, spent)
    seconds, answers = scale.timed_rounds(calls, repeats)
    same = {name: answers[name] == answers[f"{name.partition(': ')[0]}: today"] for name in answers}
    return {"seconds": seconds, "cpu_seconds": {name: round(statistics.median(s), 4) for name, s in cpu.items()},
            "same_output_as_today": same}


def _output(argv: list[str], cpu_spent: list[float]) -> str:
    """What the process printed; its CPU seconds appended to cpu_spent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_spent.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv[3:])} exited {r.returncode}: {(r.stderr or r.stdout)[-300:]}")
    return r.stdout


def bench_records(nodes: int, gpus: int, metric_rows: int, members: int, repeats: int) -> dict[str, Any]:
    """Build the synthetic run and sweep under a temp dir, then every comparison on them."""
    with tempfile.TemporaryDirectory(prefix="bench-records-") as tmp:
        root = Path(tmp).resolve()
        with scale.private_journal(root):
            built = scale.build_run(root, nodes, gpus, attempts=100, metric_rows=metric_rows, log_lines=10)
            sweep = scale.build_sweep(root, members)
            run_dir = Path(built["run_dir"])
            reads = in_process(run_dir, members, repeats)
            damaged = damaged_lines(root)
            commands = end_to_end(root, run_dir, sweep, repeats)
    import msgspec

    return {"bench": "records", "msgspec": msgspec.__version__, "nodes": nodes, "gpus_per_node": gpus,
            "metric_rows": metric_rows, "sweep_members": members, "metrics_bytes": built["metrics_bytes"],
            "measured": f"median of {repeats} rounds, the readers (and the commands) alternated in each round",
            "in_process": reads, "damaged_lines": damaged, "end_to_end": commands}


def add_parser(sub: Any) -> None:
    r = sub.add_parser("records", help="today's run-dir readers against msgspec's decoder (needs msgspec)")
    r.add_argument("--nodes", type=int, default=1024)
    r.add_argument("--gpus-per-node", type=int, default=8)
    r.add_argument("--metric-rows", type=int, default=1_000_000)
    r.add_argument("--members", type=int, default=1000, help="sweep members (compare)")
    r.add_argument("--repeats", type=int, default=5)


def run(args: Any) -> int:
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    print(json.dumps(bench_records(args.nodes, args.gpus_per_node, args.metric_rows, args.members, args.repeats),
                     indent=2))
    return 0
