"""Golden dry runs: what `dry_run=true` prints for a fixed set of commands, every backend and kind (single
runs and sweeps, script=, module= and model=hf), byte for byte.

The dry run is the exact request each backend submits (tests/unit/test_sbatch.py and the SLURM tier hold
submitted == shown), so a refactor that changes any of these files changes what users' jobs get. A change
here must be deliberate: regenerate with `FSDP_JOBS_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_golden_dry_runs.py` and name the difference in the commit.

Only what differs between machines is replaced by a placeholder: the run root, this checkout, the
interpreter and its prefixes and the invoking user; Kubernetes' random name suffixes come from a seeded
generator; the Docker engine's kernel is one with net.ipv4.tcp_rto_max_ms. The run root is fixed (a sweep's
id hashes the command); a dry run writes nothing there.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import site
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
RUN_ROOT = Path(tempfile.gettempdir()) / "fsdp-jobs-golden" / "runs"
UPDATE = bool(os.environ.get("FSDP_JOBS_UPDATE_GOLDEN"))  # read before the cases clear FSDP_JOBS_* variables
K8S = ["cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:0.1"]
SCRIPT = ["script=tests/scripts/ddp_train.py", "script_args=[--epochs,2,--log,x]"]
HF = ["model=hf", "fsdp.wrap.transformer_blocks=[transformers.models.llama.modeling_llama.LlamaDecoderLayer]"]

COMMANDS: dict[str, list[str]] = {
    "local": ["cluster=local", "cluster.rdzv_port=29511"],
    "local-knobs": ["cluster=local", "cluster.rdzv_port=29511", "nodes=3", "cluster.min_nodes=2",
                    "fsdp=full_shard", "train.global_batch_size=24", "+cluster.env.FOO=bar baz",
                    "fsdp.limit_all_gathers=true"],
    "local-script": ["cluster=local", "cluster.rdzv_port=29511", *SCRIPT],
    "local-module": ["cluster=local", "cluster.rdzv_port=29511", "module=tests.scripts.ddp_train"],
    "local-hf": ["cluster=local", "cluster.rdzv_port=29511", *HF],
    # cluster.gpus pinned: `auto` asks sinfo whether the partition has GPUs, which depends on this machine
    "slurm": ["cluster=slurm", "cluster.gpus=true"],
    "slurm-knobs": ["cluster=slurm", "cluster.gpus=true", "nodes=4", "gpus_per_node=8", "model=llama3_8b", "cluster.device=cuda",
                    "cluster.partition=gpu", "cluster.account=proj", "cluster.qos=high", "cluster.time_min=60",
                    "cluster.constraint=h100", "cluster.exclusive=true", "cluster.mem=0",
                    'cluster.setup=["module load cuda","source ~/venv/bin/activate"]',
                    "+cluster.sbatch.reservation=res1", "+cluster.env.NCCL_DEBUG=INFO"],
    "slurm-script": ["cluster=slurm", "cluster.gpus=true", *SCRIPT],
    "slurm-hf": ["cluster=slurm", "cluster.gpus=false", *HF],
    "docker": ["cluster=docker"],
    "docker-image": ["cluster=docker", "cluster.image=fsdp-jobs:test", "nodes=3", "cluster.min_nodes=2",
                     "cluster.detach=true", "cluster.cpus=2", "cluster.mem=4g", "cluster.internal_network=true"],
    "docker-script": ["cluster=docker", "cluster.image=fsdp-jobs:test", *SCRIPT],
    "docker-cuda": ["cluster=docker", "cluster.image=fsdp-jobs:test", "cluster.device=cuda"],
    "kubernetes-volcano": [*K8S, "cluster.kind=volcano"],
    "kubernetes-pytorchjob": [*K8S, "cluster.kind=pytorchjob", "cluster.min_nodes=1",
                              "+cluster.secret_env.HF_TOKEN=hf/token"],
    "kubernetes-jobset": [*K8S, "cluster.kind=jobset", "cluster.device=cuda", "gpus_per_node=8",
                          "+cluster.node_selector.pool=gpu"],
    "kubernetes-trainjob-kueue": [*K8S, "cluster.kind=trainjob", "cluster.kueue_queue=team-a", "cluster.device=cuda",
                                  "gpus_per_node=8"],
    "kubernetes-jobset-kueue": [*K8S, "cluster.kind=jobset", "cluster.kueue_queue=team-a"],
    "kubernetes-pytorchjob-kueue": [*K8S, "cluster.kind=pytorchjob", "cluster.kueue_queue=team-a"],
    "kubernetes-script": [*K8S, *SCRIPT],
    "kubernetes-hf": [*K8S, *HF],
    # fault_tolerance=replica: each node a replica group with its own torchrun, the lighthouse beside them
    "local-replica": ["cluster=local", "cluster.rdzv_port=29511", "fault_tolerance=replica", "nodes=3",
                      "fault_tolerance.lighthouse_port=29600"],
    "slurm-replica": ["cluster=slurm", "cluster.gpus=true", "fault_tolerance=replica", "nodes=4", "gpus_per_node=4",
                      "fsdp.shard_group_size=8"],
    "docker-replica": ["cluster=docker", "cluster.image=fsdp-jobs:test", "fault_tolerance=replica", "nodes=3",
                       "gpus_per_node=1", "fault_tolerance.heartbeat_timeout_s=2"],
    "kubernetes-jobset-replica": [*K8S, "cluster.kind=jobset", "fault_tolerance=replica", "nodes=4",
                                  "gpus_per_node=2", "fsdp.shard_group_size=4"],
    "kubernetes-volcano-replica": [*K8S, "cluster.kind=volcano", "fault_tolerance=replica", "nodes=2", "gpus_per_node=1"],
    # cluster.spare_nodes: nodes + K agents with a rendezvous of `nodes` (SLURM: an allocation of nodes + K, --no-kill)
    "slurm-spares": ["cluster=slurm", "cluster.gpus=true", "nodes=3", "cluster.spare_nodes=1"],
    "docker-spares": ["cluster=docker", "cluster.image=fsdp-jobs:test", "nodes=3", "cluster.spare_nodes=1"],
    # a TorchX app (what `torchx run ... fsdp_jobs.job` submits): the role, then what each replica runs
    "torchx": ["cluster=torchx", "cluster.device=cpu"],
    "torchx-script": ["cluster=torchx", "nodes=3", "cluster.min_nodes=2", "cluster.rdzv_port=29400", *SCRIPT],
    "sweep-local": ["-m", "cluster=local", "cluster.rdzv_port=29511", "train.lr=1e-3,3e-3"],
    "sweep-slurm": ["-m", "cluster=slurm", "cluster.gpus=true", "nodes=2,4", "fsdp=full_shard,hybrid_shard", "name=scan"],
    "sweep-slurm-script": ["-m", "cluster=slurm", "cluster.gpus=true", *SCRIPT, "train.seed=1,2"],
    "sweep-docker": ["-m", "cluster=docker", "cluster.image=fsdp-jobs:test", "train.lr=1e-3,3e-3"],
    "sweep-kubernetes": ["-m", *K8S, "cluster.kind=jobset,volcano"],
}


def _placeholders(run_root: Path) -> list[tuple[str, str]]:
    """Longest first, so a prefix never replaces part of a longer path."""
    pairs = {str(run_root): "<RUN_ROOT>", str(REPO): "<REPO>", sys.executable: "<PYTHON>",
             os.path.realpath(sys.executable): "<PYTHON>", sys.prefix: "<PREFIX>", sys.base_prefix: "<PREFIX>",
             os.path.realpath(sys.base_prefix): "<PREFIX>"}
    for p in [*site.getsitepackages(), site.getusersitepackages()]:
        pairs.setdefault(p, "<SITE>")
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def normalize(text: str, run_root: Path) -> str:
    for path, name in _placeholders(run_root):
        text = text.replace(path, name)
    # the image=auto bind mounts: one line per directory of this interpreter, however many it has
    text = re.sub(r"(\n *- <(?:PREFIX|SITE)>[^\n]*)+", "\n    - <PYTHON DIRS>", text)
    text = re.sub(r"\n *- /usr:/usr:ro", "", text)
    text = re.sub(r"uid\d+", "uid<N>", text)
    # module=tests.scripts...: what travels is the whole tests/ package, which grows with every test file
    text = re.sub(r"module=('?)'s package tests: \d+ files travel into the run dir:[^\n]*(\n    [^\n]*)*",
                  r"module=\1's package tests: <N> files travel into the run dir", text)
    text = re.sub(r"fsdpjobs-([A-Za-z0-9_.-]+)-[0-9a-f]{8}\b", r"fsdpjobs-\1-<HASH>", text)  # compose project
    return text


def dry_run(args: list[str], run_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The command as a user types it, in this process (a new interpreter per case would cost the quick loop
    half a second each), from the checkout, with none of this shell's job variables."""
    from fsdp_jobs.__main__ import main

    for k in list(os.environ):
        if k.startswith(("FSDP_JOBS_", "SLURM_", "SUDO_")) or k in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "KUBECONFIG"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(run_root.parent / "home"))  # no ~/.kube/config of this machine's
    monkeypatch.chdir(REPO)
    # Kubernetes names carry random suffixes (ours and TorchX's app id): drawn from a seeded generator here
    import secrets

    import torchx.schedulers.ids

    rng = random.Random(0)
    monkeypatch.setattr(secrets, "choice", rng.choice)
    monkeypatch.setattr(torchx.schedulers.ids, "random_uint64", lambda: rng.getrandbits(64))
    # cluster=docker's tcp_rto_max_ms=auto asks the engine for its kernel: one that has the setting, engine or not
    from fsdp_jobs.launchers.docker import engine

    monkeypatch.setattr(engine, "engine_kernel", lambda: (6, 15))
    argv = list(args)
    named = "-m" in argv or any(a.startswith("name=") for a in argv)
    capsys.readouterr()
    rc = main([*argv, f"run_root={run_root}", "dry_run=true", *([] if named else ["name=gold"])])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return normalize(f"$ fsdp-jobs {' '.join(args)}\n# stderr\n{out.err}# stdout\n{out.out}", run_root)


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_dry_run_output_is_unchanged(case, capsys, monkeypatch):
    got = dry_run(COMMANDS[case], RUN_ROOT, capsys, monkeypatch)
    golden = GOLDEN_DIR / f"{case}.txt"
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(got)
    assert golden.is_file(), f"no golden file {golden}: FSDP_JOBS_UPDATE_GOLDEN=1 records it"
    assert got == golden.read_text(), f"dry run of {case} changed (see the module docstring)"
