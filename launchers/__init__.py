"""One package per backend (launchers/local, slurm, docker, kubernetes), each with its config schema
(config.py) and its `Backend` (backend.py, launchers/base.py's interface), plus what every backend
shares: launchers/common.py (torchrun flags, the ranks' environment and entry point),
launchers/snapshot.py (code snapshots). fsdp_jobs/planning/backends.py is the registry that finds them.

Nothing is imported here: importing a backend's config for planning must not load any backend."""
