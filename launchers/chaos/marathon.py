"""`fsdp-jobs chaos RUN marathon --faults N [--seed S]`: a seeded random schedule of mixed faults injected
into one running job, one at a time, each measured from what the job itself recorded in its run dir.

The schedule (`schedule`) spreads N faults over the job's steps, after its first checkpoint and before its
last one, and deals the kinds the backend can inject in shuffled rounds, so that every kind comes up (its
TRAITS.marathon): kill-rank (SIGKILL: a crash), hang-rank (SIGSTOP: alive, no progress; the
watchdog's hang timeout finds it), slow-node (a CPU quota on one node's ranks until the straggler view names
it), corrupt-checkpoint (the newest committed checkpoint damaged, a shard's bytes flipped or cut short, then
a rank killed so that the restart meets it: it must be set aside and the one before used) and, where the
backend has nodes of its own, kill-node and cut-node (every packet of a node dropped until the job has
recorded the hang it causes, then healed: with cluster.min_nodes = nodes the others cannot go on without
it, so the job resumes on every node, and its last checkpoint can still be compared bit for bit; going on
without the node, elastic, is tests/docker and tests/slurm's cut-node tests). NaN injection is left out: rollback skips a batch window by design,
so its run cannot end bit for bit where an uninterrupted one does (tests/integration/test_local_runs.py
proves rollback on its own).

Per incident (a ChaosIncident line in the run dir's chaos.jsonl; the table at the end):
- injected at: wall clock, and the newest step the job had recorded;
- detected after: the first record the job wrote about it: a rank's failure record, a watchdog's hang
  record, a checkpoint set aside, the new attempt's start on the timeline, or the straggler view naming the
  node;
- recovered after: the first step past the one it was at, recorded by the attempt after the fault (a slow
  node: the first step back at its earlier pace once the quota is lifted);
- steps lost: the steps the job did again (where it was, minus the checkpoint it resumed from).
The job's metrics are read by offset, never whole again; the small records (failures, hangs, timeline)
are read whole each poll, which only a test tool may afford.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from fsdp_jobs.rundir import stragglers
from fsdp_jobs.planning.chaos_kinds import DEFAULT_BIT, ChaosKind
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir import checkpoints, events, failures, hangs, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import ChaosIncident, MetricsRow
from fsdp_jobs.rundir.status import JobState, JobStatus, Run


class Faults(Protocol):
    """What the marathon asks of a backend's faults (launchers/capabilities.py Faults has it; named here, not
    imported: Faults.marathon calls this module)."""

    dealt: tuple[ChaosKind, ...]

    def describe(self, run: Run) -> JobStatus: ...

    def inject(self, run: Run, kind: ChaosKind, node: int, rate: str = "100mbit", bit: int = DEFAULT_BIT) -> str: ...

    def resume(self, run: Run) -> str: ...


# a node's own: never node0, whose loss is every node's (it holds the store)
NODE_KINDS = (ChaosKind.KILL_NODE, ChaosKind.CUT_NODE)
POLL_S = 0.1
DESCRIBE_S = 2.0  # how often the backend is asked whether the job still runs
SLOW_DETECT_S = 90.0  # a slow node the straggler view has not named by then: not detected, quota lifted
RECOVER_S = 240.0  # a restart that has not stepped past the fault's step by then: not recovered
SLOW_SHARE = 0.05  # slow-node: what a throttled rank keeps of a core
AUTO_MARGIN = 20  # steps kept free of faults at each end of a checkpoint.interval=auto job (plan_for)
SAVE_WAIT_S = 30.0  # corrupt-checkpoint waits this long for a save under way to commit before it damages the newest
CUT_MAX_S = 120.0  # cut-node: healed by then, detected or not (slurmd's timeout, 300 s here, would end the allocation)
PACE_RATIO = 1.5  # a slow node has recovered when a step is back within this of the earlier median


@dataclass
class Fault:
    at_step: int
    kind: ChaosKind
    target: int  # a rank (kill-rank, hang-rank, corrupt-checkpoint's kill) or a node index


def schedule(seed: int, faults: int, kinds: tuple[ChaosKind, ...], world: int, nodes: int, steps: int,
             interval: int) -> list[Fault]:
    """`faults` faults at steps spread evenly from the first checkpoint on, the last one a gap before the last
    checkpoint: the job has as many steps after its last fault as between two, to show it recovered (a slow
    node dealt 21 steps before the end was still being named when the job completed). The kinds are dealt in
    shuffled rounds (each kind once per round). Raises UserError when the steps cannot hold them."""
    first, last = interval + 1, steps - interval - 1
    if interval <= 0 or last - first < 2 * faults:
        raise UserError("--faults", faults, f"{faults} faults need train.steps >= {2 * faults + 2 * interval + 2} "
                                            f"with a margin of {interval} steps (the checkpoint interval or --margin; "
                                            f"2 steps apart, none in the first or last margin); this job has {steps}")
    rng = random.Random(seed)
    dealt: list[ChaosKind] = []
    while len(dealt) < faults:
        round_ = list(kinds)
        rng.shuffle(round_)
        dealt += round_
    gap = (last - first) / faults
    out = []
    for i, kind in enumerate(dealt[:faults]):
        at = first + round(i * gap)
        # node0 holds the rendezvous store: its loss restarts every node, a fault of its own (not dealt)
        target = (rng.randrange(nodes) if kind is ChaosKind.SLOW_NODE else rng.randrange(1, nodes) if kind in NODE_KINDS
                  else rng.randrange(world))
        out.append(Fault(at, kind, target))
    return out


class Progress:
    """The job's metrics rows, read from where the last read ended."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.offset, self.rows = RunDir(run_dir).metrics_file, 0, []  # type: list[MetricsRow]

    def poll(self) -> list[MetricsRow]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        new = []
        for line in data[:end].splitlines():
            try:
                row = MetricsRow.from_dict(json.loads(line))
            except ValueError:
                row = None
            if row is not None and row.time is not None:
                new.append(row)
        self.rows += new
        return new

    def last(self) -> Optional[MetricsRow]:
        self.poll()
        return self.rows[-1] if self.rows else None


def _attempt(row: MetricsRow) -> tuple[str, int]:
    return (row.attempt or "", row.restart or 0)


def evidence(run_dir: Path, since: float, known_aside: set[str]) -> list[tuple[float, str]]:
    """(when, what) of every record the job wrote since a fault was injected at `since`."""
    found: list[tuple[float, str]] = []
    found += [(f.time, f"rank {f.rank}'s failure record ({f.error.split(':')[0]})") for f in failures.read(run_dir)
              if f.time >= since]
    found += [(h.time, f"{h.node}'s watchdog: hang, {hangs.culprit(h.first_stopped)}")
              for h in hangs.read(run_dir) if h.time >= since]
    found += [(e.time, "the workers restarted") for e in events.read_events(RunDir(run_dir).goodput_file)
              if e.event == "start" and e.time >= since]
    for ckpt in checkpoints.set_aside_checkpoints(run_dir):
        if ckpt.name not in known_aside:
            why = (ckpt / checkpoints.UNUSABLE_REASON_FILE)
            found.append((why.stat().st_mtime if why.exists() else time.time(), f"{ckpt.name}: set aside"))
    return found


class Marathon:
    """One job, one schedule, one incident at a time."""

    def __init__(self, injector: Faults, run: Run, faults: list[Fault], say: Callable[[str], None]) -> None:
        self.injector, self.run, self.run_dir, self.faults, self.say = injector, run, run.run_dir, faults, say
        self.progress = Progress(run.run_dir)
        self.incidents: list[ChaosIncident] = []
        self.next_describe, self.ended = 0.0, False

    def running(self) -> bool:
        """False once the job has ended (asked of the backend every DESCRIBE_S)."""
        if not self.ended and time.time() >= self.next_describe:
            self.next_describe = time.time() + DESCRIBE_S
            self.ended = self.injector.describe(Run.load(self.run_dir)).state.terminal
        return not self.ended

    def wait(self, until: Callable[[], bool], timeout: float) -> bool:
        deadline = time.time() + timeout
        while self.running() and time.time() < deadline:
            if until():
                return True
            time.sleep(POLL_S)
        return until()

    def run_all(self) -> list[ChaosIncident]:
        for n, fault in enumerate(self.faults, 1):
            self.next_describe = 0.0  # asked afresh before each fault: never inject into a job that has ended
            if not self.wait(lambda: self._reached(fault.at_step), RECOVER_S * 4) or not self.running():
                self.say(f"marathon: the job ended (or stalled) before fault {n} (step {fault.at_step}); "
                         f"{len(self.faults) - n + 1} not injected")
                break
            incident = self.inject_and_measure(n, fault)
            self.incidents.append(incident)
            with runs.open_append(RunDir(self.run_dir).chaos_incidents_file) as f:
                f.write(json.dumps(incident.to_json()) + "\n")
            self.say(incident_line(incident))
        return self.incidents

    def _reached(self, step: int) -> bool:
        row = self.progress.last()
        return row is not None and row.step >= step

    def inject_and_measure(self, n: int, fault: Fault) -> ChaosIncident:
        before = self.progress.last()
        if before is None:  # _reached saw a row; a metrics record replaced meanwhile has none
            return ChaosIncident(n=n, kind=fault.kind, target="", injected_at=time.time(),
                                 evidence="not injected: the job's metrics record has no row")
        known_aside = {p.name for p in checkpoints.set_aside_checkpoints(self.run_dir)}
        seen = len(self.progress.rows)
        incident = ChaosIncident(n=n, kind=fault.kind, target="", injected_at=time.time(), step=before.step)
        try:
            incident.target = self.inject(fault)
        except (UserError, LookupError, OSError) as e:
            incident.evidence = f"not injected: {e}"
            return incident
        if fault.kind is ChaosKind.SLOW_NODE:
            return self.measure_slow(incident)
        return self.measure_restart(incident, before, seen, known_aside)

    def inject(self, fault: Fault) -> str:
        """Inject one fault; what it hit, in words."""
        if fault.kind is ChaosKind.CORRUPT_CHECKPOINT:
            return corrupt_newest_and_kill(self.run_dir, fault.target, random.Random(fault.at_step))
        if fault.kind is ChaosKind.SLOW_NODE:  # a fifth of a core hides among 4 ranks sharing 2 cores; a twentieth shows
            from fsdp_jobs.launchers.chaos import inject

            node = inject.node_name(self.run_dir, fault.target)
            inject.slow_node(self.run_dir, node, SLOW_SHARE)
            return node
        self.injector.inject(self.run, fault.kind, fault.target)
        if fault.kind is ChaosKind.CUT_NODE:
            from fsdp_jobs.launchers.chaos import inject

            return inject.node_name(self.run_dir, fault.target)
        return f"node{fault.target}" if fault.kind is ChaosKind.KILL_NODE else f"rank {fault.target}"

    def measure_restart(self, incident: ChaosIncident, before: MetricsRow, seen: int,
                        known_aside: set[str]) -> ChaosIncident:
        """A fault the job restarts from: detected at its first record of it, recovered at the new attempt's
        first step past the newest one the old attempt recorded."""
        t0, old = incident.injected_at, _attempt(before)
        only_aside = incident.kind == ChaosKind.CORRUPT_CHECKPOINT  # the kill is not what this one is about
        cut = [incident.kind == ChaosKind.CUT_NODE]  # healed once the job has recorded it, or after CUT_MAX_S

        def first() -> Optional[tuple[float, str]]:
            found = [e for e in evidence(self.run_dir, t0, known_aside) if not only_aside or "set aside" in e[1]]
            return min(found) if found else None

        def lost_at() -> int:  # the newest step the old attempt recorded
            return max([before.step] + [r.step for r in self.progress.rows[seen:] if _attempt(r) == old])

        def recovered() -> Optional[MetricsRow]:
            return next((r for r in self.progress.rows[seen:] if _attempt(r) != old and r.step > lost_at()), None)

        found: list[Optional[tuple[float, str]]] = [None]

        def from_memory() -> bool:  # a damaged checkpoint the restart had no need to read: nothing to detect
            return only_aside and (restart_source(self.run_dir, t0) or "").startswith("memory")

        def done() -> bool:
            self.progress.poll()
            found[0] = found[0] or first()
            if cut[0] and (found[0] is not None or time.time() - t0 > CUT_MAX_S):
                self.injector.resume(self.run)
                cut[0] = False
            return (found[0] is not None or from_memory()) and recovered() is not None

        try:
            self.wait(done, RECOVER_S)
        finally:
            if cut[0]:  # never detected: heal it anyway, the marathon goes on
                self.injector.resume(self.run)
        row, ev = recovered(), found[0] or first()
        incident.source = restart_source(self.run_dir, t0)
        if ev is not None:
            incident.detected_s, incident.evidence = round(ev[0] - t0, 2), ev[1]
        elif only_aside and row is not None and unread(incident):
            incident.evidence = "not needed: the restart took the state from memory (read later, it is set aside)"
        elif only_aside and row is not None:
            incident.evidence = "not detected: the restart did not load the damaged checkpoint"
        else:
            incident.evidence = f"no record of it in {RECOVER_S:g} s"
        if row is not None and row.time is not None:
            resumed_at = next(r.step for r in self.progress.rows[seen:] if _attempt(r) == _attempt(row)) - 1
            incident.recovered_s = round(row.time - t0, 2)
            incident.steps_lost = lost_at() - resumed_at
        return incident

    def measure_slow(self, incident: ChaosIncident) -> ChaosIncident:
        """A slow node: detected when the straggler view names it; the quota is then lifted, and it has
        recovered at the first step back within PACE_RATIO of the pace before."""
        t0, node = incident.injected_at, incident.target
        paces = [r.step_time_s for r in self.progress.rows[-20:] if r.step_time_s]
        pace = statistics.median(paces) if paces else None
        ratio = float(self.backend_ratio())
        named = self.wait(lambda: node in ((stragglers.of_run(self.run_dir, ratio) or {}).get("stragglers") or []),
                          SLOW_DETECT_S)
        if named:
            incident.detected_s, incident.evidence = round(time.time() - t0, 2), f"straggler view names {node}"
        else:
            incident.evidence = f"not detected: the straggler view did not name {node} in {SLOW_DETECT_S:g} s"
        self.injector.resume(self.run)
        lifted, seen = time.time(), len(self.progress.rows)

        def back() -> bool:
            self.progress.poll()
            return any(r.step_time_s is not None and pace is not None and r.step_time_s <= PACE_RATIO * pace
                       and (r.time or 0) > lifted for r in self.progress.rows[seen:])

        if self.wait(back, RECOVER_S) and named:
            row = next(r for r in self.progress.rows[seen:] if r.step_time_s is not None and pace is not None
                       and r.step_time_s <= PACE_RATIO * pace and (r.time or 0) > lifted)
            incident.recovered_s, incident.steps_lost = round((row.time or lifted) - t0, 2), 0
        return incident

    def backend_ratio(self) -> float:
        from fsdp_jobs.planning.config import job_config

        return job_config(runs.load_job(self.run_dir)).fault.straggler_ratio


def corrupt_newest_and_kill(run_dir: Path, rank: int, rng: random.Random) -> str:
    """Damage the newest committed checkpoint and SIGKILL `rank`, with every rank stopped meanwhile and no save
    under way (no save may commit a newer one between the two: the restart must meet the damaged one; dealt on
    a checkpoint step, the save of that step could otherwise commit after the kill)."""
    from fsdp_jobs.launchers.chaos import inject

    procs = inject.rank_processes(run_dir)
    if rank not in procs:
        raise LookupError(f"no running rank {rank} of this run on this machine")
    deadline = time.monotonic() + SAVE_WAIT_S
    while True:
        for pid, _ in procs.values():
            os.kill(pid, signal.SIGSTOP)
        try:
            # a save's leftover of a dead attempt also counts until a newer commit: past the deadline, go on
            if not checkpoints.saves_under_way(run_dir) or time.monotonic() > deadline:
                newest = checkpoints.newest_checkpoint(run_dir)
                if newest is None:
                    raise LookupError("no committed checkpoint to damage yet")
                how = damage_shard(newest, rng)
                os.kill(procs[rank][0], signal.SIGKILL)
                return f"{newest.name}: {how}; rank {rank} killed"
        finally:
            for pid, _ in procs.values():
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        time.sleep(0.05)


def damage_shard(ckpt: Path, rng: random.Random) -> str:
    """Flip 64 bytes in the middle of one shard (bit rot: same size, only its checksum tells) or cut it to
    half (a torn copy: its size tells)."""
    shards = sorted(ckpt.glob("*.distcp"))
    if not shards:
        raise LookupError(f"{ckpt.name} has no shard to damage")
    shard = rng.choice(shards)
    size = shard.stat().st_size
    if rng.random() < 0.5:
        with open(shard, "r+b") as f:
            f.seek(size // 2)
            data = f.read(64)
            f.seek(size // 2)
            f.write(bytes(b ^ 0xFF for b in data))
        return f"64 bytes of {shard.name} flipped"
    os.truncate(shard, size // 2)
    return f"{shard.name} cut to {size // 2} of {size} bytes"


def restart_source(run_dir: Path, since: float) -> Optional[str]:
    """Where the first restart after `since` took its state from (the ranks' "loaded" timeline event)."""
    loaded = [e for e in events.read_events(RunDir(run_dir).goodput_file) if e.event == "loaded" and e.time >= since]
    return min(loaded, key=lambda e: e.time).extra.get("source") if loaded else None


def unread(i: ChaosIncident) -> bool:
    """A damaged checkpoint the restart had no need to read: the state came from memory."""
    return i.kind == ChaosKind.CORRUPT_CHECKPOINT and (i.source or "").startswith("memory")


def incident_line(i: ChaosIncident) -> str:
    def s(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.1f}s"

    return (f"marathon: #{i.n} {i.kind} {i.target} at step {i.step}: detected after {s(i.detected_s)}, recovered "
            f"after {s(i.recovered_s)}, {'-' if i.steps_lost is None else i.steps_lost} steps lost, state from "
            f"{i.source or '-'} ({i.evidence})")


def table(incidents: list[ChaosIncident]) -> list[str]:
    """The incidents as a Markdown table (the README shows one)."""
    lines = ["| # | fault | target | step | detected after | recovered after | steps lost | state from | first record |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i in incidents:
        lines.append(f"| {i.n} | {i.kind} | {i.target} | {i.step} | "
                     f"{'-' if i.detected_s is None else f'{i.detected_s:.1f} s'} | "
                     f"{'-' if i.recovered_s is None else f'{i.recovered_s:.1f} s'} | "
                     f"{'-' if i.steps_lost is None else i.steps_lost} | {i.source or '-'} | {i.evidence} |")
    return lines


def restarts_needed(faults: list[Fault]) -> tuple[int, int]:
    """(restarts, of them after hangs) the schedule costs the job."""
    restarting = [f for f in faults if f.kind is not ChaosKind.SLOW_NODE]
    return len(restarting), sum(f.kind in (ChaosKind.HANG_RANK, ChaosKind.CUT_NODE) for f in restarting)


def kinds_for(kinds: tuple[ChaosKind, ...], nodes: int, min_nodes: int) -> tuple[ChaosKind, ...]:
    """The backend's kinds this job can take: a node's own need more than one node, and cut-node a job that
    cannot go on without the node (min_nodes = nodes): one that could would train on fewer nodes, a different
    run from the uninterrupted one it is compared with (going on without it: tests/docker, tests/slurm)."""
    return tuple(k for k in kinds if (nodes > 1 or k not in (ChaosKind.SLOW_NODE, *NODE_KINDS))
                 and (k is not ChaosKind.CUT_NODE or min_nodes >= nodes))


def plan_for(dealt: tuple[ChaosKind, ...], run: Run, count: int, seed: int, only: tuple[str, ...] = (),
             margin: Optional[int] = None) -> list[Fault]:
    """The schedule for this job, refused in one line when the job cannot survive it as configured. `dealt`: the
    kinds the backend deals (its TRAITS.marathon); `only`: these of them alone (--kinds); `margin`: steps kept free
    of faults at each end (--margin; by default the checkpoint interval, AUTO_MARGIN for checkpoint.interval=auto:
    the same schedule whatever the interval)."""
    from fsdp_jobs.planning.config import job_config

    cfg, plan = job_config(runs.load_job(run.run_dir)), runs.load_plan(run.run_dir)
    unknown = [k for k in only if k not in dealt]
    if unknown:
        raise UserError("--kinds", ",".join(only), f"this backend deals {', '.join(dealt)}")
    kinds = kinds_for(tuple(ChaosKind(k) for k in only) or dealt, plan.nodes, cfg.cluster.min_nodes or plan.nodes)
    if not kinds:
        raise UserError("--kinds", ",".join(only), f"none of them can be dealt to a job of {plan.nodes} nodes")
    every = cfg.checkpoint.interval
    margin = margin if margin is not None else AUTO_MARGIN if every == "auto" else int(every)
    faults = schedule(seed, count, kinds, plan.world_size, plan.nodes, cfg.train.steps, margin)
    restarts, after_hangs = restarts_needed(faults)
    if restarts > cfg.cluster.max_restarts:
        raise UserError("--faults", count, f"this schedule restarts the job {restarts} times and its "
                                           f"cluster.max_restarts is {cfg.cluster.max_restarts}: submit it with "
                                           f"cluster.max_restarts={restarts + 2} or fewer faults")
    if after_hangs > cfg.fault.max_hang_restarts:
        raise UserError("--faults", count, f"this schedule hangs the job {after_hangs} times and its "
                                           f"fault.max_hang_restarts is {cfg.fault.max_hang_restarts}: submit it "
                                           f"with fault.max_hang_restarts={after_hangs} or fewer faults")
    kills = max(Counter(f.target for f in faults if f.kind is ChaosKind.KILL_NODE).values(), default=0)
    allowed = getattr(cfg.cluster, "container_restarts", None)  # a backend that restarts a killed node's container
    if allowed is not None and kills > allowed:
        raise UserError("--faults", count, f"this schedule kills one node {kills} times and its "
                                           f"cluster.container_restarts is {allowed}: submit it with "
                                           f"cluster.container_restarts={kills} or fewer faults")
    return faults


def _say(line: str) -> None:
    print(line, flush=True)


def run_marathon(injector: Faults, run: Run, count: int, seed: int, say: Callable[[str], None] = _say,
                 only: tuple[str, ...] = (), margin: Optional[int] = None) -> int:
    """Inject the schedule into the running job, wait for it to end, print the table and the goodput.
    0 when every fault was injected, detected and recovered from and the job succeeded; 1 otherwise."""
    from fsdp_jobs.rundir import goodput

    if injector.describe(run).state.terminal:
        raise UserError("RUN", run.run_dir.name, "is not running: a marathon needs a running job (start it, then "
                                                 "run this from another terminal)")
    faults = plan_for(injector.dealt, run, count, seed, only, margin)
    say(f"marathon: {len(faults)} faults (seed {seed}) at steps "
        f"{', '.join(f'{f.at_step} {f.kind}' for f in faults)}")
    marathon = Marathon(injector, run, faults, say)
    incidents = marathon.run_all()
    marathon.wait(lambda: False, 24 * 3600)  # until the job ends
    state = injector.describe(Run.load(run.run_dir)).state
    for line in table(incidents):
        say(line)
    report = goodput.of_run(run.run_dir)
    total = (report or {}).get("total", {})
    say(f"marathon: the job {state.value}; goodput {total.get('effective_pct')}% of "
        f"{total.get('wall_s')} s wall, {total.get('lost_steps')} steps lost over "
        f"{len((report or {}).get('attempts', []))} attempts")
    bad = [i for i in incidents if (i.detected_s is None and not unread(i)) or i.recovered_s is None]
    if len(incidents) < len(faults) or bad or state != JobState.SUCCEEDED:
        say(f"marathon: FAILED: {len(faults) - len(incidents)} not injected, {len(bad)} not detected or not "
            f"recovered ({', '.join(f'#{i.n}' for i in bad) or 'none'}), job {state.value}")
        return 1
    return 0
