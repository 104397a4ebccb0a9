"""The sbatch script `cluster=slurm` submits, rendered without a cluster (dry_run prints exactly what
submitit hands to sbatch): every cluster.* knob lands on its #SBATCH line or in the setup."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO


def script(cli, run_root, *args: str) -> str:
    r = cli("cluster=slurm", "cluster.device=cpu", f"run_root={run_root}", "name=s", "dry_run=true", *args)
    assert r.returncode == 0, r.stderr
    assert list(run_root.iterdir()) == []
    return r.stdout.split("# launch commands (slurm)\n", 1)[1]


def sbatch_lines(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, flags=re.M))


def test_every_knob_reaches_its_sbatch_line(cli_here, run_root):
    text = script(cli_here, run_root, "nodes=4", "gpus_per_node=8", "cluster.partition=gpu", "cluster.account=proj",
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


def test_setup_lines_run_before_the_job_and_the_snapshot_comes_first_on_the_path(cli_here, run_root):
    text = script(cli_here, run_root, "cluster.setup=[\"module load cuda/12.4\",\"source ~/venv/bin/activate\"]",
                  "+cluster.env.NCCL_DEBUG=INFO")
    setup = text.split("# setup\n", 1)[1].split("# command", 1)[0]
    assert setup.index("module load cuda/12.4") < setup.index("source ~/venv/bin/activate") < setup.index("PYTHONPATH")
    run_dir = (run_root / "s").resolve()
    assert f"export PYTHONPATH={run_dir}/code/001" in setup and "export PYTHONSAFEPATH=1" in setup
    assert "export NCCL_DEBUG=INFO" in setup and "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in setup
    assert text.rstrip().splitlines()[-1].startswith("srun ")


def test_gpus_are_asked_per_node_unless_the_job_runs_on_cpu(cli_here, run_root):
    assert "gpus-per-node" not in sbatch_lines(script(cli_here, run_root))  # cluster.device=cpu
    s = sbatch_lines(script(cli_here, run_root, "cluster.gpus=true", "gpus_per_node=4"))
    assert s["gpus-per-node"] == "4"


def test_excluded_nodes_reach_the_exclude_line_and_the_job_keeps_them(cli_here, run_root):
    """cluster.exclude renders --exclude (the nodes a preflight named are added to it by a requeue,
    launchers/slurm/node_task.py); cluster.exclude_bad_nodes travels in job.yaml for the node task."""
    assert "exclude" not in sbatch_lines(script(cli_here, run_root))
    s = sbatch_lines(script(cli_here, run_root, "cluster.exclude=[c3,gpu-17]", "cluster.exclude_bad_nodes=true",
                            "preflight=true"))
    assert s["exclude"] == "c3,gpu-17"


@pytest.mark.parametrize("extra", [(), ("cluster.min_nodes=1",), ("cluster.max_nodes=3",)])
def test_each_node_task_starts_torchrun_with_the_flags_the_plan_gives(extra):
    """launchers/slurm/node_task.py builds torchrun's flags on the node from plan.json and job.yaml (as
    runs.load_plan and planning.config.job_config read them back): they are the plan's, but for the attempt's
    rendezvous id and the first node as endpoint. (A flag that read a plan field the node task did not
    have broke every SLURM job once; it now has the whole Plan.)"""
    from omegaconf import OmegaConf

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.config import job_config
    from fsdp_jobs.planning.plan import Plan, make_plan
    from fsdp_jobs.launchers.common import torchrun_args
    from fsdp_jobs.launchers.slurm.node_task import agent_args

    cfg, _ = compose(["cluster=slurm", "cluster.device=cpu", "nodes=2", "gpus_per_node=2", *extra])
    plan = make_plan(cfg)
    on_node = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))  # plan.json's round trip
    job = job_config(OmegaConf.to_container(cfg, resolve=True))
    expected = [a.replace(f"--rdzv-id={plan.rendezvous.run_id}", "--rdzv-id=7-0")
                for a in torchrun_args(plan, "n1:20007", cfg.cluster.stop_grace_s)]
    assert agent_args(on_node, job, "7-0", "n1:20007") == expected


DUMP = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))"
HOSTS = ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize("extra, slurm", [
    ((), {"SLURM_JOB_ID": "4123456", "SLURM_NODEID": "1"}),  # a first attempt: no SLURM_RESTART_COUNT yet
    (("cluster.rdzv_port=29600", "script=tests/scripts/ddp_train.py", "script_args=[--log,x]"),
     {"SLURM_JOB_ID": "4123461", "SLURM_NODEID": "3", "SLURM_RESTART_COUNT": "2",  # an array element, requeued
      "SLURM_ARRAY_JOB_ID": "4123457", "SLURM_ARRAY_TASK_ID": "4"}),
    (("fault_tolerance=replica", "gpus_per_node=1", "fsdp.shard_group_size=2"),  # two groups of two nodes
     {"SLURM_JOB_ID": "4123477", "SLURM_NODEID": "3"}),
], ids=["first-attempt", "array-requeued-script", "replica"])
def test_the_dry_run_shows_the_exact_command_each_node_task_starts(tmp_path, monkeypatch, extra, slurm):
    """The batch script (what dry_run=true prints and sbatch gets) shows each node's command with what only
    the allocation knows as shell variables: run in bash on a node of the job (scontrol answering from the
    job's nodes), it gives the argv and environment the node task builds there from SLURM's variables and the
    job's records, word for word (launchers/slurm/node_task.py: node_launch builds both)."""
    from omegaconf import OmegaConf

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.config import job_config
    from fsdp_jobs.planning.plan import Plan, make_plan
    from fsdp_jobs.launchers.common import USER_CODE_ENV
    from fsdp_jobs.launchers.slurm.backend import BACKEND
    from fsdp_jobs.launchers.slurm.node_task import node_launch, this_node

    monkeypatch.chdir(REPO)
    cfg, _ = compose(["cluster=slurm", "cluster.gpus=false", "nodes=4", f"run_root={tmp_path}/runs", "name=s", *extra])
    plan = make_plan(cfg)
    text = BACKEND.dryrun(plan, cfg).request.sbatch
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("# every node's task starts the command below"))
    shown = list(itertools.takewhile(lambda line: line.startswith("#   "), lines[head + 2:]))
    assert len(shown) > 3, text
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(HOSTS) + "\n")
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    (tmp_path / "dump.py").write_text(DUMP)
    environ = {**slurm, "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SUBMITIT_EXECUTOR": "slurm",
               "SLURMD_NODENAME": HOSTS[int(slurm["SLURM_NODEID"])], "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}
    command = shown[-1][4:].replace(shlex.quote(sys.executable), f"{shlex.quote(sys.executable)} {tmp_path}/dump.py", 1)
    exports = [line for line in lines if line.startswith("export ")]  # what the node task inherits
    script = "\n".join([*exports, *(line[4:] for line in shown[:-1]), command])
    ran = json.loads(subprocess.run(["bash", "-c", script], env={**os.environ, **environ}, capture_output=True,
                                    text=True, check=True, timeout=60).stdout)

    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    on_node = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))  # as the node reads plan.json and job.yaml
    job = job_config(OmegaConf.to_container(cfg, resolve=True))
    user = ran["env"].get(USER_CODE_ENV)  # the node task reads it from the batch script's exports
    cmd, env = node_launch(on_node, job, plan.run_dir, sys.executable, user, this_node(on_node, job)[1])
    assert [sys.executable, *ran["argv"]] == cmd
    assert {k: ran["env"][k] for k in env} == env
    assert "$" not in " ".join(cmd) + " ".join(env.values())  # every variable was filled


def test_a_slurm_job_may_be_given_room_to_grow(cli_here, run_root):
    """(the node tasks' flags for it: test_each_node_task_starts_torchrun_with_the_flags_the_plan_gives)"""
    r = cli_here("cluster=slurm", f"run_root={run_root}", "name=s", "dry_run=true", "nodes=2", "cluster.max_nodes=3")
    assert r.returncode == 0, r.stderr
    assert "    min_nodes: 2\n    max_nodes: 3\n" in r.stdout


def test_a_grow_job_is_the_job_for_more_nodes_never_requeued_and_outlasting_the_job():
    """launchers/slurm/grow.py: the grow job keeps the job's partition, setup and stop signal; it must
    not be requeued on its own (its nodes belong to one attempt's rendezvous), and its time limit is the
    job's remaining time plus a margin, so the job's own stop signal comes first."""
    from fsdp_jobs.launchers.slurm.grow import GROW_TIME_MARGIN_MIN, grow_parameters

    job = {"job_name": "big", "nodes": 2, "time": 60, "partition": "gpu", "setup": ["export A=1"],
           "additional_parameters": {"requeue": True, "signal": "USR2@120", "exclude": "c3"}}
    g = grow_parameters(job, 1, 17 + GROW_TIME_MARGIN_MIN, busy=["c[1-2]", "c7"])
    assert g["nodes"] == 1 and g["job_name"] == "big-grow" and g["time"] == 22
    assert g["partition"] == "gpu" and g["setup"] == ["export A=1"]
    # never on the nodes the job (and its earlier grow jobs) run on, nor on those the job excludes
    assert g["additional_parameters"] == {"no-requeue": True, "signal": "USR2@120", "exclude": "c3,c[1-2],c7"}
    assert job["nodes"] == 2 and job["additional_parameters"] == {"requeue": True, "signal": "USR2@120",
                                                                  "exclude": "c3"}  # the job's own are untouched
    assert grow_parameters({"job_name": "j", "additional_parameters": {}}, 1, 9, busy=["n1"])[
        "additional_parameters"] == {"no-requeue": True, "exclude": "n1"}


def test_a_grow_job_excludes_only_well_formed_hostlists_of_the_running_jobs(monkeypatch):
    """What squeue prints reaches sbatch's --exclude: hostlists pass, anything else is dropped."""
    import subprocess

    from fsdp_jobs.launchers.slurm import grow

    seen: list[list[str]] = []

    def squeue(cmd, **_):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "n[1-2]\ngpu-[01,03],cpu7\nn3;rm -rf /\n$(id)\n", "")

    monkeypatch.setattr(grow.subprocess, "run", squeue)
    assert grow.nodes_in_use(["7", "9"]) == ["n[1-2]", "gpu-[01,03],cpu7"]
    assert seen == [["squeue", "-h", "-t", "RUNNING", "-j", "7,9", "-o", "%N"]]


@pytest.mark.parametrize("left, minutes", [("1-02:03:04", 1564), ("2:03:00", 123), ("14:59", 15), ("0:30", 1),
                                           ("UNLIMITED", 60), ("", 60)])
def test_a_grow_job_gets_the_jobs_remaining_minutes(monkeypatch, left, minutes):
    import subprocess

    from fsdp_jobs.launchers.slurm import grow

    monkeypatch.setattr(grow.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, left + "\n", ""))
    assert grow.minutes_left("7", default=60) == minutes


def test_a_grow_is_refused_in_one_line_before_the_job_trains_or_when_it_would_not_grow(tmp_path):
    """launchers/slurm/grow.py: nothing is submitted for a job whose current attempt has not recorded its
    rendezvous (still starting, or requeued), nor for a node count it already has with its grow jobs."""
    from fsdp_jobs.rundir import runs
    from fsdp_jobs.planning.errors import UserError
    from fsdp_jobs.rundir.status import Run
    from fsdp_jobs.launchers.slurm import grow
    from fsdp_jobs.launchers.slurm.node_task import write_rendezvous

    run_dir = tmp_path / "big"
    (run_dir / "slurm").mkdir(parents=True)
    runs.write_atomic(run_dir / "job.yaml", "nodes: 2\ncluster: {time_min: 60}\n")
    run = Run(run_dir, {"backend": "slurm", "job_id": "41"})
    with pytest.raises(UserError, match="not training yet"):
        grow.submit_grow(run, 3, "41", active=lambda j: True)
    runs.write_state(run_dir, status="running", step=5)
    write_rendezvous(run_dir, "40", "40.0", "40-0", "n1:20040")  # an older job's record
    with pytest.raises(UserError, match="not training yet"):
        grow.submit_grow(run, 3, "41", active=lambda j: True)
    write_rendezvous(run_dir, "41", "41.1", "41-1", "n2:20041")
    (run_dir / "slurm" / grow.GROW_FILE).write_text(
        '{"job_id": "42", "nodes": 1, "of": "41", "run_id": "41-1"}\n'
        '{"job_id": "43", "nodes": 1, "of": "41", "run_id": "41-0"}\n')  # joined the attempt before the requeue
    with pytest.raises(UserError, match="has 3 nodes already"):
        grow.submit_grow(run, 3, "41", active=lambda j: True)
    with pytest.raises(UserError, match="parameters.json is missing"):  # 4 > 3: it would submit
        grow.submit_grow(run, 4, "41", active=lambda j: True)
    with pytest.raises(UserError, match="parameters.json is missing"):  # job 42 ended: 2 nodes now
        grow.submit_grow(run, 3, "41", active=lambda j: j != "42")
