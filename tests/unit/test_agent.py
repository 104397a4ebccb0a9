"""launchers/node/agent.py: which entries the agent forks (the built-in trainer: torch and the trainer imported
once per agent) and which torchrun spawns as before (script=, module=, the preflight alone... any entry
that is not exactly `-m fsdp_jobs.runtime RUN_DIR`), read from the very torchrun command line every backend
builds (launchers/common.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from torch.distributed.run import parse_args  # noqa: E402

from launchers.node.agent import SPAWN_ENV, forks_the_trainer  # noqa: E402

FLAGS = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29500",
         "--rdzv-id=x", "--max-restarts=3", "--monitor-interval=1"]


@pytest.mark.parametrize("entry, forked", [
    (["-m", "fsdp_jobs.runtime", "/runs/a"], True),
    (["-m", "fsdp_jobs.runtime.user_code", "--", "/runs/a/script/001/train.py"], False),
    (["-m", "fsdp_jobs.runtime.user_code", "--", "-m", "mypkg.train"], False),
    (["/runs/a/script/001/train.py"], False),
    (["-m", "fsdp_jobs.runtime", "/runs/a", "extra"], False),
    (["--no-python", "-m", "fsdp_jobs.runtime", "/runs/a"], False),
])
def test_only_the_builtin_trainer_is_forked(entry, forked, monkeypatch):
    monkeypatch.delenv(SPAWN_ENV, raising=False)
    flags = [f for f in entry if f == "--no-python"]
    args = parse_args([*FLAGS, *flags, *[f for f in entry if f != "--no-python"]])
    assert forks_the_trainer(args) is forked


def test_the_trainer_can_be_spawned_again(monkeypatch):
    monkeypatch.setenv(SPAWN_ENV, "1")
    assert not forks_the_trainer(parse_args([*FLAGS, "-m", "fsdp_jobs.runtime", "/runs/a"]))
