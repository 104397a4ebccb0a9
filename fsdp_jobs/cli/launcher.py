"""The chosen backend itself (launchers/<name>/backend.py's BACKEND), for the commands that submit or ask
about jobs (fsdp_jobs/cli/submit.py, fsdp_jobs/cli/sweep.py, fsdp_jobs/cli/ctl.py). Kept apart from the registry
(fsdp_jobs/planning/backends.py), which planning uses: the planning path never reaches a backend's module."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fsdp_jobs.planning import backends

if TYPE_CHECKING:
    from fsdp_jobs.launchers.base import Backend


def get(name: str) -> "Backend":
    """Only the chosen backend is imported: one backend's dependencies never load for another."""
    return importlib.import_module(backends.backend_module(name)).BACKEND
