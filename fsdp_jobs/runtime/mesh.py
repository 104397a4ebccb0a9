"""Process group and device mesh from the world torchrun actually started (not the plan's), so an
elastic change in node count still gives a valid HSDP grouping."""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fsdp_jobs.planning.plan import REPLICA_GROUP_ENV, choose_mesh, count_params

if TYPE_CHECKING:  # types only: the ranks' config comes from fsdp_jobs/planning/config.py rank_config
    from fsdp_jobs.planning.config import JobConfig


@dataclass
class World:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int  # GROUP_RANK: decided by the rendezvous, not by us (fsdp_jobs/ARCHITECTURE.md, pitfall 6)
    restart: int  # TORCHELASTIC_RESTART_COUNT (may differ between nodes)
    device: torch.device
    # fault_tolerance=replica: torchrun's world (rank, world_size above) is one replica group's, the
    # default process group is that group's, and the job has `groups` of them (fsdp_jobs/runtime/replicas.py)
    group: int = 0
    groups: int = 1

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def job_rank(self) -> int:
        """The rank's number in the whole job: what its rank file, its heartbeat and its data slice use."""
        return self.group * self.world_size + self.rank

    @property
    def job_world_size(self) -> int:
        return self.groups * self.world_size


def read_world(device_kind: str, groups: int = 1) -> World:
    """`groups`: the job's replica groups (fault_tolerance=replica), of which this rank's torchrun world is one."""
    env = os.environ
    local_rank = int(env.get("LOCAL_RANK", 0))
    if device_kind == "auto":
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", local_rank) if device_kind == "cuda" else torch.device("cpu")
    return World(
        rank=int(env.get("RANK", 0)),
        local_rank=local_rank,
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        node_rank=int(env.get("GROUP_RANK", 0)),
        restart=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        device=device,
        group=int(env.get(REPLICA_GROUP_ENV, 0)) if groups > 1 else 0,
        groups=groups,
    )


def init_process_group(world: World, timeout_s: float = 600, cpu_collectives: bool = False) -> None:
    """nccl on GPU, gloo on CPU. The device is bound first so NCCL uses the right GPU (and connects
    eagerly). A world-wide gloo backend rides along only when CPU tensors take part in the default
    group's collectives (`cpu_collectives`: CPU offload's gradient-norm all-reduce): at thousands of
    ranks it is a start-up cost and picks network interfaces of its own. Async checkpoint saves make
    their own gloo group (checkpoint.py)."""
    if world.device.type == "cuda":
        torch.cuda.set_device(world.device)
        backend = "cuda:nccl,cpu:gloo" if cpu_collectives else "nccl"
        dist.init_process_group(backend, device_id=world.device, timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def mesh_shape(cfg: JobConfig, world: World) -> dict[str, int]:
    """The plan's mesh rule applied to the actual world (nodes x ranks-per-node seen at run time). With
    replica groups the torchrun world is one shard group: the mesh is its `shard` dimension alone, and
    torchft replicates across the groups (fsdp_jobs/runtime/replicas.py)."""
    if world.groups > 1:
        return {"shard": world.world_size}
    seen = dataclasses.replace(cfg, nodes=world.nodes, gpus_per_node=world.local_world_size)
    shape, _ = choose_mesh(seen, count_params(cfg.model))
    return shape


def build_mesh(cfg: JobConfig, world: World) -> DeviceMesh:
    shape = mesh_shape(cfg, world)
    # the shard dim is innermost: consecutive ranks (one node, RANK = GROUP_RANK*LWS + LOCAL_RANK)
    # form a shard group, so all-gathers and reduce-scatters stay on the fast intra-node links
    return init_device_mesh(world.device.type, tuple(shape.values()), mesh_dim_names=tuple(shape.keys()))

