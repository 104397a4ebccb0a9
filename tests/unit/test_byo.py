"""Bring your own training, fast tier: refusals of script=/module=/model=hf, what every backend's dry run
starts on the ranks, the state a plain script leaves, and the torch-free planning of HF models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = REPO / "tests" / "scripts"
TINY_HF = ("model=hf", "model.kwargs.config.hidden_size=64", "model.kwargs.config.intermediate_size=128",
           "model.kwargs.config.num_hidden_layers=2", "model.kwargs.config.vocab_size=128",
           "model.kwargs.config.max_position_embeddings=64", "data.seq_len=32")


def assert_refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-jobs: error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_script_is_one_line_and_writes_nothing(cli_here, tmp_path):
    root = tmp_path / "runs"
    r = cli_here(f"run_root={root}", "name=x", "script=missing.py")
    assert_refused(r, "script='missing.py'", "no such file")
    assert not root.exists()


def test_a_script_that_is_not_python_is_refused(cli_here, tmp_path):
    root = tmp_path / "runs"
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/bash\nfor i in 1 2; do echo $i; done\n")
    r = cli_here(f"run_root={root}", "name=x", f"script={shell}")
    assert_refused(r, "script=", "is not a Python script", "line 2")
    binary = tmp_path / "train.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    assert_refused(cli_here(f"run_root={root}", "name=x", f"script={binary}"), "is not a Python script")
    assert not root.exists()


def test_model_hf_without_transformers_is_one_line(tmp_path, monkeypatch, capsys):
    """transformers is hidden from the finder (it is installed here for the other tests)."""
    import importlib.util

    from fsdp_jobs.__main__ import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "transformers" else real(name, *a))
    root = tmp_path / "runs"
    with pytest.raises(SystemExit) as e:
        main([f"run_root={root}", "name=x", "model=hf"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fsdp-jobs: error: model='hf': needs the transformers package"), err
    assert "pip install 'fsdp-jobs[hf]'" in err[0]
    assert not root.exists()


def test_script_args_without_a_script_and_both_modes_are_refused(cli_here, tmp_path):
    root = tmp_path / "runs"
    assert_refused(cli_here(f"run_root={root}", "script_args=[--epochs,3]"), "script_args", "needs script=")
    assert_refused(cli_here(f"run_root={root}", f"script={SCRIPTS / 'ddp_train.py'}", "module=json.tool"),
                   "module=", "choose one")
    assert_refused(cli_here(f"run_root={root}", "module=no_such_pkg_xyz.train"), "module=", "not importable")
    assert not root.exists()


def dry(cli, backend: str, tmp_path: Path, *args: str) -> str:
    extra = ["cluster.image=registry.example.com/fsdp-jobs:1"] if backend == "kubernetes" else []
    r = cli(f"cluster={backend}", "cluster.device=cpu", f"run_root={tmp_path / 'runs'}", "name=byo", "dry_run=true",
            *extra, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("backend", ["local", "slurm", "docker"])
def test_every_backend_starts_the_copied_script_after_torchrun_with_its_arguments(cli_here, tmp_path, backend):
    """The dry run shows it, under the shim that records its exception (fsdp_jobs/runtime/user_code.py); `--`
    keeps torchrun from claiming `--log` (prefix of its --log-dir...)."""
    out = dry(cli_here, backend, tmp_path, f"script={SCRIPTS / 'ddp_train.py'}", "script_args=[--epochs,3,--log,1]")
    run_dir = tmp_path / "runs" / "byo"
    entry = f"-m fsdp_jobs.runtime.user_code -- {run_dir}/script/001/ddp_train.py --epochs 3 --log 1"
    if backend == "docker":  # the compose file, as YAML: the command is a list
        import yaml

        spec = yaml.safe_load(out.split("# launch commands (docker)\n", 1)[1].split("# then", 1)[0])
        out = out + "\n" + " ".join(spec["services"]["node0"]["command"])
    assert entry in out, out[-3000:]
    assert f"fsdp_jobs.runtime {run_dir}" not in out.split("# launch commands", 1)[1]  # not the trainer
    assert f"FSDP_JOBS_RUN_DIR={run_dir}" in out.replace(": ", "=").replace("'", "")
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_module_mode_runs_the_copied_package_first_on_the_path(tmp_path):
    pkg = tmp_path / "src" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('hi')\n")
    r = subprocess.run([sys.executable, "-m", "fsdp_jobs", f"run_root={tmp_path / 'runs'}", "name=m", "dry_run=true",
                        "module=mypkg.train", "script_args=[--x,1]"], cwd=REPO, text=True, capture_output=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(tmp_path / "src")})
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "m"
    assert "-m fsdp_jobs.runtime.user_code -- -m mypkg.train --x 1" in r.stdout
    assert f"PYTHONPATH={run_dir}/script/001:{tmp_path / 'src'}" in r.stdout


def test_copy_of_the_user_code_skips_the_run_root_and_caches(tmp_path):
    from omegaconf import OmegaConf

    from fsdp_jobs.launchers.snapshot import take_user_code

    src = tmp_path / "proj"
    (src / "runs" / "old").mkdir(parents=True)
    (src / "runs" / "old" / "big.bin").write_bytes(b"x" * 100)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (src / "train.py").write_text("import helper\n")
    (src / "helper.py").write_text("")
    cfg = OmegaConf.create({"script": str(src / "train.py"), "module": None, "run_root": str(src / "runs")})
    take_user_code(cfg, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").rglob("*")) == ["helper.py", "train.py"]


def test_a_plain_script_that_exits_0_completed_and_a_stopped_one_stays_preempted(tmp_path, monkeypatch):
    """The user-code shim's rank 0 records that the attempt trains (an earlier attempt's word never reads as this
    one's); the node task that saw the attempt end records a script whose ranks exited 0 as completed, its
    own verdict, unless the script recorded a stop (fsdp_jobs.job: preempted) since the attempt began."""
    import time

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.rundir.outcome import JobState, outcome
    from fsdp_jobs.runtime.user_code import record_running
    from fsdp_jobs.launchers.node.wrapper import settle_script

    script = {"script": "/x/train.py"}
    runs.write_state(tmp_path, status="preempted", step=7)  # left by an earlier attempt
    began = time.time()
    monkeypatch.setenv("FSDP_JOBS_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    record_running()  # not the leader
    assert runs.read_state(tmp_path).status == "preempted"
    monkeypatch.setenv("RANK", "0")
    record_running()
    assert (runs.read_state(tmp_path).status, runs.read_state(tmp_path).step) == ("running", 7)
    assert settle_script(script, tmp_path, "node0", 1, began) == ""  # a failure is not a completion: no word yet
    assert settle_script(script, tmp_path, "node0", 0, began) == "completed"
    assert outcome(tmp_path, began).state == JobState.SUCCEEDED and runs.read_state(tmp_path).status == "running"
    began = time.time()
    runs.write_state(tmp_path, status="preempted", step=9)  # fsdp_jobs.job recorded a stop
    assert settle_script(script, tmp_path, "node0", 0, began) == "preempted"
    began = time.time()
    runs.write_state(tmp_path, status="running", step=3)
    assert settle_script({"script": None, "module": None}, tmp_path, "node0", 0, began) == ""  # built-in: its own


def test_hf_plan_counts_the_real_parameters_without_torch_or_transformers(tmp_path):
    code = ("import sys, json; from fsdp_jobs.planning.compose import compose; from fsdp_jobs.planning.plan import make_plan; "
            f"cfg, job = compose({list(TINY_HF) + [f'run_root={tmp_path}']!r}); p = make_plan(cfg); "
            "print(json.dumps({'params': p.memory.params, 'vocab': job['model']['vocab_size'], "
            "'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # embeddings 2 x 128 x 64, per layer q/o 64x64, k/v 64x32 (2 kv heads), mlp 3 x 64x128, 2 norms; final norm
    assert got == {"params": 2 * 128 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64,
                   "vocab": 128, "heavy": []}


def test_kubernetes_pods_get_the_script_through_the_configmap_and_unpack_it(tmp_path, monkeypatch):
    """No submitter can write the PVC: the code travels in the job's ConfigMap; boot.py unpacks it where
    the pods' command names it (the same rank_entry as every backend)."""
    import base64

    from fsdp_jobs.planning.compose import compose
    from fsdp_jobs.planning.plan import make_plan
    from fsdp_jobs.cli import launcher
    from fsdp_jobs.launchers.kubernetes import boot as k8s_boot, manifests as k8s_manifests

    cfg, _ = compose(["cluster=kubernetes", "cluster.image=registry.example.com/fsdp-jobs:1", "cluster.device=cpu",
                      f"run_root={tmp_path / 'runs'}", "name=byo", f"script={SCRIPTS / 'ddp_train.py'}",
                      "script_args=[--log,1]"])
    plan = make_plan(cfg)
    d = launcher.get("kubernetes").dryrun(plan, cfg)
    cm = next(o for o in d.request.objects if o["kind"] == "ConfigMap")
    pod = k8s_manifests.pod_templates(d.request.job)[0]["spec"]["containers"][0]
    user_dir = pod["command"][-3].rsplit("/", 1)[0]
    assert pod["command"][-2:] == ["--log", "1"] and pod["command"][-3].endswith("/ddp_train.py")
    assert pod["command"][-6:-3] == ["-m", "fsdp_jobs.runtime.user_code", "--"]
    assert user_dir.startswith("/runs/byo/script/")
    env = {e["name"]: e.get("value") for e in pod["env"]}
    assert env["FSDP_JOBS_USER_CODE"] == user_dir and env["FSDP_JOBS_RUN_DIR"] == "/runs/byo"

    config_dir, dest = tmp_path / "cm", tmp_path / "pvc" / "script" / "abc"
    config_dir.mkdir()
    (config_dir / "user-code.tgz").write_bytes(base64.b64decode(cm["binaryData"]["user-code.tgz"]))
    dest.parent.mkdir(parents=True)
    monkeypatch.setenv("FSDP_JOBS_USER_CODE", str(dest))
    k8s_boot.unpack_user_code(str(config_dir))
    assert (dest / "ddp_train.py").read_text() == (SCRIPTS / "ddp_train.py").read_text()
    assert (dest / "model_def.py").is_file()


def test_dotfiles_keys_and_secret_looking_files_stay_behind_in_the_run_dir_and_the_configmap(tmp_path):
    """A .env, a secrets.json or a key next to the script is not code: neither the run dir's copy nor the
    Kubernetes ConfigMap's archive carries it, and the dry run's note says what stays behind."""
    import gzip
    import io
    import tarfile

    from omegaconf import OmegaConf

    from fsdp_jobs.planning.byo import travel_note
    from fsdp_jobs.launchers.snapshot import take_user_code, user_code_tar

    src = tmp_path / "proj"
    src.mkdir()
    for name in ("train.py", "tokenizer.json", ".env", "secrets.json", "server.key", "hf_token", ".netrc"):
        (src / name).write_text("HF_TOKEN=hunter2\n" if name not in ("train.py", "tokenizer.json") else "x = 1\n")
    cfg = OmegaConf.create({"script": str(src / "train.py"), "module": None, "run_root": str(tmp_path / "runs")})
    take_user_code(cfg, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").rglob("*")) == ["tokenizer.json", "train.py"]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(user_code_tar(cfg)))) as tar:
        assert sorted(tar.getnames()) == ["tokenizer.json", "train.py"]
    note = travel_note(cfg)
    assert "2 files travel" in note and ".env" in note.split("left behind")[1] and "secrets.json" in note
