"""train.tensorboard and train.wandb.*: a bad value, or a tracker asked for whose package is not installed, is
one line naming the key and how to install it, exit 2, nothing written; the default TensorBoard setting
never refuses. And the TensorBoard rule the trackers rely on (fsdp_jobs/runtime/trackers.py), read back
with TensorBoard's own reader."""

from __future__ import annotations

import importlib.util

import pytest

from tests.unit.test_bad_inputs import refused, world  # noqa: F401  (world: the fixture refused() needs)

NL = "x\ntouch PWNED #"

CASES = [
    (["train.wandb.project='a b'"], "train.wandb.project='a b'", "a W&B name may hold"),
    (["train.wandb.project=../up"], "train.wandb.project='../up'", "a W&B name may hold"),
    (["train.wandb.project=" + "p" * 200], "train.wandb.project=", "at most 128"),
    (["train.wandb.entity='team;rm'"], "train.wandb.entity='team;rm'", "a W&B name may hold"),
    ([f"train.wandb.entity='{NL}'"], "train.wandb.entity=", "a W&B name may hold"),
    (["train.wandb.mode=shared"], "train.wandb.mode='shared'", "allowed: online, offline or null"),
    (["train.wandb.enabled=maybe"], "train.wandb.enabled", "maybe"),
    (["train.tensorboard=sometimes"], "train.tensorboard", "sometimes"),
    (["train.wandb.bogus=1"], "train.wandb.bogus", "unknown key"),
]


@pytest.mark.parametrize("args, key, allowed", CASES, ids=[c[0][0][:50] for c in CASES])
def test_a_bad_tracker_key_is_one_line_exit_2_nothing_written(world, capsys, args, key, allowed):  # noqa: F811
    line = refused(world, capsys, "job", [*args, f"run_root={world['run_root']}"])
    assert key in line and allowed in line, line


def _without(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """As if `package` were not installed (config.py asks importlib.util.find_spec, importing nothing)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))


@pytest.mark.parametrize("args, package, key", [
    (["train.wandb.enabled=true"], "wandb", "train.wandb.enabled=True"),
    (["train.tensorboard=true"], "tensorboard", "train.tensorboard=True"),
    (["-m", "train.lr=1e-3,3e-3", "train.wandb.enabled=true"], "wandb", "train.wandb.enabled=True"),
])
def test_a_tracker_asked_for_but_not_installed_says_how_to_install_it(world, capsys, monkeypatch,  # noqa: F811
                                                                     args, package, key):
    _without(monkeypatch, package)
    line = refused(world, capsys, "job", [*args, f"run_root={world['run_root']}"])
    assert key in line and f"pip install 'fsdp-jobs[{package}]'" in line, line


def test_the_default_tensorboard_setting_needs_no_package(world, capsys, monkeypatch):  # noqa: F811
    """train.tensorboard=null (the default) writes TensorBoard files only where the package is installed."""
    from fsdp_jobs.__main__ import main

    _without(monkeypatch, "tensorboard")
    assert main(["dry_run=true", f"run_root={world['run_root']}"]) == 0
    assert "world_size: 4" in capsys.readouterr().out


def test_purge_step_makes_a_restarts_steps_replace_the_earlier_ones(tmp_path):
    """What trackers.TensorBoard relies on: an attempt that resumes at step 5 opens its writer with
    purge_step=6, and TensorBoard's reader then shows steps 6.. only from the new attempt."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fsdp_jobs.runtime.trackers import TensorBoard

    first = TensorBoard(tmp_path, first_step=1)
    for step in range(1, 9):  # killed after step 8; its checkpoint is step 5
        first.log(step, {"loss": 1.0})
    second = TensorBoard(tmp_path, first_step=6)  # a new event file, as a restarted process has
    for step in range(6, 11):
        second.log(step, {"loss": 2.0})
    second.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s, 1.0) for s in range(1, 6)] + \
        [(s, 2.0) for s in range(6, 11)]
