"""python -m launchers.node TORCHRUN_FLAGS... ENTRY... (launchers/node/wrapper.py)."""

from launchers.node.wrapper import main

if __name__ == "__main__":
    main()
