"""torchrun (torch.distributed.run) as launchers/node.py starts it on every node, with its c10d stores on
loopback when the rendezvous host is loopback (fsdp_jobs/runtime/loopback_store.py).

The built-in trainer's ranks (`-m fsdp_jobs.runtime RUN_DIR`) are forked from this agent, which imports
torch and the trainer once, before its rendezvous: a rank, and every restart of one, starts without
importing torch again. Spawned ranks spent 4.2 s each on imports in CI (four ranks on two cores, 171
starts) and most of a restart's 9.9 s (`fsdp-jobs bench recovery`); on a shared filesystem far more.
This is torchrun's own `--start-method=fork` with the trainer as a function (torch.distributed.launcher);
the agent never touches CUDA, so the ranks may. Any other entry (script=, module=) is spawned by torchrun
unchanged. FSDP_JOBS_SPAWN_RANKS=1 spawns the trainer's ranks too. What a forked rank must undo:
ARCHITECTURE.md, pitfall 11."""

from __future__ import annotations

import os
import sys
from typing import Any

from fsdp_jobs.runtime.loopback_store import install

TRAINER = "fsdp_jobs.runtime"
SPAWN_ENV = "FSDP_JOBS_SPAWN_RANKS"


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


def main() -> None:
    install()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record

    args = torchrun.parse_args(sys.argv[1:])
    record(launch_forked if forks_the_trainer(args) else torchrun.run)(args)


if __name__ == "__main__":
    main()
