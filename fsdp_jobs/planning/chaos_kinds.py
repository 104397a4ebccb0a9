"""The faults `fsdp-jobs chaos` injects into a running job, as one enum whose values are the CLI's words.

A backend's config.py declares which of them it injects (BackendTraits.chaos: `chaos RUN KIND N`) and which
its marathon deals (BackendTraits.marathon: `chaos RUN marathon`); launchers/chaos/ does the injecting. Not to
be confused with `fault.*` (how the job itself meets a failure), `fault_tolerance.*` (replica groups) or the
FSDP_JOBS_TEST_* variables (fsdp_jobs/planning/faults.py: failures the ranks raise in themselves)."""

from __future__ import annotations

from enum import Enum


class ChaosKind(str, Enum):
    KILL_RANK = "kill-rank"
    HANG_RANK = "hang-rank"
    SLOW_NODE = "slow-node"
    SLOW_LINK = "slow-link"
    CUT_NODE = "cut-node"
    KILL_NODE = "kill-node"
    STOP_NODE = "stop-node"
    CORRUPT_CHECKPOINT = "corrupt-checkpoint"
    CORRUPT_RANK = "corrupt-rank"

    def __str__(self) -> str:  # the CLI's word in every f-string and message (a str Enum says ChaosKind.X)
        return self.value

    @property
    def help(self) -> str:
        return HELP[self]

    @property
    def by_hand(self) -> bool:
        """Can `fsdp-jobs chaos RUN KIND` inject it? corrupt-checkpoint is the marathon's alone: it damages the
        newest checkpoint and kills a rank in one move, with every rank stopped meanwhile."""
        return self is not ChaosKind.CORRUPT_CHECKPOINT

    @property
    def on_rank(self) -> bool:
        """Does `chaos RUN KIND N` take a rank for N (else a node index)?"""
        return self in (ChaosKind.KILL_RANK, ChaosKind.HANG_RANK, ChaosKind.CORRUPT_RANK)


HELP = {
    ChaosKind.KILL_RANK: "SIGKILL one rank (a crash)",
    ChaosKind.HANG_RANK: "SIGSTOP one rank (alive, no progress)",
    ChaosKind.SLOW_NODE: "throttle a node's ranks",
    ChaosKind.SLOW_LINK: "limit a node's network (--rate)",
    ChaosKind.CUT_NODE: "drop every packet of a node's network",
    ChaosKind.KILL_NODE: "SIGKILL the node's agent (it restarts)",
    ChaosKind.STOP_NODE: "the node is gone for good",
    ChaosKind.CORRUPT_CHECKPOINT: "damage the newest checkpoint, then kill a rank (the marathon's own)",
    ChaosKind.CORRUPT_RANK: "flip one bit (--bit) of a rank's parameter shard at its next step (silent data corruption)",
}
CORRUPT_BITS = range(0, 31)  # --bit: SIGRTMIN + K tells the rank which (fsdp_jobs/runtime/sdc.py CorruptRequests)
DEFAULT_BIT = 20  # a high mantissa bit of a float32: the value moves by about a tenth and stays finite
# `chaos RUN resume` undoes slow-node, slow-link and cut-node; `chaos RUN marathon` deals a seeded schedule
RESUME = "resume"
MARATHON = "marathon"
# what launchers/chaos/inject.py does to the rank processes this machine sees, whichever backend started them
ON_RANKS = (ChaosKind.KILL_RANK, ChaosKind.HANG_RANK, ChaosKind.SLOW_NODE, ChaosKind.CORRUPT_RANK)
# ... and to a node's own network namespace, entered through one of its ranks
ON_NETWORK = (ChaosKind.SLOW_LINK, ChaosKind.CUT_NODE)
# the marathon's faults on such ranks (launchers/chaos/marathon.py); a backend with nodes of its own adds more.
# Not corrupt-rank yet: the marathon has no measure of its detection
MARATHON_ON_RANKS = (ChaosKind.KILL_RANK, ChaosKind.HANG_RANK, ChaosKind.SLOW_NODE, ChaosKind.CORRUPT_CHECKPOINT)


def actions() -> tuple[str, ...]:
    """The words `fsdp-jobs chaos RUN ACTION` takes."""
    return (*(k.value for k in ChaosKind if k.by_hand), RESUME, MARATHON)
