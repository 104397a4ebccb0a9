"""One config, four backends: the dry runs agree on what the training sees (world size, mesh, the torchrun
agent's flags, the ranks' environment); only where the rendezvous lives may differ."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdp_jobs.planning.compose import compose
from fsdp_jobs.planning.plan import make_plan
from fsdp_jobs.cli import launcher
from fsdp_jobs.planning import backends
from fsdp_jobs.launchers.kubernetes import manifests as k8s_manifests

pytestmark = pytest.mark.kubernetes

BACKENDS = list(backends.names())
PER_BACKEND = {"kubernetes": ["cluster.image=registry.example.com/fsdp-jobs:1"]}
# SLURM warns the ranks with its own signal before a time limit or preemption; everywhere else the stop
# signal is torchrun's SIGTERM, so this one variable is SLURM's alone
SLURM_ONLY = {"FSDP_JOBS_STOP_SIGNAL"}


def masked(args: list[str]) -> list[str]:
    """Where the rendezvous lives (endpoint, local address, run id) is each backend's own business."""
    out = [re.sub(r"^(--rdzv-endpoint|--rdzv-id)=.*", r"\1=*", a) for a in args]
    return [a for a in out if not a.startswith("--local-addr=")]


def test_dry_runs_of_every_backend_agree(tmp_path: Path) -> None:
    common = ["nodes=2", "gpus_per_node=2", "fsdp=hybrid_shard", "cluster.max_restarts=2", "cluster.device=cpu",
              "cluster.stop_grace_s=60", "cluster.min_nodes=1", "name=agree", f"run_root={tmp_path / 'runs'}",
              "dry_run=true"]
    seen = {}
    for backend in BACKENDS:
        cfg, _ = compose([f"cluster={backend}", *common, *PER_BACKEND.get(backend, [])])
        plan = make_plan(cfg)
        d = launcher.get(backend).dryrun(plan, cfg)
        env = {k: v for k, v in d.agent_env.items() if backend == "slurm" or k not in SLURM_ONLY}
        assert backend == "slurm" or not SLURM_ONLY & set(d.agent_env), backend
        seen[backend] = {"world": plan.world_size, "mesh": plan.mesh, "args": masked(d.agent_args),
                         "env": {k: v for k, v in env.items() if k not in SLURM_ONLY}}
        if backend == "kubernetes":  # the flags and environment are really what the pods get
            for c in (t["spec"]["containers"][0] for t in k8s_manifests.pod_templates(d.request.job)):
                assert c["command"][7:-3] == d.agent_args
                assert {e["name"]: e["value"] for e in c["env"] if "value" in e}.items() >= d.agent_env.items()
    reference = seen["local"]
    assert reference["world"] == 4 and reference["mesh"] == {"replicate": 2, "shard": 2}
    assert "--nnodes=1:2" in reference["args"] and "--max-restarts=2" in reference["args"]
    assert reference["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    for backend, got in seen.items():
        assert got == reference, backend
