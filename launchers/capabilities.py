"""What a backend MAY do beyond being one (launchers/base.py): small objects it offers as attributes of its
BACKEND, None where it has none. Its config.py's TRAITS (fsdp_jobs/planning/cluster_config.py BackendTraits)
says which, as data: the CLI refuses a command a backend lacks in one line naming those that have it
(fsdp_jobs/planning/backends.py lacking), and fsdp_jobs/cli/launcher.py refuses a BACKEND whose objects
disagree with its TRAITS.

    scaler   Scaler: `fsdp-jobs scale RUN nodes=N` grows the running job            (TRAITS.scale)
    faults   Faults: `fsdp-jobs chaos RUN KIND|resume|marathon`                     (TRAITS.chaos, .marathon)
    stacks   Stacks: `fsdp-jobs stacks RUN` reads every running rank's Python stacks (TRAITS.stacks)

Faults and Stacks here act on the rank processes this machine can see (launchers/chaos/inject.py,
launchers/stacks.py), which is right for a backend whose ranks run here or in containers or namespaces of
this machine; a backend subclasses them for what is its own (cluster=docker's nodes, SLURM's srun).
"""

from __future__ import annotations

import abc
import time
from pathlib import Path
from typing import Optional, Protocol

from fsdp_jobs.planning import backends
from fsdp_jobs.planning.chaos_kinds import DEFAULT_BIT, ChaosKind
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.status import JobStatus, Run


class Owner(Protocol):
    """What a capability object asks of the backend it belongs to (launchers/base.py Backend; named here, not
    imported: base.py names these classes as its attributes)."""

    name: str

    def describe(self, run: Run) -> JobStatus: ...


class Scaler(abc.ABC):
    @abc.abstractmethod
    def scale(self, run: Run, nodes: int) -> str:
        """Grow the running job to `nodes` (at most its cluster.max_nodes; fsdp_jobs/cli/ctl.py checked that):
        start the new nodes, which join its rendezvous; the ranks checkpoint and go on at the new size. What
        was done, in one line."""


def request_scale(run: Run, nodes: int) -> None:
    """Hand `fsdp-jobs scale` to a launcher that starts the new nodes itself (cluster=local's launcher,
    cluster=docker's supervisor): only once the ranks train (launchers/supervisor.py: why_not_grow)."""
    training = runs.read_state(run.run_dir).status or None
    if training != "running":
        raise UserError("RUN", run.run_dir.name, f"its ranks are not training ({RunDir(run.run_dir).state_file.name}: {training or 'none'}); "
                                                 "scale a job once it trains")
    runs.request_scale(run.run_dir, nodes)


class Faults:
    """Failure injection for testing resilience: kill-rank R, hang-rank R, slow-node N, slow-link N, cut-node N
    and resume act on the rank processes (and a node's network namespace, entered through one of them) this
    machine can see (launchers/chaos/inject.py). A backend with nodes of its own injects more by overriding
    `inject` (cluster=docker: kill-node, stop-node). Which kinds it offers: its TRAITS.chaos."""

    def __init__(self, backend: Owner) -> None:
        self.backend = backend

    @property
    def dealt(self) -> tuple[ChaosKind, ...]:
        """The kinds `chaos RUN marathon` deals on this backend (TRAITS.marathon)."""
        return backends.traits(self.backend.name).marathon

    def describe(self, run: Run) -> JobStatus:
        return self.backend.describe(run)

    def inject(self, run: Run, kind: ChaosKind, node: int, rate: str = "100mbit", bit: int = DEFAULT_BIT) -> str:
        """Inject `kind` at rank or node `node` (ChaosKind.on_rank says which); what was done, in one line."""
        from fsdp_jobs.launchers.chaos import inject

        try:
            if kind is ChaosKind.KILL_RANK:
                return inject.kill_rank(run.run_dir, node)
            if kind is ChaosKind.HANG_RANK:
                return inject.hang_rank(run.run_dir, node)
            if kind is ChaosKind.CORRUPT_RANK:
                return inject.corrupt_rank(run.run_dir, node, bit)
            if kind is ChaosKind.SLOW_NODE:
                return inject.slow_node(run.run_dir, inject.node_name(run.run_dir, node))
            if kind is ChaosKind.SLOW_LINK:
                return inject.slow_link(run.run_dir, inject.node_name(run.run_dir, node), rate)
            if kind is ChaosKind.CUT_NODE:
                return inject.cut_node(run.run_dir, inject.node_name(run.run_dir, node))
        except LookupError as e:
            raise UserError("chaos", kind.value, str(e)) from None
        raise backends.lacking(self.backend.name, kind.value)

    def resume(self, run: Run) -> str:
        """Undo slow-node, slow-link and cut-node."""
        from fsdp_jobs.launchers.chaos import inject

        try:
            return inject.resume(run.run_dir)
        except LookupError as e:
            raise UserError("chaos", "resume", str(e)) from None

    def marathon(self, run: Run, faults: int, seed: int, kinds: tuple[str, ...] = (),
                 margin: Optional[int] = None) -> int:
        """`chaos RUN marathon`: a seeded schedule of mixed faults into the running job (launchers/chaos/marathon.py);
        its exit status."""
        from fsdp_jobs.launchers.chaos import marathon

        return marathon.run_marathon(self, run, faults, seed, only=kinds, margin=margin)


class Stacks:
    """`fsdp-jobs stacks`: the Python stacks of every running rank into one file of the run dir
    (launchers/stacks.py). Here each rank is read where this machine's /proc shows it (cluster=local; Docker's
    containers are this machine's processes); a backend whose ranks run elsewhere overrides `dump`."""

    def __init__(self, backend: Owner) -> None:
        self.backend = backend

    def collect(self, run: Run, node: Optional[str], ranks: Optional[set[int]]) -> tuple[Path, list[str]]:
        """The stacks of the ranks (of `node`: an index or a name; of `ranks`) in one file: its path and one
        header line a rank ([] when none ran; no file is left then)."""
        from fsdp_jobs.launchers import stacks
        from fsdp_jobs.launchers.chaos.inject import node_name

        where = (node_name(run.run_dir, int(node)) if node.isdigit() else node) if node is not None else None
        when = time.time()
        parts = RunDir(run.run_dir).stacks_parts_dir(when)
        self.dump(run, parts, where, ranks)
        path, heads = stacks.gather(run.run_dir, parts, when)
        if not heads:
            path.unlink(missing_ok=True)
        return path, heads

    def dump(self, run: Run, parts: Path, node: Optional[str], ranks: Optional[set[int]]) -> None:
        """Each rank's stacks into `parts`, a file a rank."""
        from fsdp_jobs.launchers import stacks

        stacks.dump_here(run.run_dir, parts, ranks, node)
