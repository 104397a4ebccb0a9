"""Resolve `package.module.Name` strings from the config (`_target_`, wrap classes)."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not an import path like package.module.Name")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {path!r}: {e}") from None
