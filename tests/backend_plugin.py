"""A backend from outside this tree, as a distribution installs one: a package (config.py + backend.py) and a
dist-info folder whose entry_points.txt names it in the `fsdp_jobs.backends` group (fsdp_jobs/planning/backends.py).
Put the folder `install` returns on PYTHONPATH and `cluster=mine` is a backend: cluster=local's simulated nodes
under a name of its own."""

from __future__ import annotations

from pathlib import Path

CONFIG = '''"""cluster=mine: this machine's simulated nodes, as cluster=local runs them."""
from dataclasses import dataclass

from fsdp_jobs.launchers.local import config as local
from fsdp_jobs.planning.cluster_config import register_cluster_schema

NAME = "mine"
TRAITS = local.TRAITS
validate = local.validate


@dataclass
class MineClusterConfig(local.LocalClusterConfig):
    backend: str = NAME


SCHEMA = MineClusterConfig


def register() -> None:
    register_cluster_schema(NAME, SCHEMA, option=True)  # no conf/cluster/mine.yaml: the option is stored here
'''
BACKEND = '''from fsdp_jobs.launchers.local.backend import LocalBackend


class MineBackend(LocalBackend):
    name = "mine"


BACKEND = MineBackend()
'''


def install(root: Path, entry: str = "mine = mybackend", config: str = CONFIG, backend: str = BACKEND) -> Path:
    """Write the package `mybackend` and its distribution's metadata under root/site; that folder."""
    site = root / "site"
    (site / "mybackend").mkdir(parents=True)
    (site / "mybackend" / "config.py").write_text(config)
    (site / "mybackend" / "backend.py").write_text(backend)
    info = site / "mybackend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mybackend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fsdp_jobs.backends]\n{entry}\n")
    return site
