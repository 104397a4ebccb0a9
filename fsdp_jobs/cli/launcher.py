"""The chosen backend itself (<package>/backend.py's BACKEND), for the commands that submit or ask about jobs
(fsdp_jobs/cli/submit.py, fsdp_jobs/cli/sweep.py, fsdp_jobs/cli/ctl.py). Kept apart from the registry
(fsdp_jobs/planning/backends.py), which planning uses: the planning path never reaches a backend's module."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fsdp_jobs.planning import backends
from fsdp_jobs.planning.errors import UserError

if TYPE_CHECKING:
    from fsdp_jobs.launchers.base import Backend


def get(name: str) -> "Backend":
    """Only the chosen backend is imported: one backend's dependencies never load for another. Refused in one
    line where it is not what its config.py's TRAITS declare (a backend outside this tree is anyone's code)."""
    module = backends.backend_module(name)
    try:
        backend = importlib.import_module(module).BACKEND
    except Exception as e:  # noqa: BLE001  a built-in's own errors are this project's: only a plugin's are one line
        if name in backends.BACKENDS:
            raise
        raise UserError("cluster", name, f"cannot load {module}.BACKEND ({type(e).__name__}: {e}); fix, reinstall or "
                                         f"uninstall the distribution whose {backends.GROUP} entry point names it") from None
    traits = backends.traits(name)
    offered = {"scaler": (backend.scaler, traits.scale is not None), "stacks": (backend.stacks, traits.stacks),
               "faults": (backend.faults, bool(traits.chaos or traits.marathon))}
    wrong = [f"{attr} is {'None' if have is None else 'set'} but TRAITS says {'yes' if declared else 'no'}"
             for attr, (have, declared) in offered.items() if (have is not None) != declared]
    if backend.name != name or wrong:
        raise UserError("cluster", name, f"{module}.BACKEND is not what its config.py declares: "
                        + "; ".join([f"its name is {backend.name!r}"] * (backend.name != name) + wrong))
    return backend
