"""python -m fsdp_jobs.launchers.node TORCHRUN_FLAGS... ENTRY... (launchers/node/wrapper.py)."""

from fsdp_jobs.launchers.node.wrapper import main

if __name__ == "__main__":
    main()
