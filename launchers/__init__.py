"""One module per backend, each exposing `render(plan, cfg) -> str` (what `dry_run` prints: exactly
what would be submitted) and `submit(plan, cfg) -> int` (exit status for the CLI)."""

from __future__ import annotations

import importlib
from types import ModuleType

from fsdp_jobs.config import BACKENDS


def get(backend: str) -> ModuleType:
    """Import only the chosen backend: a backend's dependencies never load for another."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    return importlib.import_module(f"launchers.{backend}")
