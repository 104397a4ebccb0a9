"""`import fsdp_jobs.job as job`: the public API for your own training script, which runs in a rank
(fsdp_jobs/runtime/job.py). This name is the same module object, so its functions and state are one."""

import sys

from fsdp_jobs.runtime import job as _job

sys.modules[__name__] = _job
