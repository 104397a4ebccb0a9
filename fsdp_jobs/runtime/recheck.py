"""Silent data corruption where no replicas can be compared (fault.sdc_recompute_interval): a step taken twice.

Under full_shard on one group (and wherever the replica agreement check of fsdp_jobs/runtime/sdc.py is off) no
two ranks hold the same bits. Every N steps the step is taken a second time, in process, from a copy of the state
made just before it (on the host), with the same batch and the same random state: every rank compares the
fingerprint of its parameter and optimizer shards after each computation (sdc.py `fingerprint`), and one
all-reduce says whether every rank reproduced its own. Where one did not, the step is taken a third time: the two
computations that agree on every rank are trusted, the job goes on from their state, and the ranks whose odd
computation differed are the evidence. A strict subset of the ranks differing means the corruption stayed in
those ranks' state, which happens only after the step's last collective (a bit flipped in memory after the
update, a wrong update computed on one rank): their nodes are named and treated as the replica check's
(fsdp_jobs/runtime/sdc.py `respond`: a hot spare, else the job stops naming them). Every rank differing means it
reached them all through the step's all-gathers or reduce-scatters (a bit flipped before the forward, a wrong
gradient): no node can be named, and training goes on from the trusted state. Three computations with no two in
agreement is a fault that reproduces: the job goes back to the kept state before the step, keeps it, and stops,
naming the ranks that moved where they are a strict subset (else none: on every rank it is more likely kernels
that are not deterministic). The kept copy is verified when it is put back (its fingerprint against the state's
before the step): a copy host memory corrupted fails the rank, and the job restarts from its last kept state.

What it catches: a corruption that lands in a checked step, between the copy and the step's end. What it cannot:
one in any other step, which the next check's copy already holds. So for a single flip at a random moment the
chance per interval is about 1/N; for a chip that corrupts a share q of its steps, 1-(1-q)^k within k intervals.
The comparison needs bitwise reproducible steps: CPU, and a GPU's deterministic kernels; with
nondeterministic ones the first check finds three different computations and stops the job, saying so.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from fsdp_jobs.runtime.sdc import Mismatch, fingerprint, state_tensors
from fsdp_jobs.runtime.snapshots import local

Prints = list[tuple[int, int]]  # one rank's fingerprints, one per computation of the step


def judge(prints: list[Prints]) -> Optional[Mismatch]:
    """What the computations of one step say, from every rank's fingerprints (`prints[rank]`, one per computation,
    in order; the step number is the caller's): None where every rank reproduced its own (two computations
    agreeing on every rank); else the ranks whose odd computation differed, named ("rerun") where they are a strict
    subset of the ranks, not ("rerun-unresolved") where they are all; where no two computations agree on every
    rank, the ranks whose three fingerprints are not all equal: named ("rerun-repeated") where they are a strict
    subset, not ("rerun-irreproducible") where they are all (kernels that are not deterministic, or a fault that
    reaches every rank each time)."""
    if all(p[0] == p[1] for p in prints):
        return None
    assert all(len(p) == 3 for p in prints), "a disagreement is decided by a third computation"
    for odd, pair in ((0, (1, 2)), (1, (0, 2))):
        if all(p[pair[0]] == p[pair[1]] for p in prints):
            ranks = [r for r, p in enumerate(prints) if p[odd] != p[2]]
            how = "rerun" if len(ranks) < len(prints) else "rerun-unresolved"
            return Mismatch(0, 0, ranks, how, [p[odd] for p in prints])
    ranks = [r for r, p in enumerate(prints) if len(set(p)) > 1]
    how = "rerun-repeated" if len(ranks) < len(prints) else "rerun-irreproducible"
    return Mismatch(0, 0, ranks, how, [p[2] for p in prints])


@dataclass
class Kept:
    """A rank's state before a checked step: its tensors' host copies (`live`: the tensors they were copied from,
    updated in place by the step), the optimizer's hyperparameters and the schedule, progress, the random state,
    and the fingerprint of the state as it was (a copy that does not read back as it was written is not used)."""

    live: list[torch.Tensor]
    host: list[torch.Tensor]
    groups: list[dict[str, Any]]
    schedule: dict[str, Any]
    progress: tuple[int, int]
    rng: torch.Tensor
    cuda_rng: Optional[torch.Tensor]
    with_state: list[Any]  # the parameters the optimizer held state for (a parameter's first update makes it)
    print: tuple[int, int]


class CopyDamaged(RuntimeError):
    """The kept copy did not read back as the state it was made of: host memory corrupted it."""


class StepRecheck:
    """One rank's side: the schedule (`due`), the copy (`keep`, `restore`) and the computations compared
    (`confirm`)."""

    def __init__(self, every: int, enabled: bool, device: torch.device) -> None:
        """`enabled`: the job has no replicas compared otherwise (the trainer decides); `every`: N, 0 = off."""
        self.every = int(every) if enabled else 0
        self.device = device
        self.kept: Optional[Kept] = None
        self.checked = self.reproduced = 0  # this attempt's checks, and how many of them reproduced on every rank
        self.spent_s = 0.0  # what they took beyond the steps' first computations: the copies, computations, prints

    def due(self, step: int) -> bool:
        """Whether `step` (the one about to be taken) is taken twice."""
        return self.every > 0 and step % self.every == 0

    def keep(self, state: Any, model: torch.nn.Module) -> None:
        """A copy of this rank's state on the host (a GPU may not hold a second one): what each further computation
        of the step starts from."""
        began = time.perf_counter()
        live = state_tensors(model, state.optimizer) + [local(b) for b in model.buffers()]
        opt = state.optimizer
        self.kept = Kept(live, [t.detach().to("cpu", copy=True) for t in live],
                         copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
                         copy.deepcopy(state.scheduler.state_dict()), (state.step, state.samples_seen),
                         torch.get_rng_state(), torch.cuda.get_rng_state(self.device)
                         if self.device.type == "cuda" else None, list(opt.state), self.print_of(state, model))
        self.spent_s += time.perf_counter() - began

    def restore(self, state: Any, model: torch.nn.Module) -> bool:
        """`state` back to the kept copy, in place: the same tensors (the step updates them in place), so nothing
        is allocated on the device. False where the state does not read back as it was (its fingerprint)."""
        kept = self.kept
        assert kept is not None
        opt = state.optimizer
        held = {id(p) for p in kept.with_state}
        for param in [p for p in opt.state if id(p) not in held]:  # the step made it: the next makes it again
            del opt.state[param]
        with torch.no_grad():
            for t, h in zip(kept.live, kept.host):
                t.copy_(h)
        for group, saved in zip(opt.param_groups, kept.groups):
            group.update(copy.deepcopy(saved))
        state.scheduler.load_state_dict(copy.deepcopy(kept.schedule))
        state.step, state.samples_seen = kept.progress
        torch.set_rng_state(kept.rng)
        if kept.cuda_rng is not None:
            torch.cuda.set_rng_state(kept.cuda_rng, self.device)
        return self.print_of(state, model) == kept.print

    def release(self) -> None:
        self.kept = None

    def print_of(self, state: Any, model: torch.nn.Module) -> tuple[int, int]:
        fp = fingerprint(state_tensors(model, state.optimizer), self.device)
        return tuple(fp.tolist())  # type: ignore[return-value]

    def confirm(self, state: Any, model: torch.nn.Module, step_again: Callable[[], Any]
                ) -> tuple[Any, Optional[Mismatch]]:
        """Collective: the step just taken (from the kept copy) taken again by `step_again`, and a third time
        where any rank's two differ. Returns the result to go on with (the last computation's: its state is the
        trusted one where two agreed) and what was found (None: every rank reproduced its own; the Mismatch's step
        is the state's). The kept copy stays until `release`: a verdict with no two computations alike goes back
        to it."""
        began = time.perf_counter()
        try:
            return self.compare(state, model, step_again)
        finally:
            self.spent_s += time.perf_counter() - began

    def compare(self, state: Any, model: torch.nn.Module, step_again: Callable[[], Any]
                ) -> tuple[Any, Optional[Mismatch]]:
        mine = [self.print_of(state, model)]
        result = self.again(state, model, step_again, mine)
        self.checked += 1
        if not self.any_rank(mine[0] != mine[1]):
            self.reproduced += 1
            return result, None
        result = self.again(state, model, step_again, mine)
        gathered = torch.zeros(dist.get_world_size() * 6, dtype=torch.int64, device=self.device)
        dist.all_gather_single(gathered, torch.tensor([x for p in mine for x in p], dtype=torch.int64,
                                                      device=self.device))
        found = judge([[tuple(p) for p in row] for row in gathered.view(-1, 3, 2).tolist()])
        if found is not None:
            found.step = found.agreed_step = state.step
        return result, found

    def again(self, state: Any, model: torch.nn.Module, step_again: Callable[[], Any], prints: Prints) -> Any:
        """Collective: the step taken once more from the kept copy; its fingerprint appended to `prints`."""
        self.put_back(state, model)
        result = step_again()
        prints.append(self.print_of(state, model))
        return result

    def put_back(self, state: Any, model: torch.nn.Module) -> None:
        """Collective: `restore`; raises CopyDamaged on every rank where any rank's copy did not read back as its
        state was (every rank at once: the others would wait in the step's collectives for one that failed)."""
        whole = self.restore(state, model)
        if self.any_rank(not whole):
            raise CopyDamaged(f"the host copy of the state before step {state.step + 1} (the step recheck, "
                              f"fault.sdc_recompute_interval) no longer reads back as the state it was made of on "
                              f"{'this rank' if not whole else 'another rank'}: host memory corrupted it; the job "
                              "restarts from its last kept state")

    def any_rank(self, mine: bool) -> bool:
        """Collective: whether any rank says so (one all-reduce of 8 bytes)."""
        flag = torch.tensor([int(mine)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
