"""torchrun (torch.distributed.run) as launchers/node.py starts it on every node, with its c10d stores on
loopback when the rendezvous host is loopback (fsdp_jobs/runtime/loopback_store.py)."""

import runpy

from fsdp_jobs.runtime.loopback_store import install

if __name__ == "__main__":
    install()
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
