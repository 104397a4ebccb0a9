"""cluster=local's keys: simulated nodes on this machine (launchers/local/backend.py)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from fsdp_jobs.planning.chaos_kinds import MARATHON_ON_RANKS, ON_RANKS
from fsdp_jobs.planning.cluster_config import BackendTraits, ClusterConfig, register_cluster_schema
from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:  # types only: no import cycle
    from fsdp_jobs.planning.config import JobConfig

NAME = "local"
# spare nodes: K more agents (launchers/local/backend.py agent_count); the simulated nodes share this machine's
# network namespace, so no fault of a node's own link
TRAITS = BackendTraits(host_files=True, spare_nodes=True, scale="", chaos=ON_RANKS, marathon=MARATHON_ON_RANKS,
                       stacks=True)


@dataclass
class LocalClusterConfig(ClusterConfig):
    """Simulated nodes on this machine: one torchrun agent per node on loopback."""

    backend: str = "local"
    device: str = "cpu"
    # None = the device's: a rough 0.5 for one CPU core (fp32 is the dtype that runs), so MFU stays
    # meaningful-ish; with cluster.device=cuda the common default (an H100's dense bf16, fsdp_jobs/planning/cluster_config.py)
    peak_tflops: Optional[float] = None
    peak_tflops_fp32: Optional[float] = None


SCHEMA = LocalClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA)


def validate(cl: LocalClusterConfig) -> None:
    """Nothing beyond the common keys (fsdp_jobs/planning/config.py ClusterConfig)."""


def check_machine(cfg: JobConfig) -> None:
    """The simulated nodes are this machine, so its torch, its GPUs and its compiler are the job's: what it
    lacks failed every rank after the job had started. Asked by a submission (LocalBackend.check), not by a
    dry run, which may plan a GPU job anywhere."""
    check_device(cfg)
    check_compiler(cfg)


def check_device(cfg: JobConfig) -> None:
    """cluster.device=cuda: a CPU-only torch, or no NVIDIA GPU, failed every rank at torch.cuda.set_device."""
    if cfg.cluster.device != "cuda":
        return
    build = torch_build()
    if build.get("cuda") is None and build.get("hip") is None and "__version__" in build:
        raise UserError("cluster.device", "cuda", f"this machine's torch {build['__version__']} is a CPU-only build; "
                                                  "use cluster.device=cpu, or install a CUDA build of torch")
    if build.get("cuda") is not None and not nvidia_gpus():
        raise UserError("cluster.device", "cuda", "this machine shows no NVIDIA GPU (no /dev/nvidia0, /dev/nvidia1 "
                                                  "...); use cluster.device=cpu")


def check_compiler(cfg: JobConfig) -> None:
    """train.compile=true on CPU: inductor compiles each block with $CXX or g++ found on the ranks' PATH; without
    one every rank failed at its first step (BackendCompilerFailed: InvalidCxxCompiler)."""
    build = torch_build()
    on_cpu = cfg.cluster.device == "cpu" or (cfg.cluster.device == "auto" and not (build.get("cuda") and nvidia_gpus()))
    env = {**os.environ, **{str(k): str(v) for k, v in cfg.cluster.env.items()}}
    if not cfg.train.compile or not on_cpu or env.get("TORCH_INDUCTOR_INSTALL_GXX"):
        return
    cxx = env.get("CXX") or "g++"
    if shutil.which(cxx, path=env.get("PATH")) is None:
        raise UserError("train.compile", True, f"on CPU needs a C++ compiler, and the ranks' PATH has no {cxx} "
                                               "(inductor's; $CXX names another): install one (apt-get install g++), "
                                               "or train.compile=false")


def torch_build() -> dict[str, Optional[str]]:
    """__version__, cuda and hip of the installed torch, read from torch/version.py (importing torch would cost
    the dry run seconds); {} where it cannot be read."""
    spec = importlib.util.find_spec("torch")
    where = list(spec.submodule_search_locations or []) if spec else []
    try:
        tree = ast.parse((Path(where[0]) / "version.py").read_text())
    except (IndexError, OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, Optional[str]] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
            out[target.id] = node.value.value  # type: ignore[union-attr]
    return out


def nvidia_gpus() -> int:
    """The NVIDIA GPUs this machine (or container) exposes: its /dev/nvidiaN device files."""
    return sum(1 for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", p.name))
