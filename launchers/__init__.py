"""One module per backend, each defining BACKEND, an instance of `launchers.base.Backend` (dryrun,
submit, describe, log_iter, cancel). Only the chosen backend's module is imported."""

from __future__ import annotations

import importlib

from fsdp_jobs.config import BACKENDS
from launchers.base import Backend


def get(backend: str) -> Backend:
    """Import only the chosen backend: a backend's dependencies never load for another."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    return importlib.import_module(f"launchers.{backend}").BACKEND
