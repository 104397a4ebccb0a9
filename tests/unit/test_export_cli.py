"""python -m fsdp_jobs.export's options on a hand-made run dir (a real single-process DCP checkpoint):
which checkpoint, where to, which dtype, and one-line refusals that never overwrite anything."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import cli


def make_run(tmp_path, steps=(10, 20)):
    import torch.distributed.checkpoint as dcp

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "job.yaml").write_text("model: {_target_: fsdp_jobs.models.llama.Transformer}\n")
    for step in steps:
        ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
        state = {"model": {"w": torch.full((3, 2), float(step)), "b": torch.arange(2)},
                 "optim": {"state": {"w": {"exp_avg": torch.ones(3, 2)}}}}
        dcp.save(state, checkpoint_id=str(ckpt), no_dist=True)
        (ckpt / "manifest.json").write_text(json.dumps({"step": step}))
    return run_dir


def export(*args: str):
    return cli(*args, module="fsdp_jobs.export")


def test_newest_checkpoint_by_default_only_the_model_and_never_overwritten(tmp_path):
    run_dir = make_run(tmp_path)
    r = export(str(run_dir))
    assert r.returncode == 0, r.stderr
    out = run_dir / "export" / "model-step-000020.pt"
    sd = torch.load(out)
    assert set(sd) == {"w", "b"}  # the optimizer's state is not exported
    assert torch.equal(sd["w"], torch.full((3, 2), 20.0))
    assert r.stderr == ""  # a quick export says nothing but its line (progress begins after 2 s)
    again = export(str(run_dir))
    assert again.returncode == 2 and "exists already" in again.stderr and len(again.stderr.splitlines()) == 1


def test_a_long_phase_says_every_interval_that_it_goes_on(capsys):
    import time

    from fsdp_jobs.export import phase

    with phase("reading 70 GB", every_s=0.05, after_s=0.1):
        time.sleep(0.33)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "export: reading 70 GB: 0 s so far" and lines[-1].startswith("export: reading 70 GB: done in 0.")
    assert 4 <= sum(ln.endswith(" s so far") for ln in lines) <= 6, lines
    with phase("reading 1 MB", every_s=0.05, after_s=0.1):
        pass
    assert capsys.readouterr().err == ""  # done before the first line is due: silent, also when it failed


def export_here(*args: str) -> int:
    """The command's main() in this process (the other tests run the command itself: 1.5 s of imports each)."""
    import os

    from fsdp_jobs.export import main

    umask = os.umask(0o022)  # main() sets the owner-only umask of a command; give this process its own back
    try:
        return main(list(args))
    finally:
        os.umask(umask)


def test_step_output_and_dtype(tmp_path):
    run_dir = make_run(tmp_path)
    out = tmp_path / "w10.pt"
    assert export_here(str(run_dir), "--step", "10", "-o", str(out), "--dtype", "bfloat16") == 0
    sd = torch.load(out)
    assert sd["w"].dtype == torch.bfloat16 and float(sd["w"][0, 0]) == 10.0
    assert sd["b"].dtype == torch.int64  # only floating-point weights are cast
    assert export_here(str(run_dir / "checkpoints" / "step-000010"), "-o", str(tmp_path / "direct.pt")) == 0
    assert torch.equal(torch.load(tmp_path / "direct.pt")["w"], torch.full((3, 2), 10.0))


@pytest.mark.parametrize("args, says", [
    (("{run}", "--step", "15"), "no complete checkpoint step-000015"),
    (("{tmp}/nope",), "is not a directory"),
    (("{empty}",), "holds no complete checkpoint"),
    (("{run}", "--format", "hf"), "not a Hugging Face model"),
])
def test_refusals_are_one_line(tmp_path, args, says):
    run_dir = make_run(tmp_path)
    (tmp_path / "empty").mkdir()
    r = export(*(a.format(run=run_dir, tmp=tmp_path, empty=tmp_path / "empty") for a in args))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    assert not (run_dir / "export").exists()
