"""torchrun (torch.distributed.run) as launchers/node/wrapper.py starts it on every node, with its c10d stores on
loopback when the rendezvous host is loopback (fsdp_jobs/runtime/loopback_store.py).

The built-in trainer's ranks (`-m fsdp_jobs.runtime RUN_DIR`) are forked from this agent, which imports
torch and the trainer once, before its rendezvous: a rank, and every restart of one, starts without
importing torch again. Spawned ranks spent 4.2 s each on imports in CI (four ranks on two cores, 171
starts) and most of a restart's 9.9 s (`fsdp-jobs bench recovery`); on a shared filesystem far more.
This is torchrun's own `--start-method=fork` with the trainer as a function (torch.distributed.launcher);
the agent never touches CUDA, so the ranks may. Any other entry (script=, module=) is spawned by torchrun
unchanged. FSDP_JOBS_SPAWN_RANKS=1 spawns the trainer's ranks too. What a forked rank must undo:
fsdp_jobs/ARCHITECTURE.md, pitfall 11."""

from __future__ import annotations

import os
import sys
from typing import Any

from fsdp_jobs.planning.plan import REPLICA_GROUP_ENV
from fsdp_jobs.runtime.loopback_store import install

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
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    import fsdp_jobs.runtime.train  # noqa: F401  torch and the trainer, imported once, here
    from fsdp_jobs.runtime.__main__ import forked

    args.start_method = "fork"
    config, _, _ = torchrun.config_from_args(args)
    elastic_launch(config=config, entrypoint=forked)(args.training_script_args[0])


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


def main() -> None:
    install()
    shorten_exit_barrier()
    shorten_replica_restart_stop()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record

    args = torchrun.parse_args(sys.argv[1:])
    record(launch_forked if forks_the_trainer(args) else torchrun.run)(args)


if __name__ == "__main__":
    main()
