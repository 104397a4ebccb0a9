"""Test-only fault injection through FSDP_JOBS_TEST_* environment variables.

Parsed in one place: a bad value is one line at plan time (not a crash on every rank), and any such
variable that reaches a job is announced, so one forgotten in a shell never goes unnoticed."""

from __future__ import annotations

import os
import re
from typing import Mapping

from fsdp_jobs.planning.errors import UserError

PREFIX = "FSDP_JOBS_TEST_"
FLOAT8_EMULATE_ENV = "FSDP_JOBS_TEST_FLOAT8_EMULATE"
KNOWN = {
    "FSDP_JOBS_TEST_FAIL_AT_STEP": "every training step from this one on raises",
    "FSDP_JOBS_TEST_CRASH_IN_SAVE": "rank 0 SIGKILLs itself in the middle of saving this step (first attempt)",
    "FSDP_JOBS_TEST_CRASH_IN_SNAPSHOT": "the last rank SIGKILLs itself half way through copying this step's "
                                        "in-memory snapshot (first attempt)",
    "FSDP_JOBS_TEST_OOM_AT_STEP": "the job's last rank allocates memory until the kernel kills it, at this step (first attempt)",
    "FSDP_JOBS_TEST_NONFINITE_AT_STEP": "the batch a run from scratch takes at this step makes the loss NaN (a bad batch)",
    "FSDP_JOBS_TEST_REJOIN_DELAY_S": "a restarted replica group waits this many seconds before it rejoins (a node slow to come back)",
    "FSDP_JOBS_TEST_STEP_PAUSE_MS": "every rank sleeps this many milliseconds before each step (a job that keeps "
                                    "stepping without using the CPU: tests that wait on the clock)",
    "FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE": "this node's preflight checks take 3x as long (fsdp_jobs/runtime/preflight.py)",
    "FSDP_JOBS_TEST_PREFLIGHT_SLOW_ONCE": "this node's preflight checks take 3x as long in the first round only",
    "FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE_RANK": "in the job's first attempt, the preflight checks of its K-th node by "
                                              "node rank (K >= 1) not serving the rendezvous store take 3x as long",
    "FSDP_JOBS_TEST_CORRUPT_AT": "STEP:RANK: that rank flips a bit of its parameter shard after that step's update "
                                 "(first attempt; RANK -1: the last rank not on the rendezvous store's node)",
    "FSDP_JOBS_TEST_UNREPRODUCIBLE_FROM_STEP": "from this step on every rank scales its loss by a random factor "
                                               "near 1 before the backward: no computation of a step reproduces "
                                               "another (as kernels that are not deterministic)",
    "FSDP_JOBS_TEST_FLOAT8_EMULATE": "1: train.float8 runs torchao's emulated float8 matmuls, on a CPU too (tests of "
                                     "the wiring, not of float8's speed: fsdp_jobs/runtime/float8.py)",
    "FSDP_JOBS_TEST_SPIKE_AT_STEP": "this step's loss, and so its gradients, 1000 times as large (first attempt): a "
                                    "spike for the sentinel (fault.sdc_spike_factor)",
}
STEP_AND_RANK = ("FSDP_JOBS_TEST_CORRUPT_AT",)  # these take STEP:RANK
UNITS = (("_MS", "milliseconds"), ("_S", "seconds"), ("_RANK", "a node rank"))  # by name suffix; else a step
NAMED = ("FSDP_JOBS_TEST_PREFLIGHT_SLOW_NODE", "FSDP_JOBS_TEST_PREFLIGHT_SLOW_ONCE")  # these take a node's name, the others a step number


def parse(env: Mapping[str, str]) -> dict[str, int | str]:
    """The fault variables in `env` and their values (a step number, or a node's name for NAMED ones);
    UserError for an unknown name or a bad value."""
    out = {}
    for name, value in env.items():
        if not name.startswith(PREFIX):
            continue
        if name not in KNOWN:
            raise UserError(name, value, "unknown test fault variable; known: " + ", ".join(KNOWN))
        if name in STEP_AND_RANK:
            if not re.fullmatch(r"\d+:-?\d+", str(value)):
                raise UserError(name, value, "must be STEP:RANK (a step number, a rank or -1)")
            out[name] = str(value)
            continue
        if name in NAMED:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", str(value)):
                raise UserError(name, value, "must be a node's name (letters, digits, . _ -)")
            out[name] = str(value)
            continue
        if not str(value).strip().isdigit():
            unit = next((u for suffix, u in UNITS if name.endswith(suffix)), "a step number")
            raise UserError(name, value, f"must be {unit} (an integer >= 0)")
        out[name] = int(value)
    return out


def step(name: str) -> int:
    """In the job: the step the fault fires at, 0 = off (the plan already refused a bad value)."""
    return int(parse({name: os.environ[name]}).get(name, 0)) if name in os.environ else 0


def name(variable: str) -> str:
    """In the job: the node a NAMED fault applies to (a STEP_AND_RANK one's STEP:RANK), "" = off."""
    return str(parse({variable: os.environ[variable]}).get(variable, "")) if variable in os.environ else ""
