"""launchers/node/agent.py: which entries the agent forks (the built-in trainer: torch and the trainer imported
once per agent) and which torchrun spawns as before (script=, module=, the preflight alone... any entry
that is not exactly `-m fsdp_jobs.runtime RUN_DIR`), read from the very torchrun command line every backend
builds (launchers/common.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch.distributed.run import parse_args  # noqa: E402

from fsdp_jobs.launchers.node.agent import SPAWN_ENV, forks_the_trainer  # noqa: E402

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


def test_the_ranks_are_forked_with_the_imports_frozen_out_of_the_collector(monkeypatch):
    """A forked rank's full collection then walks its own objects, not the ~300,000 of torch's and the
    trainer's imports it shares with its agent (launchers/node/agent.py: freeze_what_the_ranks_inherit)."""
    import gc

    import torch.distributed.launcher.api as launcher_api

    from fsdp_jobs.launchers.node import agent

    frozen_at_launch = []

    def launch(config, entrypoint):
        frozen_at_launch.append(gc.get_freeze_count())
        return lambda run_dir: None

    monkeypatch.setattr(launcher_api, "elastic_launch", launch)
    monkeypatch.setattr(agent, "quiet_about_replaced_ranks", lambda: None)
    monkeypatch.delenv(SPAWN_ENV, raising=False)
    gc.disable()  # as `python -m fsdp_jobs.launchers.node.agent` runs: the collector off while it imports (pitfall 23)
    try:
        agent.launch_forked(parse_args([*FLAGS, "-m", "fsdp_jobs.runtime", "/runs/a"]))
        collecting_at_launch = gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
    assert frozen_at_launch and frozen_at_launch[0] > 100_000, frozen_at_launch
    assert collecting_at_launch  # the ranks it forks collect their own garbage


@pytest.mark.integration  # a new interpreter imports torch (3 s): with the jobs tier, not the quick loop
def test_the_agent_imports_torch_and_the_trainer_without_a_single_collection(tmp_path):
    """`python -m fsdp_jobs.launchers.node.agent` turns the collector off before its first import (pitfall 23): its
    import of torch (~300,000 objects with the trainer's) then runs no collection, where it ran 640 of the
    youngest generation, 58 of the middle one and 5 full ones, 0.35-0.45 of 2.4 CPU-s on every node.
    Seen from the agent's own exit: torchrun refuses the missing entry (exit 2) before the agent turns the
    collector on again, and a sitecustomize prints what the collector did until then: no more than the
    interpreter's own start-up does (`python -c pass`: 16 of the youngest, 1 of the middle one here)."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, gc, json, sys\n"
        "atexit.register(lambda: print('GC', json.dumps({'enabled': gc.isenabled(), 'torch': 'torch' in sys.modules,"
        " 'collections': [g['collections'] for g in gc.get_stats()]}), file=sys.stderr))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def collections(*argv: str) -> dict:
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120)
        return {"rc": r.returncode, **json.loads(r.stderr.split("GC ", 1)[1].splitlines()[0])}

    bare, seen = collections("-c", "pass"), collections("-m", "fsdp_jobs.launchers.node.agent")
    assert seen["rc"] == 2 and seen["torch"] and not seen["enabled"], seen
    young, middle, full = seen["collections"]
    assert full == 0 and middle <= bare["collections"][1] + 1 and young <= bare["collections"][0] + 10, (seen, bare)


def test_small_worlds_notice_a_failed_rank_within_torchs_default_and_large_ones_keep_5_s():
    """--monitor-interval by torchrun world: 0.1 s up to 256 nodes (its store reads go through the
    rendezvous state's cache), 5 s above (launchers/common.py)."""
    from fsdp_jobs.launchers.common import monitor_interval_s

    assert [monitor_interval_s(n) for n in (1, 2, 256, 257, 1024)] == [0.1, 0.1, 0.1, 5, 5]


def test_the_rendezvous_poll_grows_with_the_square_of_the_nodes_up_to_torchs_1_s():
    """Where shorter than torch's 1 s, a round's store load (nodes x state size / period) never exceeds
    torch's own at 64 nodes."""
    from fsdp_jobs.launchers.node.agent import max_nodes, rendezvous_poll_s

    assert [rendezvous_poll_s(n) for n in (1, 2, 20, 32, 64, 1024)] == [0.1, 0.1, 0.1, 0.25, 1.0, 1.0]
    assert all(rendezvous_poll_s(n) == 1.0 or n * n / rendezvous_poll_s(n) <= 64 * 64 for n in range(1, 2049))
    assert max_nodes("2") == 2 and max_nodes("1:4") == 4


def _patched_rendezvous(monkeypatch, nodes: int) -> tuple[list, object]:
    """torch's rendezvous after shorten_rendezvous_poll(nodes): the sleeps it asked for, a state holder."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from fsdp_jobs.launchers.node.agent import shorten_rendezvous_poll

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

    from fsdp_jobs.launchers.node import agent

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


def _joined_pair(monkeypatch, **settings):
    """Two agents' real rendezvous handlers (torch's c10d backend, on a TCPStore one of them serves on
    loopback) after both joined round 0 of a 2-node rendezvous."""
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from fsdp_jobs.runtime.loopback_store import LoopbackTCPStore
    from fsdp_jobs.launchers.node.agent import shorten_rendezvous_poll

    monkeypatch.setattr(c10d_rendezvous_backend, "TCPStore", LoopbackTCPStore)
    monkeypatch.setattr(dynamic_rendezvous, "_delay", dynamic_rendezvous._delay)  # both restored after the test
    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    monkeypatch.setattr(holder, "__init__", holder.__init__)
    shorten_rendezvous_poll(2)  # as a 2-node job's agents do: 0.1 s polls, not torch's 1 s
    handlers = []
    for is_host, port in ((True, 0), (False, None)):
        port = handlers[0]._store.port if port is None else port
        params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "linger", 2, 2, is_host=is_host, **settings)
        backend, store = c10d_rendezvous_backend.create_backend(params)
        handlers.append(create_handler(store, backend, params))
    joins = [threading.Thread(target=h.next_rendezvous) for h in handlers]
    [t.start() for t in joins]
    [t.join(60) for t in joins]
    assert handlers[0]._store.hosts_server and not handlers[1]._store.hosts_server
    return handlers


@pytest.mark.parametrize("succeeded", [True, False])
def test_the_store_hosts_agent_leaves_only_after_the_other_agents_last_call(monkeypatch, succeeded):
    """The store host's agent exited as soon as its own rendezvous shutdown returned, and an agent a moment
    slower then failed its close and keep-alive against a store that was gone: torch's `failed to shutdown
    the rendezvous ... RendezvousConnectionError` and TCPStore's C++ frames at the end of a job that completed
    (CI saw them from a hot spare's job). The host's shutdown now returns once the other agent has closed,
    when the host's workers succeeded (torchrun's run result); a failed host does not hold the failure up."""
    import threading
    import time

    from torch.distributed.elastic.agent.server.api import RunResult, SimpleElasticAgent, WorkerState
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node import agent

    monkeypatch.setattr(DynamicRendezvousHandler, "shutdown", DynamicRendezvousHandler.shutdown)  # undone after
    result = RunResult(state=WorkerState.SUCCEEDED if succeeded else WorkerState.FAILED)
    monkeypatch.setattr(SimpleElasticAgent, "run", lambda agent, role="default": result)
    agent.let_the_store_host_leave_last()
    host, other = _joined_pair(monkeypatch)

    class Agent:  # what run_and_remember reads of torchrun's agent: its worker group's rendezvous handler
        class _worker_group:
            class spec:
                rdzv_handler = host

    assert SimpleElasticAgent.run(Agent()) is result
    ended = {}

    def shut(name, handler, after_s):
        time.sleep(after_s)
        closed = handler.shutdown()
        ended[name] = (time.monotonic(), closed)

    threads = [threading.Thread(target=shut, args=("host", host, 0.0)),
               threading.Thread(target=shut, args=("other", other, 0.5))]  # the slower agent
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert ended["other"][1] is True  # its close reached the store
    if succeeded:
        assert ended["host"][0] >= ended["other"][0] - 0.05, ended  # the host stayed until then (not 0.5 s before)
        assert ended["host"][0] < ended["other"][0] + agent.LINGER_S / 2, ended  # and left as it said it left
    else:
        assert ended["host"][0] < ended["other"][0] - 0.3, ended  # it did not wait


def test_a_stop_signal_stops_the_agents_heartbeats_and_leaves_the_rendezvous_open(monkeypatch):
    """fsdp_jobs/ARCHITECTURE.md, pitfall 34: torchrun skips its rendezvous shutdown on a signal, and the
    keep-alive thread went on beating into a store whose host had exited (TCPStore's C++ frames, torch's
    RendezvousConnectionError warning and `cannot join current thread` after a 4-node Ctrl-C in CI)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from fsdp_jobs.launchers.node import agent

    def stopped_by_ctrl_c(agent_, role="default"):
        raise SignalException("Process got signal: 2", sigval=2)

    monkeypatch.setattr(SimpleElasticAgent, "_invoke_run", stopped_by_ctrl_c)  # undone after the test
    agent.stop_heartbeats_on_a_stop()
    host, other = _joined_pair(monkeypatch)
    beating = other._keep_alive_timer._thread
    assert beating.is_alive()  # joined round 0: it beats

    class Agent:  # what run_until_a_stop reads of torchrun's agent
        class _worker_group:
            class spec:
                rdzv_handler = other

    with pytest.raises(SignalException):  # torchrun's run then stops the ranks and re-raises, as before
        SimpleElasticAgent._invoke_run(Agent(), "default")
    assert not beating.is_alive()  # stopped and joined on the main thread, before any exit
    assert not host._state_holder.state.closed and other.is_closed() is False  # the rendezvous stays open
    host._stop_heartbeats()


@pytest.mark.integration  # a real rendezvous waits out a keep-alive expiry (5 s): with the jobs tier, not the quick loop
def test_an_agent_tells_its_watchdog_which_node_left_its_round_by_our_name(tmp_path, monkeypatch):
    """A node cut off from the network keeps every other node's ranks waiting, and only the hang timeout found
    it; torch's rendezvous drops its agent from the round once its keep-alive lapses. The other agent names it,
    by our name, in its node's liveness directory for the watchdog, and nothing while it beats."""
    import time

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV
    from fsdp_jobs.rundir import liveness

    for name in ("next_rendezvous", "num_nodes_waiting"):
        monkeypatch.setattr(DynamicRendezvousHandler, name, getattr(DynamicRendezvousHandler, name))  # undone after
    restarted = []
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda agent_, group: restarted.append(group))
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(NODE_ENV, "node7")  # both agents run here: each says it is node7
    agent.report_nodes_that_left_the_round()
    host, other = _joined_pair(monkeypatch, keep_alive_interval=1, keep_alive_max_attempt=2)
    assert liveness.read_left(tmp_path) is None
    time.sleep(3)  # both beat: 1.5 x the expiry
    host.num_nodes_waiting()
    assert liveness.read_left(tmp_path) is None
    other._stop_heartbeats()  # the other agent cut off: its beats no longer reach the store
    began = time.time()
    deadline = began + 10
    while liveness.read_left(tmp_path) is None and time.time() < deadline:
        host.num_nodes_waiting()  # what torchrun's monitor loop calls every --monitor-interval
        time.sleep(0.1)
    left = liveness.read_left(tmp_path)
    assert left is not None and list(left.left) == ["node7"] and left.expiry_s == 2.0, left
    assert began + 1 <= left.left["node7"] <= time.time()  # the expiry first: no sooner than the beat lapsed

    class Group:  # what torchrun's restart hands over: the worker group, whose spec names the handler
        class spec:
            rdzv_handler = host

    SimpleElasticAgent._restart_workers(None, Group)  # the workers restart (after the watchdog's kill): said
    assert restarted == [Group] and liveness.read_left(tmp_path) is None  # no more, for the watchdog
    host._stop_heartbeats()


@pytest.mark.integration  # a real rendezvous and a process killed (3 s): with the jobs tier, not the quick loop
def test_a_node_dropped_from_its_round_restarts_its_ranks_once_the_others_went_on_without_it(monkeypatch, capsys):
    """A node cut off past the keep-alive expiry is dropped from the round; the others' watchdogs restart their
    ranks into a new round, as participants, so torch's `num_nodes_waiting` tells the dropped agent nothing and
    its ranks waited in a dead collective until a TCP reset or its own hang timeout. Its agent's first read after
    the heal now restarts them (SIGKILL, then torch's restart), and not before the others went on: a node only
    dropped may still be in collectives that finish."""
    import subprocess
    import threading
    import time

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV

    for name in ("next_rendezvous", "num_nodes_waiting"):
        monkeypatch.setattr(DynamicRendezvousHandler, name, getattr(DynamicRendezvousHandler, name))  # undone after
    restarted = []
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda agent_, group: restarted.append(group))
    monkeypatch.setenv(NODE_ENV, "node1")
    agent.join_the_round_that_went_on_without_this_node()
    host, cut = _joined_pair(monkeypatch, keep_alive_interval=1, keep_alive_max_attempt=2)
    cut._stop_heartbeats()  # its beats no longer reach the store
    deadline = time.time() + 10
    while cut._this_node in host._state_holder.state.participants and time.time() < deadline:
        assert host.num_nodes_waiting() == 0
        time.sleep(0.1)
    assert cut._this_node not in host._state_holder.state.participants  # dropped by the host's read
    time.sleep(0.2)
    assert cut.num_nodes_waiting() == 0  # dropped, but the round has not moved on: nothing restarts
    moved_on = threading.Thread(target=host.next_rendezvous)  # the host's watchdog restarted its ranks
    moved_on.start()
    while (waiting := cut.num_nodes_waiting()) == 0 and time.time() < deadline:
        time.sleep(0.1)
    assert waiting == 1  # what torch's monitor loop restarts the workers for
    rank = subprocess.Popen(["sleep", "60"])  # a rank in a collective with the processes gone

    class Group:
        class spec:
            rdzv_handler = cut

    class Agent:
        class _pcontext:
            pids = staticmethod(lambda: {0: rank.pid})

    SimpleElasticAgent._restart_workers(Agent, Group)
    assert rank.wait(5) == -9 and restarted == [Group]
    out = capsys.readouterr().out
    assert "fsdp-jobs: node1: the other nodes went on to rendezvous round 1 without it (dropped from round 0" in out
    cut.next_rendezvous()  # torch's restart joins the new round, which then completes
    moved_on.join(30)
    assert not moved_on.is_alive() and cut.num_nodes_waiting() == 0  # back in the round: no second restart
    SimpleElasticAgent._restart_workers(Agent, Group)  # an ordinary restart kills nothing itself
    assert restarted == [Group, Group] and "went on" not in capsys.readouterr().out
    for h in (host, cut):
        h._stop_heartbeats()


def test_only_an_agent_of_this_nodes_name_at_this_address_is_its_predecessor(monkeypatch):
    """cluster=local runs every node's agent on one machine (one address): the node name tells them apart; an
    agent of our name elsewhere (another address) is not ours either; nor is this agent itself."""
    import threading
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    from fsdp_jobs.launchers.node import agent

    me, old = _NodeDesc("host-a", 20, 0), _NodeDesc("host-a", 10, 0)
    local_peer, elsewhere = _NodeDesc("host-a", 11, 0), _NodeDesc("host-b", 10, 0)
    names = {old: "node1", local_peer: "node2", elsewhere: "node1", me: "node1"}
    monkeypatch.setattr(agent, "name_of", lambda handler, n: names[n])
    state = SimpleNamespace(last_heartbeats={n: 0 for n in names})
    handler = SimpleNamespace(_this_node=me, _heartbeat_lock=threading.Lock(),
                              _state_holder=SimpleNamespace(state=state))
    assert agent.predecessors(handler, "node1") == [old]
    assert agent.predecessors(handler, "node3") == []


@pytest.mark.integration  # a real rendezvous (a few seconds of polls): with the jobs tier, not the quick loop
def test_a_nodes_new_agent_drops_its_dead_predecessor_instead_of_waiting_for_its_keep_alive(monkeypatch, capsys):
    """A container killed and restarted by its engine: its old agent stays a participant of the closed round until its
    keep-alive lapses, and torch starts the next round only once that round is empty, so the survivor and the new
    agent waited it out. The new agent, before its first join, dates the beats of an agent of its own node name at
    its own address back to the epoch; torch's sanitize drops it at once. A keep-alive of 60 s x 3 here: without
    that, the round below does not form within the test's 30 s."""
    import threading

    from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV

    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", DynamicRendezvousHandler.next_rendezvous)
    host, old = _joined_pair(monkeypatch, keep_alive_interval=60, keep_alive_max_attempt=3)
    for handler, name in ((host, "node0"), (old, "node1")):
        handler._store.set(agent.name_key(handler, handler._this_node), name)
    old._stop_heartbeats()  # node1's container is killed: its agent never leaves the round
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as every backend runs torchrun (pitfall 1)
    survivor = threading.Thread(target=host.next_rendezvous)  # node0 restarts its workers: exit, then join
    survivor.start()
    monkeypatch.setenv(NODE_ENV, "node1")
    agent.forget_this_nodes_dead_agent()
    params = RendezvousParameters("c10d", f"127.0.0.1:{host._store.port}", "linger", 2, 2, is_host=False,
                                  keep_alive_interval=60, keep_alive_max_attempt=3)
    new = create_handler(*c10d_rendezvous_backend.create_backend(params)[::-1], params)
    assert new._this_node != old._this_node and new._this_node.addr == old._this_node.addr
    restarted = threading.Thread(target=new.next_rendezvous)
    restarted.start()
    for t in (survivor, restarted):
        t.join(30)
    try:
        assert not survivor.is_alive() and not restarted.is_alive()
        state = new._state_holder.state
        assert state.round == 1 and set(state.participants) == {host._this_node, new._this_node}
        assert old._this_node not in state.last_heartbeats
        out = capsys.readouterr().out
        assert "fsdp-jobs: node1: its earlier torchrun agent (" in out and "dropped from the rendezvous" in out
    finally:
        for h in (host, new):
            h._stop_heartbeats()


def test_a_round_only_torchs_own_read_moved_on_restarts_nothing(monkeypatch):
    """A whole job paused past the keep-alive expiry (SLURM's suspend, `docker pause`): torch's read finds every
    participant's beat stale and empties and bumps the round in its own copy of the state, where nobody joined:
    nothing restarts. Once others joined a later round, this node restarts, also with nodes waiting (its ranks
    SIGKILLed first, not torch's SIGTERM alone)."""
    import threading
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, _NodeDesc

    from fsdp_jobs.launchers.node import agent

    waiting = [0]
    monkeypatch.setattr(DynamicRendezvousHandler, "num_nodes_waiting", lambda handler: waiting[0])
    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", DynamicRendezvousHandler.next_rendezvous)
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", SimpleElasticAgent._restart_workers)
    agent.join_the_round_that_went_on_without_this_node()
    me, other = _NodeDesc("a", 1, 0), _NodeDesc("b", 2, 0)
    state = SimpleNamespace(round=4, closed=False, participants={}, wait_list=set())
    handler = SimpleNamespace(_heartbeat_lock=threading.Lock(), _state_holder=SimpleNamespace(state=state),
                              _this_node=me, _fsdp_jobs_joined_round=3)
    assert DynamicRendezvousHandler.num_nodes_waiting(handler) == 0  # bumped in torch's copy only
    assert getattr(handler, "_fsdp_jobs_left_behind", None) is None
    state.participants = {other: 0}
    waiting[0] = 2
    assert DynamicRendezvousHandler.num_nodes_waiting(handler) == 2 and handler._fsdp_jobs_left_behind == (3, 4)
    state.closed = True  # the job ended meanwhile: torch's own exit, no restart of ours
    handler._fsdp_jobs_left_behind, waiting[0] = None, 0
    assert DynamicRendezvousHandler.num_nodes_waiting(handler) == 0 and handler._fsdp_jobs_left_behind is None


@pytest.mark.parametrize("phase, stalled_s, killed", [
    ("step", 3.0, True),  # blocked in a collective since before the stop: the SIGTERM never reaches it
    ("step", 0.5, False),  # stepping: it reaches its stop vote, and saves, as torch's stop asks
    ("save", 30.0, False),  # a stop's checkpoint takes as long as it takes
])
def test_a_restart_kills_ranks_stalled_in_a_step_and_leaves_the_others_to_its_sigterm(tmp_path, phase, stalled_s,
                                                                                       killed):
    """Pitfall 38: torch's restart SIGTERMs the workers and SIGKILLs them 30 s later; a rank blocked in a collective
    with a peer already gone reads no signal. The agent's guard kills ranks stalled in a step past the watchdog's
    left_stall_s (2 s at least), and only those."""
    import subprocess
    import time

    from fsdp_jobs.launchers.node.agent import stop_guard
    from fsdp_jobs.rundir import liveness

    rank = subprocess.Popen(["sleep", "60"])
    now = time.time()
    liveness.write_beat(tmp_path, liveness.RankBeat(rank=0, node="node0", pid=rank.pid, step=40, phase=phase,
                                                    progress=now - stalled_s, alive=now, step_s=0.05))
    try:
        stall = stop_guard(tmp_path, {rank.pid}, "node0", limit_s=0.5)
        assert (rank.wait(5) == -9 and stall >= 3.0) if killed else (stall is None and rank.poll() is None)
    finally:
        rank.kill()
        rank.wait()


@pytest.mark.parametrize("one_ended, round_lost, killed", [
    (True, False, True),  # a local rank failed: torch's monitor stops the others, one blocked beside it
    (False, True, True),  # a node of the round left it (restarted, or its beats lapsed): its collectives are gone
    (False, False, False),  # a node joining (a grow, a spare), a cancel: the ranks save where they are, torch's stop
])
def test_only_a_stop_after_a_loss_is_watched(tmp_path, monkeypatch, one_ended, round_lost, killed):
    """Pitfall 38: every stop of the workers goes through torch's PContext.close; the agent watches it only where
    something was lost (a local rank ended, or a node left this agent's round), never a planned one, where a rank
    that has not stepped for a while may yet reach its stop's checkpoint."""
    import subprocess
    import time

    from torch.distributed.elastic.multiprocessing.api import PContext

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.rundir import liveness

    closed = []
    monkeypatch.setattr(PContext, "close", lambda context, death_sig=None, timeout=30: closed.append(timeout))
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(agent, "ROUND_LOST", [round_lost])
    agent.watch_the_stops_after_a_loss()
    ended, blocked = subprocess.Popen(["true"]), subprocess.Popen(["sleep", "60"])
    ended.wait()
    now = time.time()
    liveness.write_beat(tmp_path, liveness.RankBeat(rank=1, node="node0", pid=blocked.pid, step=40, phase="step",
                                                    progress=now - 5, alive=now, step_s=0.05))

    class Context:
        @staticmethod
        def pids() -> dict[int, int]:
            return {0: ended.pid, 1: blocked.pid} if one_ended else {1: blocked.pid}

    try:
        PContext.close(Context(), None, 30)
        assert closed == [30]  # torch's own stop, as it was
        try:
            assert (blocked.wait(5) == -9) is killed
        except subprocess.TimeoutExpired:
            assert not killed
    finally:
        blocked.kill()
        blocked.wait()


def test_a_node_is_lost_to_the_round_once_it_is_no_longer_a_participant():
    """What arms the guard in a restart: a node of the round this agent joined is missing from its participants
    (it left to restart, or its keep-alive lapsed); not a node waiting to join, nor a round that moved on."""
    import threading
    from types import SimpleNamespace

    from fsdp_jobs.launchers.node.agent import lost_a_node

    state = SimpleNamespace(round=3, participants={"me": 0, "b": 1, "c": 2}, wait_list={"new"})
    handler = SimpleNamespace(_heartbeat_lock=threading.Lock(), _state_holder=SimpleNamespace(state=state),
                              _fsdp_jobs_round=(3, {"b", "c"}))
    assert not lost_a_node(handler)  # a node waiting to join: a grow, a spare
    state.participants = {"me": 0, "c": 2}
    assert lost_a_node(handler)
    state.round = 4
    assert not lost_a_node(handler)  # moved on: the left-behind restart's, not this
    assert not lost_a_node(SimpleNamespace())  # no watchdog: nothing reported, nothing watched


def test_the_stop_guard_ends_with_the_ranks(tmp_path):
    """Ranks that exit on their SIGTERM end the guard."""
    import subprocess
    import time

    from fsdp_jobs.launchers.node.agent import stop_guard

    rank = subprocess.Popen(["sleep", "0.2"])
    began = time.monotonic()
    rank.wait()
    assert stop_guard(tmp_path, {rank.pid}, "node0", limit_s=10) is None and time.monotonic() - began < 5


def test_a_rank_torch_spawned_in_a_session_of_its_own_is_killed_with_its_children():
    """script= and module= ranks are spawned by torch in a session of their own (their data loader's workers, the
    interpreter under a wrapper): the left-behind kill takes the whole group, as torch's own stop signals it."""
    import os
    import subprocess
    import time

    from fsdp_jobs.launchers.node.agent import kill_with_its_group

    rank = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE,
                            text=True)
    child = int(rank.stdout.readline())
    kill_with_its_group(rank.pid)
    assert rank.wait(5) == -9

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    deadline = time.time() + 5
    while alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(child)
    kill_with_its_group(rank.pid)  # gone already: nothing to do, no error
    assert os.getpgid(os.getpid()) != rank.pid


def test_the_store_host_waits_for_exactly_its_nodes_and_no_longer_than_linger_s():
    """An agent that died never says it left: the host gives up after linger_s (LINGER_S: 10 s). A node that
    was not in the host's last rendezvous state (too late for the last round) does not stand in for one."""
    import time

    from fsdp_jobs.runtime.loopback_store import LoopbackTCPStore
    from fsdp_jobs.launchers.node import agent

    store = LoopbackTCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    began = time.monotonic()
    assert agent.wait_for_the_others(store, [], 5.0) is True and time.monotonic() - began < 1  # alone
    store.set("left/a", "1")
    assert agent.wait_for_the_others(store, ["left/a"], 5.0) is True  # the one other left already
    store.set("left/late", "1")
    began = time.monotonic()
    assert agent.wait_for_the_others(store, ["left/a", "left/b"], 0.3) is False  # b never comes; late is not b
    assert 0.3 <= time.monotonic() - began < 3


def test_a_node_spares_replace_leaves_its_round_and_the_next_takes_the_spare(tmp_path, monkeypatch, capsys):
    """Three real rendezvous handlers of a 2-node job (torch's c10d backend on a loopback store): node0 (the store
    host) and node1 joined round 0, node2 waits as a hot spare (the redundancy list). A preflight named node1 and
    had it replaced: when its ranks end, its agent does not restart them but leaves the round at once (off the
    participants: the others need not wait for its keep-alive to lapse) and exits 0, without closing the
    rendezvous; node0's restart then forms round 1 with the spare. node0, not named, restarts as before."""
    import threading
    import time

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler

    from fsdp_jobs.rundir import replaced
    from fsdp_jobs.rundir.records import ReplacedNodes
    from fsdp_jobs.launchers.node import agent

    monkeypatch.setattr(DynamicRendezvousHandler, "shutdown", DynamicRendezvousHandler.shutdown)  # undone after
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as every job's agents run (launchers/common.py)
    agent.let_the_store_host_leave_last()  # torchrun's shutdown after the exit: must not close the rendezvous
    host, node1 = _joined_pair(monkeypatch)
    params = RendezvousParameters("c10d", f"127.0.0.1:{host._store.port}", "linger", 2, 2)
    spare = create_handler(*reversed(c10d_rendezvous_backend.create_backend(params)), params)
    worlds = {}
    waiting = threading.Thread(target=lambda: worlds.update(spare=spare.next_rendezvous()))
    waiting.start()
    deadline = time.monotonic() + 30
    while spare._this_node not in host._state_holder.state.redundancy_list and time.monotonic() < deadline:
        time.sleep(0.05)
        host._state_holder.sync()
    assert spare._this_node in host._state_holder.state.redundancy_list  # it waits beyond max_nodes

    restarted = []
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda a, g: restarted.append(g.spec.rdzv_handler))
    monkeypatch.setenv("FSDP_JOBS_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FSDP_JOBS_NODE", "node1")
    agent.leave_when_replaced()
    replaced.record(tmp_path, ReplacedNodes(time=time.time(), nodes=["node1"], reason="slow"))

    def group(handler):
        class Group:
            class spec:
                rdzv_handler = handler
        return Group()

    with pytest.raises(SystemExit) as e:
        SimpleElasticAgent._restart_workers(None, group(node1))
    assert e.value.code == 0 and restarted == []
    assert "node1: the preflight named this node and a hot spare takes its place" in capsys.readouterr().out
    time.sleep(0.3)  # past the host's cache of the state (0.1 s: shorten_rendezvous_poll)
    host._state_holder.sync()
    assert node1._this_node not in host._state_holder.state.participants, node1._state_holder.state.participants
    assert node1.shutdown() is False and not host._state_holder.state.closed  # and closes nothing on its way out

    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda a, g: restarted.append(g.spec.rdzv_handler))
    monkeypatch.setenv("FSDP_JOBS_NODE", "node0")  # node0's agent, as its process installs it
    agent.leave_when_replaced()
    SimpleElasticAgent._restart_workers(None, group(host))  # not named: torchrun's restart, as always
    assert restarted == [host]
    rejoin = threading.Thread(target=lambda: worlds.update(host=host.next_rendezvous()))  # what that restart does
    rejoin.start()
    rejoin.join(60)
    waiting.join(60)
    assert worlds["host"].world_size == 2 and worlds["spare"].world_size == 2, worlds  # the spare filled the hole
    assert host._state_holder.state.round == 1
    for h in (spare, host):
        h.shutdown()


def test_the_ranks_are_told_whether_their_agent_hosts_the_rendezvous_store(monkeypatch):
    """A preflight never has a spare replace the store host's node: its ranks learn it from the agent's env."""
    import os
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.runtime.loopback_store import STORE_HOST_ENV
    from fsdp_jobs.rundir.failures import ROUND_ENV
    from fsdp_jobs.launchers.node import agent

    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", lambda handler: "round")
    monkeypatch.setenv(STORE_HOST_ENV, "")
    agent.tell_the_ranks_who_hosts_the_store()
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    monkeypatch.setenv(ROUND_ENV, "")
    pair = {_NodeDesc("node0", 7, 0): 0, _NodeDesc("node1", 8, 0): 1}
    labels = []
    for hosts, says, round_, participants in ((True, "1", 3, pair), (False, "0", 3, dict(reversed(pair.items()))),
                                              (True, "1", 4, pair), (True, "1", 3, {_NodeDesc("node0", 9, 0): 0})):
        state = SimpleNamespace(round=round_, participants=participants)
        handler = SimpleNamespace(_store=SimpleNamespace(hosts_server=hosts), _state_holder=SimpleNamespace(state=state))
        assert DynamicRendezvousHandler.next_rendezvous(handler) == "round" and os.environ[STORE_HOST_ENV] == says
        labels.append(os.environ[ROUND_ENV])  # what their failure records carry
    # both nodes of a round name it alike; the next round, or a round 3 of another store (its agent restarted:
    # another pid), differ
    assert labels[0] == labels[1] and len(set(labels)) == 3 and labels[0].startswith("3-"), labels


def test_torchrun_logs_no_failure_for_ranks_that_ended_for_a_replaced_node(caplog, monkeypatch):
    """Every rank exits REPLACED_EXIT when spares replace a node (a planned end): torchrun's 7-line failure log
    per rank is dropped for that exit status only."""
    import logging

    from fsdp_jobs.launchers.node import agent

    log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    monkeypatch.setattr(log, "filters", list(log.filters))  # the filter goes with the test
    agent.quiet_about_replaced_ranks()
    with caplog.at_level(logging.ERROR):
        log.error("failed (exitcode: %s) local_rank: %s", 4, 0)
        log.error("failed (exitcode: %s) local_rank: %s", 1, 0)
    assert [r.getMessage() for r in caplog.records] == ["failed (exitcode: 1) local_rank: 0"]


def test_rendezvous_events_are_named_as_torch_names_them_without_reading_source(monkeypatch):
    """The agent's get_method_name (sys._getframe) names the same function as torch's (inspect.stack), from
    torch's own `_record` call sites, and reads no file: linecache is never asked for a line."""
    import linecache

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from fsdp_jobs.launchers.node.agent import name_rendezvous_events_cheaply

    def record() -> str:  # torch's _record: the name is of the function that called it
        return dynamic_rendezvous.get_method_name()

    def _keep_alive() -> str:
        return record()

    torchs = _keep_alive()
    assert torchs == "_keep_alive" and dynamic_rendezvous.get_method_name(10_000) == "no_method_name"
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    name_rendezvous_events_cheaply()
    read, getlines = [], linecache.getlines
    monkeypatch.setattr(linecache, "getlines", lambda *a, **k: read.append(a[0]) or getlines(*a, **k))
    named, too_deep = _keep_alive(), dynamic_rendezvous.get_method_name(10_000)
    monkeypatch.setattr(linecache, "getlines", getlines)
    assert (named, too_deep, read) == (torchs, "no_method_name", [])


def test_the_agent_asks_nvml_not_cuda_before_it_forks_the_ranks(monkeypatch):
    """torchrun's LaunchConfig asks torch.cuda.is_available(); answered by cudaGetDeviceCount, that initializes
    the driver in the agent and every forked rank then fails at its first CUDA call (pitfall 22). Here torch
    is made to look like a CUDA build with one GPU, and the CUDA runtime's count records being asked."""
    import torch
    import torch.distributed.launcher.api as launcher_api

    from fsdp_jobs.launchers.node import agent

    runtime_asked = []
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)  # NVML answers: nothing initialized
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: runtime_asked.append(1) or 2, raising=False)
    monkeypatch.setattr(launcher_api, "elastic_launch", lambda config, entrypoint: lambda run_dir: None)
    monkeypatch.setattr(agent, "quiet_about_replaced_ranks", lambda: None)
    monkeypatch.setattr(agent, "freeze_what_the_ranks_inherit", lambda: None)
    monkeypatch.delenv(SPAWN_ENV, raising=False)
    monkeypatch.setenv(agent.NVML_CHECK_ENV, "0")  # as a user may have it; restored after the test
    agent.launch_forked(parse_args([*FLAGS, "-m", "fsdp_jobs.runtime", "/runs/a"]))
    assert runtime_asked == [], "the agent initialized CUDA before forking its ranks"
    assert agent.os.environ[agent.NVML_CHECK_ENV] == "1"  # the ranks inherit it


def _listeners_on(port):
    """This process's file descriptors that are sockets listening on `port`."""
    import os
    import socket

    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and sock.getsockname()[1] == port:
                found.append(int(name))
        except OSError:
            pass
        finally:
            sock.detach()
    return found


def test_the_workers_store_listens_before_rank_0_starts_it(monkeypatch):
    """fsdp_jobs/ARCHITECTURE.md, pitfall 33: the ranks of a restart start together and the others' first
    connect to rank 0's store came before it listened: refused, and c10d retried only after its backoff
    (0.35-0.72 s of process-group set-up in 5 of 9 restarts of a 2x2 job). The agent forking rank 0 now
    listens on the store's port first: a connect before rank 0's store exists is taken, rank 0's store adopts
    the socket, a rank that does not serve the store closes its copy, and the agent keeps none."""
    import socket
    import threading
    import time
    from datetime import timedelta

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.utils.distributed import get_free_port

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.runtime.loopback_store import LISTENER_ENV, LoopbackTCPStore

    import os

    monkeypatch.setenv(LISTENER_ENV, "")  # whatever the test leaves in it is undone after
    port, inherited = get_free_port(), {}

    def fork_two_ranks(_agent, _group):  # what each forked rank inherits: the variable and its own copy
        fd = int(os.environ[LISTENER_ENV].split(":")[0])
        inherited.update(rank0=os.dup(fd), rank1=os.dup(fd), env=os.environ[LISTENER_ENV], socket=os.fstat(fd).st_ino)

    monkeypatch.setattr(LocalElasticAgent, "_start_workers", fork_two_ranks)
    agent.listen_before_the_workers_start()

    class Group:
        group_rank, master_addr, master_port = 0, "127.0.0.1", port

    os.environ.pop(LISTENER_ENV)
    LocalElasticAgent._start_workers(None, Group())
    assert inherited["env"].endswith(f":{port}") and LISTENER_ENV not in os.environ
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # taken while no store exists yet

    clients = {}

    def client(name, fd):
        if fd is not None:
            os.environ[LISTENER_ENV] = f"{fd}:{port}"  # threads share it: set before the server's is
        clients[name] = LoopbackTCPStore("127.0.0.1", port, 3, False, timedelta(seconds=20))

    rank1 = threading.Thread(target=client, args=("rank1", inherited["rank1"]))
    rank1.start()
    while LISTENER_ENV in os.environ:  # rank 1 took its copy (and closed it) before rank 0 reads the variable
        time.sleep(0.01)
    other_node = threading.Thread(target=client, args=("rank2", None))
    other_node.start()
    os.environ[LISTENER_ENV] = f"{inherited['rank0']}:{port}"
    server = LoopbackTCPStore("127.0.0.1", port, 3, True, timedelta(seconds=20), wait_for_workers=False)
    [t.join(30) for t in (rank1, other_node)]
    clients["rank2"].set("k", "v")
    assert clients["rank1"].get("k") == b"v" and server.get("k") == b"v"
    # one socket listens: the agent's, adopted by the store (not one the store bound anew); rank 1's copy and the
    # agent's are closed
    assert [os.fstat(fd).st_ino for fd in _listeners_on(port)] == [inherited["socket"]]


def test_a_spawned_rank_ignores_a_listener_it_did_not_inherit(tmp_path, monkeypatch):
    """A spawned rank (script=) inherits the variable but not the socket: its number may be any file then."""
    from datetime import timedelta

    from torch.distributed.elastic.utils.distributed import get_free_port

    from fsdp_jobs.runtime.loopback_store import LISTENER_ENV, LoopbackTCPStore

    port = get_free_port()
    with open(tmp_path / "data", "w") as f:
        monkeypatch.setenv(LISTENER_ENV, f"{f.fileno()}:{port}")
        server = LoopbackTCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10), wait_for_workers=False)
        f.write("still open")  # not closed, not adopted
    server.set("k", "v")
    assert server.get("k") == b"v" and (tmp_path / "data").read_text() == "still open"


@pytest.mark.parametrize("given", [[], ["--log-dir", "LOGS"], ["--redirects", "3"], ["--tee", "1"]])
def test_the_agent_removes_the_log_dir_torchrun_makes_and_keeps_one_it_was_given(tmp_path, monkeypatch, given):
    """torchrun made a torchelastic_* directory in $TMPDIR for every agent and never removed it (826 of them on a
    machine that had run the tests). One the user named, or the ranks' output goes to, stays."""
    import tempfile

    from fsdp_jobs.launchers.node.agent import torchruns_log_dir_removed_at_exit
    from fsdp_jobs.rundir import liveness

    monkeypatch.delenv(liveness.LOCAL_DIR_ENV, raising=False)  # no node wrapper: the agent's own directory
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    args = parse_args([*(a.replace("LOGS", str(tmp_path / "logs")) for a in given), "--nnodes=1", "train.py"])
    with pytest.raises(SystemExit):  # a stop signal's way out (quiet_on_a_stop), as a failure's or a success's
        with torchruns_log_dir_removed_at_exit(args):
            made, scratch = args.log_dir, Path(tempfile.gettempdir())
            if made:
                Path(made, "run_0", "attempt_0", "0").mkdir(parents=True)  # where the ranks' error files go
            (scratch / "pytorch-errorfile-x.pickle").write_bytes(b"")  # torch's, for a rank that raised
            raise SystemExit(1)
    assert tempfile.tempdir == str(tmp_path) and scratch.parent == tmp_path and not scratch.exists()
    if given:
        assert args.log_dir == made and (made is None or Path(made).exists())
    else:
        assert made and Path(made).name.startswith("torchelastic_") and Path(made).parent == tmp_path
        assert not Path(made).exists()


def test_a_node_is_reported_gone_after_two_fresh_reads_miss_it_and_never_while_it_waits(tmp_path, monkeypatch):
    """One read of the state can fall between a restarting agent's exit from its round and its join of the next
    (two writes): a node is gone when a later read of the store, not torch's cache, misses it too. A node in the
    wait list (or the spares') is no loss. And the report never fails torchrun's agent: a node-local directory
    that is gone is a warning (torchrun would otherwise close the rendezvous for every node)."""
    import threading
    from datetime import timedelta
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, _NodeDesc

    from fsdp_jobs.launchers.node import agent
    from fsdp_jobs.rundir import liveness

    a, b, me = (_NodeDesc(f"h{i}", i, 0) for i in range(3))
    state = SimpleNamespace(round=4, closed=False, participants={me: 0, a: 1, b: 2}, wait_list=set(),
                            redundancy_list=set())
    holder = SimpleNamespace(state=state, _last_sync_time=1.0)
    names = {repr(a): b"node1", repr(b): b"node2"}
    store = SimpleNamespace(check=lambda keys: keys[0].split("/", 1)[1] in names,
                            get=lambda key: names[key.split("/", 1)[1]])
    handler = SimpleNamespace(_heartbeat_lock=threading.Lock(), _state_holder=holder, _store=store,
                              _fsdp_jobs_round=(4, {a, b}),
                              _settings=SimpleNamespace(run_id="r", keep_alive_interval=timedelta(seconds=1),
                                                        keep_alive_max_attempt=3))
    watch = agent.RoundWatch(tmp_path)
    del state.participants[b]  # node2's agent stopped beating: torch's sanitize dropped it
    watch.read(handler)
    watch.read(handler)  # the same (cached) read again
    assert liveness.read_left(tmp_path) is None
    holder._last_sync_time = 1.1  # a fresh read still misses it
    watch.read(handler)
    left = liveness.read_left(tmp_path)
    assert left and list(left.left) == ["node2"] and left.round == 4 and left.expiry_s == 3.0, left
    del state.participants[a]
    state.wait_list.add(a)  # node1 left the round to join the next (its workers restart): waiting, not gone
    holder._last_sync_time = 1.2
    watch.read(handler)
    assert list(liveness.read_left(tmp_path).left) == ["node2"]
    state.wait_list.clear()
    state.participants[b] = 2  # a new round with node2 back would be a new report; here: it is there again
    holder._last_sync_time = 1.3
    watch.read(handler)
    assert liveness.read_left(tmp_path) is None  # node1 missed once only: not yet

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    for name in ("next_rendezvous", "num_nodes_waiting"):
        monkeypatch.setattr(DynamicRendezvousHandler, name, getattr(DynamicRendezvousHandler, name))  # undone after
    monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", SimpleElasticAgent._restart_workers)
    monkeypatch.setattr(DynamicRendezvousHandler, "num_nodes_waiting", lambda h: 0)
    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "removed"))
    agent.report_nodes_that_left_the_round()
    for synced in (1.4, 1.5):  # node1 missed by two fresh reads: its report cannot be written
        holder._last_sync_time = synced
        assert DynamicRendezvousHandler.num_nodes_waiting(handler) == 0  # a warning, not an exception
    assert not (tmp_path / "removed").exists()

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def ctrl_c_meanwhile(*args):  # torch's handler raises a stop signal on this (the agent's main) thread
        raise SignalException("Process got signal: 2", sigval=2)

    monkeypatch.setattr(liveness, "write_left", ctrl_c_meanwhile)
    del state.participants[b]  # node2 gone again: a report to write
    with pytest.raises(SignalException):  # goes on to torchrun, which stops the ranks: not a warning
        for synced in (1.6, 1.7):
            holder._last_sync_time = synced
            DynamicRendezvousHandler.num_nodes_waiting(handler)


@pytest.mark.parametrize("configured, after", [(None, 3.0), (12, 12.0)])
def test_after_its_first_round_an_elastic_agents_last_call_is_short(monkeypatch, configured, after):
    """cluster.min_nodes below nodes: torch's rendezvous waits the last call (30 s) at every round once min_nodes
    joined, after a failure too, where the node missing is the one that failed (ARCHITECTURE pitfall 35). Two
    agents of a 1..2-node rendezvous take two rounds: the first keeps torch's 30 s, the second waits less, as the
    state's deadline says; a last call the user set stays."""
    import threading
    from datetime import datetime, timezone

    from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler

    from fsdp_jobs.launchers.node.agent import shorten_rendezvous_poll, shorten_the_last_call_after_the_first_round
    from fsdp_jobs.runtime.loopback_store import LoopbackTCPStore

    monkeypatch.setattr(c10d_rendezvous_backend, "TCPStore", LoopbackTCPStore)
    monkeypatch.setattr(dynamic_rendezvous, "_delay", dynamic_rendezvous._delay)
    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    monkeypatch.setattr(holder, "__init__", holder.__init__)
    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", DynamicRendezvousHandler.next_rendezvous)
    executor = dynamic_rendezvous._DistributedRendezvousOpExecutor
    add = executor._add_to_participants
    deadlines = {}

    def add_and_note_the_deadline(self):
        add(self)
        if len(self._state.participants) == self._settings.min_nodes:  # this join set the round's deadline (a
            # join whose write lost to the other's is tried again: the round's last try counts)
            deadlines[self._state.round] = (self._state.deadline - datetime.now(timezone.utc)).total_seconds()
    monkeypatch.setattr(executor, "_add_to_participants", add_and_note_the_deadline)
    shorten_rendezvous_poll(2)
    shorten_the_last_call_after_the_first_round(2, seconds=3.0)
    handlers = []
    for is_host in (True, False):
        port = handlers[0]._store.port if handlers else 0
        params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "elastic", 1, 2, is_host=is_host,
                                      **({"last_call_timeout": configured} if configured else {}))
        backend, store = c10d_rendezvous_backend.create_backend(params)
        handlers.append(create_handler(store, backend, params))
    for _ in range(2):  # the first round, then one after a restart: both agents join, the round completes at 2
        joins = [threading.Thread(target=h.next_rendezvous) for h in handlers]
        [t.start() for t in joins]
        [t.join(60) for t in joins]
    assert handlers[0]._op_executor._settings.timeout is handlers[0]._settings.timeout  # the object its rounds read
    first, second = deadlines.values()
    assert (configured or 30) - 1 < first <= (configured or 30) and after - 1 < second <= after, deadlines
    for handler in reversed(handlers):
        handler.shutdown()


def test_the_last_call_stays_where_the_engine_restarts_nodes_or_the_world_is_large(monkeypatch):
    """A restarted container or pod is expected back, maybe later than the short last call; a round of 64 agents
    took longer than it to re-form: neither agent changes torch's rendezvous."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node.agent import POLL_BUDGET_NODES, shorten_the_last_call_after_the_first_round
    from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV

    torchs = DynamicRendezvousHandler.next_rendezvous
    monkeypatch.setattr(DynamicRendezvousHandler, "next_rendezvous", torchs)
    monkeypatch.setenv(ENGINE_RESTARTS_ENV, "1")
    shorten_the_last_call_after_the_first_round(2)
    assert DynamicRendezvousHandler.next_rendezvous is torchs
    monkeypatch.delenv(ENGINE_RESTARTS_ENV)
    shorten_the_last_call_after_the_first_round(POLL_BUDGET_NODES)
    assert DynamicRendezvousHandler.next_rendezvous is torchs
    shorten_the_last_call_after_the_first_round(POLL_BUDGET_NODES - 1)
    assert DynamicRendezvousHandler.next_rendezvous is not torchs


def test_under_a_node_wrapper_torchruns_files_go_into_the_nodes_local_directory(tmp_path, monkeypatch):
    """The wrapper removes its node's local directory however the agent ends (SIGKILLed on a repeating failure
    too), so torchrun's log dir and the error pickles torch's process starter writes for every rank that raised
    go there; a forked rank takes the user's temporary directory back (fsdp_jobs/runtime/__main__.py)."""
    import tempfile

    from fsdp_jobs.launchers.node.agent import torchruns_log_dir_removed_at_exit
    from fsdp_jobs.rundir import liveness

    monkeypatch.setenv(liveness.LOCAL_DIR_ENV, str(tmp_path / "node-memory"))
    monkeypatch.setattr("tempfile.tempdir", None)  # restored after the test
    args = parse_args(["--nnodes=1", "train.py"])
    with torchruns_log_dir_removed_at_exit(args):
        assert Path(args.log_dir) == tmp_path / "node-memory" / "torchrun" and Path(args.log_dir).is_dir()
        assert tempfile.gettempdir() == args.log_dir  # where torch's pytorch-errorfile-*.pickle go
    assert Path(args.log_dir).is_dir()  # the wrapper's to remove, with the rest of the node's memory
    assert tempfile.tempdir is None  # the agent's own temporary directory as it was
    given = parse_args([f"--log-dir={tmp_path / 'logs'}", "--nnodes=1", "train.py"])
    with torchruns_log_dir_removed_at_exit(given):  # the user's log dir stays; the error pickles still go
        assert given.log_dir == str(tmp_path / "logs")
        assert tempfile.gettempdir() == str(tmp_path / "node-memory" / "torchrun")


def test_a_forked_rank_makes_its_temporary_files_under_tmpdir_not_the_agents_scratch(tmp_path, monkeypatch):
    """The agent's temporary directory is torchrun's scratch in node memory (above); a rank forked from it takes
    TMPDIR's back before the trainer runs, so inductor's cache and a user's temporary files are not written into
    node memory, nor removed with it (fsdp_jobs/runtime/__main__.py `forked`)."""
    import tempfile

    from fsdp_jobs.runtime import __main__ as entry

    seen: dict[str, str] = {}
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "node-memory" / "torchrun"))  # restored after the test
    monkeypatch.setattr(entry, "main", lambda exit_process: seen.update(tmp=tempfile.gettempdir()))
    monkeypatch.setattr(entry.streams, "follow_readers", lambda: None)
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)  # this process's handlers stay pytest's
    monkeypatch.setattr(entry.sys, "argv", ["fsdp_jobs.runtime"])
    monkeypatch.setattr(entry.timeline, "MAIN_STARTED", 0.0)
    entry.forked(str(tmp_path / "run"))
    assert seen == {"tmp": str(tmp_path)}
