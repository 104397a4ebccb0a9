"""fault_tolerance=replica inside a rank: HSDP's replica groups as torchft replicas (README: Lose a node,
keep training).

Without it (`NoReplicas`) the job is one torchrun world and every method here is the identity. With it,
each replica group (a shard group of whole nodes, fsdp_jobs/planning/plan.py ReplicaLayout) is a torchrun world of
its own: the default process group and the FSDP mesh are the group's, and `Replicas` joins the groups
through torchft (PyTorch's fault-tolerance library):

  * a Manager per rank; the group's rank 0 serves the group to the job's lighthouse
    (launchers/lighthouse.py), which forms a quorum of the live groups at every step (`begin_step`);
  * FSDP2's all-reduce hook averages each reduce-scattered gradient shard across the groups in the
    quorum, through torchft's reconfigurable gloo group (`attach`): the pattern of torchft's own HSDP test;
  * a step updates the model only if every group in its quorum finished its all-reduces (`commit`,
    torchft's should_commit): a group that died mid-step makes the others retry that step without it,
    after the lighthouse stops counting it (fault_tolerance.heartbeat_timeout_s);
  * a group that starts while others train is behind them: the quorum has it recover the model,
    optimizer, schedule, data position and RNG live from a healthy peer, over the same gloo group
    (torchft's PGTransport: no file, no extra server), instead of loading a checkpoint (`join`).

Checkpoints stay as they are: written by the group that is first in the step's quorum (`writer`), read by
every group when the whole job starts again. The data: every step takes the configured global batch's
slice of every group; a step taken while a group is missing skips that group's slice (torchft's
DYNAMIC world size: the gradient is the mean over the groups present).

torchft 0.2.0's servers bind every interface ([::]); the group's servers here listen only on the address
the launcher names (FSDP_JOBS_REPLICA_ADDR: loopback where the nodes share one machine), as the rest of the job does
(README: Security).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional, TYPE_CHECKING

import torch

from fsdp_jobs.planning.plan import REPLICA_ADDR_ENV
from fsdp_jobs.rundir import liveness
from fsdp_jobs.runtime.mesh import World
from fsdp_jobs.runtime.metrics import log

if TYPE_CHECKING:  # types only: the ranks' config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig
JOINING = "join"  # the heartbeat phase of a rank whose Manager is up: it waits for its first quorum


class NoReplicas:
    """One torchrun world is the whole job: nothing to join, every step commits."""

    enabled = False
    healed: Optional[tuple[int, float]] = None  # (step, seconds) of the last live recovery: never

    def __init__(self, world: World) -> None:
        self.world = world

    @property
    def writer(self) -> bool:
        """Whether this rank's group writes the job's metrics, checkpoints and state (rank 0's)."""
        return True

    def job_world_size(self) -> int:
        return self.world.world_size

    def attach(self, model: torch.nn.Module) -> None:
        """FSDP's gradient hooks: none needed."""

    def begin_step(self) -> None:
        """Before a step's forward: nothing to agree on."""

    def average(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def commit(self) -> bool:
        return True

    def close(self) -> None:
        pass



def training(node: liveness.NodeSummary) -> bool:
    """A node whose ranks are past their first step: stepping, or saving a checkpoint between two steps (a
    save takes seconds, the CRC-32s of its files included: a group restarting then took the others for a
    job just starting, loaded the checkpoint and was recovered live anyway)."""
    if node.phases.get("step") and (node.step_max or 0) > 0:
        return True
    return bool(node.phases.get("save")) and node.laggard is not None and node.laggard.step > 0

class Replicas(NoReplicas):
    """This rank's side of a replica group (module docstring)."""

    enabled = True

    def __init__(self, run_dir: Path, cfg: JobConfig, world: World) -> None:
        super().__init__(world)
        self.run_dir, self.ft = run_dir, cfg.fault_tolerance
        self.manager: Any = None
        self.pg: Any = None  # torchft's reconfigurable gloo group across the replica groups
        self.live = True  # False while a throw-away warm-up step runs: the gradient hook does nothing
        self.healed: Optional[tuple[int, float]] = None  # (step, seconds) of the last live recovery
        self.quorum_id: Optional[int] = None
        self.changed = False  # the last quorum's groups differ from the one before
        self.participants = 0
        self.fresh_quorum = False  # join()'s quorum is the first step's too
        # heartbeats written before this rank started are no evidence of a live group: the run's previous
        # launch wrote them (a job started again at once found them 3 s old, "training", and joined nobody)
        self.since = time.time()
        quiet_torchft_logs()

    # ------------------------------------------------------------------ before the first quorum
    def attach(self, model: torch.nn.Module) -> None:
        """Every FSDP unit's reduce-scattered gradient shard is averaged across the groups in the quorum
        (rank r of each group holds the same shard of every parameter: the groups are shaped alike)."""
        from torch.distributed.fsdp import FSDPModule

        def across_groups(grad: torch.Tensor) -> None:
            if self.live and self.manager is not None:
                self.manager.allreduce(grad).wait()  # an error is recorded: commit() then drops the step

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(across_groups)

    def warm_up(self, step: Callable[[], None]) -> None:
        """Run `step` (a forward and backward on made-up data) with the cross-group hook off, before this
        group joins groups that train: its first real step is then as fast as theirs, which wait for it."""
        self.live = False
        try:
            step()
        finally:
            self.live = True

    def others_training(self, timeout_s: float, phases: Optional[set[str]] = None) -> bool:
        """Wait until every other replica group has a live rank in one of `phases` (None: any), or the
        timeout; returns early, True, as soon as another group is training (this group joins a running job).
        Groups are whole nodes: the job's liveness view has each node's live phases (fsdp_jobs/rundir/liveness.py)."""
        deadline = time.time() + timeout_s
        ranks_per_group, me = self.world.world_size, self.world.group
        while True:
            now = time.time()  # what was said since this rank started, and is fresh: a live group
            nodes = [n for n in liveness.job_nodes(self.run_dir, now)
                     if n.written > self.since and now - n.written <= liveness.FRESH_S]
            others = [n for n in nodes if n.rank_min // ranks_per_group != me and n.phases]
            if any(training(n) for n in others):
                return True
            ready = {n.rank_min // ranks_per_group for n in others if phases is None or phases & set(n.phases)}
            if len(ready) >= self.world.groups - 1 or time.time() > deadline:
                return False
            time.sleep(0.2)

    def open(self, state_dict: Callable[[], dict[str, Any]], load_state_dict: Callable[[dict[str, Any]], None],
             step: int, mesh: Any) -> None:
        """The torchft Manager, at `step` (the checkpoint loaded, or 0 when a peer will be recovered from).
        `mesh`: this group's FSDP mesh, which the state a peer sends is put back on."""
        from torchft import manager as tfm
        from torchft.checkpointing.pg_transport import PGTransport
        from torchft.process_group import ProcessGroupGloo

        timeout = timedelta(seconds=float(self.ft.timeout_s))
        addr = os.environ.get(REPLICA_ADDR_ENV) or os.environ["MASTER_ADDR"]
        pg = self.pg = ProcessGroupGloo(timeout=timeout)

        def recovered(sd: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            load_state_dict(on_mesh(sd, mesh))
            self.healed = (int(sd["progress"]["step"]), time.perf_counter() - t0)

        transport = PGTransport(pg, timeout=timeout, device=self.world.device, state_dict=state_dict)
        with bound_to(tfm, addr):
            self.manager = tfm.Manager(
                pg=pg, load_state_dict=recovered, state_dict=state_dict,
                min_replica_size=int(self.ft.min_replicas), use_async_quorum=False,
                timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
                replica_id=f"group{self.world.group}", hostname=addr, store_addr=os.environ["MASTER_ADDR"],
                checkpoint_transport=transport,
                init_sync=False)  # every group initialises the same weights from train.seed
        self.manager.load_state_dict({"step": step, "batches_committed": 0})

    # ------------------------------------------------------------------ every step
    def join(self) -> None:
        """The group's first quorum (the trainer's join()): the first step uses it."""
        self.begin_step()
        self.fresh_quorum = True

    def begin_step(self) -> None:
        """The quorum of this step: which groups take part; a group behind the others recovers here."""
        if self.fresh_quorum:  # join() said what it recovered
            self.fresh_quorum, self.healed = False, None
            return
        self.healed = None
        self.manager.start_quorum()
        self.participants = self.manager.num_participants()
        quorum = self.manager._quorum_id  # torchft bumps it when the groups in the quorum change
        self.changed = self.quorum_id is not None and quorum != self.quorum_id
        if self.changed:
            log(self.world.rank, f"replica groups: the quorum changed at step {self.manager.current_step() + 1}: "
                                 f"{self.participants} of {self.world.groups} groups")
        self.quorum_id = quorum

    def average(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over the groups of this step's quorum."""
        out = value.detach().clone()
        self.manager.allreduce(out).wait()
        return out

    def commit(self) -> bool:
        """Whether the step may update the model: every group of its quorum finished it (torchft's
        should_commit, agreed by this group's ranks). A step that did not is said in one line."""
        error = self.manager.errored()
        if self.manager.should_commit():
            return True
        # Leave the step's collectives now, closing this group's connections. In a ring all-reduce a group
        # can wait for data from a group that already failed (which saw the dead peer's error) rather than
        # from the dead peer itself: it got its own error only when that group reconfigured, after a new
        # quorum, which the lighthouse forms from more than half of the live groups, the waiting one among
        # them, so it waits until the killed group is back or, with a group gone for good, for
        # fault_tolerance.timeout_s. torchft bumps the quorum id after a failed commit, so the next quorum
        # configures a new group.
        self.pg.abort(errored=False)
        why = str(getattr(error, "original_exception", error) or "another group's rank failed").splitlines()[0]
        log(self.world.rank, f"replica group {self.world.group}: step {self.manager.current_step() + 1} not committed "
                             f"({why[:200]}); taken again with the groups then alive")
        return False

    @property
    def writer(self) -> bool:
        """The first group of this step's quorum writes the metrics, checkpoints and state (each group is
        the same model at every committed step, so any one could); before the first quorum, group 0."""
        if self.manager is None or self.manager._quorum_future is None:
            return self.world.group == 0
        return self.manager.participating_rank() == 0

    def job_world_size(self) -> int:
        """The ranks of the groups taking part in this step."""
        return max(1, self.participants) * self.world.world_size

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)


def open_replicas(run_dir: Path, cfg: JobConfig, world: World) -> NoReplicas:
    return Replicas(run_dir, cfg, world) if world.groups > 1 else NoReplicas(world)


def on_mesh(tree: Any, mesh: Any) -> Any:
    """A received state with every DTensor on this group's own mesh (torchft's transport rebuilds them on
    an unpickled copy of the sender's: the same layout, but a mesh DTensor's caches have not seen, which
    made the first optimizer step after a recovery 50 times slower than the next ones)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tree, DTensor):
        return DTensor.from_local(tree.to_local(), device_mesh=mesh, placements=tree.placements, run_check=False,
                                  shape=tree.shape, stride=tree.stride())
    if isinstance(tree, dict):
        return {k: on_mesh(v, mesh) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(on_mesh(v, mesh) for v in tree)
    return tree


class bound_to:
    """torchft 0.2.0's Manager makes its server listen on every interface (`[::]:port`, hard-coded): while
    it is made, the server class is one that listens on `addr` alone."""

    def __init__(self, module: Any, addr: str) -> None:
        self.module, self.host = module, socket.gethostbyname(addr)
        self.original = module.ManagerServer

    def __enter__(self) -> None:
        original, host = self.original, self.host

        def server(**kwargs: Any) -> Any:
            port = str(kwargs["bind"]).rsplit(":", 1)[1]
            return original(**{**kwargs, "bind": f"{host}:{port}"})

        self.module.ManagerServer = server

    def __exit__(self, *exc: Any) -> None:
        self.module.ManagerServer = self.original


def quiet_torchft_logs() -> None:
    """torchft warns at every quorum change that NCCL's flight recorder cannot be reset (also on gloo), and
    logs every failed all-reduce with its traceback on every rank: Replicas.commit says it in one line."""
    logging.getLogger("torchft").setLevel(logging.CRITICAL)
