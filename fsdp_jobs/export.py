"""Consolidate a sharded checkpoint into one plain `state_dict` file, loadable without FSDP:

    python -m fsdp_jobs.export RUN_DIR [--step N] [-o model.pt] [--dtype bfloat16]

    model = build_plain_model(RUN_DIR); model.load_state_dict(torch.load("model.pt"))
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from fsdp_jobs.rundir import checkpoints
from fsdp_jobs.planning.errors import OneLineParser, UserError, die
from fsdp_jobs.planning.plan import DTYPE_BYTES
from fsdp_jobs.rundir.layout import RunDir

EXPORT_DIR = RunDir(Path("RUN_DIR")).export_dir  # the default output folder, as the help names it


def find_checkpoint(path: Path, step: Optional[int]) -> Path:
    if checkpoints.has_manifest(path):
        return path
    if step is not None:
        ckpt = checkpoints.step_dir(checkpoints.root_of(path), step)
        if not checkpoints.has_manifest(ckpt):
            raise UserError("--step", step, f"no complete checkpoint {ckpt.name} in {ckpt.parent}")
        return ckpt
    ckpt = checkpoints.newest_checkpoint(path)
    if ckpt is None:
        raise UserError("RUN_DIR", str(path), f"holds no complete checkpoint ({checkpoints.COMMITTED_WORDS})")
    return ckpt


PROGRESS_EVERY_S = 30.0  # a long read or write of a large model says it goes on this often (stderr)
PROGRESS_AFTER_S = 2.0  # ... first after this long: a quick export, and a refusal, stay silent but for their line


@contextlib.contextmanager
def phase(what: str, every_s: float = PROGRESS_EVERY_S, after_s: float = PROGRESS_AFTER_S) -> Iterator[None]:
    """On stderr, once `what` has taken `after_s`: that it goes on, again every `every_s`, and when done how long it
    took (a 70B checkpoint is minutes of reading: the user is never left looking at nothing)."""
    began, done, said = time.monotonic(), threading.Event(), []

    def tick() -> None:
        wait = after_s
        while not done.wait(wait):
            print(f"export: {what}: {time.monotonic() - began:.0f} s so far", file=sys.stderr, flush=True)
            said.append(True)
            wait = every_s

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    if said:
        print(f"export: {what}: done in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)


def _gb(ckpt: Path) -> float:
    return sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file()) / 1e9


def export(ckpt: Path, out: Path, dtype: Optional[str] = None, hf_model: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Read the model's shards of the checkpoint (never the optimizer's; no process group needed) and
    write its weights."""
    import torch

    from torch.distributed.checkpoint.api import CheckpointException

    from fsdp_jobs.runtime.consolidate import read_model_state
    from fsdp_jobs.runtime.checkpoint import first_error_line

    damaged = checkpoints.damage(ckpt)
    if damaged:  # what the ranks' resume would set aside (fsdp_jobs/runtime/checkpoint.py find_latest)
        raise UserError("checkpoint", str(ckpt), f"is damaged ({damaged}): export another step with --step N")
    try:
        with checkpoints.quiet_dcp_logs(), phase(f"reading the model's shards of {ckpt.name} ({_gb(ckpt):.2f} GB "
                                                 "with the optimizer's)"):
            model_sd = read_model_state(ckpt)
    # DCP's reader fails in many ways on a damaged metadata file or shard (fsdp_jobs/ARCHITECTURE.md, pitfall 4)
    except (Exception, CheckpointException) as e:  # noqa: BLE001
        raise UserError("checkpoint", str(ckpt), f"cannot be read ({first_error_line(e)}); it is damaged: export "
                                                 "another step with --step N") from None
    out.parent.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    if dtype:
        model_sd = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in model_sd.items()}
    if hf_model is not None:  # --format hf: an HF directory (config.json + safetensors) for from_pretrained
        from fsdp_jobs.models.hf import export_hf

        with phase(f"writing {out}"):
            return {"checkpoint": str(ckpt), "output": str(out), **export_hf(model_sd, hf_model, out)}
    tmp_out = out.with_name(f".{out.name}.tmp")
    with phase(f"writing {out}"):
        torch.save(model_sd, tmp_out)
    tmp_out.rename(out)
    return {"checkpoint": str(ckpt), "output": str(out), "tensors": len(model_sd),
            "params": sum(v.numel() for v in model_sd.values())}


def build_plain_model(run_dir: Path) -> Any:
    """The run's model class, unsharded, on CPU, with buffers initialised: load_state_dict into it."""
    import torch

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.planning.config import rank_config
    from fsdp_jobs.runtime.shard import build_meta_model

    model_cfg = rank_config(runs.load_job(run_dir)).model
    model = build_meta_model(model_cfg).to_empty(device="cpu").to(getattr(torch, model_cfg.dtype))
    if hasattr(model, "init_buffers"):
        model.init_buffers(torch.device("cpu"))
    return model


def hf_export_model(run_dir: Path) -> dict[str, Any]:
    """The run's model config, if --format hf can write it (a model=hf run, transformers installed)."""
    import importlib.util

    from fsdp_jobs.rundir import runs
    from fsdp_jobs.planning.byo import is_hf

    import yaml

    try:
        model = runs.load_job(run_dir)["model"]
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as e:
        raise UserError("--format", "hf", f"needs the run's model config, {RunDir(run_dir).job_file}, which cannot be "
                                          f"read ({type(e).__name__}); export the run dir, or use --format torch") from None
    if not is_hf(model):
        raise UserError("--format", "hf", f"run {run_dir.name} trained {model.get('_target_')}, not a Hugging Face "
                                          "model (model=hf); use --format torch")
    if importlib.util.find_spec("transformers") is None:
        raise UserError("--format", "hf", "needs the transformers package: pip install 'fsdp-jobs[hf]'")
    return model


def main(argv: Optional[list[str]] = None) -> int:
    p = OneLineParser(prog="python -m fsdp_jobs.export", description=__doc__.splitlines()[0])
    p.add_argument("path", help="a run dir (its newest complete checkpoint) or one checkpoint dir")
    p.add_argument("--step", type=int, help="export the checkpoint of step N instead of the newest")
    p.add_argument("-o", "--output", help=f"output file (default: {EXPORT_DIR}/model-step-N.pt); never overwritten")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="cast floating-point weights")
    p.add_argument("--format", choices=("torch", "hf"), default="torch",
                   help="torch: one state_dict file; hf: a Hugging Face directory (config.json + model.safetensors, "
                        f"for from_pretrained) of a model=hf run (default: {EXPORT_DIR}/hf-step-N)")
    args = p.parse_args(argv)
    os.umask(0o077)  # the exported weights are the owner's, like the run dir they come from
    try:
        path = Path(args.path)
        if not path.is_dir():
            raise UserError("path", args.path, f"is not a directory (a run dir or a {checkpoints.STEP_DIR_WORDS} dir)")
        ckpt = find_checkpoint(path, args.step)
        run_dir = ckpt.parent.parent
        hf_model = hf_export_model(run_dir) if args.format == "hf" else None
        default = f"hf-{ckpt.name}" if hf_model is not None else f"model-{ckpt.name}.pt"
        out = Path(args.output) if args.output else RunDir(run_dir).export_dir / default
        if out.exists():
            raise UserError("--output", str(out), "exists already; it is never overwritten (choose another path)")
        info = export(ckpt, out, args.dtype, hf_model)
    except UserError as e:
        die(e)
    print(f"exported {info['tensors']} tensors ({info['params']:,} params) from {ckpt} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
