"""Silent data corruption: the replicas that must agree are compared (fault.sdc_check_interval).

Under HSDP each shard of the model and of the optimizer state is held by one rank of every replica group, and
after each optimizer step those copies are identical bit for bit: the gradients are all-reduced across the
replicate dimension, so every replica applies the same update to the same state. A flipped bit in one copy (a
corrupted multiply, a bit in HBM) crashes nothing and trains on; comparing the copies finds it.

A check: every rank folds its parameter and optimizer shards into a fingerprint on its own device (each tensor's
bytes read as integers and summed exactly in int64, one reduction a tensor, no host copy of the tensors), and the
fingerprints ride the stop vote's all-reduce (fsdp_jobs/runtime/stopping.py StopVote): every rank learns whether
each shard's replicas agree. Only where they do not is every rank's gathered (16 bytes each), so each compares
every replicate group itself and all name the same ranks. A single flipped bit always shows: it moves one integer
by 2^k, so the exact sum by the same amount (and the position-weighted sum too: two changes cannot cancel by
trading places). With three or more replica groups the majority's fingerprint is the truth and the ranks that differ are
named. With two there is no majority: every rank rolls back in its process to the newest agreed state (its
in-memory snapshot, else the checkpoint a check vouched for) and takes the steps since again, on the same nodes and
ranks (a restart would let torchrun's rendezvous deal ranks and nodes anew); at the step that disagreed the check
compares each rank with its own fingerprint from before: the replica that does not reproduce its own state was the
corrupted one. Recomputation is bitwise where the steps are (CPU, and a
GPU's deterministic kernels); where a corruption reached both replicas before the check (through the gradients'
all-reduce of a later step), neither reproduces its own, and the job trains on from the recomputed, agreed state
with no node named. A disagreement that the recomputation repeats is a fault that reproduces: the job stops naming
both nodes.

`auto` checks every m steps and keeps an in-memory snapshot (fsdp_jobs/runtime/snapshots.py) at each check, and
checks every checkpoint before it is saved, so a mismatch rolls the job back to the newest state the replicas agreed
on. The snapshots between checks (every k steps: a crash loses fewer) are kept unchecked, in the slot the newest
vouched one does not hold; a state restored from one is agreed only to the check before it, and none is sent to
another rank (a peer's copy could make two replicas agree on a corruption). checkpoint.memory_interval=auto times
a few checks with its first snapshots (the launch and the verdict's read; what reading the state costs the next
step is budgeted on top) and chooses m, a multiple of k, so that the checks cost at most 1% of the step time
(`CHECK_SHARE`); with a fixed memory_interval every snapshot is checked. With two replica groups the recomputation
names a node only where the flip came at a checked step: from the next step on the gradients' all-reduce carries it
into the other replica, which then does not reproduce its own state either, and no node is named (the job goes
on from the recomputed state). fault.sdc_check_interval=1 checks every step.

A check reads the state once, as the snapshot's copy does, and adds 32 bytes a shard to the vote (a step without one
votes its code alone). The vote is read at the next step's start, or at once before a checkpoint is saved; meanwhile
the snapshot is written pending, and an agreeing verdict vouches for it. That read waits for the slowest rank's
cast; read after the next step's computation instead, it would not, but the snapshot would stay pending through that
step, and a rank dying in it would send the restart back one snapshot interval more. A check with a collective of
its own, waited for at once, cost more than its work: the ranks' skew at the point, and gloo's thread.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist

from fsdp_jobs.planning.chaos_kinds import CORRUPT_BITS
from fsdp_jobs.rundir import replaced, runs
from fsdp_jobs.rundir.checkpoints import committed_checkpoints, set_aside
from fsdp_jobs.rundir.records import ReplacedNodes
from fsdp_jobs.runtime.snapshots import local

AUTO = "auto"
CHECK_NAMES = {False: "a replica agreement check", True: "a step recheck"}  # what named a node (fsdp_jobs/runtime/recheck.py)
AGREED, ROLLED_BACK = "agreed", "rolled back"  # what a check left the step loop to do (else: "sdc", it ends)
INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# test-only fault injection: "STEP:RANK" makes RANK flip one bit of its first parameter shard right after
# that step's update, on the first attempt only (fsdp_jobs/runtime/trainer.py train_step); RANK -1: the last
# rank whose node does not serve the rendezvous store (which no hot spare can replace)
CORRUPT_AT_ENV = "FSDP_JOBS_TEST_CORRUPT_AT"


def corrupt_target(spec: str, world: Any) -> Optional[tuple[int, int]]:
    """CORRUPT_AT_ENV's (step, rank), or None. Collective where RANK is -1 (every rank has the same value)."""
    if not spec:
        return None
    step, rank = (int(x) for x in spec.split(":"))
    if rank < 0:
        from fsdp_jobs.runtime.loopback_store import STORE_HOST_ENV

        hosts: list[Any] = [None] * world.world_size
        dist.all_gather_object(hosts, os.environ.get(STORE_HOST_ENV) == "1")
        rank = max(r for r, host in enumerate(hosts) if not host)
    return step, rank


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors replicas hold identically: each parameter's local shard and its optimizer state's tensors,
    in the same order on every rank."""
    out = [local(p) for p in model.parameters()]
    for per in optimizer.state.values():
        out += [local(v) for v in per.values() if isinstance(v, torch.Tensor)]
    return out


class CorruptRequests:
    """`fsdp-jobs chaos RUN corrupt-rank R --bit K` (launchers/chaos/inject.py) sends rank R the real-time signal
    SIGRTMIN + K; the handler only notes K, and the step loop flips that bit after its next update (`take`)."""

    def __init__(self, bits: range = CORRUPT_BITS) -> None:
        self.pending: Optional[int] = None
        for bit in bits:
            signal.signal(signal.SIGRTMIN + bit, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.pending = signum - signal.SIGRTMIN

    def take(self) -> Optional[int]:
        bit, self.pending = self.pending, None
        return bit


def flip_a_bit(model: torch.nn.Module, bit: int = 20) -> None:
    """Test fault injection: flip one bit of the first element of this rank's first parameter shard, in place
    (bit 20 of a float32 is a high mantissa bit: the value moves by about a tenth, and stays finite)."""
    with torch.no_grad():
        shard = local(next(model.parameters())).detach().reshape(-1)
        ints = shard.view(INTS[shard.element_size()])
        ints[0] ^= 1 << min(bit, shard.element_size() * 8 - 2)


def words(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as integers: 64-bit words where its bytes split into whole, aligned words (an int64 sum
    runs at memory speed; an int32 view summed into int64 took 25 times longer), else its element's size. The
    choice depends on shape and offset only, so every replica of a shard makes the same one."""
    flat = t.detach().reshape(-1)
    size = flat.element_size()
    if size < 8 and flat.numel() * size % 8 == 0 and flat.storage_offset() * size % 8 == 0:
        try:
            return flat.view(torch.int64)
        except RuntimeError:  # a view torch refuses: the element-sized one below
            pass
    return flat.view(INTS[size])


def fingerprint(tensors: Iterable[torch.Tensor], device: torch.device,
                views: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
    """int64[2] on `device`: the sum, mod 2^64, of every tensor's bytes read as integers (`words`; or `views`,
    those words made before), and the same sums weighted by each tensor's position. Integer sums do not depend on
    the order they are added in: equal bytes, equal fingerprints, whatever the kernels; any one flipped bit moves a
    word by 2^k, and the sums with it. One reduction a tensor, then two for the whole."""
    sums = [w.sum(dtype=torch.int64) for w in (views if views is not None else map(words, tensors))]
    if not sums:
        return torch.zeros(2, dtype=torch.int64, device=device)
    stacked = torch.stack(sums).to(device)
    weights = torch.arange(1, len(sums) + 1, dtype=torch.int64, device=device)
    return torch.stack([stacked.sum(), (stacked * weights).sum()])


def disagreeing(prints: list[tuple[int, int]]) -> list[int]:
    """The positions in the replicate group whose fingerprint is not the majority's; [] when all agree. With no
    strict majority (two replicas, or a tie) every position is named: none can be trusted over another."""
    counts = Counter(prints)
    if len(counts) == 1:
        return []
    common, n = counts.most_common(1)[0]
    if n * 2 <= len(prints):
        return list(range(len(prints)))
    return [i for i, p in enumerate(prints) if p != common]


@dataclass
class Mismatch:
    """What a check found: the step it ran at, the newest step whose check agreed, the ranks named, how they were
    named ("majority"; "pair": two replicas, no majority, recomputation to come; "recomputation": the rank that did
    not reproduce its own state; "repeated": the recomputation disagreed again; "unresolved": it agreed, and
    neither or both reproduced their own) and every rank's fingerprint (the recomputation's reference)."""

    step: int
    agreed_step: Optional[int]
    ranks: list[int]
    how: str
    prints: list[tuple[int, int]] = field(default_factory=list)

    @property
    def names_nodes(self) -> bool:
        """Whether these ranks' nodes are to be excluded (a spare in their place, or the job stops)."""
        return self.how in ("majority", "recomputation", "repeated", "rerun", "rerun-repeated")


class ReplicaAgreement:
    """One rank's side of the checks: schedule (`due`) and the check itself (collective over the world)."""

    def __init__(self, mesh_shape: dict[str, int], every: Any, snapshot_every: Any, device: torch.device) -> None:
        """`snapshot_every`: checkpoint.memory_interval where the job keeps in-memory snapshots, else 0. `auto` checks
        every snapshot where their interval is a number, else every `space`-d steps (memory_interval=auto times
        the check with its first snapshots: fsdp_jobs/runtime/snapshots.py), and needs them (a rollback's target)."""
        kept = snapshot_every not in (0, "0", None)
        self.enabled = mesh_shape.get("replicate", 1) >= 2 and every not in (0, "0", None) and (every != AUTO or kept)
        self.world_size = dist.get_world_size() if self.enabled else 1
        # the ranks holding one shard: the shard dimension is innermost (fsdp_jobs/runtime/mesh.py build_mesh)
        shard = mesh_shape.get("shard", 1)
        self.replicate_groups = [list(range(s, self.world_size, shard)) for s in range(shard)] if self.enabled else []
        self.shards = shard if self.enabled else 0  # the stop vote's places for fingerprints (StopVote)
        self.auto = every == AUTO
        self.every = 0 if not self.enabled else int(every) if not self.auto else \
            0 if snapshot_every == AUTO else int(snapshot_every)  # 0: not chosen yet (`space`)
        self.device = device
        self.agreed_step: Optional[int] = None
        self.recheck: Optional[Mismatch] = None  # two replicas' disagreement the steps since are recomputed for
        self.pending: Optional[tuple[int, torch.Tensor, Optional[list[tuple[int, int]]]]] = None  # a launched
        # check: its step, this rank's fingerprint, and every rank's where it gathered them at once
        self.views: Optional[tuple[list[Any], list[torch.Tensor]]] = None  # `words_of`'s, and what they are of
        self.checked = self.agreed = 0  # this attempt's verdicts, and how many of them every shard agreed in
        self.timed: list[Optional[float]] = [0.0, None]  # the last check's launch and its verdict's read, in seconds

    def recompute(self, found: Mismatch, from_step: int) -> None:
        """The job rolled back to `from_step` to take the steps to `found.step` again: judge them there."""
        self.recheck, self.agreed_step, self.views = found, from_step, None

    def due(self, step: int, keeping: bool, measuring: bool = False) -> bool:
        """`keeping`: this step's state is about to be kept on disk (a checkpoint, the last step's): always checked
        first, so no checkpoint was saved unchecked; every `every` steps (an in-memory snapshot is kept at each:
        the trainer's check_and_snapshot), or where auto is `measuring` its cost; and the step a recomputation has
        to judge."""
        if not self.enabled:
            return False
        judging = self.recheck is not None and step == self.recheck.step
        return keeping or judging or measuring or (self.every > 0 and step % self.every == 0)

    def space(self, every: int) -> None:
        """auto's interval, once memory_interval=auto chose it (a multiple of the snapshots')."""
        self.every = every

    def rolled_back_to(self, step: int) -> None:
        """The job went back to `step` (a non-finite loss's rollback): no newer step is agreed any more."""
        if self.agreed_step is not None:
            self.agreed_step = min(self.agreed_step, step)
        self.recheck = None  # the steps it was to compare are not the ones taken again

    def launch(self, step: int, tensors: Iterable[torch.Tensor], gather: bool = False) -> None:
        """This rank's fingerprint of `step`'s state, which rides this step's stop vote (`riding`;
        fsdp_jobs/runtime/stopping.py StopVote): no collective of its own, and the verdict is read with the vote,
        at the next step's start or before a save. The step a recomputation is judged at gathers every rank's at
        once instead: the judgement compares each rank with itself."""
        began = time.perf_counter()
        tensors = list(tensors)
        mine = fingerprint(tensors, self.device, self.words_of(tensors))
        judging = gather or (self.recheck is not None and step == self.recheck.step)  # `gather`: waited for now
        self.pending = (step, mine, self.gather(mine) if judging else None)
        self.timed = [time.perf_counter() - began, None]

    def read_took(self, seconds: float) -> None:
        """What reading the launched check's verdict took the step loop (the vote's wait, the verdict, the rows)."""
        self.timed[1] = seconds

    def took(self) -> Optional[float]:
        """The seconds the last check took the step loop that `launch` and `read_took` timed, once both are in
        (memory_interval=auto spaces checks by it: fsdp_jobs/runtime/snapshots.py); else None. Given once."""
        launch, read = self.timed
        if read is None or launch is None:
            return None
        self.timed = [0.0, None]
        return launch + read

    def riding(self, step: int) -> Optional[torch.Tensor]:
        """The fingerprint this step's vote carries, if a check of this step was launched to ride it."""
        if self.pending is None or self.pending[0] != step or self.pending[2] is not None:
            return None
        return self.pending[1]

    def gather(self, mine: torch.Tensor) -> list[tuple[int, int]]:
        """Collective: every rank's fingerprint, by rank (one all-gather of 16 bytes a rank)."""
        gathered = torch.zeros(self.world_size * 2, dtype=torch.int64, device=self.device)
        dist.all_gather_single(gathered, mine)  # not all_gather_into_tensor: deprecated, a FutureWarning on every rank
        return [tuple(p) for p in gathered.view(self.world_size, 2).tolist()]

    def words_of(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """`words` of each tensor, made once while the state's tensors stay the same ones (updated in place, step
        after step; a rollback's load may make new ones): a small model's checks were mostly per-tensor calls."""
        if not all(t.is_contiguous() for t in tensors):  # `words` of one is a copy: never kept
            return [words(t) for t in tensors]
        # a wrapper subclass (train.float8's weights) has no storage of its own: data_ptr() 0; its inner tensor's
        key = [(getattr(t, "_tensor", t).data_ptr(), t.numel(), t.dtype) for t in tensors]
        if self.views is None or self.views[0] != key:
            self.views = (key, [words(t) for t in tensors])
        return self.views[1]

    def settle(self, disagreed: bool) -> tuple[Optional[int], Optional[Mismatch]]:
        """The launched check's verdict, given what the vote that carried it said (`disagreed`: some shard's
        replicas differed; the vote is read on every rank, so every rank takes the same path): (its step, None)
        when every group agreed (the step is then the newest agreed one) and there was no recomputation to
        judge, else (its step, what was found); (None, None) when no check was under way. Collective where the
        vote disagreed: every rank's fingerprint gathered, so that each compares every replicate group itself
        and all name the same ranks."""
        if self.pending is None:
            return None, None
        step, mine, prints = self.pending
        self.pending = None
        if prints is None and disagreed:
            prints = self.gather(mine)
        found = self.verdict(step, prints)
        self.checked, self.agreed = self.checked + 1, self.agreed + (found is None)
        return step, found

    def drop(self) -> None:
        """A launched check whose verdict no longer matters (a non-finite step's rollback, the loop's end)."""
        self.pending = None
        self.views = None  # the tensors a rollback replaces are not kept alive by the words made of them

    def verdict(self, step: int, prints: Optional[list[tuple[int, int]]]) -> Optional[Mismatch]:
        """What `step`'s fingerprints say (`prints` None: the vote found every shard's replicas equal)."""
        if prints is None:
            if self.recheck is not None and step >= self.recheck.step:
                self.recheck = None  # passed unjudged (cannot happen: its step gathers); nothing to compare
            self.agreed_step = step
            return None
        named, majority = [], True
        for members in self.replicate_groups:
            odd = disagreeing([prints[r] for r in members])
            named += [members[i] for i in odd]
            majority = majority and len(odd) < len(members) if odd else majority
        recheck = self.recheck if self.recheck is not None and step >= self.recheck.step else None
        if recheck is not None:
            self.recheck = None
            if step == recheck.step:
                return self.judge(step, prints, sorted(named), recheck)
        if not named:
            self.agreed_step = step
            return None
        return Mismatch(step, self.agreed_step, sorted(named), "majority" if majority else "pair", prints)

    def judge(self, step: int, prints: list[tuple[int, int]], named: list[int], recheck: Mismatch) -> Mismatch:
        """The recomputed step: the ranks of the earlier disagreement whose fingerprint changed are the corrupted
        ones, where their replicas' did not change (a replica that reproduces its own state is trusted)."""
        if named:
            return Mismatch(step, self.agreed_step, named, "repeated", prints)
        self.agreed_step = step
        before = {r: recheck.prints[r] for r in recheck.ranks}
        changed = {r for r in recheck.ranks if before[r] != prints[r]}
        culprits = []
        for members in self.replicate_groups:
            suspects = [r for r in members if r in before]
            moved = [r for r in suspects if r in changed]
            if moved and len(moved) < len(suspects):
                culprits += moved
        return Mismatch(step, step, sorted(culprits) or sorted(recheck.ranks),
                        "recomputation" if culprits else "unresolved", prints)


# ---------------------------------------------------------------------- what happens then
def shortened(names: list[Any], shown: int = 8) -> str:
    """The first `shown` of a list, and how many more: a line names every rank of a 1,024-node job no better."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(map(str, names[:shown])) + more


def describe(found: Mismatch, nodes: list[str]) -> str:
    """The one line that says what a check found."""
    who = f"silent data corruption: rank(s) {shortened(found.ranks)} on {shortened(nodes)} " \
        if found.how not in ("rerun-unresolved", "rerun-irreproducible") else "silent data corruption: every rank "
    since = f"(the last check that agreed: step {found.agreed_step})"
    return who + {
        "majority": f"disagreed with the other replicas of their shards at step {found.step} {since}",
        "pair": f"and their replicas disagree at step {found.step} {since}, and two replicas make no majority",
        "recomputation": f"did not reproduce their own state when the steps to {found.step} were recomputed from an "
                         "agreed snapshot; their replicas did",
        "repeated": f"and their replicas disagree again at step {found.step}, recomputed from step "
                    f"{found.agreed_step}: a fault that reproduces, on one of these nodes",
        "unresolved": f"and their replicas agree at step {found.step} once recomputed, but neither reproduced its own "
                      "state (the corruption had reached both): no node can be named; training goes on from the "
                      "recomputed state",
        "rerun": f"did not reproduce their own state when step {found.step} was taken again, twice from the same "
                 "state, and the others did: the corruption stayed in their state, after the step's collectives",
        "rerun-unresolved": f"did not reproduce its own state in one of three computations of step "
                            f"{found.step}, from the same state: with every rank moved (a corruption before the "
                            "step's collectives reaches them all) no node can be named; training goes on from the two "
                            "computations that agreed",
        "rerun-repeated": f"did not reproduce their own state in any two of three computations of step {found.step} "
                          f"from the same state, and the others did: a fault that reproduces, on one of these nodes",
        "rerun-irreproducible": f"did not reproduce its own state in any two of three computations of step "
                                f"{found.step} from the same state: the steps are not bitwise reproducible here "
                                "(kernels that are not deterministic), or a fault reaches every rank each time; no "
                                "node can be named (fault.sdc_recompute_interval=0 and fault.sdc_spike_factor=0 turn the check "
                                "off)",
    }[found.how]


def recorded_ranks(found: Mismatch, world: Any) -> Any:
    """The ranks an incident's event lists: "all" where every rank is (8,192 numbers at 1,024 x 8 say nothing more)."""
    return "all" if len(found.ranks) == world.world_size > 1 else found.ranks


def settle(found: Mismatch, world: Any, timeline: Any, say: Callable[[str], None]) -> None:
    """A recomputation that agreed but named no node: recorded and said; no collective."""
    if world.rank == 0:
        timeline.event("sdc", step=found.step, agreed_step=found.agreed_step, ranks=recorded_ranks(found, world),
                       nodes=[], by_majority=False, named_by=None, how=found.how)
    say(describe(found, ["their nodes"]))


def stop_unnamed(found: Mismatch, run_dir: Path, world: Any, snapshots: Any, timeline: Any,
                 say: Callable[[str], None]) -> tuple[int, str]:
    """A step recheck with no two computations alike on every rank: no node to name, none to exclude; recorded,
    and the job stops (the ranks exit 0 so that no restart repeats it: the run's record says it failed), its
    snapshots' buddy copies finished first. Returns the ranks' exit status and the attempt's end."""
    line = describe(found, [])
    stop = f"{line}; stopped before step {found.step}, the state of step {found.agreed_step} kept"
    snapshots.close()
    if world.rank == 0:
        timeline.event("sdc", step=found.step, agreed_step=found.agreed_step, ranks=recorded_ranks(found, world),
                       nodes=[], by_majority=False, named_by=None, how=found.how)
        runs.write_state(run_dir, status="failed", reason=stop[:1000], step=found.agreed_step, stage="sdc")
    say(stop)
    return 0, f"failed: {line}"


def set_aside_newer(found: Mismatch, run_dir: Path, world: Any, snapshots: Any, timeline: Any) -> tuple[str, list[Any]]:
    """Collective: everything newer than the last agreed check set aside (each node's snapshots by its first rank,
    the committed checkpoints by rank 0; the snapshot the check was to vouch for is none) and the incident on the
    timeline. Returns its line and where each rank runs ({"node", "store_host"}, by rank)."""
    from fsdp_jobs.runtime.loopback_store import STORE_HOST_ENV

    node = os.environ.get("FSDP_JOBS_NODE") or socket.gethostname()
    where: list[Any] = [None] * world.world_size
    dist.all_gather_object(where, {"node": node, "store_host": os.environ.get(STORE_HOST_ENV) == "1"})
    nodes = sorted({where[r]["node"] for r in found.ranks})
    agreed = found.agreed_step
    snapshots.uncommitted = None
    snapshots.close()
    if world.local_rank == 0:
        snapshots.forget_after(agreed)
    line = describe(found, nodes)
    if world.rank == 0:
        for step, path in committed_checkpoints(run_dir):
            if agreed is None or step > agreed:
                try:
                    set_aside(path, f"saved after step {agreed}, the last step {CHECK_NAMES[found.how.startswith('rerun')]} "
                                    f"vouched for: {line}")
                except FileNotFoundError:  # removed meanwhile (keep_last): nothing to set aside
                    pass
        timeline.event("sdc", step=found.step, agreed_step=agreed, ranks=recorded_ranks(found, world), nodes=nodes,
                       by_majority=found.how == "majority", named_by=found.how if found.names_nodes else None,
                       how=found.how)
    dist.barrier()  # the state set aside before any rank goes on
    return line, where


def respond(found: Mismatch, run_dir: Path, cfg: Any, world: Any, snapshots: Any, timeline: Any,
            say: Callable[[str], None]) -> tuple[int, str]:
    """Collective, after a check named nodes (by a majority, or by a recomputation): the state newer than the last
    agreed check set aside, and the named nodes replaced by hot spares where they wait, or else the job stops
    naming them (and a requeue excludes them). Returns the ranks' exit status and the attempt's end."""
    from fsdp_jobs.runtime.preflight import REPLACED_EXIT, spares_for

    line, where = set_aside_newer(found, run_dir, world, snapshots, timeline)
    nodes, agreed = sorted({where[r]["node"] for r in found.ranks}), found.agreed_step
    decided = [spares_for(run_dir, cfg, {"bad": nodes, "ranks": where}) if world.rank == 0 else None]
    dist.broadcast_object_list(decided, src=0)  # one reader of the records, one answer on every rank
    why_not = decided[0]
    if why_not is None:
        if world.rank == 0:
            replaced.record(run_dir, ReplacedNodes(time=time.time(), nodes=nodes, reason=line[:1000],
                                                   restart=world.restart, named_by=CHECK_NAMES[found.how.startswith("rerun")]))
        back = f"going on from step {agreed}" if agreed == found.step else f"rolling back to step {agreed}"
        say(f"{line}; {back}, and a hot spare takes the place of {shortened(nodes)}")
        return REPLACED_EXIT, f"failed: {line}; hot spares replace {shortened(nodes)}"
    stop = f"{line}; stopped: {why_not or 'no hot spare (cluster.spare_nodes)'} to take the place of {shortened(nodes)}"
    if world.rank == 0:
        runs.write_state(run_dir, status="failed", reason=stop[:1000], step=found.step if agreed is None else agreed,
                         stage="sdc", bad_nodes=nodes,
                         exclude=nodes)  # stage: a requeue that leaves named nodes out does (cluster.exclude_bad_nodes)
    say(stop)
    return 0, f"failed: {line}"
