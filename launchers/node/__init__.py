"""The node side, shared by every backend: what runs on each node of a job around torchrun.

  python -m fsdp_jobs.launchers.node ...   the node wrapper (wrapper.py): its agent, its hang watchdog, its goodput
                                 events and exit status
  agent.py        the torchrun agent, which forks the built-in trainer's ranks after importing torch once
  watchdog.py     the hang and straggler watchdog of one node, from its ranks' node-local heartbeats

Nothing is imported here: `python -m fsdp_jobs.launchers.node` runs __main__.py alone."""
