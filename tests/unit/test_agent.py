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


def test_small_worlds_notice_a_failed_rank_within_torchs_default_and_large_ones_keep_5_s():
    """--monitor-interval by torchrun world: 0.1 s up to 256 nodes (its store reads go through the
    rendezvous state's cache), 5 s above (launchers/common.py)."""
    from launchers.common import monitor_interval_s

    assert [monitor_interval_s(n) for n in (1, 2, 256, 257, 1024)] == [0.1, 0.1, 0.1, 5, 5]


def test_the_rendezvous_poll_grows_with_the_square_of_the_nodes_up_to_torchs_1_s():
    """Where shorter than torch's 1 s, a round's store load (nodes x state size / period) never exceeds
    torch's own at 64 nodes."""
    from launchers.node.agent import max_nodes, rendezvous_poll_s

    assert [rendezvous_poll_s(n) for n in (1, 2, 20, 32, 64, 1024)] == [0.1, 0.1, 0.1, 0.25, 1.0, 1.0]
    assert all(rendezvous_poll_s(n) == 1.0 or n * n / rendezvous_poll_s(n) <= 64 * 64 for n in range(1, 2049))
    assert max_nodes("2") == 2 and max_nodes("1:4") == 4


def _patched_rendezvous(monkeypatch, nodes: int) -> tuple[list, object]:
    """torch's rendezvous after shorten_rendezvous_poll(nodes): the sleeps it asked for, a state holder."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from launchers.node.agent import shorten_rendezvous_poll

    slept: list = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", lambda seconds: slept.append(seconds))
    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    monkeypatch.setattr(holder, "__init__", holder.__init__)  # restored after the test
    shorten_rendezvous_poll(nodes)
    dynamic_rendezvous._delay(seconds=1)
    dynamic_rendezvous._delay(seconds=(0, 0.3))
    return slept, holder(backend=None, settings=None)


def test_a_small_worlds_agent_polls_the_rendezvous_and_caches_its_state_for_0_1_s(monkeypatch):
    slept, state = _patched_rendezvous(monkeypatch, 2)
    assert slept == [0.1, (0.0, pytest.approx(0.03))]
    assert state._cache_duration == pytest.approx(0.1)


def test_a_large_worlds_agent_keeps_torchs_1_s(monkeypatch):
    slept, state = _patched_rendezvous(monkeypatch, 1024)
    assert slept == [1, (0, 0.3)] and state._cache_duration == 1


def test_a_restart_after_a_repeating_failure_is_held_for_the_wrapper_to_stop(tmp_path, monkeypatch):
    """A small world restarts in under a second, sooner than the wrapper's once-a-second look at the failure
    records: the agent holds a restart while the records show a repeat (a Docker test saw a third attempt)."""
    import json
    import time

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from launchers.node import agent

    restarts, slept = [], []
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda a, g: restarts.append(g))
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setenv("FSDP_JOBS_RUN_DIR", str(tmp_path))
    agent.hold_restart_on_a_repeat(hold_s=3.0)
    record = {"error": "RuntimeError: boom", "step": 2, "where": "trainer.py:9", "rank": 0, "v": 1}
    (tmp_path / "failures.jsonl").write_text(json.dumps({**record, "attempt": ":0", "time": 1.0}) + "\n")
    SimpleElasticAgent._restart_workers(None, "first")  # one failure: restart at once
    assert restarts == ["first"] and slept == []
    with open(tmp_path / "failures.jsonl", "a") as f:
        f.write(json.dumps({**record, "attempt": ":1", "time": 2.0}) + "\n")
    SimpleElasticAgent._restart_workers(None, "second")  # the same failure again: held, then (if not stopped) on
    assert restarts == ["first", "second"] and slept == [3.0]
