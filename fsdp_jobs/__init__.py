"""fsdp-jobs: launch and keep alive multi-node FSDP2 training (fsdp_jobs/ARCHITECTURE.md: the layout).

Folders by the process their code runs in:
  planning/   the CLI's pure half: the typed config, its checks and the plan (imports no torch, no backend)
  rundir/     the run directory's contract: every path, record, atomic write and tolerant read (no torch)
  cli/        the CLI and its readers: submit, sweeps, status/logs/list/cancel/goodput/compare
  runtime/    a rank: the trainer and fsdp_jobs.job (torch)
  models/     the built-in models (torch)
The node side (node wrapper, torchrun agent, watchdog, supervisor) lives in launchers/node/. The files at
this level are the public entry points: `python -m fsdp_jobs`, `fsdp_jobs.job`, `python -m fsdp_jobs.export`
and `python -m fsdp_jobs.bench`.
"""
