"""One package per backend (launchers/local, slurm, docker, kubernetes, torchx), each with its config schema
(config.py) and its `Backend` (backend.py, launchers/base.py's interface), plus what every backend
shares: launchers/common.py (torchrun flags, the ranks' environment and entry point),
launchers/snapshot.py (code snapshots). fsdp_jobs/planning/backends.py is the registry that finds them.

The folder installs as `fsdp_jobs.launchers` (pyproject.toml's package-dir), so that no package with a
generic name lands in site-packages; imported under its folder's name (a checkout's root on sys.path) it
refuses, so no code can come to depend on that name. Nothing else is imported here: importing a
backend's config for planning must not load any backend."""

if __name__ != "fsdp_jobs.launchers":
    raise ImportError(f"{__name__!r} is fsdp_jobs.launchers: import it under that name (pip install -e . maps it)")
