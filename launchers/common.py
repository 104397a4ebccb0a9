"""What every backend launches the same way: the torchrun command line and the ranks' environment."""

from __future__ import annotations

from typing import Any


def torchrun_args(plan: Any, endpoint: str, stop_grace_s: int) -> list[str]:
    """torchrun (elastic agent) flags for one node of the plan; the rendezvous decides node order.
    stop_grace_s: on SIGTERM torchrun gives the ranks this long (default 30 s) to save and exit."""
    r = plan.rendezvous
    nnodes = f"{r.min_nodes}:{r.max_nodes}" if r.min_nodes != r.max_nodes else str(r.max_nodes)
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={plan.gpus_per_node}",
        f"--rdzv-backend={r.backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={r.run_id}",
        f"--max-restarts={r.max_restarts}",
        "--monitor-interval=1",
        f"--shutdown-timeout={stop_grace_s}",
    ]


def runtime_env(cfg: Any) -> dict[str, str]:
    """Environment every agent and rank needs, whatever the backend."""
    env = {
        # torch 2.13: without it, restarted workers read stale addresses from the rendezvous
        # store the agent shares with them and fail in init_process_group (env-notes pitfall 1)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if "signal" in cfg.cluster:
        env["FSDP_JOBS_STOP_SIGNAL"] = str(cfg.cluster.signal)  # the ranks checkpoint and stop on it
    if cfg.cluster.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # several ranks share the cores; torchrun would set 1 anyway
    env.update({str(k): str(v) for k, v in cfg.cluster.env.items()})
    return env
