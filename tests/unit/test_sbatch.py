"""The sbatch script `cluster=slurm` submits, rendered without a cluster (dry_run prints exactly what
submitit hands to sbatch): every cluster.* knob lands on its #SBATCH line or in the setup."""

from __future__ import annotations

import re

import pytest

from tests.conftest import cli


def script(run_root, *args: str) -> str:
    r = cli("cluster=slurm", "cluster.device=cpu", f"run_root={run_root}", "name=s", "dry_run=true", *args)
    assert r.returncode == 0, r.stderr
    assert list(run_root.iterdir()) == []
    return r.stdout.split("# launch commands (slurm)\n", 1)[1]


def sbatch_lines(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, flags=re.M))


def test_every_knob_reaches_its_sbatch_line(run_root):
    text = script(run_root, "nodes=4", "gpus_per_node=8", "cluster.partition=gpu", "cluster.account=proj",
                  "cluster.qos=high", "cluster.mem=200G", "cluster.gres=gpu:h100:8", "cluster.time_min=60",
                  "+cluster.sbatch.reservation=big", "cluster.constraint=h100", "cluster.exclusive=true",
                  "cluster.signal=URG", "cluster.signal_delay_s=90")
    s = sbatch_lines(text)
    assert s["partition"] == "gpu" and s["account"] == "proj" and s["qos"] == "high" and s["mem"] == "200G"
    assert s["gres"] == "gpu:h100:8" and "gpus-per-node" not in s  # gres replaces the GPU request
    assert s["nodes"] == "4" and s["ntasks-per-node"] == "1"  # one torchrun agent per node
    assert s["cpus-per-task"] == "8"  # the agent's task holds all its ranks
    assert s["time"] == "60" and s["reservation"] == "big" and s["constraint"] == "h100"
    assert "exclusive" in s and "requeue" in s
    assert s["signal"] == "URG@90"
    assert "export SUBMITIT_PREEMPT_SIGNAL=URG" in text and "export FSDP_JOBS_STOP_SIGNAL=URG" in text


def test_setup_lines_run_before_the_job_and_the_snapshot_comes_first_on_the_path(run_root):
    text = script(run_root, "cluster.setup=[\"module load cuda/12.4\",\"source ~/venv/bin/activate\"]",
                  "+cluster.env.NCCL_DEBUG=INFO")
    setup = text.split("# setup\n", 1)[1].split("# command", 1)[0]
    assert setup.index("module load cuda/12.4") < setup.index("source ~/venv/bin/activate") < setup.index("PYTHONPATH")
    run_dir = (run_root / "s").resolve()
    assert f"export PYTHONPATH={run_dir}/code/001" in setup and "export PYTHONSAFEPATH=1" in setup
    assert "export NCCL_DEBUG=INFO" in setup and "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in setup
    assert text.rstrip().splitlines()[-1].startswith("srun ")


def test_gpus_are_asked_per_node_unless_the_job_runs_on_cpu(run_root):
    assert "gpus-per-node" not in sbatch_lines(script(run_root))  # cluster.device=cpu
    s = sbatch_lines(script(run_root, "cluster.gpus=true", "gpus_per_node=4"))
    assert s["gpus-per-node"] == "4"


def test_excluded_nodes_reach_the_exclude_line_and_the_job_keeps_them(run_root):
    """cluster.exclude renders --exclude (the nodes a preflight named are added to it by a requeue,
    launchers/slurm/node_task.py); cluster.exclude_bad_nodes travels in job.yaml for the node task."""
    assert "exclude" not in sbatch_lines(script(run_root))
    s = sbatch_lines(script(run_root, "cluster.exclude=[c3,gpu-17]", "cluster.exclude_bad_nodes=true",
                            "preflight=true"))
    assert s["exclude"] == "c3,gpu-17"


@pytest.mark.parametrize("extra", [(), ("cluster.min_nodes=1",)])
def test_each_node_task_starts_torchrun_with_the_flags_the_plan_gives(extra):
    """launchers/slurm/node_task.py builds torchrun's flags on the node from job.yaml alone (no plan
    there): they are the plan's, but for the attempt's rendezvous id and the first node as endpoint.
    (A flag that read a plan field the node task did not have broke every SLURM job once.)"""
    from omegaconf import OmegaConf

    from fsdp_jobs.compose import compose
    from fsdp_jobs.plan import make_plan
    from launchers.common import torchrun_args
    from launchers.slurm.node_task import agent_args

    cfg, _ = compose(["cluster=slurm", "cluster.device=cpu", "nodes=2", "gpus_per_node=2", *extra])
    plan = make_plan(cfg)
    job = OmegaConf.to_container(cfg, resolve=True)
    expected = [a.replace(f"--rdzv-id={plan.rendezvous.run_id}", "--rdzv-id=7-0")
                for a in torchrun_args(plan, "n1:20007", cfg.cluster.stop_grace_s)]
    assert agent_args(job, "7-0", "n1:20007") == expected


def test_a_slurm_job_cannot_be_given_room_to_grow(run_root):
    r = cli("cluster=slurm", f"run_root={run_root}", "name=s", "dry_run=true", "nodes=2", "cluster.max_nodes=3")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cluster.max_nodes" in r.stderr and "resubmit the same name with nodes=N" in r.stderr
    assert list(run_root.iterdir()) == []
