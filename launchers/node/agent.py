"""torchrun (torch.distributed.run) as launchers/node/wrapper.py starts it on every node, with its c10d stores on
loopback when the rendezvous host is loopback (fsdp_jobs/runtime/loopback_store.py).

The built-in trainer's ranks (`-m fsdp_jobs.runtime RUN_DIR`) are forked from this agent, which imports
torch and the trainer once, before its rendezvous: a rank, and every restart of one, starts without
importing torch again. Spawned ranks spent 4.2 s each on imports in CI (four ranks on two cores, 171
starts) and most of a restart's 9.9 s (`fsdp-jobs bench recovery`); on a shared filesystem far more.
This is torchrun's own `--start-method=fork` with the trainer as a function (torch.distributed.launcher);
the agent never initializes CUDA (pitfall 22), so the ranks may. Any other entry (script=, module=) is spawned by torchrun
unchanged. FSDP_JOBS_SPAWN_RANKS=1 spawns the trainer's ranks too. What a forked rank must undo:
fsdp_jobs/ARCHITECTURE.md, pitfall 11."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

if __name__ == "__main__":  # fsdp_jobs/ARCHITECTURE.md, pitfall 23: no collection while torch is imported
    gc.disable()

from fsdp_jobs.planning.plan import REPLICA_GROUP_ENV  # noqa: E402  (after the collector is off: pitfall 23)
from fsdp_jobs.runtime.loopback_store import STORE_HOST_ENV, install  # noqa: E402
from fsdp_jobs.rundir.failures import ROUND_ENV  # noqa: E402

TRAINER = "fsdp_jobs.runtime"
SPAWN_ENV = "FSDP_JOBS_SPAWN_RANKS"
# torchrun's agent, once its ranks succeed, waits for every other agent in a store barrier (300 s), in a
# C++ wait no signal interrupts. Only agents that succeed enter it: one that fails never arrives, so the
# others sat there 300 s, or until killed after stop_grace_s (a 2-node job with one failed rank took 173 s
# to end in CI). The trainer's ranks end together behind a collective barrier, and no rank uses an
# agent's store after it exits (launchers/common.py: TORCH_DISABLE_SHARE_RDZV_TCP_STORE), so 30 s is
# plenty; an agent that times out logs it and exits as it would have.
EXIT_BARRIER_S = 30


def forks_the_trainer(args: Any) -> bool:
    """Whether the entry is the built-in trainer, which runs as a function in forked ranks."""
    return bool(args.module and args.training_script == TRAINER and not args.no_python and not args.run_path
                and len(args.training_script_args) == 1 and os.environ.get(SPAWN_ENV, "0") != "1")


def launch_forked(args: Any) -> None:
    """torch.distributed.run.run for the trainer, with the function entry and the fork start method."""
    never_poison_the_fork()
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    import fsdp_jobs.runtime.train  # noqa: F401  torch and the trainer, imported once, here
    import omegaconf  # noqa: F401  the ranks' config (fsdp_jobs/planning/config.py: rank_config), once, here
    from fsdp_jobs.runtime.__main__ import forked

    quiet_about_replaced_ranks()
    listen_before_the_workers_start()
    args.start_method = "fork"
    config, _, _ = torchrun.config_from_args(args)
    freeze_what_the_ranks_inherit()
    elastic_launch(config=config, entrypoint=forked)(args.training_script_args[0])


def listen_before_the_workers_start() -> None:
    """fsdp_jobs/ARCHITECTURE.md, pitfall 33. The agent that forks rank 0 (group rank 0) listens on the workers'
    store port before it forks them; rank 0's store adopts the socket (fsdp_jobs/runtime/loopback_store.py) and
    the agent closes its copy once they are forked. Fork only: a spawned rank would not inherit the socket."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from fsdp_jobs.runtime.loopback_store import LISTENER_ENV, listen_for_the_workers

    start = LocalElasticAgent._start_workers

    def start_with_the_store_listening(agent: Any, worker_group: Any) -> Any:
        port = int(worker_group.master_port or 0)
        serves_rank_0 = worker_group.group_rank == 0 and port
        sock = listen_for_the_workers(str(worker_group.master_addr), port) if serves_rank_0 else None
        if sock is None:
            return start(agent, worker_group)
        os.environ[LISTENER_ENV] = f"{sock.fileno()}:{port}"  # the forked ranks' environment is this one's
        try:
            return start(agent, worker_group)
        finally:
            os.environ.pop(LISTENER_ENV, None)
            sock.close()

    LocalElasticAgent._start_workers = start_with_the_store_listening


NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def never_poison_the_fork() -> None:
    """fsdp_jobs/ARCHITECTURE.md, pitfall 22. torchrun's LaunchConfig asks torch.cuda.is_available() (for its
    default NUMA binding), which by default calls cudaGetDeviceCount: the driver is then initialized in the
    agent, and every rank forked from it fails at torch.cuda.set_device with "Cannot re-initialize CUDA in
    forked subprocess" (seen on an H100: a GPU job failed at start-up twice and stopped). With this variable
    torch answers from NVML, which leaves the fork usable; the ranks inherit it, and their own first CUDA call
    initializes CUDA in the rank, as a spawned one's does."""
    os.environ[NVML_CHECK_ENV] = "1"


def freeze_what_the_ranks_inherit() -> None:
    """fsdp_jobs/ARCHITECTURE.md, pitfall 21. Every object the imports made (~300,000: torch, DTensor, DCP,
    sympy, the trainer) goes to the collector's permanent generation before the first fork (Python's
    gc.freeze, for fork without exec). A forked rank's full collection (its shutdown's gc.collect, and the
    automatic ones while it builds, saves and loads) otherwise walks all of them, 0.20-0.25 s each on 2 cores,
    and writes each object's header, so the pages the rank shares with its agent are copied: CPU and memory
    on every rank and every restart. Frozen, that collection took 0.001 s, and a 2x2 job of 40 steps 17.8
    CPU-s instead of 21.2 (medians of 5 alternated pairs). The agent's objects made before the freeze are
    never freed: they are module-level and live as long as it does. The collector, off while the agent
    imported them (pitfall 23), is on again from here, in the agent and in every rank it forks."""
    gc.freeze()
    gc.enable()


def quiet_about_replaced_ranks() -> None:
    """The trainer's ranks exit REPLACED_EXIT when hot spares replace nodes a preflight named (a planned end of
    the attempt, which the node named says in one line: leave_when_replaced). torchrun logs every rank that
    exits non-zero as a failure with a 7-line traceback: 8,192 of them at 1,024 x 8 for one replaced node.
    Those records, and only those, are dropped (built-in trainer only: a user's script may exit 4 itself)."""
    import logging

    from fsdp_jobs.runtime.preflight import REPLACED_EXIT

    said = f"(exitcode: {REPLACED_EXIT})"
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        lambda record: said not in record.getMessage())


def shorten_exit_barrier(seconds: float = EXIT_BARRIER_S) -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    original = SimpleElasticAgent._exit_barrier

    def exit_barrier(agent: Any) -> None:
        agent._exit_barrier_timeout = min(agent._exit_barrier_timeout, seconds)
        original(agent)

    SimpleElasticAgent._exit_barrier = exit_barrier


# fault_tolerance=replica: when one rank of a replica group dies, torchrun stops the group's others (then
# restarts them all) with SIGTERM, and SIGKILL 30 s later. Such a rank is often inside a torchft call (the
# step's quorum, its commit), which handles no signal: a killed rank's group came back 30 s late in a test,
# and its group's server, still heartbeating, held the other group's quorum as long (the lighthouse forms
# none from half of the live groups). Nothing is saved on the way to a restart, so a few seconds do.
REPLICA_RESTART_STOP_S = 3


def shorten_replica_restart_stop(seconds: int = REPLICA_RESTART_STOP_S) -> None:
    """Both ways torchrun stops the others when a rank fails get `seconds`: its process context's own (when
    it sees the failure) and the agent's (before the restart). Not the agent's stop on a signal (a cancel,
    a preemption: the ranks checkpoint), which passes --shutdown-timeout explicitly."""
    if not os.environ.get(REPLICA_GROUP_ENV):
        return
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    def stop_workers(agent: Any, worker_group: Any) -> None:
        agent._shutdown(timeout=seconds)

    close = PContext.close

    def close_soon(context: Any, death_sig: Any = None, timeout: int = seconds) -> None:
        close(context, death_sig, timeout)

    LocalElasticAgent._stop_workers = stop_workers
    PContext.close = close_soon


# torch's c10d rendezvous hard-codes three waits of the restart's critical path (fsdp_jobs/ARCHITECTURE.md,
# pitfall 14): 1 s between two polls of the state while a round forms
# (dynamic_rendezvous._DistributedRendezvousOpExecutor.run's `_delay(seconds=1)`), a 1 s cache in front of
# every read of it (_BackendRendezvousStateHolder's cache_duration: a poll sooner reads the cached state),
# and a random 0-0.3 s before the first round, which at the first restart still reads round 0: together
# nearly all of a small world's rendezvous after a failure. Each read fetches the whole state (it grows with the
# nodes), so the store's load grows as nodes^2 / period. The period is world^2 / POLL_BUDGET_NODES^2 seconds,
# between 0.1 s and torch's 1 s: never more load than torch's own 1 s at POLL_BUDGET_NODES nodes (0.1 s up to
# 20 nodes, 1 s from 64 and unchanged above, where fsdp_jobs/bench/rendezvous.py measured what large worlds
# need). All three scale together; the cache also bounds the monitor loop's reads (launchers/common.py).
POLL_BUDGET_NODES = 64
TORCH_POLL_S = 1.0
MIN_POLL_S = 0.1


def rendezvous_poll_s(nodes: int) -> float:
    """The rendezvous' poll while a round forms, for a torchrun world of at most `nodes` nodes."""
    return min(TORCH_POLL_S, max(MIN_POLL_S, nodes * nodes / POLL_BUDGET_NODES ** 2))


def max_nodes(nnodes: str) -> int:
    """torchrun's --nnodes (`N` or `MIN:MAX`): the most nodes of the world."""
    return int(str(nnodes).split(":")[-1])


def shorten_rendezvous_poll(nodes: int) -> None:
    """Every sleep of torch's dynamic rendezvous and its state's cache, scaled by rendezvous_poll_s(nodes) / 1 s."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    scale = rendezvous_poll_s(nodes) / TORCH_POLL_S
    if scale >= 1.0:
        return
    delay = dynamic_rendezvous._delay
    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    make_holder = holder.__init__

    def scaled(seconds: Any) -> None:
        delay(tuple(s * scale for s in seconds) if isinstance(seconds, tuple) else seconds * scale)

    def cached_shorter(self: Any, backend: Any, settings: Any, cache_duration: float = TORCH_POLL_S) -> None:
        make_holder(self, backend, settings, cache_duration * scale)

    dynamic_rendezvous._delay = scaled
    holder.__init__ = cached_shorter


# A failure that repeats stops the job: the node wrapper (launchers/node/wrapper.py) reads the failure records
# once a second and stops the agent with the job's reason (fsdp_jobs/rundir/failures.py). With the waits above a
# small world restarts in well under a second, so the agent could start a third attempt before its wrapper saw
# the second failure, where the repeat should stop it at two. Before each
# restart the agent reads the records once (a node per restart: nothing in steady state); when they show a
# repeat it holds the restart REPEAT_HOLD_S, three of its wrapper's ticks, in which the wrapper stops it. A
# restart the wrapper did not stop then goes ahead as before.
REPEAT_HOLD_S = 3.0


def hold_restart_on_a_repeat(hold_s: float = REPEAT_HOLD_S) -> None:
    from fsdp_jobs.launchers.node.wrapper import RUN_DIR_ENV  # the node wrapper's, which the agent inherits

    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    import time
    from pathlib import Path

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from fsdp_jobs.rundir import failures

    restart = SimpleElasticAgent._restart_workers

    def restart_unless_repeating(agent: Any, worker_group: Any) -> None:
        if failures.repeating(failures.read(Path(run_dir))):
            time.sleep(hold_s)  # the wrapper stops this agent meanwhile
        restart(agent, worker_group)

    SimpleElasticAgent._restart_workers = restart_unless_repeating


# A node waiting in the rendezvous when the job completes (a hot spare never needed: cluster.spare_nodes, or a
# node too late for the last round) learns it from the store: the finishing agents close the rendezvous
# (torch's RendezvousGracefulExitError, which torchrun 2.13 then turns into an AttributeError on the None
# result), or, when the store host's agent exited first, the next poll fails (RendezvousConnectionError).
# Either way torchrun exited 1 with a traceback, and a spare's container was restarted by Docker
# (on-failure) to fail again (pitfall 16). Such an agent exits 0 with one line when the ranks recorded the
# job completed since it started; any other rendezvous error stays one.
#
# The store host's agent leaves last (pitfall 18). It served the rendezvous store and exited as soon as its
# own shutdown returned, while the other agents still had calls to make: their close, a keep-alive, a
# waiting spare's poll. Those failed and printed torch's warnings (`failed to shutdown the rendezvous`, a
# keep-alive `due to an error of type RendezvousConnectionError`, TCPStore.cpp's C++ frames) at the end of
# a job that completed; at 1,024 nodes, from up to 1,023 agents. Now every other agent sets a key of its own
# on the store once it made its last call, and the host, when its workers succeeded, waits for the keys of
# all the nodes it last saw in the rendezvous (participants, wait list, redundancy list) before it exits,
# LINGER_S at most (an agent that died sets none). A key per node, not a count: a node outside that state
# (one too late for the last round) must not stand in for one inside it. A failed or stopped host does not
# wait: a failure is not held up. LINGER_POLL_S between two checks: one request, on the host itself.
LINGER_S = 10.0
LINGER_POLL_S = 0.05
LEFT_KEY = "fsdp_jobs.agent_left."


def left_key(handler: Any, node: Any) -> str:
    """The key `node` (a rendezvous node descriptor) sets once it left this rendezvous."""
    return f"{LEFT_KEY}{handler._settings.run_id}/{node!r}"


def others_in_the_rendezvous(handler: Any) -> list[str]:
    """The keys of the other agents the rendezvous state this agent last read holds."""
    state = handler._state_holder.state
    nodes = set(state.participants) | set(state.wait_list) | set(state.redundancy_list)
    nodes.discard(handler._this_node)
    return sorted(left_key(handler, n) for n in nodes)


def wait_for_the_others(store: Any, keys: list[str], linger_s: float) -> bool:
    """On the store host: wait until every one of `keys` is set; False after `linger_s`."""
    import time

    deadline = time.monotonic() + linger_s
    while keys and not store.check(keys):
        if time.monotonic() >= deadline:
            return False
        time.sleep(LINGER_POLL_S)
    return True


def leave_the_rendezvous(handler: Any, store_is_up: bool, succeeded: bool) -> None:
    """The last thing an agent does with its rendezvous: the host waits for the others (when it `succeeded`),
    an other says it left (when the store is still up: nothing to tell a store that is gone)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    try:
        store = handler._store  # the c10d backend's TCPStore (fsdp_jobs/runtime/loopback_store.py)
        if getattr(store, "hosts_server", False):
            if succeeded:
                wait_for_the_others(store, others_in_the_rendezvous(handler), LINGER_S)
        elif store_is_up:
            store.set(left_key(handler, handler._this_node), "1")
    except (RendezvousError, RuntimeError, OSError):  # a store that fails now has nothing left to serve
        pass


def end_a_waiting_node_when_the_job_completed() -> None:
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV, RUN_DIR_ENV  # the node wrapper's, which the agent inherits

    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return
    import time
    from pathlib import Path

    from torch.distributed.elastic.rendezvous import api
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.rundir.outcome import outcome

    started = time.time()
    next_rendezvous = DynamicRendezvousHandler.next_rendezvous
    ended = (api.RendezvousConnectionError, api.RendezvousClosedError, api.RendezvousGracefulExitError)

    def next_rendezvous_unless_completed(handler: Any) -> Any:
        try:
            return next_rendezvous(handler)
        except ended as error:
            status = outcome(Path(run_dir), started).status
            if status not in ("completed", "failed"):
                raise
            handler._fsdp_jobs_left = True  # the job closed the rendezvous: nothing left to close
            print(f"fsdp-jobs: {os.environ.get(NODE_ENV, 'this node')}: the job {status} while this node waited "
                  "in the rendezvous (a hot spare it did not need, or a node too late for its last round)",
                  flush=True)  # the node wrapper then says how the job ended, as every node's does
            leave_the_rendezvous(handler, store_is_up=not isinstance(error, api.RendezvousConnectionError),
                                 succeeded=status == "completed")
            raise SystemExit(0) from None

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous_unless_completed


def let_the_store_host_leave_last() -> None:
    """torchrun's last rendezvous call (`launch_agent`'s shutdown, not made on a signal) is followed by
    leave_the_rendezvous, unless the agent left already (a waiting node, above). Whether this agent's
    workers succeeded is the result of its run, which launch_agent gets just before."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    run, shutdown = SimpleElasticAgent.run, DynamicRendezvousHandler.shutdown

    def run_and_remember(agent: Any, *args: Any, **kwargs: Any) -> Any:
        result = run(agent, *args, **kwargs)
        agent._worker_group.spec.rdzv_handler._fsdp_jobs_succeeded = result is not None and not result.is_failed()
        return result

    def shutdown_then_leave(handler: Any) -> bool:
        if getattr(handler, "_fsdp_jobs_left", False):
            return False
        closed = shutdown(handler)  # False when the store is gone (torch logs it)
        leave_the_rendezvous(handler, store_is_up=closed, succeeded=getattr(handler, "_fsdp_jobs_succeeded", False))
        return closed

    SimpleElasticAgent.run = run_and_remember
    DynamicRendezvousHandler.shutdown = shutdown_then_leave


def stop_heartbeats_on_a_stop() -> None:
    """fsdp_jobs/ARCHITECTURE.md, pitfall 34. On a stop signal torchrun skips its rendezvous shutdown (to leave
    the rendezvous open), so the agent's keep-alive thread went on beating while the ranks checkpointed and
    after: once the store host's agent had exited, a keep-alive against its store printed TCPStore's C++
    frames and a RendezvousConnectionError warning, and a handler freed on that thread printed `cannot join
    current thread` on Ctrl-C. The agent stops beating when the signal reaches it; its round needs no more
    beats, as it leaves, and the store is up then. Nothing is closed: the rendezvous stays open as torch
    wants."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException

    invoke_run = SimpleElasticAgent._invoke_run

    def run_until_a_stop(agent: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return invoke_run(agent, *args, **kwargs)
        except SignalException:
            stop = getattr(agent._worker_group.spec.rdzv_handler, "_stop_heartbeats", None)
            if stop is not None:  # the dynamic handler's (c10d, etcd-v2): torch's own, joins the thread
                stop()
            raise

    SimpleElasticAgent._invoke_run = run_until_a_stop


# A node cut off from the network (or a host lost with its agent) keeps its ranks waiting in their collectives
# with it: nothing fails, every heartbeat thread beats, and only the hang timeout found it (at least 60 s by
# default). torch's rendezvous knows sooner: the node's agent stops beating, and every other agent's next read
# of the state drops it from the round's participants once keep_alive_interval x keep_alive_max_attempt passed
# (3 s below 28 nodes: launchers/common.py keep_alive_s); torch itself acts on that only at the next round.
# The agent tells its node's watchdog which nodes of its round are gone (a node-local file, rewritten when
# that changes), and the watchdog restarts the workers once its ranks have also stopped stepping for a while
# (launchers/node/watchdog.py `Watchdog.left_the_round`). A node counts as gone when two of this agent's reads
# of the state, torch's own, miss it: one read can fall between a restarting agent's exit from the round and
# its join of the next (two writes). No store traffic of its own but one key a node a round saying which of
# our nodes an agent is, read for at most NAMED_MAX gone nodes (a whole job's agents dropped at once, after a
# pause, would otherwise each read every other's).
NODE_NAME_KEY = "fsdp_jobs.node_name."
NAMED_MAX = 4
log = logging.getLogger(__name__)


def name_key(handler: Any, node: Any) -> str:
    return f"{NODE_NAME_KEY}{handler._settings.run_id}/{node!r}"


def unnamed(node: Any) -> str:
    return f"{node.addr} (agent pid {node.pid})"


def name_of(handler: Any, node: Any) -> str:
    """Our name of the node a rendezvous descriptor stands for (the agent's address and pid where it said none)."""
    key = name_key(handler, node)
    try:
        if handler._store.check([key]):  # a get would wait for a key never set
            return handler._store.get(key).decode() or unnamed(node)
    except (RuntimeError, OSError, UnicodeDecodeError):
        pass
    return unnamed(node)


def gone_from_the_round(handler: Any) -> tuple[float, Optional[list[Any]]]:
    """When the state was last read from the store, and the other nodes of this agent's round no longer in it (nor
    waiting for the next; None once the round has moved on or closed). Both under torch's heartbeat lock: its
    keep-alive thread reads the store too, and replaces and prunes the state."""
    joined = getattr(handler, "_fsdp_jobs_round", None)
    with handler._heartbeat_lock:
        state, synced = handler._state_holder.state, handler._state_holder._last_sync_time
        if joined is None or state.round != joined[0] or state.closed:
            return synced, None
        present = set(state.participants) | set(state.wait_list) | set(state.redundancy_list)
    return synced, sorted((n for n in joined[1] if n not in present), key=repr)


class RoundWatch:
    """One agent's view of who left its round, as its node's file says it."""

    def __init__(self, directory: Any) -> None:
        self.directory = directory
        self.missing: dict[Any, tuple[float, float]] = {}  # descriptor -> (torch's sync time, wall time) first missed
        self.reported: dict[Any, tuple[str, float]] = {}  # descriptor -> (our name, wall time first missed)
        self.asked = 0  # names read from the store this round

    def clear(self) -> None:
        from fsdp_jobs.rundir import liveness

        self.missing, self.reported, self.asked = {}, {}, 0
        liveness.write_left(self.directory, None)

    def read(self, handler: Any) -> None:
        """After a read of the state: report the nodes that a later, fresh read still misses."""
        import time

        from fsdp_jobs.rundir import liveness

        synced, gone = gone_from_the_round(handler)  # synced: a new value only for a read of the store, not the cache
        gone = gone or []
        self.missing = {n: self.missing.get(n, (synced, time.time())) for n in gone}
        confirmed = [n for n in gone if self.missing[n][0] != synced]
        if set(confirmed) == set(self.reported):
            return
        for n in confirmed:
            if n not in self.reported:
                ask, self.asked = self.asked < NAMED_MAX, self.asked + 1
                self.reported[n] = (name_of(handler, n) if ask else unnamed(n), self.missing[n][1])
        self.reported = {n: self.reported[n] for n in confirmed}
        settings = handler._settings
        expiry = (settings.keep_alive_interval * settings.keep_alive_max_attempt).total_seconds()
        liveness.write_left(self.directory, liveness.LeftTheRound(
            handler._fsdp_jobs_round[0], expiry, dict(self.reported.values())) if confirmed else None)


def report_nodes_that_left_the_round() -> None:
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV
    from fsdp_jobs.rundir import liveness

    local = os.environ.get(liveness.LOCAL_DIR_ENV)
    if not local:
        return
    from pathlib import Path

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    watch = RoundWatch(Path(local))
    next_rendezvous, num_nodes_waiting = DynamicRendezvousHandler.next_rendezvous, DynamicRendezvousHandler.num_nodes_waiting
    restart = SimpleElasticAgent._restart_workers

    def quietly(what: Callable[[], None]) -> None:
        """The report is advice to the watchdog: never a reason for torchrun's agent to fail (a full /dev/shm, a
        store that fails: the agent's own next call says so in torch's words). A stop signal torch raises on this
        thread meanwhile (SignalException, an Exception) goes on to torchrun."""
        try:
            what()
        except SignalException:
            raise
        except Exception as e:  # noqa: BLE001  (anything: torchrun would close the rendezvous for every node)
            log.warning("fsdp-jobs: cannot tell the watchdog who left the rendezvous round: %s", e)

    def next_round_named(handler: Any) -> Any:
        result = next_rendezvous(handler)

        def joined() -> None:
            with handler._heartbeat_lock:
                state = handler._state_holder.state
                handler._fsdp_jobs_round = (state.round, set(state.participants) - {handler._this_node})
            watch.clear()
            handler._store.set(name_key(handler, handler._this_node), os.environ.get(NODE_ENV, ""))
        quietly(joined)
        return result

    def waiting_and_gone(handler: Any) -> int:
        waiting = num_nodes_waiting(handler)  # torch's read of the state (cached), which drops silent agents
        # nodes waiting: torchrun restarts the workers now (a spare taking a node's place, a node joining)
        quietly(watch.clear if waiting else lambda: watch.read(handler))
        return waiting

    def restart_unreported(agent: Any, worker_group: Any) -> None:
        quietly(watch.clear)  # the workers restart anyway: nothing left for the watchdog to do
        return restart(agent, worker_group)

    DynamicRendezvousHandler.next_rendezvous = next_round_named
    DynamicRendezvousHandler.num_nodes_waiting = waiting_and_gone
    SimpleElasticAgent._restart_workers = restart_unreported


# A node's agent that died with its ranks (a container killed and restarted by its engine, a host rebooted into
# its old job) stays among the round's participants until its keep-alive lapses (launchers/common.py keep_alive_s),
# and torch begins the next round only once the last one has no participant left: the survivors and the node's
# new agent, ready 1.9 s after the kill in a Docker job, waited out the rest of the 3 s. A node runs one agent of a
# job, so one of our node's name in the state with our address and another pid is its predecessor, dead: the new
# agent dates its last beat back to the epoch before its first join, and torch's own sanitize, in every agent's
# next read of the state, drops it as it drops any node whose beats lapsed. The name (NODE_NAME_KEY) tells apart
# the nodes of a job on one machine (cluster=local), which share an address. Read for at most NAMED_MAX
# descriptors of our address.
PREDECESSOR_TRIES = 3


def predecessors(handler: Any, node: str) -> list[Any]:
    """This node's earlier agents still in the state (under torch's heartbeat lock, after a sync)."""
    me = handler._this_node
    ours = [n for n in handler._state_holder.state.last_heartbeats if n != me and n.addr == me.addr]
    return [n for n in ours[:NAMED_MAX] if name_of(handler, n) == node]


def expire_predecessors(handler: Any, node: str) -> list[Any]:
    """Date this node's earlier agents' last beats back to the epoch in the store's state; the ones dropped (none
    where every try lost its write to another agent's: torch's keep-alive expiry drops them then)."""
    from datetime import datetime, timezone

    holder = handler._state_holder
    with handler._heartbeat_lock:
        for _ in range(PREDECESSOR_TRIES):
            holder.sync()
            gone = predecessors(handler, node)
            if not gone:
                return []
            for n in gone:
                holder.state.last_heartbeats[n] = datetime.fromtimestamp(0, timezone.utc)
            holder.mark_dirty()
            if holder.sync():  # False: another agent wrote first; its state is read, and tried again
                return gone
    return []


def forget_this_nodes_dead_agent() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node.wrapper import NODE_ENV

    node = os.environ.get(NODE_ENV)
    if not node:
        return
    next_rendezvous = DynamicRendezvousHandler.next_rendezvous
    first = [True]

    def next_rendezvous_without_a_predecessor(handler: Any) -> Any:
        if first[0]:
            first[0] = False
            try:
                gone = expire_predecessors(handler, node)
            except Exception as e:  # noqa: BLE001  (advice only: torch's keep-alive expiry drops it anyway)
                log.warning("fsdp-jobs: cannot drop this node's earlier agent from the rendezvous: %s", e)
            else:
                if gone:
                    print(f"fsdp-jobs: {node}: its earlier torchrun agent ({unnamed(gone[0])}) died with the node; "
                          "dropped from the rendezvous without waiting for its keep-alive to lapse", flush=True)
        return next_rendezvous(handler)

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous_without_a_predecessor


# A node cut off from the network for longer than torch's keep-alive expiry is dropped from its rendezvous round
# by the others' reads of the state; their watchdogs then restart their ranks, and the round, emptied of its
# participants, moves on. Torch's monitor loop tells this node's agent nothing of it: it counts only the nodes
# waiting for a next round (`num_nodes_waiting`), and the others join the new round as its participants, not
# its wait list. So its ranks waited in a collective with processes already gone, until a retransmitted segment
# drew a reset from a dead peer (seconds after the heal, by the TCP backoff of the cut) or its own watchdog's hang
# timeout (`fault.hang_timeout_s`) killed them. The agent's first read of the state after the heal now sees the
# round it joined is gone, SIGKILLs its ranks (no collective they are in can finish, and a SIGTERM is a flag
# never seen inside a blocked one: pitfall 29; the node's snapshots outlive them) and restarts them into the new
# round, as torch restarts for a node waiting. Not while the rendezvous is closed (the job is ending), and not for
# a round only torch's read moved on: finding every participant's beat stale (a whole job paused), it empties and
# bumps the round in its own copy of the state, where nobody joined.
def join_the_round_that_went_on_without_this_node() -> None:
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node.wrapper import NODE_ENV

    next_rendezvous, num_nodes_waiting = DynamicRendezvousHandler.next_rendezvous, DynamicRendezvousHandler.num_nodes_waiting
    restart = SimpleElasticAgent._restart_workers

    def next_rendezvous_noted(handler: Any) -> Any:
        result = next_rendezvous(handler)
        with handler._heartbeat_lock:
            handler._fsdp_jobs_joined_round = handler._state_holder.state.round
        return result

    def waiting_or_left_behind(handler: Any) -> int:
        waiting = num_nodes_waiting(handler)  # torch's read of the state (cached), then ours of the same
        if getattr(handler, "_fsdp_jobs_joined_round", None) is None:
            return waiting
        with handler._heartbeat_lock:
            state = handler._state_holder.state
            # others joined a later round: torch's read also bumps the round in its own copy when it finds every
            # participant's beat stale (a whole job paused, or starved), with nobody in it and nothing to restart
            went_on = (not state.closed and state.round != handler._fsdp_jobs_joined_round
                       and bool(state.participants) and handler._this_node not in state.participants)
        if went_on:  # also with nodes waiting: torch's restart alone would SIGTERM ranks that cannot see it
            handler._fsdp_jobs_left_behind = (handler._fsdp_jobs_joined_round, state.round)
        return max(waiting, 1) if went_on else waiting

    def restart_left_behind(agent: Any, worker_group: Any) -> None:
        rounds = getattr(worker_group.spec.rdzv_handler, "_fsdp_jobs_left_behind", None)
        if rounds is not None:
            worker_group.spec.rdzv_handler._fsdp_jobs_left_behind = None
            node = os.environ.get(NODE_ENV) or "this node"
            print(f"fsdp-jobs: {node}: the other nodes went on to rendezvous round {rounds[1]} without it (dropped "
                  f"from round {rounds[0]} when its agent stopped beating: cut off from the network, or paused); "
                  "its ranks cannot finish a collective with them: killed, restarting them into the new round",
                  flush=True)
            for pid in (agent._pcontext.pids().values() if agent._pcontext is not None else ()):
                kill_with_its_group(pid)  # torch's stop, next, reaps them
            return restart(agent, worker_group)
        ROUND_LOST[0] = lost_a_node(worker_group.spec.rdzv_handler)  # the stop below is watched (pitfall 38)
        try:
            return restart(agent, worker_group)
        finally:
            ROUND_LOST[0] = False

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous_noted
    DynamicRendezvousHandler.num_nodes_waiting = waiting_or_left_behind
    SimpleElasticAgent._restart_workers = restart_left_behind


# fsdp_jobs/ARCHITECTURE.md, pitfall 38. torch stops the workers with SIGTERM and SIGKILLs them 30 s later: in its
# restart (`_stop_workers`), and in its monitor the moment one local rank failed (the others, `PContext.close`). A
# rank blocked in a collective with a peer that is gone never sees the SIGTERM (a flag, read only between Python's
# bytecodes): a healed cut node whose round did not move on (the node restarted first joined its wait list), and
# the round's third node, waited for their hang timeout; a rank blocked beside a local one that died (an NCCL
# collective with a dead peer waits for its timeout) would wait the 30 s. A stop that follows a loss (a local rank
# ended, or a node of this agent's round left it) is watched: ranks that every heartbeat shows stalled in a step
# for the watchdog's `left_stall_s` (2 s at least, 3 of their slowest steps) are SIGKILLed. A rank that can act on
# the signal steps to its stop vote within a step, and one saving, loading or finishing is never stalled in a
# step. A stop without a loss (a node joining: a grow, a spare; a cancel, a preemption: the ranks save at the step
# they reached) is torch's alone. Their state is in the node's snapshots.
STOP_GUARD_POLL_S = 0.1
TORCH_STOP_S = 30.0
ROUND_LOST = [False]  # set by the restart's patch while its stop runs: a node of the round left it


def lost_a_node(handler: Any) -> bool:
    """A node of the round this agent joined is no longer among its participants (left to restart, or its beats
    lapsed); False where this agent never reported its round (no watchdog) or the round moved on."""
    joined = getattr(handler, "_fsdp_jobs_round", None)
    if joined is None:
        return False
    with handler._heartbeat_lock:
        state = handler._state_holder.state
        return state.round == joined[0] and not set(joined[1]) <= set(state.participants)


def watch_the_stops_after_a_loss() -> None:
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV
    from fsdp_jobs.rundir import liveness

    local = os.environ.get(liveness.LOCAL_DIR_ENV)
    if not local:
        return
    from pathlib import Path

    from torch.distributed.elastic.multiprocessing.api import PContext

    from fsdp_jobs.launchers.node.watchdog import running  # here: no first import in a thread beside a fork

    close = PContext.close
    node = os.environ.get(NODE_ENV) or "this node"

    def close_watched(context: Any, death_sig: Any = None, timeout: int = 30) -> None:
        try:
            pids = set(context.pids().values())
            alive = {pid for pid in pids if running(pid)}
            if alive and (len(alive) < len(pids) or ROUND_LOST[0]):
                import threading

                threading.Thread(target=stop_guard, args=(Path(local), alive, node), daemon=True,
                                 name="fsdp-jobs-stop-guard").start()
        except Exception as e:  # noqa: BLE001  (advice only: torch's own stop goes on)
            log.warning("fsdp-jobs: cannot watch the workers' stop: %s", e)
        return close(context, death_sig, timeout)

    PContext.close = close_watched


def stop_guard(directory: Any, pids: set[int], node: str, limit_s: float = TORCH_STOP_S) -> Optional[float]:
    """SIGKILL `pids` once they are all stalled in a step past `left_stall_s`; returns that stall (None: they
    ended, or were never stalled so long, within `limit_s`)."""
    import time

    from fsdp_jobs.launchers.node.watchdog import left_stall_s, running, stalled_for
    from fsdp_jobs.rundir import liveness

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alive = {pid for pid in pids if running(pid)}
        if not alive:
            return None
        beats = [b for b in liveness.read_local(directory) if b.pid in alive]
        stalled = stalled_for(beats, time.time())
        if len(beats) == len(alive) and stalled >= left_stall_s(beats):
            for pid in alive:  # first: the line after it is a write to a reader that may be gone
                kill_with_its_group(pid)
            print(f"fsdp-jobs: {node}: its ranks have not stepped for {stalled:.0f} s while their agent stops them "
                  "for a restart: blocked in a collective, a SIGTERM never reaches them (pitfall 38); killed",
                  flush=True)
            return stalled
        time.sleep(STOP_GUARD_POLL_S)
    return None


def kill_with_its_group(pid: int) -> None:
    """SIGKILL a rank, and where torch spawned it in a session of its own (script=, module=: its data loader's
    workers, the interpreter under a wrapper) its whole process group, as torch's own stop signals it."""
    import signal

    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone already (a pid reused by another user's process: not ours)
        pass


# fsdp_jobs/ARCHITECTURE.md, pitfall 35. With fewer nodes allowed than wanted (cluster.min_nodes below nodes),
# torch's rendezvous waits last_call_timeout (30 s) for the rest once min_nodes have joined, at every round: the
# first, where nodes come up minutes apart, and every round after a failure, where the agents of the round before
# are all waited for anyway (torch starts a round only once each has left the last) and the node missing is
# usually the one that failed. Not where the engine restarts a node that failed (a restarted container or pod
# is expected back, and may take longer than this to start), nor from POLL_BUDGET_NODES nodes on (a re-round of
# 64 agents took 11 s in fsdp_jobs/bench/rendezvous.py, one of 32 2.3 s), nor a last call the user set.
RELAST_CALL_S = 10.0
TORCH_LAST_CALL_S = 30.0


def shorten_the_last_call_after_the_first_round(nodes: int, seconds: float = RELAST_CALL_S) -> None:
    """After this agent's first round, its rounds' last call waits `seconds` where torch's default would wait 30
    (torch's timeout object is shared by the handler and its state machine; the node whose join reaches
    min_nodes sets the round's deadline from it). A node back later joins the running job as one `scale` adds."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from fsdp_jobs.launchers.node.wrapper import ENGINE_RESTARTS_ENV

    if nodes >= POLL_BUDGET_NODES or os.environ.get(ENGINE_RESTARTS_ENV) == "1":
        return
    next_rendezvous = DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous_then_shorten(handler: Any) -> Any:
        result = next_rendezvous(handler)
        settings = handler._settings
        if settings.min_nodes < settings.max_nodes and settings.timeout.last_call == timedelta(seconds=TORCH_LAST_CALL_S):
            settings.timeout._last_call = timedelta(seconds=seconds)
        return result

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous_then_shorten


def round_label(state: Any) -> str:
    """A rendezvous round's name, the same on every node in it: torch's number, which starts from 0 again on a new
    store (its host's agent restarted) and in each replica group's rendezvous, and a digest of the participants
    (each agent's address, pid and local id), which tells those apart."""
    import hashlib

    nodes = sorted(f"{n.addr}:{n.pid}:{n.local_id}" for n in state.participants)
    return f"{state.round}-{hashlib.sha256(chr(10).join(nodes).encode()).hexdigest()[:12]}"


def tell_the_ranks_who_hosts_the_store() -> None:
    """After each round, STORE_HOST_ENV in this agent's environment, which the ranks it then starts inherit
    (forked or spawned): "1" where this agent serves the rendezvous store. A preflight never has a hot spare
    replace that node (fsdp_jobs/runtime/preflight.py): its agent's exit would end the rendezvous for all.
    And ROUND_ENV, which their failure records carry (fsdp_jobs/rundir/failures.py, pitfall 37): the round's
    number and a digest of its participants, the same on every node of the round."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    next_rendezvous = DynamicRendezvousHandler.next_rendezvous

    def next_rendezvous_and_say_who_hosts(handler: Any) -> Any:
        result = next_rendezvous(handler)
        os.environ[STORE_HOST_ENV] = "1" if getattr(handler._store, "hosts_server", False) else "0"
        holder = getattr(handler, "_state_holder", None)  # the round, which every node of the attempt shares
        if holder is not None:
            os.environ[ROUND_ENV] = round_label(holder.state)
        return result

    DynamicRendezvousHandler.next_rendezvous = next_rendezvous_and_say_who_hosts


# A node a preflight named while hot spares waited (cluster.spare_nodes) leaves the job: its ranks, like every
# rank, ended the attempt with REPLACED_EXIT, and where every other agent restarts its ranks, this one finds its
# node in the record of replaced nodes (written since it started), leaves the rendezvous round it was in (what
# torch's own next round begins with: its keep-alive stops, and it takes itself off the participants, so the
# others' next round need not wait for its keep-alive to lapse) and exits 0 with one line. The next round has
# room and takes a spare from the redundancy list. Nothing closes the rendezvous (`_fsdp_jobs_left`), and exit
# 0 keeps Docker (on-failure) from starting the node again.
def leave_when_replaced() -> None:
    from fsdp_jobs.launchers.node.wrapper import NODE_ENV, RUN_DIR_ENV  # the node wrapper's, which the agent inherits

    run_dir, node = os.environ.get(RUN_DIR_ENV), os.environ.get(NODE_ENV)
    if not run_dir or not node:
        return
    import time
    from pathlib import Path

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

    from fsdp_jobs.rundir import replaced

    started = time.time()
    restart = SimpleElasticAgent._restart_workers

    def restart_unless_replaced(agent: Any, worker_group: Any) -> None:
        by = replaced.named_by(Path(run_dir), node, started)
        if by is None:
            return restart(agent, worker_group)
        handler = worker_group.spec.rdzv_handler
        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), handler._get_deadline(handler._settings.timeout.close))
        handler._fsdp_jobs_left = True
        print(f"fsdp-jobs: {node}: {by} named this node and a hot spare takes its place; it leaves the job",
              flush=True)
        raise SystemExit(0)

    SimpleElasticAgent._restart_workers = restart_unless_replaced


def import_the_log_formatter() -> None:
    """torch's log formatter imports torch._dynamo the first time it formats an exception (0.3-1.0 s on 2
    busy cores), and the first one an agent logs is its ranks' failure, on the way to their restart
    (fsdp_jobs/ARCHITECTURE.md, pitfall 15): imported here, before the first rendezvous, instead. Not in
    a thread beside the rendezvous: a rank forked while another thread imports would inherit a held
    import lock."""
    import torch._dynamo.config  # noqa: F401


def name_rendezvous_events_cheaply() -> None:
    """fsdp_jobs/ARCHITECTURE.md, pitfall 19: torch's rendezvous names every event it records (a join, each
    keep-alive, a close: `_record`) by `inspect.stack()[2].function`, which reads the source lines of every
    frame on the stack from disk: 8.5% of an agent's CPU in a 40-step 2x2 job, more with each restart's
    rendezvous and, at 1,024 nodes, in every agent's keep-alive thread. sys._getframe(2) is the same frame
    (the caller of `_record`), found without reading a file."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # a stack shorter than depth, as torch's own answers
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def main() -> None:
    from fsdp_jobs.rundir import streams

    streams.follow_readers()  # torchrun's own lines, and the forked ranks', outlive their reader
    install()
    import_the_log_formatter()
    name_rendezvous_events_cheaply()
    shorten_exit_barrier()
    shorten_replica_restart_stop()
    hold_restart_on_a_repeat()
    leave_when_replaced()
    end_a_waiting_node_when_the_job_completed()
    tell_the_ranks_who_hosts_the_store()
    report_nodes_that_left_the_round()
    join_the_round_that_went_on_without_this_node()
    forget_this_nodes_dead_agent()
    watch_the_stops_after_a_loss()
    let_the_store_host_leave_last()
    stop_heartbeats_on_a_stop()
    quiet_planned_stops()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record

    args = torchrun.parse_args(sys.argv[1:])
    shorten_rendezvous_poll(max_nodes(args.nnodes))
    shorten_the_last_call_after_the_first_round(max_nodes(args.nnodes))
    with torchruns_log_dir_removed_at_exit(args):
        if forks_the_trainer(args):
            # turns the collector on again once the ranks' imports are frozen
            record(quiet_on_a_stop(name_a_silent_failure(launch_forked)))(args)
        else:
            gc.enable()  # off while torch was imported (pitfall 23); the spawned ranks start with their own on
            record(quiet_on_a_stop(name_a_silent_failure(torchrun.run)))(args)


@contextmanager
def torchruns_log_dir_removed_at_exit(args: Any) -> Iterator[None]:
    """torchrun makes a directory in the temporary directory (torchelastic_*) for every agent, where its ranks'
    error files go (one folder per attempt and rank), and never removes it; torch's process starter leaves a
    pytorch-errorfile-*.pickle there for every rank that raised. Every node of every job left them behind: 826
    directories in /tmp of a machine that had run this project's tests. What a failure says is in the run dir
    already (the node's TORCHELASTIC_ERROR_FILE, the ranks' failure records), and the ranks' error files are
    read before torchrun returns (`name_a_silent_failure`). Both go into a scratch directory: under a node
    wrapper its node's local directory, which the wrapper removes when the agent ends, however it ends
    (SIGKILLed too: a repeating failure, a hang given up; the next wrapper on the node removes it where the
    wrapper itself was killed: fsdp_jobs/rundir/liveness.py remove_abandoned_local_dirs); without one a
    directory the agent makes and removes itself. The agent's temporary directory is the scratch one (a forked
    rank takes the user's back: fsdp_jobs/runtime/__main__.py). A --log-dir the user gave, and one the ranks'
    output is redirected or tee'd into, stay torchrun's."""
    from fsdp_jobs.rundir import liveness

    local, before = os.environ.get(liveness.LOCAL_DIR_ENV), tempfile.tempdir
    if local:
        scratch = os.path.join(local, "torchrun")
        os.makedirs(scratch, mode=0o700, exist_ok=True)
    else:
        scratch = tempfile.mkdtemp(prefix="torchelastic_")
    if not (args.log_dir or str(args.redirects) != "0" or str(args.tee) != "0"):
        args.log_dir = scratch
    tempfile.tempdir = scratch
    try:
        yield
    finally:
        tempfile.tempdir = before
        if not local:
            shutil.rmtree(scratch, ignore_errors=True)


class PlannedStopLines:
    """A logging filter for torch's agent: on a stop signal it logs that it received it, then one line per
    rank it signals (at 8 ranks a node, 9 lines a node on every cancel), which the node wrapper's one line says
    already. Dropped from the death signal on; a rank's failure and its restart keep their lines."""

    def __init__(self) -> None:
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg.startswith("Received %s death signal"):
            self.stopping = True
        return not (self.stopping and (record.msg.startswith("Received %s death signal")
                                       or record.msg.startswith("Closing process %s via signal")))


def quiet_planned_stops() -> None:
    quiet = PlannedStopLines()
    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(quiet)


def quiet_on_a_stop(launch: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A stop signal (a cancel, Ctrl-C, the scheduler's stop) ends torchrun's agent with a SignalException
    once it has stopped its ranks: a traceback on every node of every planned stop, and, through `record`,
    the node's error file naming the signal as if it were the job's first error. The node wrapper says in
    one line that the node stopped (launchers/node/wrapper.py); the exit status stays torchrun's, 1."""
    def run(args: Any) -> Any:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        try:
            return launch(args)
        except SignalException:
            raise SystemExit(1) from None
    return run


def name_a_silent_failure(launch: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A rank that ends without a Python exception (os._exit(3), a signal: the OOM killer's, a segfault's) writes no
    error file, and torchrun's `record` then leaves the node's empty: its failure line could only say "torchrun
    exited 1". The first failure's rank and exit code, or signal, go there instead (launchers/node/wrapper.py
    reads it where no failure record names the rank: fsdp_jobs/rundir/failures.py)."""
    def run(args: Any) -> Any:
        from pathlib import Path

        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        from fsdp_jobs.launchers.node.wrapper import write_error_file

        try:
            return launch(args)
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path and not os.path.isfile(failure.error_file):
                how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else
                       f"exited {failure.exitcode} without a Python exception (os._exit, or a crash in native code)")
                write_error_file(Path(path), f"rank {rank} {how}")
            raise
    return run


if __name__ == "__main__":
    main()
