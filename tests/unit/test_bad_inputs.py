"""Every bad input, on every backend and every command (a job, a sweep, ctl, export): one line on stderr
naming what is wrong and what is allowed, exit status 2, and nothing written or changed anywhere (the run
root, the existing run dirs in it, the state dir with the journal).

Each case runs in this process (a fresh interpreter per case would cost the quick loop a minute). A job's
case is NOT a dry run: a refusal must come before anything is submitted, so submit_group is replaced by a
failure, and a value the checks let through would end the case there.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO

NL = "x\ntouch PWNED #"  # a newline in a quoted value: what turned one #SBATCH line into two
SCRIPT = str(REPO / "tests" / "scripts" / "ddp_train.py")
K8S = ["cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:0.1"]

# (arguments, what the one line must say): key first, then what is allowed or what is wrong
JOB_CASES = [
    (["nodes=0"], "nodes=0", ">= 1"),
    (["nodes=1000000000"], "nodes=1000000000", "at most 10000"),
    (["gpus_per_node=65"], "gpus_per_node=65", "at most 64"),
    (["name=a:b"], "name='a:b'", "a name may hold"),
    (["name=" + "a" * 300], "name=", "at most 100"),
    ([f"name='{NL}'"], "name=", "a name may hold"),
    (["name=.hidden"], "name='.hidden'", "a name may hold"),
    (["name=-rf"], "name='-rf'", "a name may hold"),
    (["name='a b'"], "name='a b'", "a name may hold"),
    (["train.lr=inf"], "train.lr=inf", "finite number > 0"),
    (["train.lr=nan"], "train.lr=nan", "finite number > 0"),
    (["train.lr=0"], "train.lr=0", "finite number > 0"),
    (["train.weight_decay=-0.1"], "train.weight_decay=-0.1", ">= 0"),
    (["train.grad_clip=-1"], "train.grad_clip=-1", ">= 0"),
    (["train.float8=true", "cluster.device=cpu"], "train.float8=true", "compute capability >= 8.9"),
    (["train.float8_recipe=blockwise"], "train.float8_recipe='blockwise'", "tensorwise"),
    (["train.float8=true", "cluster.device=cuda", "train.float8_recipe=rowwise", "fsdp.mixed_precision.param_dtype=float32"],
     "train.float8_recipe='rowwise'", "needs bfloat16 compute"),
    (["train.float8=true", "cluster.device=cuda", "fault_tolerance=replica"], "train.float8_recipe='tensorwise'", "with fault_tolerance=replica"),
    (["train.min_lr_ratio=1.5"], "train.min_lr_ratio=1.5", "[0, 1]"),
    (["train.betas=[0.9,1.0]"], "train.betas[1]=1.0", "[0, 1)"),
    (["train.betas=[0.9]"], "train.betas", "two numbers"),
    (["train.steps=-1"], "train.steps=-1", ">= 1"),
    (["train.warmup_steps=-1"], "train.warmup_steps=-1", ">= 0"),
    (["train.log_interval=0"], "train.log_interval=0", ">= 1"),
    (["train.global_batch_size=0"], "train.global_batch_size=0", ">= 1"),
    (["model.norm_eps=0"], "model.norm_eps=0", "finite number > 0"),
    (["model.rope_theta=-1"], "model.rope_theta=-1", "finite number > 0"),
    (["model._target_=os.system"], "model._target_='os.system'", "not of the standard library"),
    (["data._target_=subprocess.Popen"], "data._target_='subprocess.Popen'", "not of the standard library"),
    (["model.dim=abc"], "model.dim", "abc"),
    (["model.dim=130"], "model.dim=130", "divisible by model.n_heads"),
    (["data.seq_len=4096"], "data.seq_len=4096", "model.max_seq_len"),
    (["data=token_file"], "data.path", "needs the token file"),
    # values no rank can run with: otherwise each passes the dry run, and the job then fails on every rank
    # after its start-up, hundreds of lines (tests/unit/test_rank_values.py: the rules themselves)
    (["model.dim=132"], "model.dim=132", "33 channels per head"),
    (["train.seed=-8"], "train.seed=-8", ">= 0"),
    (["train.seed=99999999999999999999"], "train.seed=99999999999999999999", "64-bit integer"),
    (["model.max_seq_len=99999999999999999999"], "model.max_seq_len=99999999999999999999", "64-bit integer"),
    (["train.lr=1e300"], "train.lr=1e+300", "AdamW's float32 step"),
    (["train.collective_timeout_s=1e300"], "train.collective_timeout_s=1e+300", "in [10, 8.64e+13]"),
    (["model._target_=fsdp_jobs.models.llama.Nope"], "model._target_=", "defines no Nope (its classes:"),
    (["model._target_=fsdp_jobs.models.nope.Transformer"], "model._target_=", "no module fsdp_jobs.models.nope"),
    (["model._target_=fsdp_jobs.models.llama"], "model._target_=", "is a module; name the class in it"),
    (["model._target_=fsdp_jobs.models.llama.rope_table"], "model._target_=", "needs head_dim, theta"),
    (["+model.kwargs.heads=4"], "model.kwargs.heads=4", "takes no argument heads"),
    (["data._target_=fsdp_jobs.runtime.data.Tokens"], "data._target_=", "defines no Tokens"),
    (["+data.kwargs.branches=4"], "data.kwargs.branches=4", "takes no argument branches"),
    (["fsdp.wrap.transformer_blocks=[fsdp_jobs.models.llama.Block]"], "fsdp.wrap.transformer_blocks=",
     "defines no Block"),
    (["fsdp.wrap.transformer_blocks=[fsdp_jobs.models.llama.rope_table]"], "fsdp.wrap.transformer_blocks=",
     "is a function; name a class"),
    # bytes that are not UTF-8 (as Python keeps them: lone surrogates) failed in every node wrapper's traceback
    (["data=token_file", "data.path=/tmp/caf\udce9/tokens.bin"], "data.path=b'/tmp/caf\\xe9/tokens.bin'",
     "holds bytes that are not UTF-8"),
    (["name=café"], "name='café'", "only in quotes: name='café'"),  # Hydra's parser: was 'LexerNoViableAltException'
    # a float or word where an integer or bool goes: OmegaConf's words, and the value the user gave last (Hydra's)
    (["nodes=2", "nodes=2.5"], "nodes='2.5'", "must be a whole number"),
    (["train.steps=1e3"], "train.steps='1e3'", "must be a whole number"),
    (["model.tie_embeddings=maybe"], "model.tie_embeddings='maybe'", "must be true or false"),
    (["data=token_file", "data.path=/etc/services"], "data.path='/etc/services'", "is a text file"),
    (["data=token_file", "data.path=/nonexistent/tokens.bin"], "data.path=", "no such file"),
    (["checkpoint.interval=-1"], "checkpoint.interval=-1", ">= 0"),
    (["checkpoint.keep_last=0"], "checkpoint.keep_last=0", ">= 1"),
    (["cluster.env={A:1}"], "cluster.env=", "is a map; set its entries one by one"),
    (["+cluster.env.A-B=x"], "cluster.env.A-B", "environment variable name"),
    ([f"+cluster.env.FOO='{NL}'"], "cluster.env.FOO=", "control characters"),
    ([f"script={SCRIPT}", f"script_args=['{NL}']"], "script_args[0]=", "control characters"),
    (["+cluster.secret_env.TOKEN=plain"], "cluster.secret_env.TOKEN='plain'", "env:VAR"),
    (["+cluster.secret_env.TOKEN=env:FSDP_JOBS_SURELY_UNSET"], "cluster.secret_env.TOKEN=", "is not set"),
    (["+cluster.secret_env.TOKEN=file:/nonexistent/token"], "cluster.secret_env.TOKEN=", "cannot read"),
    (["+cluster.secret_env.A-B=env:HOME"], "cluster.secret_env.A-B", "environment variable name"),
    (["cluster.memory_fraction=0"], "cluster.memory_fraction=0", "(0, 1]"),
    (["cluster.rdzv_port=70000"], "cluster.rdzv_port=70000", "1-65535"),
    (["cluster.min_nodes=5"], "cluster.min_nodes=5", "between 1 and nodes=2"),
    (["cluster.gpu_memory_gb=-1"], "cluster.gpu_memory_gb=-1", "finite number > 0"),
    (["cluster.device=tpu"], "cluster.device='tpu'", "allowed"),
    (["fsdp=bogus"], "fsdp", "hybrid_shard"),
    (["fsdp.shard_group_size=3"], "fsdp.shard_group_size", "must divide the world size 4"),
    (["bogus_key=1"], "bogus_key", "unknown key"),
    (["script=/nonexistent/train.py"], "script='/nonexistent/train.py'", "no such file"),
    (["module=not a module"], "module=", "dotted module name"),
    (["--bogus"], "--bogus", "unknown option"),
    (["nodes"], "nodes", "key=value"),
    # SLURM: every value lands on an #SBATCH line or in the batch script
    (["cluster=slurm", "cluster.mem=lots"], "cluster.mem='lots'", "sbatch size"),
    (["cluster=slurm", "cluster.partition=''"], "cluster.partition=''", "partition name"),
    (["cluster=slurm", "cluster.partition=a,b"], "cluster.partition='a,b'", "must be quoted"),
    (["cluster=slurm", "cluster.partition='p;rm -rf x'"], "cluster.partition=", "partition name"),
    (["cluster=slurm", f"cluster.partition='{NL}'"], "cluster.partition=", "partition name"),
    (["cluster=slurm", "cluster.job_name='a b'"], "cluster.job_name='a b'", "a name may hold"),
    (["cluster=slurm", f"cluster.job_name='{NL}'"], "cluster.job_name=", "a name may hold"),
    (["cluster=slurm", "+cluster.sbatch.output=x"], "cluster.sbatch.output='x'", "not one fsdp-jobs sets"),
    (["cluster=slurm", f"+cluster.sbatch.comment='{NL}'"], "cluster.sbatch.comment=", "control characters"),
    (["cluster=slurm", "cluster.account='a b'"], "cluster.account='a b'", "account name"),
    (["cluster=slurm", "cluster.signal=TERM"], "cluster.signal='TERM'", "USR2"),
    (["cluster=slurm", "cluster.time_min=0"], "cluster.time_min=0", ">= 1"),
    (["cluster=slurm", "cluster.exclude_bad_nodes=maybe"], "cluster.exclude_bad_nodes", "maybe"),
    (["cluster=slurm", "cluster.exclude=['c1;reboot']"], "cluster.exclude='c1;reboot'", "node names"),
    (["cluster=slurm", "+cluster.sbatch.exclude=c1"], "cluster.sbatch.exclude='c1'", "not one fsdp-jobs sets"),
    # preflight: a mode and a ratio
    (["preflight=maybe"], "preflight='maybe'", "allowed: false, true"),
    (["fault.preflight_slow_ratio=1"], "fault.preflight_slow_ratio=1", "finite number > 1"),
    (["fault.sdc_recompute_interval=-5"], "fault.sdc_recompute_interval=-5", "a number of steps >= 0"),
    (["fault.sdc_recompute_interval=auto"], "fault.sdc_recompute_interval='auto'", "must be a whole number"),
    (["fault.sdc_spike_factor=1"], "fault.sdc_spike_factor=1.0", "a number above 1"),
    (["fault.sdc_spike_factor=nan"], "fault.sdc_spike_factor=nan", "or 0 (off)"),
    ([f"script={SCRIPT}", "preflight=true"], "preflight=True", "use preflight=only first"),
    # fault_tolerance=replica: its keys, and what the mesh and the launch keys allow with it
    (["fault_tolerance=sometimes"], "fault_tolerance='sometimes'", "allowed: none, replica"),
    (["fault_tolerance.mode=maybe"], "fault_tolerance.mode='maybe'", "allowed: none, replica"),
    (["fault_tolerance=replica", "fault_tolerance.heartbeat_timeout_s=0"], "fault_tolerance.heartbeat_timeout_s=0",
     "in [0.2, 3600]"),
    (["fault_tolerance=replica", "fault_tolerance.min_replicas=0"], "fault_tolerance.min_replicas=0", ">= 1"),
    (["fault_tolerance=replica", "fault_tolerance.min_replicas=3"], "fault_tolerance.min_replicas=3",
     "at most the 2 replica groups"),
    (["fault_tolerance=replica", "fault_tolerance.lighthouse_port=70000"], "fault_tolerance.lighthouse_port=70000",
     "TCP port"),
    (["fault_tolerance=replica", "fault_tolerance.quorum_tick_ms=0"], "fault_tolerance.quorum_tick_ms=0",
     "from 1 to 10000"),
    # a survivor waiting on a silent group fails its step before its watchdog takes it for a hang (pitfall 20)
    (["fault_tolerance=replica", "fault_tolerance.timeout_s=31"], "fault_tolerance.timeout_s=31",
     "at most half the hang watchdog's timeout (at least 60 s)"),
    (["fault_tolerance=replica", "fault.hang_timeout_s=20"], "fault_tolerance.timeout_s=30",
     "at most half the hang watchdog's timeout (fault.hang_timeout_s=20)"),
    (["fault_tolerance=replica", "fsdp=full_shard"], "fault_tolerance='replica'", "use fsdp=hybrid_shard"),
    (["fault_tolerance=replica", "nodes=1"], "fault_tolerance='replica'", "at least 2 replica groups"),
    (["fault_tolerance=replica", "fsdp.shard_group_size=1"], "fsdp.shard_group_size=1", "a replica group is whole nodes"),
    (["fault_tolerance=replica", "nodes=3", "cluster.min_nodes=2"], "cluster.min_nodes=2", "leave it null"),
    (["fault_tolerance=replica", "cluster.max_nodes=3"], "cluster.max_nodes=3", "leave it null"),
    (["fault_tolerance=replica", "preflight=true"], "preflight=True", "run preflight=only first"),
    ([*K8S, "cluster.kind=pytorchjob", "fault_tolerance=replica"], "cluster.kind='pytorchjob'",
     "use cluster.kind=jobset or volcano"),
    # Docker: never root, never the host's system
    (["cluster=docker", "cluster.user=0:0"], "cluster.user='0:0'", "uid 0 is root"),
    (["cluster=docker", "cluster.user=root"], "cluster.user='root'", "UID:GID"),
    (["cluster=docker", "cluster.mounts=[/:/host]"], "cluster.mounts='/:/host'", "the host path / is the system's"),
    (["cluster=docker", "cluster.mounts=[/var/run/docker.sock:/var/run/docker.sock]"], "cluster.mounts=",
     "the host path /var/run/docker.sock"),
    (["cluster=docker", "cluster.mounts=[/data:/etc]"], "cluster.mounts='/data:/etc'", "the container path /etc"),
    (["cluster=docker", "cluster.mounts=[data:/data]"], "cluster.mounts='data:/data'", "/host/path:/container/path"),
    (["cluster=docker", "cluster.mem=lots"], "cluster.mem='lots'", "size such as 16g"),
    (["cluster=docker", "cluster.shm_size=huge"], "cluster.shm_size='huge'", "size such as 2g"),
    # Kubernetes: names, paths and secrets that reach manifests
    (["cluster=kubernetes"], "cluster.image", ""),
    ([*K8S, "cluster.mount_path=/etc"], "cluster.mount_path='/etc'", "outside the system's directories"),
    ([*K8S, "cluster.namespace=Bad_NS"], "cluster.namespace='Bad_NS'", "Kubernetes name"),
    ([*K8S, "+cluster.env.HF_TOKEN=hunter2"], "cluster.env.HF_TOKEN=", "Kubernetes Secret"),
    ([*K8S, "+cluster.secret_env.X=nope"], "cluster.secret_env.X='nope'", "SECRET_NAME/KEY"),
    ([*K8S, "cluster.run_as_user=0"], "cluster.run_as_user=0", ">= 1"),
    # sweeps: the sweep id and every member, before any member is written
    (["-m", "train.lr=1e-3,3e-3", "name=a:b"], "name='a:b'", "a name may hold"),
    (["-m", f"name='{NL}'", "train.lr=1e-3,3e-3"], "name=", "a name may hold"),
    (["-m", "name=x,y"], "name", "cannot be swept"),
    (["-m", "train.lr=1e-3,inf"], "train.lr=inf", "finite number > 0"),
    (["-m", "nodes=2,0"], "nodes=0", ">= 1"),
    (["-m", "train.lr=interval(0,1)"], "train.lr", "allowed sweeps"),
    (["-m", "cluster=slurm", "cluster.mem=1G,lots"], "member 2 of 2 (mem=lots): cluster.mem='lots'", "sbatch size"),
]


def _tree(*roots: Path) -> list[tuple[str, str, int]]:
    """Every path under the roots with a hash of its bytes and its mode: what 'nothing written' compares."""
    out = []
    for root in roots:
        for p in sorted(root.rglob("*")):
            data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out.append((str(p), data, p.stat().st_mode))
    return out


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A run root with a run in it, a state dir with a journal entry, no job variables of this shell, and
    submission made impossible."""
    import fsdp_jobs.cli.submit

    for k in list(os.environ):
        if (k.startswith(("FSDP_JOBS_", "SLURM_", "SUDO_")) and k != "FSDP_JOBS_STATE_DIR") or k == "KUBECONFIG":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config of this machine's
    monkeypatch.chdir(REPO)

    def no_submission(*a: object, **k: object) -> None:
        raise AssertionError("a bad input reached submission")

    monkeypatch.setattr(fsdp_jobs.cli.submit, "submit_group", no_submission)
    run_root = tmp_path / "runs"
    keep = run_root / "keep"
    (keep / "logs").mkdir(parents=True)
    (keep / "job.yaml").write_text("name: keep\nnodes: 1\n")
    (keep / "state.json").write_text(json.dumps({"status": "completed", "step": 3}))
    from fsdp_jobs.rundir import journal

    journal.record(sweep="old", member="m", overrides=["train.lr=1"], params={}, backend="local", job_id="1",
                   run_dir=str(keep), config_hash="x")
    return {"run_root": run_root, "state": journal.state_dir()}


def refused(world: dict[str, Path], capsys: pytest.CaptureFixture[str], entry: str, argv: list[str]) -> str:
    """Run the command in this process; assert exit 2, one line, nothing written; return the line."""
    from fsdp_jobs.__main__ import main
    from fsdp_jobs.export import main as export_main

    before = _tree(world["run_root"], world["state"])
    capsys.readouterr()
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        with pytest.raises(SystemExit) as exit_:
            (export_main if entry == "export" else main)(argv)
    finally:
        os.umask(umask)  # the CLI makes everything owner-only; later tests in this process must not inherit it
    out = capsys.readouterr()
    assert exit_.value.code == 2, (exit_.value.code, out.err)
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-jobs: error: "), out.err
    assert "Traceback" not in out.err and out.out == "", out
    assert _tree(world["run_root"], world["state"]) == before, "a refusal wrote or changed something"
    return lines[0]


@pytest.mark.parametrize("args, key, allowed", JOB_CASES, ids=[" ".join(c[0])[:60] for c in JOB_CASES])
def test_a_bad_job_or_sweep_is_one_line_exit_2_nothing_written(world, capsys, args, key, allowed):
    line = refused(world, capsys, "job", [*args, f"run_root={world['run_root']}"])
    assert key in line and allowed in line, line
    assert "hunter2" not in line  # a refused secret is not printed either


def _ctl_run(run_root: Path, name: str, launch: dict[str, object]) -> Path:
    run_dir = run_root / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "job.yaml").write_text(f"name: {name}\nnodes: 1\n")
    (run_dir / "launches.jsonl").write_text(json.dumps({"time": "t", **launch}) + "\n")
    return run_dir


def _checkpoint_run(run_root: Path, name: str, metadata: bytes | None, job: bool) -> Path:
    run_dir = run_root / name
    ckpt = run_dir / "checkpoints" / "step-000010"
    ckpt.mkdir(parents=True)
    if job:
        (run_dir / "job.yaml").write_text("model: {_target_: fsdp_jobs.models.llama.Transformer}\n")
    if metadata is not None:
        (ckpt / ".metadata").write_bytes(metadata)
    (ckpt / "manifest.json").write_text(json.dumps({"step": 10}))
    return run_dir


CTL_CASES = [
    (["status", "nope"], "RUN='nope'", "no such run or job"),
    (["cancel", "nope"], "RUN='nope'", "no such run or job"),
    (["logs"], "logs", "required"),
    (["chaos", "keep", "kill-node", "abc"], "node", "invalid int"),
    (["chaos", "keep", "explode", "1"], "action", "invalid choice"),
    (["chaos", "keep", "slow-link", "1", "--rate", "1mbit;reboot"], "--rate='1mbit;reboot'", "need a number and kbit"),
    (["chaos", "slurmrun", "cut-node", "1"], "chaos='cut-node'", "no running rank on node1"),
    (["status", "keep", "--bogus"], "--bogus", "unrecognized"),
    (["bogus-command"], "bogus-command", "overrides are key=value"),  # not a command: an override without '='
    (["cancel", "slurmrun"], "RUN='slurmrun'", "not a SLURM job id"),
    (["cancel", "dockerrun"], "RUN='dockerrun'", "fsdp-jobs never makes"),
    (["cancel", "nolaunch"], "RUN='nolaunch'", "records no launch"),
    (["compare", "nope"], "SWEEP='nope'", "no such sweep"),
    (["plot", "keep", "-o", "out.txt"], "-o='out.txt'", "must name a .png"),
]


@pytest.mark.parametrize("args, key, allowed", CTL_CASES, ids=[" ".join(c[0]) for c in CTL_CASES])
def test_a_bad_ctl_command_is_one_line_exit_2_nothing_written(world, capsys, args, key, allowed):
    root = world["run_root"]
    _ctl_run(root, "slurmrun", {"backend": "slurm", "job_id": "-u root"})
    _ctl_run(root, "dockerrun", {"backend": "docker", "job_id": "evil", "project": "evil; rm -rf /"})
    (root / "nolaunch" / "logs").mkdir(parents=True)
    (root / "nolaunch" / "job.yaml").write_text("name: nolaunch\n")
    argv = ["bogus-command"] if args == ["bogus-command"] else [*args, "--run-root", str(root)]
    line = refused(world, capsys, "job", argv)
    assert key in line and allowed in line, line


def test_a_damaged_journal_is_one_line_naming_it_and_a_run_is_still_found(world, capsys):
    journal_file = world["state"] / "journal.sqlite"
    journal_file.write_bytes(b"this is not an sqlite database at all" * 100)
    line = refused(world, capsys, "job", ["status", "no-such-sweep", "--run-root", str(world["run_root"])])
    assert str(journal_file) in line and "damaged" in line, line
    from fsdp_jobs.__main__ import main

    assert main(["status", "keep", "--run-root", str(world["run_root"])]) == 0  # a run needs no journal
    assert json.loads(capsys.readouterr().out)["run"] == "keep"


EXPORT_CASES = [
    ("/nonexistent/run", [], "path='/nonexistent/run'", "is not a directory"),
    ("good", ["--step", "5"], "--step=5", "no complete checkpoint step-000005"),
    ("empty", [], "RUN_DIR=", "holds no complete checkpoint"),
    ("nojob", ["--format", "hf"], "--format='hf'", "needs the run's model config"),
    ("corrupt", [], "checkpoint=", "cannot be read"),
    ("truncated", [], "checkpoint=", "cannot be read"),
    ("good", ["--dtype", "fp8"], "--dtype", "invalid choice"),
    ("good", ["--format", "hf"], "--format='hf'", "not a Hugging Face model"),
    ("good", ["-o", "EXISTING"], "--output=", "exists already"),
]


@pytest.mark.parametrize("run, args, key, allowed", EXPORT_CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in EXPORT_CASES])
def test_a_bad_export_is_one_line_exit_2_nothing_written(world, capsys, run, args, key, allowed):
    root = world["run_root"]
    good = _checkpoint_run(root, "good", b"unused: --step and --dtype are refused before reading", job=True)
    (root / "empty" / "checkpoints").mkdir(parents=True)
    _checkpoint_run(root, "nojob", b"x", job=False)
    _checkpoint_run(root, "corrupt", b"\x80\x04garbage, not a pickle", job=True)
    _checkpoint_run(root, "truncated", b"", job=True)
    existing = good / "exists.pt"
    existing.write_text("precious")
    argv = [str(root / run) if not run.startswith("/") else run, *[str(existing) if a == "EXISTING" else a for a in args]]
    line = refused(world, capsys, "export", argv)
    assert key in line and allowed in line, line
    assert existing.read_text() == "precious"


def test_the_table_covers_every_backend_and_command():
    cases = [" ".join(c[0]) for c in JOB_CASES]
    for backend in ("slurm", "docker", "kubernetes"):
        assert any(f"cluster={backend}" in c for c in cases), backend
    assert sum(c.startswith("-m") for c in cases) >= 5
    assert len(JOB_CASES) + len(CTL_CASES) + len(EXPORT_CASES) + 1 >= 60
