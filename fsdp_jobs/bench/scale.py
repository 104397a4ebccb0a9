"""`python -m fsdp_jobs.bench scale`: what the commands a user waits on cost on a run of N nodes x G GPUs.

Builds a synthetic run dir of that size through the run-dir package (fsdp_jobs/rundir: the same writers and
record types the job uses), as a long, troubled run leaves it:

    every node's liveness record (G ranks each) and the leader's job view
    a rank file per rank, and `attempts` attempts in the goodput timeline (in the nodes' record a node_start and
    node_end per node and requeue (every 10th attempt); in rank 0's its phase marks, a steps window per 100
    steps, a save per 1,000)
    `metric_rows` rows of metrics (one per step)
    `log_lines` lines of log per node, node-prefixed as the launcher writes them
    `checkpoints` committed checkpoints, each with a manifest of N x G shard files (sparse: sizes only)
    a sweep of `members` members, each a small finished run, in a private journal

then times what a user waits for: `status`, `list`, `goodput`, `logs --node K --tail 100` and `compare`,
each `python -m fsdp_jobs ...` in a process of its own as a user runs it, beside `python -m fsdp_jobs status
--help` (the interpreter and the CLI's imports: what each of them pays before it reads the run); and, in this
process, the library calls below the CLI: the straggler report (fsdp_jobs/rundir/stragglers.py, which
`status` and `compare` make) and a resume's "find the newest checkpoint that passes its checks" (rank 0's
part: list, sizes, .metadata; its share of the CRCs). A benchmark drives the product as a user does: it
imports neither the CLI nor a backend. Nothing here imports torch. The run is the default backend's
(backends.DEFAULT), ended (its state record says completed), so `status` asks no scheduler.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from fsdp_jobs.planning import backends
from fsdp_jobs.rundir import checkpoints, journal, liveness, runs
from fsdp_jobs.rundir.events import NODE_EVENTS
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import GoodputEvent, LaunchRecord, MetricsRow, RankRecord

STEPS_PER_WINDOW = 100  # rank 0's goodput `steps` event: one per window (STEPS_EVENT_S = 10 s at ~10 steps/s)
STEPS_PER_SAVE = 1000
# every 10th attempt a requeue: every node's wrapper exits and starts again (a node_end and node_start each);
# the other attempts are torchrun's restarts on nodes that stay, which write no node event
REQUEUE_EVERY = 10
SHARD_BYTES = 1 << 20  # each rank's checkpoint file, as a sparse file: only sizes are checked by rank 0


def _plan(root: Path, name: str, nodes: int, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job and plan records of a default-backend job of that shape (what `python -m fsdp_jobs` writes)."""
    from omegaconf import OmegaConf

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan

    cfg, _ = compose([f"cluster={backends.DEFAULT}", f"nodes={nodes}", f"gpus_per_node={gpus}", "model=tiny", f"name={name}",
                      f"run_root={root}", "dry_run=true"])
    return OmegaConf.to_container(cfg, resolve=True), make_plan(cfg).to_dict()  # type: ignore[return-value]


def _jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    n = 0
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def write_timeline(run_dir: Path, events: Iterator[dict[str, Any]]) -> int:
    """The goodput timeline into its two records as the job writes them (node_start and node_end: the nodes'
    record; the rest rank 0's); the events written."""
    rd, events = RunDir(run_dir), list(events)
    return sum(_jsonl(path, (e for e in events if (e["event"] in NODE_EVENTS) == of_nodes))
               for path, of_nodes in ((rd.goodput_file, False), (rd.node_events_file, True)))


def _node(k: int) -> str:
    return f"node{k}"


def write_liveness(run_dir: Path, nodes: int, gpus: int, now: float) -> None:
    """Every node's record (its G ranks stepping, timed) and the leader's job view, as written in training;
    node 3 is the straggler (1.6x the compute per step)."""
    records = []
    for k in range(nodes):
        compute = 0.16 if k == 3 else 0.1
        beats = [liveness.RankBeat(rank=k * gpus + r, node=_node(k), pid=10_000 + r, step=5_000, phase="step",
                                   progress=now, alive=now, step_s=0.2, local_rank=r, restart=99,
                                   compute_s=compute, wait_s=0.05) for r in range(gpus)]
        record = liveness.NodeLiveness(_node(k), now, beats)
        records.append(record)
        if k:  # the leader's node writes no record: it is in the view from memory
            path = RunDir(run_dir).node_liveness_file(_node(k))
            path.parent.mkdir(parents=True, exist_ok=True)
            liveness.write_in_place(path, json.dumps(asdict(record)))
    view = liveness.JobView(now, _node(0), liveness.summarize(records, now))
    liveness.write_in_place(RunDir(run_dir).job_liveness_file, json.dumps(asdict(view)))


def write_ranks(run_dir: Path, nodes: int, gpus: int, now: float) -> None:
    RunDir(run_dir).ranks_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(nodes * gpus):
        record = RankRecord(rank=rank, pid=10_000 + rank % gpus, node=_node(rank // gpus), host=_node(rank // gpus),
                            restart=99, world_size=nodes * gpus, time=now)
        runs.write_atomic(RunDir(run_dir).rank_file(rank), json.dumps(record.to_json()))


def timeline(nodes: int, attempts: int, steps: int, start: float) -> Iterator[dict[str, Any]]:
    """The goodput timeline of `attempts` attempts over `steps` steps, one second a step."""
    per_attempt, t = max(1, steps // attempts), start

    def ev(event: str, **extra: Any) -> dict[str, Any]:
        return GoodputEvent(event=event, time=t, pid=1, extra=extra).to_json()

    for a in range(attempts):
        for k in range(nodes) if a % REQUEUE_EVERY == 0 else ():
            yield ev("node_start", node=_node(k))
        for mark in ("start", "process_group", "built", "loaded", "loop"):
            yield ev(mark, step=a * per_attempt)
            t += 1.0
        for first in range(a * per_attempt + 1, (a + 1) * per_attempt + 1, STEPS_PER_WINDOW):
            last = min(first + STEPS_PER_WINDOW - 1, (a + 1) * per_attempt)
            yield ev("steps", first=first, last=last, seconds=float(last - first + 1))
            t += last - first + 1
            if last % STEPS_PER_SAVE == 0:
                yield ev("save", step=last, seconds=2.0)
                t += 2.0
        yield ev("end", step=(a + 1) * per_attempt, why="failed: ChildFailedError" if a < attempts - 1 else "done")
        for k in range(nodes) if (a + 1) % REQUEUE_EVERY == 0 or a == attempts - 1 else ():
            yield ev("node_end", node=_node(k), rc=1 if a < attempts - 1 else 0)


def metrics(rows: int, attempts: int, world: int, start: float) -> Iterator[dict[str, Any]]:
    per_attempt = max(1, rows // attempts)
    for step in range(1, rows + 1):
        yield MetricsRow(step=step, loss=2.0 + 1.0 / step, lr=3e-4, grad_norm=1.0, tokens_per_s=4.1e6, mfu=0.41,
                         step_time_s=1.0, world_size=world, restart=(step - 1) // per_attempt,
                         attempt=f"a{(step - 1) // per_attempt}", time=start + step).to_json()


def write_logs(run_dir: Path, nodes: int, gpus: int, lines: int) -> int:
    """`lines` lines per node into the launcher's log, node-prefixed and interleaved as its pump writes them
    (torchrun's `[defaultR]:` rank prefix inside); returns the bytes written."""
    path = RunDir(run_dir).launcher_log
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(lines):
            f.write("".join(f"[{_node(k)}] [default{i % gpus}]:step {i}: loss 2.3456 tokens/s 4.1e+06 "
                            f"grad_norm 1.0000 ({i * 1.0:.1f} s)\n" for k in range(nodes)))
        return f.tell()


def write_checkpoints(run_dir: Path, nodes: int, gpus: int, count: int, steps: int) -> None:
    """`count` committed checkpoints, each a .metadata and one sparse shard file per rank, with the
    manifest (sizes and CRC-32s) the ranks write."""
    root = checkpoints.root_of(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    world = nodes * gpus
    for i in range(count):
        step = steps - (count - 1 - i) * STEPS_PER_SAVE
        tmp = checkpoints.tmp_dir(root, step, "bench")
        tmp.mkdir(parents=True)
        (tmp / checkpoints.DCP_METADATA_FILE).write_bytes(os.urandom(64 * 1024))
        for rank in range(world):
            with open(tmp / f"__{rank}_0.distcp", "wb") as f:
                f.truncate(SHARD_BYTES)
        zero = checkpoints.file_sum(tmp / "__0_0.distcp")  # every shard alike: sum it once
        files = {f"__{rank}_0.distcp": zero for rank in range(world)}
        files[checkpoints.DCP_METADATA_FILE] = checkpoints.file_sum(tmp / checkpoints.DCP_METADATA_FILE)
        manifest = {"step": step, "samples_seen": step * 8, "world_size": world, "files": files}
        checkpoints.commit(tmp, manifest, checkpoints.step_dir(root, step))


def build_run(root: Path, nodes: int, gpus: int, attempts: int, metric_rows: int, log_lines: int,
              checkpoint_count: int = 3) -> dict[str, Any]:
    """The synthetic run dir (fsdp_jobs/rundir's writers), and what it holds."""
    name = "scale-run"
    job, plan = _plan(root, name, nodes, gpus)
    run_dir = root / name
    runs.prepare(run_dir, job, plan)
    start = time.time() - metric_rows - 10 * attempts
    runs.record_launch(run_dir, LaunchRecord(backend=backends.DEFAULT, job_id="1", nodes=nodes, gpus_per_node=gpus,
                                             unix=start, extra={"pid": 1}))
    now = time.time()
    write_liveness(run_dir, nodes, gpus, now)
    write_ranks(run_dir, nodes, gpus, now)
    events = write_timeline(run_dir, timeline(nodes, attempts, metric_rows, start))
    _jsonl(RunDir(run_dir).metrics_file, metrics(metric_rows, attempts, nodes * gpus, start))
    log_bytes = write_logs(run_dir, nodes, gpus, log_lines)
    write_checkpoints(run_dir, nodes, gpus, checkpoint_count, metric_rows)
    write_outcome(run_dir, nodes, metric_rows, start)
    return {"run_dir": str(run_dir), "goodput_events": events, "metric_rows": metric_rows, "log_bytes": log_bytes,
            "metrics_bytes": RunDir(run_dir).metrics_file.stat().st_size,
            "goodput_bytes": RunDir(run_dir).goodput_file.stat().st_size,
            "node_events_bytes": RunDir(run_dir).node_events_file.stat().st_size}


def write_outcome(run_dir: Path, nodes: int, steps: int, start: float) -> None:
    """The records the run's outcome is read from (fsdp_jobs/rundir/outcome.py), as a troubled run leaves them: a
    node's verdict from an earlier attempt's requeue, the leader's state (completed) and the supervisor's record
    of every node's exit code."""
    runs.write_node_verdict(run_dir, status="requeued-after-crash", node=_node(0), reason="torchrun exited with 1",
                            step=steps // 2, time=start + 1)
    runs.write_state(run_dir, status="completed", step=steps)
    runs.write_launcher_end(run_dir, {_node(k): 0 for k in range(nodes)}, None)


def build_sweep(root: Path, members: int, steps: int = 200) -> str:
    """A finished sweep of `members` two-node members (lr swept), each with its metrics and goodput, in the
    journal (FSDP_JOBS_STATE_DIR must point at a private one)."""
    sweep = "scale-sweep"
    job, plan = _plan(root / sweep, "m0", 2, 8)
    start = time.time() - steps - 60
    for i in range(members):
        run_dir = root / sweep / f"m{i}"
        runs.prepare(run_dir, {**job, "name": f"m{i}"}, plan)
        runs.record_launch(run_dir, LaunchRecord(backend=backends.DEFAULT, job_id=str(i), nodes=2, gpus_per_node=8,
                                                 unix=start, extra={"pid": 1}))
        write_timeline(run_dir, timeline(2, 1, steps, start))
        _jsonl(RunDir(run_dir).metrics_file, metrics(steps, 1, 16, start))
        write_outcome(run_dir, 2, steps, start)
        journal.record(sweep=sweep, member=f"m{i}", overrides=[f"train.lr={i}e-5"], params={"train.lr": f"{i}e-5"},
                       backend=backends.DEFAULT, job_id=str(i), run_dir=str(run_dir.resolve()), config_hash="bench")
    return sweep


def newest_verified(run_dir: Path, world: int) -> Optional[Path]:
    """A resume's choice, rank 0's part (fsdp_jobs/runtime/checkpoint.py find_latest): the newest committed
    checkpoint whose sizes and .metadata pass, then rank 0's share of the CRC-32s (every rank sums 1/world)."""
    for _, path in reversed(checkpoints.committed_checkpoints(run_dir)):
        if checkpoints.check_sizes(path) is None:
            if checkpoints.check_sums(path, checkpoints.listed_files(path)[0::world]) is None:
                return path
    return None


START = "start (status --help)"  # the interpreter and the CLI's imports, which every command below pays first
COMMANDS = ("status", "list", "goodput", "logs --node K --tail 100", "compare (sweep)")  # timed as processes


def _command(*argv: str) -> Callable[[], str]:
    """`python -m fsdp_jobs ARGV`, a process of its own as a user runs it: what it printed. An exit status other
    than 0 is an error."""
    def call() -> str:
        r = subprocess.run([sys.executable, "-m", "fsdp_jobs", *argv], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        if r.returncode:
            raise RuntimeError(f"fsdp-jobs {' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout)[-300:]}")
        return r.stdout
    return call


def timed_rounds(calls: dict[str, Callable[[], Any]], repeats: int,
                 keep: Callable[[Any], Any] = lambda answer: answer) -> tuple[dict[str, float], dict[str, Any]]:
    """Every call's median wall time in seconds over `repeats` rounds, the calls alternated within a round (a
    slow spell of a shared machine falls on all of them), and what each returned in the last round (`keep` of
    it, made after the clock stops: a digest of a million rows instead of the rows)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    answers: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            answer = fn()
            times[name].append(time.perf_counter() - t0)
            answers[name] = keep(answer)
    return {name: round(statistics.median(t), 4) for name, t in times.items()}, answers


def commands(root: Path, run_dir: Path, sweep: str, nodes: int, world: int) -> dict[str, Callable[[], Any]]:
    """What each user command runs, by its name in the result."""
    from fsdp_jobs.rundir import stragglers

    run, root_arg = str(run_dir), f"--run-root={root}"
    return {
        START: _command("status", "--help"),
        "status": _command("status", run, root_arg),
        "list": _command("list", root_arg),
        "goodput": _command("goodput", run, "--json", root_arg),
        "stragglers": lambda: stragglers.of_run(run_dir, thorough=True),
        "logs --node K --tail 100": _command("logs", run, "--node", str(nodes // 2), "--tail", "100", root_arg),
        "compare (sweep)": _command("compare", sweep, root_arg),
        "newest verified checkpoint": lambda: newest_verified(run_dir, world),
    }


def right_answers(answers: dict[str, Any], nodes: int, attempts: int, metric_rows: int, members: int,
                  log_lines: int) -> dict[str, bool]:
    """Whether each command said what the synthetic run holds: a fast wrong answer is no answer."""
    status = json.loads(answers["status"])
    logs = answers["logs --node K --tail 100"].splitlines()
    slow = answers["stragglers"] or {}
    newest = answers["newest verified checkpoint"]
    return {
        START: "usage:" in answers[START],
        "status": status["state"] == "SUCCEEDED" and status["last_step"]["step"] == metric_rows,
        "list": "scale-run" in answers["list"] and f"{members} SUCCEEDED" in answers["list"],
        "goodput": len(json.loads(answers["goodput"])["attempts"]) == attempts,
        "stragglers": slow.get("stragglers") == ([_node(3)] if nodes > 3 else []),
        "logs --node K --tail 100": len(logs) == min(100, log_lines)
        and all(line.startswith(f"[{_node(nodes // 2)}] ") for line in logs),
        "compare (sweep)": len(answers["compare (sweep)"].splitlines()) >= members + 1,
        "newest verified checkpoint": checkpoints.step_of(newest) == metric_rows,
    }


@contextmanager
def private_journal(root: Path) -> Iterator[None]:
    """The sweep's journal in the bench's own state dir, never the user's."""
    before = os.environ.get("FSDP_JOBS_STATE_DIR")
    os.environ["FSDP_JOBS_STATE_DIR"] = str(root / "state")
    try:
        yield
    finally:
        if before is None:
            del os.environ["FSDP_JOBS_STATE_DIR"]
        else:
            os.environ["FSDP_JOBS_STATE_DIR"] = before


def bench_one(nodes: int, gpus: int, attempts: int, metric_rows: int, members: int, log_lines: int,
              repeats: int, base: Optional[Path] = None) -> dict[str, Any]:
    """Build a run of nodes x gpus (and a sweep of `members`) under a temp dir, time every command on it."""
    random.seed(0)
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-scale-") as tmp:
        root = Path(tmp).resolve()
        with private_journal(root):
            t0 = time.perf_counter()
            built = build_run(root, nodes, gpus, attempts, metric_rows, log_lines)
            sweep = build_sweep(root, members)
            build_s = time.perf_counter() - t0
            calls = commands(root, Path(built["run_dir"]), sweep, nodes, nodes * gpus)
            seconds, answers = timed_rounds(calls, repeats)
            right = right_answers(answers, nodes, attempts, metric_rows, members, log_lines)
    return {"nodes": nodes, "gpus_per_node": gpus, "ranks": nodes * gpus, "attempts": attempts,
            "metric_rows": metric_rows, "sweep_members": members, "log_lines_per_node": log_lines,
            "build_s": round(build_s, 1), "seconds": seconds, "right_answers": right,
            "beyond_start_s": {name: round(seconds[name] - seconds[START], 4) for name in COMMANDS},
            "slowest": max(seconds, key=seconds.__getitem__),
            "bytes": {k: built[k] for k in ("metrics_bytes", "goodput_bytes", "node_events_bytes", "log_bytes")}}


def bench_scale(node_counts: list[int], gpus: int, attempts: int, metric_rows: int, members: int,
                log_lines: int, repeats: int) -> dict[str, Any]:
    """The curve over node counts: every command's median seconds at each."""
    points = [bench_one(n, gpus, attempts, metric_rows, members, log_lines, repeats) for n in node_counts]
    return {"bench": "scale", "goal_s": 1.0,
            "measured": f"median of {repeats} rounds, every command once a round; {', '.join(COMMANDS)} and "
                        f"{START}: `python -m fsdp_jobs ...` each a process of its own (beyond_start_s: less the "
                        "start); stragglers and the checkpoint choice: the library call in this process",
            "points": points}


def add_parser(sub: Any) -> None:
    s = sub.add_parser("scale", help="time status, list, goodput, stragglers, logs, compare and a resume's "
                                     "checkpoint choice on a synthetic run of N nodes x G GPUs")
    s.add_argument("--nodes", default="1024", help="node counts, comma-separated (e.g. 16,64,256,1024,4096)")
    s.add_argument("--gpus-per-node", type=int, default=8)
    s.add_argument("--attempts", type=int, default=100)
    s.add_argument("--metric-rows", type=int, default=1_000_000)
    s.add_argument("--members", type=int, default=1000, help="sweep members (for compare and list)")
    s.add_argument("--log-lines", type=int, default=200, help="log lines per node")
    s.add_argument("--repeats", type=int, default=3)


def run(args: Any) -> int:
    counts = [int(n) for n in str(args.nodes).split(",") if n.strip()]
    print(json.dumps(bench_scale(counts, args.gpus_per_node, args.attempts, args.metric_rows, args.members,
                                 args.log_lines, args.repeats), indent=2))
    return 0
