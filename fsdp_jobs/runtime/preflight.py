"""preflight=true|only: every rank checks its node before any training step (README: Preflight).

    process group   it came up (bring-up ran before this), with how many nodes
    all-reduce      PREFLIGHT_ALLREDUCE_BYTES across the world, timed: bus bandwidth 2(n-1)/n x bytes / time;
                    then with each neighbour node in a ring of node pairs (3+ nodes), which tells nodes apart
    matmul          on this rank's device: TFLOPS (CUDA: synchronized before each clock read)
    run dir         a PREFLIGHT_WRITE_BYTES file written and fsynced: MB/s; free space vs the next checkpoint
    memory          host MemAvailable; on CUDA the device's free memory (torch.cuda.mem_get_info)

Each timing is the best of a few repeats: a shared machine's momentary contention is not the node's fault;
simulated nodes sharing one machine (one kernel: machine_id) time their local checks in turns, one run each,
so they neither slow each other down nor sample different stretches of the machine's other load.
Rank 0 gathers every rank's record (all_gather_object) and judges them (fsdp_jobs/runtime/preflight_verdict.py). When it
names a node for slowness alone, every rank measures again after RECHECK_PAUSE_S and the verdict is taken
on the better of each rank's two numbers: a node is named slow only when it was slow twice. Then rank 0
prints one table, writes the preflight record (RunDir.preflight_file) and, when a node is named, the state
"failed" with the reason.

Hot spares (cluster.spare_nodes) stand in for named nodes: when as many spares wait as nodes were named, and
none of those hosts the rendezvous store (preflight_verdict.why_no_spare), rank 0 records the named nodes
(RunDir.replaced_nodes_file) instead of failing the job, and every rank exits REPLACED_EXIT. Each agent then
restarts its ranks, except the named nodes' agents, which leave the rendezvous (launchers/node/agent.py), so
the next round takes spares in their place and preflights them with the rest: same world, mesh and batch.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional, TYPE_CHECKING

import torch
import torch.distributed as dist

from fsdp_jobs.planning import faults
from fsdp_jobs.rundir import liveness, replaced, runs
from fsdp_jobs.rundir.layout import RunDir
from fsdp_jobs.rundir.records import PreflightRecord, ReplacedNodes
from fsdp_jobs.runtime import preflight_verdict as preflight
from fsdp_jobs.runtime.loopback_store import STORE_HOST_ENV
from fsdp_jobs.runtime.mesh import World
from fsdp_jobs.runtime.metrics import log

if TYPE_CHECKING:  # types only: the ranks' config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig

PREFLIGHT_ALLREDUCE_BYTES = 4 * 1024**2
PREFLIGHT_WRITE_BYTES = 8 * 1024**2
REPEATS = 10  # the same on every rank: the all-reduce's are collective
RECHECK_PAUSE_S = 1.0  # before a recheck: a burst of the machine's other load may pass meanwhile
# test-only fault injection (fsdp_jobs/planning/faults.py): this node's timed checks take 3x as long, always or in
# the first round only (a momentary slowdown the recheck must forgive)
SLOW_NODE_ENV = "FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE"
SLOW_ONCE_ENV = "FSDP_JOBS_TEST_PREFLIGHT_SLOW_ONCE"
# test-only too: in the job's first attempt, the K-th node by node rank (K >= 1) of those not serving the
# rendezvous store is slow, whichever node the rendezvous put there (with hot spares, which agent waits as the
# spare is a race, so a node's name may be the spare's; and the store host's node rank is a race of its own)
SLOW_RANK_ENV = "FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE_RANK"
# every rank's exit status when hot spares replace the nodes its preflight named: not 0, so that every agent
# restarts its ranks (torchrun restarts on a failure only); not 1, which is any exception's; nor 3, which
# launchers/node/wrapper.py gives a failure the ranks decided on
REPLACED_EXIT = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(work: Callable[[], None], device: torch.device, slow: bool, repeats: int = REPEATS,
              turns: tuple[int, int] = (0, 1)) -> float:
    """The fastest of `repeats` timed runs after one warm-up; the device is synchronized before each clock read.
    turns=(mine, of): nodes sharing a machine time one run each in turn (a barrier between), so they do not
    measure each other and all sample the same stretch of the machine's other load."""
    mine, count = turns
    best, error = float("inf"), None
    for i in range(repeats + 1):
        for t in range(count):
            if t == mine and error is None:
                try:
                    elapsed = _timed(work, device, slow)
                except Exception as e:  # noqa: BLE001  raised after the turns: no rank skips a barrier
                    error = e
                else:
                    best = best if i == 0 else min(best, elapsed)  # run 0 warms up
            if count > 1:
                dist.barrier()
    if error is not None:
        raise error
    return best


def _timed(work: Callable[[], None], device: torch.device, slow: bool) -> float:
    _sync(device)
    t0 = time.perf_counter()
    work()
    _sync(device)
    elapsed = time.perf_counter() - t0
    if slow:  # test-only fault, inside the timed region: the node is 3x slower at this, whatever the load
        time.sleep(2 * elapsed)
        elapsed *= 3
    return elapsed


def busbw_gbps(ranks: int, seconds: float) -> float:
    """An all-reduce's bus bandwidth over `ranks`: 2(n-1)/n x bytes / time (nccl-tests' busbw), GB/s."""
    return 2 * (ranks - 1) / ranks * PREFLIGHT_ALLREDUCE_BYTES / seconds / 1e9


def matmul_tflops(device: torch.device, slow: bool, turns: tuple[int, int] = (0, 1)) -> float:
    n = 4096 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = best_time(lambda: torch.mm(a, b), device, slow, repeats=3 * REPEATS, turns=turns)
    return 2 * n**3 / t / 1e12


def allreduce_busbw_gbps(world: World, slow: bool) -> float:
    """Bus bandwidth of an all-reduce over every rank (busbw_gbps)."""
    x = torch.ones(PREFLIGHT_ALLREDUCE_BYTES // 4, device=world.device, dtype=torch.float32)
    t = best_time(lambda: dist.all_reduce(x), world.device, slow)
    return busbw_gbps(world.world_size, t) if world.world_size > 1 else 0.0


def ring_edges(nodes: int) -> list[list[tuple[int, int]]]:
    """Node pairs (i, i+1 mod n) in rounds of disjoint pairs: even i, odd i, then the wrap-around pair when n
    is odd. Every node is in two pairs, so a node whose link is slow makes both its pairs slow, while each of
    its neighbours still has one fast pair. None below 3 nodes (a pair would be the whole world)."""
    if nodes < 3:
        return []
    edges = [(i, (i + 1) % nodes) for i in range(nodes)]
    rounds = [edges[0:nodes - nodes % 2:2], edges[1:nodes - nodes % 2:2]]
    return rounds + ([[edges[-1]]] if nodes % 2 else [])


def pair_busbw_gbps(world: World, slow: bool) -> Optional[float]:
    """The bus bandwidth of an all-reduce with each neighbour node (all ranks of both nodes), the best
    pair's: low only when every pair of this node is slow, i.e. this node is. The ring's rounds take turns,
    one timed all-reduce each, REPEATS times: timed one round after the other, the pairs sampled different
    stretches of the machine's other load, and a pair timed in a quiet stretch could measure twice the
    others', so the one node in neither of its pairs was named although healthy."""
    lws = world.local_world_size
    x = torch.ones(PREFLIGHT_ALLREDUCE_BYTES // 4, device=world.device, dtype=torch.float32)
    rounds = ring_edges(world.nodes)
    # every rank creates every pair's group, in the same order (new_group is collective over the world)
    groups = {pair: dist.new_group(sorted(r for node in pair for r in range(node * lws, (node + 1) * lws)))
              for pairs in rounds for pair in pairs}
    mine = [next((p for p in pairs if world.node_rank in p), None) for pairs in rounds]  # my pair in each round
    fastest = {pair: float("inf") for pair in mine if pair is not None}
    for i in range(REPEATS + 1):  # run 0 warms up
        for pair in mine:
            if pair is not None:
                elapsed = _timed(lambda: dist.all_reduce(x, group=groups[pair]), world.device, slow)
                if i:
                    fastest[pair] = min(fastest[pair], elapsed)
            dist.barrier()  # the rounds do not overlap
    for group in groups.values():
        if group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
    return max((busbw_gbps(2 * lws, t) for t in fastest.values()), default=None)


def write_mb_s(run_dir: Path, rank: int, slow: bool, turns: tuple[int, int] = (0, 1)) -> float:
    """A fresh file in the run dir, written and fsynced; removed after."""
    path = RunDir(run_dir).preflight_scratch_file(rank)
    data = os.urandom(PREFLIGHT_WRITE_BYTES)

    def write() -> None:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    try:
        t = best_time(write, torch.device("cpu"), slow, repeats=5, turns=turns)
    finally:
        path.unlink(missing_ok=True)
    return PREFLIGHT_WRITE_BYTES / t / 1e6


def host_free_gb() -> Optional[float]:
    try:
        line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024 / 1024**3


def checkpoint_gb(run_dir: Path, cfg: JobConfig) -> Optional[float]:
    """The next checkpoint's size from the plan's parameter count: params at model.dtype + AdamW's two fp32
    moments. None for script=/module= (the plan's model is not the script's) or without a plan."""
    if cfg.script or cfg.module:
        return None
    try:
        params = json.loads(RunDir(run_dir).plan_file.read_text())["memory"]["params"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return params * (DTYPE_BYTES.get(cfg.model.dtype, 4) + 8) / 1024**3


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def machine_id() -> str:
    """What tells machines apart: the kernel's boot id. Containers and network namespaces on one machine share
    it while their host names differ (a container engine's nodes, the test cluster's: told apart by host name,
    such nodes measured their matmuls all at once on 2 cores and could name a healthy node slow twice:
    fsdp_jobs/ARCHITECTURE.md, "Preflight"); two machines never share it. The host name where it cannot
    be read."""
    try:
        return BOOT_ID.read_text().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def my_turn(world: World, node: str) -> tuple[int, int]:
    """(this node's turn, how many turns): nodes on one machine (simulated nodes, containers, or a shared
    host) take turns at the local checks, so they do not measure each other. One turn on a real cluster."""
    machines: list[Any] = [None] * world.world_size
    dist.all_gather_object(machines, (machine_id(), node))
    nodes_of: dict[str, list[str]] = {}
    for machine, n in machines:
        if n not in nodes_of.setdefault(machine, []):
            nodes_of[machine].append(n)
    return sorted(nodes_of[machine_id()]).index(node), max(len(v) for v in nodes_of.values())


def slow_by_node_rank(world: World) -> bool:
    """The test fault SLOW_RANK_ENV: whether this node is the one it makes slow. Every rank takes part in one
    gather when it is set (it is the whole job's, and world.restart is agreed at bring-up)."""
    k = faults.step(SLOW_RANK_ENV)
    if not k or world.restart:
        return False
    ranks: list[Any] = [None] * world.world_size
    dist.all_gather_object(ranks, (world.node_rank, os.environ.get(STORE_HOST_ENV) == "1"))
    others = sorted({r for r, host in ranks} - {r for r, host in ranks if host})
    return len(others) >= k and others[k - 1] == world.node_rank


def measure(run_dir: Path, world: World, first_round: bool = True) -> dict[str, Any]:
    """This rank's record; a check that raises is recorded as this rank's error (the node is then named)."""
    node = os.environ.get("FSDP_JOBS_NODE") or socket.gethostname()  # launchers/node/wrapper.py: the scheduler's name
    slow = (faults.name(SLOW_NODE_ENV) == node or (first_round and faults.name(SLOW_ONCE_ENV) == node)
            or slow_by_node_rank(world))
    turns = my_turn(world, node)
    rec: dict[str, Any] = {"rank": world.rank, "node": node, "host": socket.gethostname(),
                           "turns": turns[1],  # how many nodes share this node's machine, at most
                           "device": str(world.device), "error": None,
                           # its agent serves the rendezvous store (launchers/node/agent.py): no spare replaces it
                           "store_host": os.environ.get(STORE_HOST_ENV) == "1"}
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("allreduce_busbw_gbps", lambda: allreduce_busbw_gbps(world, slow)),
        ("pair_busbw_gbps", lambda: pair_busbw_gbps(world, slow)),
        ("matmul_tflops", lambda: matmul_tflops(world.device, slow, turns)),
        ("write_mb_s", lambda: write_mb_s(run_dir, world.rank, slow, turns)),
        ("disk_free_gb", lambda: shutil.disk_usage(run_dir).free / 1024**3),
        ("host_free_gb", host_free_gb),
        ("gpu_free_gb", lambda: torch.cuda.mem_get_info(world.device)[0] / 1024**3
         if world.device.type == "cuda" else None),
    ]
    for key, check in checks:
        try:
            rec[key] = check()
        except Exception as e:  # noqa: BLE001  any failure of a check is the verdict's business
            rec[key] = None
            rec["error"] = rec["error"] or f"{key}: {type(e).__name__}: {e}"[:300]
            if key.endswith("busbw_gbps"):  # a collective failed: the ranks are out of step, stop here
                raise
    return rec


PASSED, FAILED, REPLACED = "passed", "failed", "replaced"  # run_preflight's outcomes


def run_preflight(run_dir: Path, cfg: JobConfig, world: World) -> str:
    """Every rank: measure, gather on rank 0, judge, recheck a node named slow, report. Returns the outcome, the
    same on every rank: PASSED, FAILED (the state record says why) or REPLACED (hot spares take the named
    nodes' places: see the module docstring)."""
    began = time.time()
    ratio = float(cfg.fault.preflight_slow_ratio)  # a job record older than fault.*: the schema's default
    ckpt_gb = checkpoint_gb(run_dir, cfg)
    ranks = _gathered(measure(run_dir, world), world)
    v = preflight.verdict(ranks, ratio, ckpt_gb, expected_nodes=cfg.nodes) if world.rank == 0 else None
    recheck = [preflight.slow_named(v) if v is not None else None]
    dist.broadcast_object_list(recheck, src=0)
    if recheck[0]:
        if world.rank == 0:
            log(0, f"preflight: {', '.join(recheck[0])} slow in the first round; measuring every node again")
        time.sleep(RECHECK_PAUSE_S)
        again = _gathered(measure(run_dir, world, first_round=False), world)
        if world.rank == 0:
            first, first_ranks, ranks = v, ranks, preflight.best_of(ranks, again)
            v = preflight.verdict(ranks, ratio, ckpt_gb, expected_nodes=cfg.nodes)
            v["notes"] += preflight.cleared_notes(first, v)
            v.update(rechecked=recheck[0], first_round={"ranks": first_ranks, "bad": first["bad"]})
    outcome = [PASSED]
    if world.rank == 0:
        assert v is not None
        v.update(time=time.time(), seconds=round(time.time() - began, 2), ranks=ranks)
        outcome = [report(run_dir, cfg, world, v)]
    dist.broadcast_object_list(outcome, src=0)
    return str(outcome[0])


def report(run_dir: Path, cfg: JobConfig, world: World, v: dict[str, Any]) -> str:
    """Rank 0: the verdict `v` into the preflight record, the log and, when it named nodes, into the record of
    nodes spares replace, or else the state record (failed); the outcome."""
    why_not = None if v["ok"] else spares_for(run_dir, cfg, v)
    if not v["ok"] and why_not is None:
        v["replaced"] = v["bad"]
    record = PreflightRecord(**v)  # the verdict's keys are the record's fields: a new one is added there
    runs.write_atomic(RunDir(run_dir).preflight_file, json.dumps(record.to_json(), indent=1) + "\n")
    log(0, f"preflight of {len(v['nodes'])} nodes in {v['seconds']} s" + "".join(f"; note: {n}" for n in v["notes"]))
    log(0, preflight.table(v))
    summary = preflight.summary_line(v)
    if v["ok"]:
        log(0, summary)
        return PASSED
    if why_not is None:
        replaced.record(run_dir, ReplacedNodes(time=time.time(), nodes=list(v["bad"]), reason=summary[:1000],
                                               restart=world.restart))
        log(0, f"{summary}; hot spares take the place of {', '.join(v['bad'])}: the job restarts at the same world")
        return REPLACED
    summary += f"; not replaced: {why_not}" if why_not else ""
    log(0, summary)
    runs.write_state(run_dir, status="failed", stage="preflight", bad_nodes=v["bad"], reason=summary[:1000],
                     step=runs.read_state(run_dir).step)
    return FAILED


def spares_for(run_dir: Path, cfg: JobConfig, v: dict[str, Any]) -> Optional[str]:
    """None when hot spares can take the place of the nodes the verdict `v` named, else why not ("" for a job
    without spares): preflight_verdict.why_no_spare on the spares waiting now (one read of the timeline and
    the world record: liveness.waiting_spares) and the nodes that serve the rendezvous store."""
    spares = int(cfg.cluster.get("spare_nodes") or 0)  # a job record from before spares has no such key
    if not spares:
        return ""
    hosts = sorted({str(r.get("node")) for r in v["ranks"] if r.get("store_host")})
    waiting = liveness.waiting_spares(run_dir, runs.last_launch(run_dir).get("unix"))
    return preflight.why_no_spare(v["bad"], spares, waiting, hosts)


def _gathered(rec: dict[str, Any], world: World) -> list[dict[str, Any]]:
    out: list[Any] = [None] * world.world_size
    dist.all_gather_object(out, rec)
    return out
