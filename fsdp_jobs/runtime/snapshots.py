"""In-memory snapshots: every rank's sharded training state, every `checkpoint.memory_interval` steps, in
node-local shared memory that outlives the rank's process, so that a restart resumes from the step before
the failure instead of the last DCP checkpoint, and without reading the shared file system.

The component owns its schedule (`due`), its layout (`SnapshotStore`) and its recovery (`plan_restore`,
`restore`), as the checkpoint manager owns DCP's; the step loop only asks.

Layout: one directory per node in node-local memory (the node wrapper's, fsdp_jobs/rundir/liveness.py
local_dir: it removes it when the node's part of the job ends, so it outlives every rank of every restart
on that node, and nothing stays behind). In it, two slots per rank (double-buffered), `r{rank}-{0,1}.snap`,
each a header (step, the job's identity, the mesh, the shard this state is, the offsets and checksums of the
tensors' bytes), the bytes of every local tensor, and the skeleton of the rest. A snapshot overwrites the
older slot: its header is cleared first and written last, so a rank killed mid-copy leaves that slot
invalid and the other whole. Two are enough: the ranks write synchronously, so when any rank writes step
K every rank has finished the snapshot before K (step K's collectives needed them all), and that one is
in the slot K does not overwrite. Where the replica check (fsdp_jobs/runtime/sdc.py) comes every few snapshots, the
slot it vouched for is kept instead, and the unchecked snapshots between take turns in the other (`older_slot`).

A failure is still a cold restart of every rank (torchrun's agent restarts them all: fsdp_jobs/ARCHITECTURE.md,
pitfall 27); what changes is where the restarted ranks take their state from.

Recovery (collective, before anything is loaded): every rank says which snapshots its node holds; the
newest step that every rank can get, from its own node's memory or from a rank of another replica group
holding the same shard (HSDP: the replicate dimension) or a buddy copy of it (full_shard over nodes:
fsdp_jobs/runtime/buddies.py), wins if it is at least as new as the newest DCP checkpoint. A rank whose node
lost its memory (a replaced or restarted node) receives the bytes from such a peer over the process group;
nothing is read from disk. Anything else (a different world or mesh, two neighbouring nodes lost under
full_shard, snapshots that fail their checksum or hold non-finite values) falls back to the DCP checkpoint, which
stays the source of truth for what memory cannot survive.

Cost per rank: two copies of its state shard in node memory (params + optimizer moments, in their dtypes:
`fsdp_jobs/planning/plan.py` computes it at plan time), two more of another node's rank's where it keeps buddy
copies, and one memory copy of it per snapshot; nothing on the shared file system per step, and on the
network only the buddy copies (off the step path).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy
import torch
import torch.distributed as dist

from fsdp_jobs.planning import faults
from fsdp_jobs.planning.plan import keeps_buddy_copies
from fsdp_jobs.runtime.buddies import BuddyCopies

MAGIC = b"FSDPSNP2"  # 2: the tensors' region checked by word sums (`checksum`), the skeleton by CRC-32
PENDING = b"FSDPSNPW"  # written whole, waiting for the replica check that vouches for it (then VOUCHED)
VOUCHED = b"FSDPSNPV"  # committed, and a replica check agreed on its state (MAGIC: committed, no check at its step)
SUFFIX = ".snap"
NAME = re.compile(r"([rb])(\d+)-([01])\.snap")  # r: a rank's own slots; b: copies of another node's rank (buddies)
AUTO = "auto"
AUTO_SHARE = 0.02  # memory_interval=auto: the smallest interval whose snapshots cost at most this share of the steps
CHECK_SHARE = 0.01  # ... and the replica check's (fault.sdc_check_interval=auto: fsdp_jobs/runtime/sdc.py) at most this
AUTO_MEASURE = 5  # snapshots timed before auto chooses
# ... where it times the replica check too: a snapshot every step, a check every MEASURE_PERIOD-th (the step after
# it reads its verdict, the one after that is a step alone), for this many steps
MEASURE_PERIOD, MEASURE_CHECKED = 3, 15
# what the trainer times of a check (its launch, its verdict's read) leaves out what reading the state costs the next
# step's computation: budgeted as this share more (`bench snapshot`'s check_every_2nd measures the whole)
CHECK_UNTIMED = 1.25
# test-only fault injection: "STEP" makes the last rank SIGKILL itself half way through writing that
# step's snapshot, on the first attempt only
CRASH_IN_SNAPSHOT_ENV = "FSDP_JOBS_TEST_CRASH_IN_SNAPSHOT"


@dataclass(frozen=True)
class Held:
    """A complete snapshot a rank can read from its node's memory."""

    path: str
    owner: int  # the rank that wrote it
    step: int
    shard: int  # which shard of the state it is: ranks of one shard hold the same bytes
    nbytes: int  # the file's size
    pending: bool = False  # written whole, its replica check not yet read by this rank (PENDING): see `choose`
    vouched: bool = False  # a replica check agreed on it (VOUCHED)
    sums: Optional[tuple[int, ...]] = None  # its tensors' checksum: replicas of one shard at one step hold the same


@dataclass
class RestorePlan:
    """Where every rank's state comes from: `sources[r]` is None (its own node's memory: `files[r]`, the
    snapshot it reads) or the rank that sends it `sent[r]` (a file of that rank's node: a replica's own slot, or
    a buddy copy, which holds another shard than the sender's own)."""

    step: int
    files: dict[int, Held]
    sources: dict[int, Optional[int]]
    sent: dict[int, Held] = field(default_factory=dict)
    agreed: int = 0  # the newest step at or before `step` a replica check agreed on (memory, disk; 0: the start)


def shard_of(rank: int, mesh_shape: dict[str, int]) -> int:
    """The shard of the training state a rank holds: with a replicate dimension (HSDP, no_shard), ranks at
    the same place in their shard group hold identical state; else each rank its own."""
    return rank % mesh_shape.get("shard", 1) if "replicate" in mesh_shape else rank


# ---------------------------------------------------------------------- the state, flat
TENSOR = "__snapshot_tensor__"  # a leaf's place in the skeleton: {TENSOR: index, "dtensor": whether it was one}
TUPLE = "__snapshot_tuple__"


def tuples(node: Any) -> Any:
    """The skeleton as captured: its tuples, which JSON kept as {TUPLE: [...]}, tuples again."""
    if isinstance(node, dict):
        return tuple(tuples(v) for v in node[TUPLE]) if TUPLE in node else {k: tuples(v) for k, v in node.items()}
    if isinstance(node, list):
        return [tuples(v) for v in node]
    return node


def capture(state: Any) -> tuple[list[torch.Tensor], Any]:
    """This rank's local state: every tensor leaf (a DTensor's local shard) and the skeleton that holds
    everything else. Modules and optimizers through their own state_dict (the DTensors they hold: no
    gather, no copy), unlike DCP's API, whose name mapping costs more than the copy of a small shard."""
    tree: dict[str, Any] = {"progress": {"step": state.step, "samples_seen": state.samples_seen},
                            "rng": torch.get_rng_state()}
    if state.cuda_rng is not None:
        tree["cuda_rng"] = torch.cuda.get_rng_state(state.cuda_rng)
    for name, obj in state.objects.items():
        tree[name] = obj.state_dict()
    tensors: list[torch.Tensor] = []

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()}
        if isinstance(node, tuple):  # JSON has no tuples: an optimizer's betas must come back as one
            return {TUPLE: [strip(v) for v in node]}
        if isinstance(node, list):
            return [strip(v) for v in node]
        if isinstance(node, torch.Tensor):
            tensors.append(node.to_local() if hasattr(node, "to_local") else node)
            return {TENSOR: len(tensors) - 1, "dtensor": hasattr(node, "to_local")}
        return node

    return tensors, strip(tree)


def apply(state: Any, tensors: list[torch.Tensor], skeleton: Any) -> None:
    """Load what `capture` took into `state` (a fresh process's objects of the same shapes and mesh): a
    module's tensors copied into its own, an optimizer's shards made DTensors again on their parameter's
    mesh and placements, then each object's load_state_dict."""
    for name, obj in state.objects.items():
        saved = skeleton[name]
        if isinstance(obj, torch.nn.Module):
            own = obj.state_dict()
            with torch.no_grad():
                for key, value in own.items():
                    local(value).copy_(tensors[saved[key][TENSOR]])
            obj.load_state_dict(own)
        elif isinstance(obj, torch.optim.Optimizer):
            params = [p for group in obj.param_groups for p in group["params"]]
            state_of = {int(i): {k: _optimizer_value(v, tensors, params[int(i)]) for k, v in per.items()}
                        for i, per in saved["state"].items()}
            obj.load_state_dict({"state": state_of, "param_groups": saved["param_groups"]})
        else:
            obj.load_state_dict(_fill(saved, tensors))
    state.step, state.samples_seen = int(skeleton["progress"]["step"]), int(skeleton["progress"]["samples_seen"])
    # a generator's state is read from its storage's start: a tensor of its own, not a view into the slot
    # (fsdp_jobs/ARCHITECTURE.md, pitfall 24)
    torch.set_rng_state(tensors[skeleton["rng"][TENSOR]].clone())
    if state.cuda_rng is not None and "cuda_rng" in skeleton:
        torch.cuda.set_rng_state(tensors[skeleton["cuda_rng"][TENSOR]].clone(), state.cuda_rng)


def _optimizer_value(value: Any, tensors: list[torch.Tensor], param: torch.Tensor) -> Any:
    if not (isinstance(value, dict) and TENSOR in value):
        return value
    t = tensors[value[TENSOR]]
    if value["dtensor"] and hasattr(param, "device_mesh"):  # a moment of a sharded parameter: its shard, its layout
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(t.to(param.to_local().device), param.device_mesh, param.placements,
                                  run_check=False, shape=param.shape, stride=param.stride())
    return t.clone()


def _fill(node: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(node, dict) and TENSOR in node:
        return tensors[node[TENSOR]].clone()
    if isinstance(node, dict):
        return {k: _fill(v, tensors) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_fill(v, tensors) for v in node)
    return node


def local(value: Any) -> Any:
    return value.to_local() if hasattr(value, "to_local") else value


# ---------------------------------------------------------------------- one node's files
ALIGN = 64  # each tensor's bytes start at a multiple: any dtype can be viewed in place
HEADER = 4096  # the header's room at the front of a slot; written last, so a torn write leaves no valid one


def byte_tensor(data: bytes) -> torch.Tensor:
    """A writable uint8 tensor over a copy of `data` that keeps its memory alive (torch.frombuffer's does not:
    fsdp_jobs/ARCHITECTURE.md, pitfall 25)."""
    return torch.from_numpy(numpy.frombuffer(bytearray(data), dtype=numpy.uint8))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


BULK = 1 << 20  # bytes: a host tensor smaller than this is copied with the others in one call


CHECK_BLOCK = 8192  # words (64 KiB) a block of `checksum`'s weighted sum


def checksum(region: numpy.ndarray) -> list[int]:
    """The tensors' region (a multiple of 8 bytes: ALIGN) read as 64-bit words: their sum and their blocks' sums
    weighted by position, both mod 2^64 (numpy's integer adds wrap). One pass at memory speed, where zlib's
    CRC-32 took 20 times longer than the copy it guards; any one flipped bit moves the sum, and two that cancel in
    it must also sit in one block. What it guards: a snapshot read back that is not what was written (a commit
    protocol bug, bit rot in node memory, a peer's bytes); a writer killed mid-copy is the header's to catch."""
    words = region.view(numpy.uint64)
    if not words.size:
        return [0, 0]
    blocks = numpy.add.reduceat(words, numpy.arange(0, words.size, CHECK_BLOCK))
    weights = numpy.arange(1, blocks.size + 1, dtype=numpy.uint64)
    return [int(blocks.sum(dtype=numpy.uint64)), int((blocks * weights).sum(dtype=numpy.uint64))]


def copy_tensors(places: list[Any], tensors: list[torch.Tensor]) -> None:
    """Copy each tensor into its place in a slot's mapping. The small host tensors in one call (a small model's
    ~100 tensors cost more in per-tensor calls than in bytes); a large one, or a GPU's, by one thread's memcpy of
    its host bytes: torch's copy_ hands a large copy to its thread pool, which on busy cores waits for threads
    more than it copies (fsdp_jobs/ARCHITECTURE.md, pitfall 26)."""
    small: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    for place, t in zip(places, tensors):
        if place is None:
            continue
        if t.device.type == "cpu" and t.numel() * t.element_size() < BULK:
            small[0].append(place)
            small[1].append(t.detach())
        else:
            place.reshape(-1).view(torch.uint8).numpy()[:] = t.detach().reshape(-1).view(torch.uint8).cpu().numpy()
    if small[0]:
        torch._foreach_copy_(*small)


class SnapshotStore:
    """The snapshot slots in one node's memory directory: `r{owner}-{slot}.snap`, two per rank, each a
    header, then the tensors' bytes, then the pickled skeleton. A write overwrites the older slot in
    place (no new pages to allocate after the first: tmpfs) and commits by writing its header last; the
    header is cleared first, so a writer killed mid-copy leaves that slot invalid and the other whole. A slot
    a replica check vouched for is kept until a newer one is vouched for (`older_slot`)."""

    def __init__(self, directory: Path, identity: dict[str, Any]) -> None:
        self.dir, self.identity = directory, identity
        self.maps: dict[Path, torch.Tensor] = {}
        # the step in each slot this process wrote or read, and whether a check vouched for it: no header read per write
        self.steps: dict[Path, tuple[int, bool]] = {}
        self.views: dict[Path, tuple[torch.Tensor, list[Any], list[Any]]] = {}  # `places`' views, by slot

    def slot(self, owner: int, index: int, kind: str = "r") -> Path:
        return self.dir / f"{kind}{owner}-{index}{SUFFIX}"

    def write(self, owner: int, step: int, shard: int, tensors: list[torch.Tensor], skeleton: Any,
              crash_half_way: bool = False, commit: bool = True) -> Path:
        """Write one snapshot into `owner`'s older slot (or an empty one). `commit` False: pending, everything but
        the mark that makes it valid (`vouch` sets it: once a replica check agreed on its state)."""
        path = self.older_slot(owner)
        layout, at = [], HEADER
        for t in tensors:
            layout.append([str(t.dtype).removeprefix("torch."), list(t.shape), at])
            at = _aligned(at + t.numel() * t.element_size())
        meta = json.dumps({"skeleton": skeleton, "tensors": layout}).encode()
        end = at + len(meta)
        mapped_t = self.mapping(path, end)
        mapped = mapped_t.numpy()
        mapped[:len(MAGIC)] = 0  # invalid until the header is written again
        places = self.places(path, mapped_t, tensors, layout)
        half = len(tensors) // 2
        copy_tensors(places[:half], tensors[:half])
        if crash_half_way:
            os.kill(os.getpid(), signal.SIGKILL)  # test fault injection: killed mid-copy
        copy_tensors(places[half:], tensors[half:])
        mapped[at:end] = numpy.frombuffer(meta, dtype=numpy.uint8)
        header = json.dumps({**self.identity, "step": step, "owner": owner, "shard": shard, "meta": [at, end],
                             "sums": checksum(mapped[HEADER:at]), "crc": zlib.crc32(meta)}).encode()
        if len(header) + len(MAGIC) + 8 > HEADER:
            raise ValueError(f"a snapshot header of {len(header)} bytes does not fit its {HEADER}")
        head = MAGIC + struct.pack("<Q", len(header)) + header
        mapped[len(MAGIC):len(head)] = numpy.frombuffer(head[len(MAGIC):], dtype=numpy.uint8)
        self.steps.pop(path, None)  # not a snapshot until committed: the next write may take this slot
        if commit:
            self.commit(path, step)
        else:
            mapped[:len(PENDING)] = numpy.frombuffer(PENDING, dtype=numpy.uint8)
        return path

    def commit(self, path: Path, step: int, mark: bytes = MAGIC) -> None:
        self.mapping(path, 0).numpy()[:len(mark)] = numpy.frombuffer(mark, dtype=numpy.uint8)  # the commit
        self.steps[path] = (step, mark == VOUCHED)

    def vouch(self, path: Path, step: int) -> None:
        """A pending snapshot's replica check agreed: committed, and kept until a newer vouched one (`older_slot`)."""
        self.commit(path, step, VOUCHED)

    def places(self, path: Path, mapped: torch.Tensor, tensors: list[torch.Tensor], layout: list[Any]) -> list[Any]:
        """Each tensor's place in the slot's mapping, a view of its dtype and shape (None: no bytes), made once
        for a slot's layout (every snapshot of a run has the same one, after the optimizer's first step)."""
        cached = self.views.get(path)
        if cached is not None and cached[0] is mapped and cached[1] == layout:
            return cached[2]
        views = [mapped[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape) if t.numel() else None
                 for t, (_, _, off) in zip(tensors, layout)]
        self.views[path] = (mapped, layout, views)
        return views

    def mapping(self, path: Path, end: int) -> torch.Tensor:
        """The slot file mapped shared, at least `end` bytes: grown with room to spare, so that a skeleton a
        few bytes longer (a step count's digits) does not map the file again."""
        mapped = self.maps.get(path)
        if mapped is None or mapped.numel() < end:
            size = end + end // 64 + 4096
            with open(path, "ab") as f:  # pages taken now: a full tmpfs is ENOSPC here, not a SIGBUS mid-copy
                os.posix_fallocate(f.fileno(), 0, size)
            mapped = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
            self.maps[path] = mapped
        return mapped

    def copy_target(self, head: bytes, size: int) -> tuple[Path, numpy.ndarray]:
        """Where a copy of another node's rank's snapshot (`size` bytes, beginning with `head`: its header) goes:
        that rank's older buddy slot here, mapped, its commit mark cleared. The same order as `write` (the mark
        cleared first, set last by `commit_copy`), so a copy cut short is none (fsdp_jobs/runtime/buddies.py)."""
        path = self.older_slot(int(parse_header(head)["owner"]), kind="b")
        mapped = self.mapping(path, size).numpy()
        mapped[:len(MAGIC)] = 0
        self.steps.pop(path, None)
        return path, mapped

    def commit_copy(self, path: Path, mapped: numpy.ndarray) -> None:
        mapped[:len(MAGIC)] = numpy.frombuffer(MAGIC, dtype=numpy.uint8)
        self.steps[path] = (read_header(path)["step"], False)

    @staticmethod
    def committed_size(path: Path) -> int:
        """The bytes of a slot's committed snapshot (not the room to spare after it); 0 where it holds none."""
        try:
            return int(read_header(path)["meta"][1])
        except (OSError, ValueError, KeyError):
            return 0

    def older_slot(self, owner: int, kind: str = "r") -> Path:
        """The slot to write next: an empty or invalid one, else the older, but never the newest one a replica check
        vouched for: where a check finds corruption the job rolls back to it. With checks every few snapshots the
        unchecked ones take turns in the other slot; a writer killed mid-copy of one leaves the vouched snapshot
        whole, and its shard's other replicas the step it was writing (taken only where two agree: `choose`). A
        third slot would keep the unchecked one before it too, at half as much node memory again."""
        held: dict[Path, tuple[int, bool]] = {}
        for index in (0, 1):
            path = self.slot(owner, index, kind)
            if path not in self.steps:
                try:
                    header = read_header(path)
                except (OSError, ValueError, KeyError):
                    header = {"pending": True}
                if header["pending"]:  # no snapshot of its own yet: the one to write over
                    self.steps.pop(path, None)
                    return path
                self.steps[path] = (header["step"], header["vouched"])
            held[path] = self.steps[path]
        vouched = [p for p in held if held[p][1]]
        if vouched:
            keep = max(vouched, key=lambda p: held[p][0])
            return next(p for p in held if p != keep)
        return min(held, key=lambda p: held[p][0])

    def held(self) -> list[Held]:
        """The complete snapshots of this job's identity here (headers only: the checksum is checked on read)."""
        found = []
        for name in sorted(os.listdir(self.dir)):
            if not NAME.fullmatch(name):
                continue
            try:
                header = read_header(self.dir / name)
            except (OSError, ValueError):
                continue
            size = (self.dir / name).stat().st_size
            if all(header.get(k) == v for k, v in self.identity.items()) and size >= header["meta"][1]:
                found.append(Held(str(self.dir / name), header["owner"], header["step"], header["shard"], size,
                                  header["pending"], header["vouched"], tuple(header.get("sums") or ())))
        return found

    def invalidate(self, keep_until: Optional[int] = None) -> None:
        """Clear the header of every slot newer than `keep_until` (None: of every slot)."""
        self.steps.clear()
        for name in os.listdir(self.dir):
            m = NAME.fullmatch(name)
            if m is None:
                continue
            try:
                step = read_header(self.dir / name)["step"]
            except (OSError, ValueError, KeyError):
                continue
            if keep_until is None or step > keep_until:
                with open(self.dir / name, "r+b") as f:
                    f.write(bytes(len(MAGIC)))


def read_header(path: Path) -> dict[str, Any]:
    """A slot's header; ValueError when it holds no committed snapshot."""
    with open(path, "rb") as f:
        return parse_header(f.read(HEADER), path.name)


def parse_header(head: bytes, name: str = "snapshot") -> dict[str, Any]:
    """A slot's header, with "pending": whether it waits for its replica check (PENDING), and "vouched": whether
    one agreed on it (VOUCHED); ValueError where the slot holds neither a committed nor a whole pending snapshot."""
    if len(head) < len(MAGIC) + 8 or not head.startswith((MAGIC, PENDING, VOUCHED)):
        raise ValueError(f"{name}: no committed snapshot")
    (n,) = struct.unpack("<Q", head[len(MAGIC):len(MAGIC) + 8])
    return {**json.loads(head[len(MAGIC) + 8:len(MAGIC) + 8 + n]), "pending": head.startswith(PENDING),
            "vouched": head.startswith(VOUCHED)}


def decode(blob: bytes) -> tuple[int, list[torch.Tensor], Any]:
    """(step, tensors, skeleton) of a whole slot file's bytes; ValueError if it fails its checksum."""
    header = parse_header(blob)
    at, end = header["meta"]
    if len(blob) < end:
        raise ValueError(f"snapshot of step {header['step']} by rank {header['owner']} is {len(blob)} bytes, not {end}")
    try:
        meta = json.loads(blob[at:end])
    except ValueError:
        raise ValueError(f"snapshot of step {header['step']} by rank {header['owner']} fails its checksum") from None
    flat = byte_tensor(blob)
    tensors = []
    for dtype, shape, off in meta["tensors"]:
        kind = getattr(torch, dtype)
        n = math.prod(shape) * torch.empty(0, dtype=kind).element_size()
        tensors.append(flat[off:off + n].view(kind).reshape(shape))
    region = numpy.frombuffer(blob, dtype=numpy.uint8, count=at - HEADER, offset=HEADER)
    if checksum(region) != header.get("sums") or zlib.crc32(memoryview(blob)[at:end]) != header["crc"]:
        raise ValueError(f"snapshot of step {header['step']} by rank {header['owner']} fails its checksum")
    return header["step"], tensors, tuples(meta["skeleton"])


def read_slot(held: Held) -> tuple[Optional[bytes], Optional[str]]:
    """A snapshot file's bytes, or None and why; nbytes of them (the size it had when the plan was made: a
    receiver allocates that much)."""
    try:
        return Path(held.path).read_bytes()[:held.nbytes].ljust(held.nbytes, b"\0"), None
    except OSError as e:
        return None, f"cannot read {held.path}: {e}"


def collective_device() -> torch.device:
    """Where the default group's tensors must be: NCCL's on this rank's GPU, gloo's on the host."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------------- choosing where state comes from
def choose(held_by_rank: list[list[Held]], shards: list[int], disk_step: Optional[int],
           checked: bool = False) -> Optional[RestorePlan]:
    """The newest step that memory covers for every rank, no older than the newest DCP checkpoint; None when
    memory covers none. Every rank computes the same plan from the same gathered lists. `checked`: the replica
    check vouches for snapshots (fsdp_jobs/runtime/sdc.py), and a rank takes another rank's snapshot of a step it
    did not vouch for only where two or more replicas hold that step with the same checksum: one replica's unchecked
    state may hold the corruption the next check is to find, and a copy of it would make the replicas agree on it."""
    # a pending snapshot is vouched for where another rank vouched for one of its step: a rank does only once the
    # vote carrying that step's check is in, which every rank's fingerprint (taken before its copy) made
    vouched = {h.step for held in held_by_rank for h in held if h.vouched}
    held_by_rank = [[h for h in held if not h.pending or h.step in vouched] for held in held_by_rank]
    # nor a step rank 0 left pending: it writes a checked step's metrics rows right before it commits (trainer
    # settle_check), so a resume after that step would leave its rows unwritten for good
    unlogged = {h.step for held in held_by_rank for h in held if h.pending and h.owner == 0}
    steps = sorted({h.step for held in held_by_rank for h in held} - unlogged, reverse=True)

    sums: dict[tuple[int, int], dict[int, Any]] = {}  # (step, shard) -> each holder's checksum: one pass, not one a rank
    for held in held_by_rank:
        for h in held:
            sums.setdefault((h.step, h.shard), {})[h.owner] = h.sums

    def copyable(step: int, shard: int) -> bool:
        alike = sums.get((step, shard), {})
        return not checked or step in vouched or (len(alike) >= 2 and len(set(alike.values())) == 1)

    for step in steps:
        if disk_step is not None and step < disk_step:
            return None
        files: dict[int, Held] = {}
        sent: dict[int, Held] = {}
        sources: dict[int, Optional[int]] = {}
        for rank, shard in enumerate(shards):
            others = copyable(step, shard)
            own = [h for h in held_by_rank[rank] if h.step == step and h.shard == shard and (h.owner == rank or others)]
            if own:  # its own node: prefer the file it wrote itself
                files[rank] = min(own, key=lambda h: (h.owner != rank, h.owner))
                sources[rank] = None
                continue
            holders = [r for r, held in enumerate(held_by_rank)
                       if any(h.step == step and h.shard == shard for h in held)]
            if not holders or not others:
                break
            source = holders[rank % len(holders)]
            sources[rank] = source
            sent[rank] = min((h for h in held_by_rank[source] if h.step == step and h.shard == shard),
                             key=lambda h: (h.owner != source, h.owner))
        else:
            # a checkpoint was checked before it was saved; with neither, the start (every replica's from one seed)
            agreed = max((s for s in vouched if s <= step), default=0)
            return RestorePlan(step, files, sources, sent, max(agreed, disk_step or 0))
    return None


# ---------------------------------------------------------------------- the component
class MemorySnapshots:
    """In-memory snapshots of one rank: schedule, save, and recovery (see the module docstring)."""

    def __init__(self, directory: Optional[Path], rank: int, world_size: int, mesh_shape: dict[str, int],
                 every: Any, identity: dict[str, Any], log: Callable[[str], None] = print,
                 record: Optional[Callable[[dict[str, Any]], None]] = None, local_world_size: int = 0,
                 timeout_s: float = 600) -> None:
        """`record`: given auto's choice and its inputs (rank 0's goodput timeline keeps it). Collective where
        the job needs buddy copies (fsdp_jobs/runtime/buddies.py): `local_world_size`, the ranks a node (0: one
        node holds every rank, as a test's world does); `timeout_s`, how long a copy's message may wait for its
        peer (train.collective_timeout_s)."""
        self.rank, self.world_size, self.mesh_shape, self.log = rank, world_size, mesh_shape, log
        self.record = record
        self.shard = shard_of(rank, mesh_shape)
        self.enabled = directory is not None and every not in (0, "0", None)
        self.every = 1 if every == AUTO else int(every or 0)
        self.auto = every == AUTO
        self.store = SnapshotStore(directory, {**identity, "world_size": world_size, "mesh": mesh_shape}) \
            if directory is not None else None
        self.costs: list[float] = []
        self.last_at: Optional[tuple[int, float, bool]] = None  # (step, time, checked) of the last snapshot: auto's
        self.step_times: list[float] = []  # ... steps, where no check touched them
        self.check_costs: list[float] = []  # what the trainer timed of each check while auto measured
        self.times_checks = False  # auto times the replica check too and chooses its interval (`check_every`)
        self.checked = False  # a replica check vouches for snapshots: `choose` copies unchecked ones where two agree
        self.check_every = 0  # that choice: a multiple of `every`; 0 until made
        self.crash_at = faults.step(CRASH_IN_SNAPSHOT_ENV)
        self.unwritable: Optional[str] = None  # why this process writes no more snapshots (node memory full)
        self.uncommitted: Optional[tuple[Path, int]] = None  # the snapshot a replica check is to vouch for
        self.buddies: Optional[BuddyCopies] = None
        nodes = world_size // (local_world_size or world_size)
        if self.enabled and self.store is not None and keeps_buddy_copies(nodes, mesh_shape):
            self.buddies = BuddyCopies(rank, world_size, local_world_size, self.store, log=log, timeout_s=timeout_s)

    # ------------------------------------------------------------------ schedule and save
    def interval(self) -> Any:
        """checkpoint.memory_interval as this process keeps it: AUTO until chosen, 0 where none are kept."""
        return 0 if not self.enabled else AUTO if self.auto else self.every

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def time_checks(self) -> None:
        """fault.sdc_check_interval=auto beside memory_interval=auto: time the replica check with the snapshots
        and choose its interval too (the check's schedule while timed: `measuring_checks`)."""
        self.times_checks = self.auto

    def measuring_checks(self, step: int) -> bool:
        """While auto times the replica check: whether `step` is one it checks."""
        return self.times_checks and self.auto and step % MEASURE_PERIOD == 0

    def save(self, state: Any, restart: int = 0, commit: bool = True, checked: bool = False,
             check_s: Optional[float] = None) -> float:
        """Copy this rank's state into its node's memory; returns the seconds it took. `commit` False: valid
        only once `vouch()` is called (a replica check of this step's state is under way: fsdp_jobs/runtime/sdc.py),
        so a rank that dies before then leaves the snapshot before. `checked`: a check of this step was launched;
        `check_s`: what the last check to be read took (memory_interval=auto spaces checks by it)."""
        assert self.store is not None
        began = time.perf_counter()
        tensors, skeleton = capture(state)
        crash = (bool(self.crash_at) and self.crash_at == state.step and restart == 0 and self.rank == self.world_size - 1)
        if self.buddies is not None:
            self.buddies.wait()  # the previous snapshot is the buddy's now: this one may overwrite the slot before it
        written = None
        if self.unwritable is None:
            try:
                written = self.store.write(self.rank, state.step, self.shard, tensors, skeleton, crash_half_way=crash,
                                           commit=commit or self.buddies is not None)
                self.uncommitted = None if commit else (written, state.step)
            except OSError as e:  # the snapshot is lost, not the step: its schedule (and auto's vote) goes on
                self.unwritable = f"{e.strerror or e} ({self.store.dir})"
                self.log(f"in-memory snapshots stop on rank {self.rank} at step {state.step}: {self.unwritable}; "
                         "training goes on, a failure now resumes from the DCP checkpoint (free node memory: "
                         "/dev/shm, or checkpoint.memory_interval=0)")
        if self.buddies is not None:
            self.buddies.send(written)  # None: nothing to keep this time, but every pair exchanges every snapshot
        cost = time.perf_counter() - began
        self.measure(state.step, cost, checked, check_s)
        return cost

    def measure(self, step: int, cost: float, checked: bool = False, check_s: Optional[float] = None) -> None:
        """memory_interval=auto: time the first snapshots (every step), the steps between them that no check
        touched (launched at it, or read at its start), and what the trainer timed of a check (`check_s`); then
        choose."""
        now = time.perf_counter()
        if not self.auto:
            return
        self.costs.append(cost)
        if check_s is not None:
            self.check_costs.append(check_s)
        if self.last_at is not None and step == self.last_at[0] + 1 and not checked and not self.last_at[2]:
            self.step_times.append(now - self.last_at[1] - cost)
        self.last_at = (step, now, checked)
        if len(self.costs) >= (MEASURE_CHECKED if self.times_checks else AUTO_MEASURE):
            self.choose_interval()

    def choose_interval(self) -> None:
        """Collective (every rank reaches its last timed snapshot at the same step): the largest choice of any
        rank, so every rank snapshots (and checks) the same steps; checks on snapshot steps (a multiple of their
        interval), so that each keeps one to roll back to."""
        cost = statistics.median(self.costs)
        step_s = statistics.median(self.step_times) if self.step_times else 0.0
        check = statistics.median(self.check_costs) if self.times_checks and self.check_costs else None
        every = max(1, math.ceil(cost / (AUTO_SHARE * step_s))) if step_s > 0 else 1
        check_every = max(1, math.ceil(check * CHECK_UNTIMED / (CHECK_SHARE * step_s))) \
            if check is not None and step_s > 0 else 1
        agreed = torch.tensor([every, check_every], dtype=torch.int64)
        if dist.is_initialized():
            agreed = agreed.to(collective_device())
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        self.every, self.auto = int(agreed[0].item()), False
        if self.times_checks:
            self.check_every = self.every * math.ceil(int(agreed[1].item()) / self.every)
        if self.record is not None:
            self.record({"steps": self.every, "snapshot_s": round(cost, 6), "step_s": round(step_s, 6),
                         "share": AUTO_SHARE, **({"check_steps": self.check_every, "check_s": round(check, 6),
                                                  "check_share": CHECK_SHARE} if check is not None else {})})
        checked = (f"; the replica check every {self.check_every} step(s), {check * 1000:.1f} ms each, at most "
                   f"{CHECK_SHARE:.0%}" if check is not None else "")
        self.log(f"checkpoint.memory_interval=auto: a snapshot every {self.every} step(s) (a snapshot "
                 f"{cost * 1000:.1f} ms, a step {step_s * 1000:.1f} ms on rank {self.rank}; at most "
                 f"{AUTO_SHARE:.0%} of the step time{checked})")

    def vouch(self) -> None:
        """The replica check agreed: the snapshot saved with commit=False is valid and vouched for (nothing if none)."""
        if self.uncommitted is not None and self.store is not None:
            self.store.vouch(*self.uncommitted)
        self.uncommitted = None

    def discard(self) -> None:
        """Forget every snapshot on this node (a rollback made them the wrong future)."""
        self.uncommitted = None
        self.close()  # no buddy copy arrives after this
        if self.store is not None:
            self.store.invalidate()

    def forget_after(self, step: Optional[int]) -> None:
        """Clear every snapshot on this node newer than `step` (None: every one): state a check did not vouch for
        (fsdp_jobs/runtime/sdc.py). One rank a node."""
        self.close()
        if self.store is not None:
            self.store.invalidate(keep_until=step)

    def close(self) -> None:
        """The last buddy exchange done: before the process group goes, so no peer is left mid-copy."""
        if self.buddies is not None:
            self.buddies.wait()

    # ------------------------------------------------------------------ recovery
    def plan_restore(self, disk_step: Optional[int]) -> Optional[RestorePlan]:
        """Collective: where each rank's state comes from, or None (DCP, or a fresh start). `disk_step`:
        the newest committed checkpoint's step as rank 0 sees it (None: none)."""
        if not self.enabled or self.store is None:
            return None
        mine = self.store.held()
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (mine, disk_step))
        disk = gathered[0][1]
        shards = [shard_of(r, self.mesh_shape) for r in range(self.world_size)]
        return choose([g[0] for g in gathered], shards, disk, self.checked)

    def restore(self, state: Any, plan: RestorePlan) -> Optional[dict[str, int]]:
        """Collective: load `plan`'s step into `state` on every rank; the count of ranks by source
        ("memory", "peer"), or None when any rank failed (every rank then leaves `state` as it was
        and the caller loads the DCP checkpoint)."""
        blob, why = self.fetch(plan)
        if blob is not None:
            try:
                step, tensors, skeleton = decode(blob)
                finite = all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())
                if step != plan.step or not finite:
                    raise ValueError(f"snapshot of step {step} holds non-finite values" if not finite
                                     else f"snapshot of step {step}, not {plan.step}")
            except ValueError as e:
                blob, why = None, str(e)
        ok = torch.tensor([0 if blob is None else 1], device=collective_device())
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not ok.item():
            if why:
                self.log(f"in-memory snapshot of step {plan.step} unusable here ({why}): loading from disk instead")
            return None
        apply(state, tensors, skeleton)
        used = plan.files.get(self.rank) if plan.sources[self.rank] is None else None
        if used is not None and used.pending and used.owner == self.rank and self.store is not None:
            self.store.vouch(Path(used.path), plan.step)  # vouched for (`choose`): the next writes keep it
        sources = [None] * self.world_size
        dist.all_gather_object(sources, "memory" if plan.sources[self.rank] is None else "peer")
        return {s: sources.count(s) for s in ("memory", "peer") if s in sources}

    def fetch(self, plan: RestorePlan) -> tuple[Optional[bytes], Optional[str]]:
        """This rank's snapshot bytes: read from its node, or received from its source rank; and it sends
        the bytes it is the source of. Point to point over the default group, all posted at once."""
        mine, why = None, None
        if self.rank in plan.files:
            mine, why = read_slot(plan.files[self.rank])
        device = collective_device()
        sends, ops, read = [], [], {}
        for dst, src in sorted(plan.sources.items()):
            if src == self.rank and dst != self.rank:
                held = plan.sent[dst]
                if held.path not in read:
                    read[held.path] = read_slot(held)[0]
                data = read[held.path]
                sends.append((byte_tensor(data) if data is not None  # unreadable: zeros, which fail the checksum
                              else torch.zeros(held.nbytes, dtype=torch.uint8)).to(device))
                ops.append(dist.P2POp(dist.isend, sends[-1], dst))
        got = None
        src = plan.sources[self.rank]
        if src is not None:
            got = torch.empty(plan.sent[self.rank].nbytes, dtype=torch.uint8, device=device)
            ops.append(dist.P2POp(dist.irecv, got, src))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if got is not None:
            return got.cpu().numpy().tobytes(), None
        return (mine, why) if plan.sources[self.rank] is None else (None, why)

    def after_restore(self, step: int, local_rank: int) -> None:
        """Each node's first rank invalidates what no longer belongs to the resumed run: snapshots newer than
        the resumed step (the lost future: they are taken again)."""
        if self.store is not None and local_rank == 0:
            self.store.invalidate(keep_until=step)
