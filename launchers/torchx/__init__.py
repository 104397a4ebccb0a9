"""The job on any TorchX scheduler: `torchx run -s SCHEDULER fsdp_jobs.job KEY=VALUE...` (component.py), each
replica of its role a node (node.py), and what `fsdp-jobs status|list|cancel` ask TorchX (backend.py)."""
