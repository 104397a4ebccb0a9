"""Buddy copies of the in-memory snapshots (fsdp_jobs/runtime/snapshots.py): where no other replica group holds a
rank's shard (full_shard, or HSDP with one replica) a lost node takes its ranks' only snapshots with it, and the
job goes back to its last checkpoint. So each snapshot is also kept by the next node: rank r sends its newest slot
to rank r + L (the same local rank on the next node, L ranks a node, the last node's to the first), which keeps
it in buddy slots `b{r}-{0,1}.snap` beside its own; `snapshots.choose` finds a lost rank's shard there as it
finds a replica's.

Off the step path: each rank's thread sends its snapshot of step K and receives its predecessor's, over gloo
groups of two ranks (host memory to host memory, whatever the training backend), while training goes on. The
snapshot after K waits for that exchange first, so the buddy always holds the snapshot before the one being
written, and the slot a thread reads is never the one being overwritten.

Cost at 1,024 nodes x 8: per snapshot each rank sends its state shard once, to one other node (llama3_8b,
full_shard, fp32: 8.03e9 parameters x 3 x 4 bytes / 8,192 ranks = 11.8 MB a rank, 94 MB a node), and keeps two
copies of its buddy's beside its own two (the plan counts four: fsdp_jobs/planning/plan.py snapshot_bytes, and
keeps_buddy_copies says which jobs keep them). Each
rank makes two groups of two, formed by their members alone (use_local_synchronization): no connection to any
other rank, no key in the store beyond the pair's.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Callable, Optional

import numpy
import torch
import torch.distributed as dist


def buddy_ranks(rank: int, world_size: int, local_world_size: int) -> tuple[int, int]:
    """(the rank this one sends its snapshots to, the rank it keeps copies of): the same local rank on the next
    node and on the one before."""
    return (rank + local_world_size) % world_size, (rank - local_world_size) % world_size


class BuddyCopies:
    """One rank's side of the exchange: `send(path)` after each snapshot (returns at once), `wait()` before the
    next one and before anything that must see no copy arrive later (a discard, the end)."""

    def __init__(self, rank: int, world_size: int, local_world_size: int, keep: Callable[[bytes], Path],
                 committed_bytes: Callable[[Path], bytes], log: Callable[[str], None] = print) -> None:
        """`keep`: stores a received snapshot (SnapshotStore.write_copy); `committed_bytes`: a slot's bytes up to
        its end, or b"" where it holds no committed snapshot (then the buddy keeps nothing this time)."""
        self.rank, self.keep, self.committed_bytes, self.log = rank, keep, committed_bytes, log
        self.next, self.prev = buddy_ranks(rank, world_size, local_world_size)
        # every rank creates its (at most two) pair groups in the same global order: a ring of pairs made in
        # each rank's own order would wait in a circle
        pairs = sorted({tuple(sorted((rank, self.next))), tuple(sorted((self.prev, rank)))})
        groups = {pair: dist.new_group(list(pair), backend="gloo", use_local_synchronization=True) for pair in pairs}
        self.to_next = groups[tuple(sorted((rank, self.next)))]
        self.from_prev = groups[tuple(sorted((self.prev, rank)))]
        self.jobs: queue.Queue[Optional[Path]] = queue.Queue()
        self.done = threading.Event()
        self.done.set()
        self.failed: Optional[str] = None
        self.unkept = 0
        threading.Thread(target=self.run, name="snapshot-buddy", daemon=True).start()

    def send(self, path: Path) -> None:
        self.done.clear()
        self.jobs.put(path)

    def wait(self) -> None:
        self.done.wait()

    def run(self) -> None:
        while True:
            path = self.jobs.get()
            try:
                if self.failed is None:
                    self.keep_one(self.exchange(self.committed_bytes(path) if path is not None else b""))
            except Exception as e:  # noqa: BLE001  a peer gone mid-exchange: every failure does this, and the
                self.failed = f"{type(e).__name__}: {e}"  # training's own collectives say so (no second line)
            finally:
                self.done.set()

    def keep_one(self, received: bytes) -> None:
        """A copy this node cannot hold (its memory full) is lost, not the exchange: the pair's next rounds go on,
        which the other side waits for."""
        if not received:
            return
        try:
            self.keep(received)
        except OSError as e:
            if not self.unkept:
                self.log(f"buddy copies from rank {self.prev} not kept on rank {self.rank}: {e.strerror or e}")
            self.unkept += 1

    def exchange(self, blob: bytes) -> bytes:
        """Send `blob` to the next node's rank and receive the one before's, both at once: sizes, then bytes."""
        mine, theirs = torch.tensor([len(blob)], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        both(dist.isend(mine, self.next, group=self.to_next), dist.irecv(theirs, self.prev, group=self.from_prev))
        out = torch.from_numpy(numpy.frombuffer(blob, dtype=numpy.uint8).copy()) if blob else None
        got = torch.empty(int(theirs.item()), dtype=torch.uint8) if theirs.item() else None
        both(dist.isend(out, self.next, group=self.to_next) if out is not None else None,
             dist.irecv(got, self.prev, group=self.from_prev) if got is not None else None)
        return got.numpy().tobytes() if got is not None else b""


def both(*works: Optional[dist.Work]) -> None:
    for work in works:
        if work is not None:
            work.wait()
