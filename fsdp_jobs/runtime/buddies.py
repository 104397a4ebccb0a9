"""Buddy copies of the in-memory snapshots (fsdp_jobs/runtime/snapshots.py): where no other replica group holds a
rank's shard (full_shard, or HSDP with one replica) a lost node takes its ranks' only snapshots with it, and the
job goes back to its last checkpoint. So each snapshot is also kept by the next node: rank r sends its newest slot
to rank r + L (the same local rank on the next node, L ranks a node, the last node's to the first), which keeps
it in buddy slots `b{r}-{0,1}.snap` beside its own; `snapshots.choose` finds a lost rank's shard there as it
finds a replica's.

Off the step path: each rank's thread sends its snapshot of step K and receives its predecessor's, over gloo
groups of two ranks (host memory to host memory, whatever the training backend), while training goes on. The
snapshot after K waits for that exchange first, so the buddy always holds the snapshot before the one being
written, and the slot a thread reads is never the one being overwritten. The bytes go in CHUNK-sized messages
through two buffers each rank reuses, read from its slot file and written into the buddy slot as they arrive: no
copy of the whole state is made in memory. A copy this node cannot keep (its memory full) is dropped and the
exchange goes on (the other side waits for its messages); only a failed message (a peer gone) ends the
exchanges, as every failure of the job does.

Cost at 1,024 nodes x 8: per snapshot each rank sends its state shard once, to one other node (llama3_8b,
full_shard, fp32: 8.03e9 parameters x 3 x 4 bytes / 8,192 ranks = 11.8 MB a rank, 94 MB a node), and keeps two
copies of its buddy's beside its own two (the plan counts four: fsdp_jobs/planning/plan.py snapshot_bytes, and
keeps_buddy_copies says which jobs keep them). Each rank makes two groups of two, formed by their members alone
(use_local_synchronization): no connection to any other rank, no key in the store beyond the pair's, in two
rounds (three for an odd number of nodes) whatever the nodes.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

import numpy
import torch
import torch.distributed as dist

CHUNK = 64 << 20  # bytes a message, and each of the two buffers a rank reuses


class ExchangeFailed(Exception):
    """A message of the exchange failed: the peer is gone (or its process group is)."""


def buddy_ranks(rank: int, world_size: int, local_world_size: int) -> tuple[int, int]:
    """(the rank this one sends its snapshots to, the rank it keeps copies of): the same local rank on the next
    node and on the one before."""
    return (rank + local_world_size) % world_size, (rank - local_world_size) % world_size


def pair_order(left_node: int, nodes: int) -> tuple[int, int]:
    """When the pair of node `left_node` and the next is formed: pairs of one colour share no node, so they all
    form at once; a ring of pairs formed in node order would wait along the ring, one pair at a time."""
    colour = 2 if nodes % 2 and left_node == nodes - 1 else left_node % 2
    return colour, left_node


class BuddyCopies:
    """One rank's side of the exchange: `send(path)` after each snapshot (returns at once), `wait()` before the
    next one and before anything that must see no copy arrive later (a discard, the end)."""

    def __init__(self, rank: int, world_size: int, local_world_size: int, store: Any,
                 log: Callable[[str], None] = print, timeout_s: float = 600) -> None:
        """`store`: the node's SnapshotStore (committed_size, copy_target, commit_copy). Collective: every rank
        forms its pair groups here."""
        self.rank, self.store, self.log = rank, store, log
        self.next, self.prev = buddy_ranks(rank, world_size, local_world_size)
        nodes, node = world_size // local_world_size, rank // local_world_size
        left_of = {(node, self.next): node, (self.prev, rank): (node - 1) % nodes}
        pairs = sorted({tuple(sorted(p)): pair_order(left, nodes) for p, left in left_of.items()}.items(),
                       key=lambda item: item[1])
        groups = {pair: dist.new_group(list(pair), backend="gloo", use_local_synchronization=True,
                                       timeout=timedelta(seconds=timeout_s)) for pair, _ in pairs}
        self.to_next = groups[tuple(sorted((rank, self.next)))]
        self.from_prev = groups[tuple(sorted((self.prev, rank)))]
        self.out = self.into = None  # the two message buffers, made at the first exchange
        self.jobs: queue.Queue[Optional[Path]] = queue.Queue()
        self.done = threading.Event()
        self.done.set()
        self.failed: Optional[str] = None
        self.unkept = 0
        threading.Thread(target=self.run, name="snapshot-buddy", daemon=True).start()

    def send(self, path: Optional[Path]) -> None:
        """Exchange the snapshot in `path` (None: this rank has none to send this time; it still receives)."""
        self.done.clear()
        self.jobs.put(path)

    def wait(self) -> None:
        self.done.wait()

    def run(self) -> None:
        while True:
            path = self.jobs.get()
            try:
                if self.failed is None:
                    self.exchange(path)
            except ExchangeFailed as e:  # a peer gone: every failure does this, and the training's own
                self.failed = str(e)  # collectives say so (no second line)
            except Exception as e:  # noqa: BLE001  a bug of this thread's: no more exchanges (the peer's times out)
                self.failed = f"{type(e).__name__}: {e}"
                self.log(f"buddy copies stop on rank {self.rank}: {self.failed}")
            finally:
                self.done.set()

    def exchange(self, path: Optional[Path]) -> None:
        """Send this rank's slot to the next node's rank and receive the one before's, chunk by chunk, both at
        once: first the sizes, then the bytes."""
        source = self.local(lambda: open(path, "rb"), None) if path is not None else None  # noqa: SIM115
        n_out = self.local(lambda: self.store.committed_size(path), 0) if source is not None else 0
        sizes = torch.tensor([n_out], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        self.both(dist.isend(sizes[0], self.next, group=self.to_next), dist.irecv(sizes[1], self.prev,
                                                                               group=self.from_prev))
        n_in = int(sizes[1].item())
        target: Optional[tuple[Path, numpy.ndarray]] = None
        keep = n_in > 0
        try:
            if not (n_out or n_in):
                return
            if self.out is None:
                self.out, self.into = torch.empty(CHUNK, dtype=torch.uint8), torch.empty(CHUNK, dtype=torch.uint8)
            for at in range(0, max(n_out, n_in), CHUNK):
                sent = self.read_chunk(source, at, min(CHUNK, n_out - at)) if at < n_out else None
                got = self.into[:min(CHUNK, n_in - at)] if at < n_in else None
                self.both(dist.isend(sent, self.next, group=self.to_next) if sent is not None else None,
                          dist.irecv(got, self.prev, group=self.from_prev) if got is not None else None)
                if got is not None and keep:
                    target = self.local(lambda: self.keep_chunk(target, got.numpy(), at, n_in), None)
                    keep = target is not None
            if keep and target is not None:
                keep = self.local(lambda: self.store.commit_copy(*target) or True, False)
        finally:
            if source is not None:
                source.close()

    def read_chunk(self, source: Any, at: int, n: int) -> torch.Tensor:
        """Bytes [at, at + n) of this rank's slot, in the send buffer. A slot that cannot be read sends zeros,
        which fail the copy's checksum where it is ever used."""
        view = self.out[:n]
        try:
            source.seek(at)
            source.readinto(memoryview(view.numpy()))
        except (OSError, ValueError):
            view.zero_()
        return view

    def keep_chunk(self, target: Optional[tuple[Path, numpy.ndarray]], chunk: numpy.ndarray, at: int,
                   size: int) -> tuple[Path, numpy.ndarray]:
        """Into the buddy slot; the first chunk (which holds the header) chooses and maps the slot."""
        if target is None:
            target = self.store.copy_target(chunk[:min(len(chunk), 4096)].tobytes(), size)
            target[1][8:len(chunk)] = chunk[8:]  # its commit mark stays cleared until commit_copy
        else:
            target[1][at:at + len(chunk)] = chunk
        return target

    def local(self, work: Callable[[], Any], instead: Any) -> Any:
        """`work()`, or `instead` where it failed here (this node's memory full, a slot unreadable): that copy is
        lost, not the exchange."""
        try:
            return work()
        except Exception as e:  # noqa: BLE001  any local failure costs one copy
            if not self.unkept:
                self.log(f"buddy copies on rank {self.rank}: one not kept or sent ({type(e).__name__}: {e}); "
                         "the exchanges go on")
            self.unkept += 1
            return instead

    @staticmethod
    def both(*works: Optional[dist.Work]) -> None:
        for work in works:
            if work is None:
                continue
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001  gloo's errors are RuntimeErrors of many kinds
                raise ExchangeFailed(f"{type(e).__name__}: {e}") from None
