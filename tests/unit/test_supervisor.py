"""The one supervisor (launchers/supervisor.py) that cluster=local and cluster=docker share: peer-death
grace, stopping on a signal, killing what does not stop, and the exit status, on scripted nodes."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from fsdp_jobs.rundir import runs
from fsdp_jobs.rundir.outcome import JobState, outcome
from fsdp_jobs.launchers import supervisor
from fsdp_jobs.launchers.supervisor import LogSink, Node, Outcome, exit_status, supervise


class ScriptedNode(Node):
    """Ends with `code` after `ends_after` seconds (None: only when stopped/killed)."""

    def __init__(self, name: str, code: int = 0, ends_after: Optional[float] = None, obeys_stop: bool = True):
        self.name, self.code, self.obeys_stop = name, code, obeys_stop
        self.t0 = time.monotonic()
        self.ends_after = ends_after
        self.stopped = self.killed = False
        self.result: Optional[int] = None

    def follow(self, sink: LogSink, done: threading.Event) -> None:
        sink.write(f"[{self.name}] hello")

    def ended(self) -> Optional[int]:
        if self.result is None and self.ends_after is not None and time.monotonic() - self.t0 >= self.ends_after:
            self.result = self.code
        return self.result

    def stop(self, grace_s: float) -> None:
        self.stopped = True
        if self.obeys_stop:
            self.result = 0

    def kill(self) -> None:
        self.killed = True
        self.result = 137


@pytest.fixture
def sink(tmp_path):
    s = LogSink(tmp_path / "launcher.log", echo=False)
    yield s
    s.close()


def test_every_node_finishing_ends_the_job_with_their_lines_in_the_log(sink, tmp_path):
    nodes = [ScriptedNode("node0", ends_after=0.1), ScriptedNode("node1", ends_after=0.2)]
    out = supervise(nodes, sink, min_nodes=2, stop_grace_s=1)
    assert out == Outcome({"node0": 0, "node1": 0}, False)
    assert (tmp_path / "launcher.log").read_text().splitlines() == ["[node0] hello", "[node1] hello"]


def test_a_dead_node_below_min_nodes_stops_its_peers_after_the_grace(sink, monkeypatch):
    monkeypatch.setattr(supervisor, "PEER_GONE_GRACE_S", 0.3)
    dead, waiting = ScriptedNode("node0", code=1, ends_after=0.0), ScriptedNode("node1")
    t0 = time.monotonic()
    out = supervise([dead, waiting], sink, min_nodes=2, stop_grace_s=1)
    assert waiting.stopped and not waiting.killed and time.monotonic() - t0 >= 0.3
    assert out.codes == {"node0": 1, "node1": 0} and not out.interrupted


def test_a_dead_node_that_min_nodes_allows_leaves_its_peers_running(sink, monkeypatch):
    monkeypatch.setattr(supervisor, "PEER_GONE_GRACE_S", 0.1)
    dead, elastic = ScriptedNode("node0", code=1, ends_after=0.0), ScriptedNode("node1", ends_after=0.6)
    supervise([dead, elastic], sink, min_nodes=1, stop_grace_s=1)
    assert not elastic.stopped  # it finished on its own


def test_a_signal_stops_every_node_and_what_does_not_stop_is_killed(sink, monkeypatch):
    monkeypatch.setattr(supervisor, "STOP_EXTRA_S", 0.2)
    polite, stubborn = ScriptedNode("node0"), ScriptedNode("node1", obeys_stop=False)
    # what was there before: Python's default_int_handler, or SIG_IGN where pytest itself was started in the
    # background by a non-interactive shell (asserting the former fails there)
    before = signal.getsignal(signal.SIGINT)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    out = supervise([polite, stubborn], sink, min_nodes=2, stop_grace_s=0)
    assert out.interrupted and polite.stopped and not polite.killed and stubborn.killed
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_ctrl_c_again_kills_every_node_at_once_and_sighup_stops_as_ctrl_c_does(sink, tmp_path):
    """The first Ctrl-C is a checkpointing stop however long the ranks' grace; a second one is the user asking
    for the kill (as docker compose takes it). The terminal closing (SIGHUP) stops the job as Ctrl-C does."""
    slow = ScriptedNode("node0", obeys_stop=False)  # its checkpoint would take the whole grace
    for delay in (0.2, 0.4):
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
    out = supervise([slow], sink, min_nodes=1, stop_grace_s=600)  # killed: not after the 600 s grace
    assert out.interrupted and slow.stopped and slow.killed
    assert "got SIGINT again; killing every node now" in (tmp_path / "launcher.log").read_text()
    hup = ScriptedNode("node0")
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
    out = supervise([hup], sink, min_nodes=1, stop_grace_s=600)
    assert out.interrupted and hup.stopped and not hup.killed


@pytest.mark.parametrize("codes, interrupted, state, status", [
    ({"node0": 0, "node1": 0}, False, "completed", 0),
    ({"node0": 0, "node1": 137}, False, "completed", 0),  # a node stopped for good while the others finished
    ({"node0": 1, "node1": 0}, False, "failed", 1),
    ({"node0": 0, "node1": 0}, True, "preempted", 130),  # Ctrl-C
    ({"node0": 143, "node1": 0}, False, "preempted", 143),  # cancelled from outside: the ranks checkpointed
    ({}, False, None, 1),  # nothing ran
    ({"node0": 0, "node1": 0}, False, "failed-preflight", 3),  # Docker's nodes exit 0 after one (node.py)
    ({"node0": 3, "node1": 3}, False, "failed-preflight", 3),  # the others' nodes exit 3
])
def test_exit_status(tmp_path, codes, interrupted, state, status):
    if state == "failed-preflight":
        runs.write_state(tmp_path, status="failed", stage="preflight", bad_nodes=["node1"])
    elif state:
        runs.write_state(tmp_path, status=state)
    assert exit_status(Outcome(codes, interrupted), Path(tmp_path)) == status


def test_a_plain_script_exiting_0_everywhere_completed(tmp_path):
    """A plain script records nothing itself: the supervisor's record of its nodes' exit codes says it completed,
    in status as in the exit status; the leader's state record stays the leader's alone."""
    runs.write_state(tmp_path, status="running")  # the user-code shim's, on rank 0
    assert exit_status(Outcome({"node0": 0, "node1": 0}, False), tmp_path) == 0
    said = outcome(tmp_path, None)
    assert (said.state, said.status, said.by) == (JobState.SUCCEEDED, "completed", "supervisor")
    assert said.train["status"] == "completed" and runs.read_state(tmp_path).status == "running"


def test_a_scale_is_acted_on_only_while_every_node_runs_and_the_ranks_train(tmp_path):
    """launchers/supervisor.py why_not_grow: torchrun's agents look for new nodes only while their workers
    are healthy; a newcomer after one node finished, or before the ranks train, would wait forever."""
    import json

    from fsdp_jobs.launchers.supervisor import why_not_grow

    class Fake:
        def __init__(self, name, code):
            self.name, self.code = name, code

        def ended(self):
            return self.code

    live = [Fake("node0", None), Fake("node1", None)]
    assert "not training (state.json: none)" in why_not_grow(live, tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"status": "running"}))
    assert why_not_grow(live, tmp_path) is None
    assert why_not_grow([live[0], Fake("node1", 0)], tmp_path) == "node1 ended"
    (tmp_path / "state.json").write_text(json.dumps({"status": "completed"}))
    assert "not training (state.json: completed)" in why_not_grow(live, tmp_path)


def test_an_earlier_launchs_completed_state_is_never_this_launchs_outcome(tmp_path):
    """A finished run extended with more steps whose ranks all died before recording anything (every
    checkpoint failing to load) printed `finished`, exited 0 and read SUCCEEDED from the first launch's
    record. A record counts only when written since this launch began (fsdp_jobs/rundir/outcome.py)."""
    runs.write_state(tmp_path, status="completed", step=8)  # the first launch's
    began = time.time() + 0.01
    time.sleep(0.02)
    assert exit_status(Outcome({"node0": 1, "node1": 1}, False, began), tmp_path) == 1
    assert outcome(tmp_path, began).state == JobState.FAILED  # the nodes' codes, this launch's
    assert outcome(tmp_path, began - 60).state == JobState.SUCCEEDED
    runs.write_state(tmp_path, status="completed", step=12)  # this launch's own
    assert exit_status(Outcome({"node0": 0, "node1": 0}, False, began), tmp_path) == 0
    assert outcome(tmp_path, began).state == JobState.SUCCEEDED


def test_stop_now_stops_live_nodes_as_a_signal_would_and_is_no_interruption_when_none_is_left(sink, tmp_path):
    """Docker's guardian of an attached command that died (launchers/docker/supervisor.py): its `stop_now`
    stops every live node and the outcome is an interruption; where every node had ended already (the
    command was killed after its job ended), nothing was stopped and the job's own outcome stands."""
    nodes = [ScriptedNode("node0"), ScriptedNode("node1")]
    out = supervise(nodes, sink, min_nodes=2, stop_grace_s=1, stop_now="the command died")
    assert all(n.stopped for n in nodes) and out.interrupted
    assert "fsdp-jobs: the command died" in (tmp_path / "launcher.log").read_text()
    ended = [ScriptedNode("node0", ends_after=0.0), ScriptedNode("node1", ends_after=0.0)]
    out = supervise(ended, sink, min_nodes=2, stop_grace_s=1, stop_now="the command died")
    assert out.codes == {"node0": 0, "node1": 0} and not out.interrupted and not any(n.stopped for n in ended)


def test_a_stop_signal_while_the_nodes_start_stops_them_once_they_are_supervised(sink):
    """A Ctrl-C or `fsdp-jobs cancel` (SIGTERM) between the launch record and supervise(): SIGTERM's default
    ended the launcher and a SIGINT could be lost, and the job, stopped before any rank could record it, read as
    FAILED. stop_signals() keeps it, and supervise(caught=...) acts on it as on its own."""
    before = signal.getsignal(signal.SIGTERM)
    with supervisor.stop_signals() as caught:
        os.kill(os.getpid(), signal.SIGTERM)  # before any node exists
        node = ScriptedNode("node0", ends_after=1.0)  # would finish by itself, unstopped
        out = supervise([node], sink, min_nodes=1, stop_grace_s=1, caught=caught)
    assert caught == [signal.SIGTERM] and node.stopped and out.interrupted
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_a_stop_from_outside_before_any_rank_recorded_is_cancelled_not_failed(tmp_path):
    """Stopped before the first step no rank records the stop: the supervisor records that a stop reached it (the
    CLI, that a cancel was asked), so status reads CANCELLED, not FAILED, at the run's step, whether a signal reached
    the launcher (Ctrl-C: 130) or Docker's cancel stopped the containers (cancel-requested: 143, not a node's
    SIGTERM); an outcome the ranks recorded before the stop stands."""
    runs.write_state(tmp_path, status="completed", step=8)  # an earlier launch's
    began = time.time() + 0.01
    time.sleep(0.02)
    assert exit_status(Outcome({"node0": 241}, True, began), tmp_path) == 130
    said = outcome(tmp_path, began)
    assert (said.state, said.by, said.train["status"], said.train["step"]) == (JobState.CANCELLED, "supervisor",
                                                                               "cancelled", 8)
    assert runs.read_state(tmp_path).status == "completed"  # the leader's record is the leader's alone
    began = time.time() + 0.01
    time.sleep(0.02)
    runs.record_cancel(tmp_path)  # Docker's cancel, which signals no launcher
    assert exit_status(Outcome({"node0": 241}, False, began), tmp_path) == 143
    assert (outcome(tmp_path, began).state, outcome(tmp_path, began).by) == (JobState.CANCELLED, "cli")
    runs.write_state(tmp_path, status="preempted", step=9)  # the ranks checkpointed on the stop
    assert exit_status(Outcome({"node0": 0}, True, began), tmp_path) == 130
    assert (outcome(tmp_path, began).state, outcome(tmp_path, began).status) == (JobState.CANCELLED, "preempted")
