"""The checks of the job's keys that their types alone do not express (validate), and the schemas' registration
with Hydra (register_schemas). Apart from the schema (config.py), which imports nothing of the project: the
modules the checks use (byo.py, input_rules.py, the backends' config modules) name the schema's types without
an import cycle. Nothing here imports torch."""

from __future__ import annotations

import os
from typing import Any

from fsdp_jobs.planning import backends, faults, targets
from fsdp_jobs.planning.byo import validate as validate_byo
from fsdp_jobs.planning.cluster_config import choice, positive
from fsdp_jobs.planning.config import (BACKWARD_PREFETCH, DTYPES, FLOAT8_RECIPES, HANG_TIMEOUT_FLOOR_S, LR_SCHEDULES,
                                       ON_NONFINITE, STRATEGIES, WANDB_MODES, WANDB_NAME, FaultConfig, FaultToleranceConfig,
                                       JobConfig, ModelConfig, TrainConfig)
from fsdp_jobs.planning.errors import UserError
from fsdp_jobs.planning.input_rules import (FLOAT32_MAX, MAX_NODES, TIMEDELTA_MAX_S, check_env_names, check_name,
                                            check_sizes, check_target, finite)
from fsdp_jobs.planning.plan import check_snapshot_memory, compute_dtype


_REGISTERED: set[tuple[tuple[str, str], ...]] = set()  # the backend sets whose schemas Hydra holds already


def register_schemas() -> None:
    """Let conf/ files name the schemas in their defaults lists: the root (job_schema, which types every
    group but `cluster`) and one per backend, which each cluster/*.yaml extends. The other groups need
    no schema of their own: merged under the typed root, their values are checked against it (a schema
    per group would be merged once more on every compose). Each
    backend registers its own (launchers/<name>/config.py), found through fsdp_jobs/planning/backends.py.
    Hydra is imported here, not with the schema: a node wrapper and a torchrun agent read the job record
    through the schema (rank_config) and never compose (hydra's import is most of a wrapper's start).
    Once per process for the same backends: storing converts every schema again, which a process that
    composes more than once (a sweep expands, then composes its members; the tests) would pay each time."""
    from hydra.core.config_store import ConfigStore

    installed = tuple(backends.packages().items())
    if installed in _REGISTERED:
        return
    ConfigStore.instance().store(name="job_schema", node=JobConfig)
    backends.register_schemas()
    _REGISTERED.add(installed)


def _importable(key: str, path: str) -> None:
    """The top-level package must exist here (checked without importing it: no torch on this path)."""
    import importlib.util

    module = path.rpartition(".")[0]
    if not module or importlib.util.find_spec(module.split(".")[0]) is None:
        raise UserError(key, path, "must be an import path package.module.Name of an installed package")


def _installed(key: str, value: Any, package: str, extra: str) -> None:
    import importlib.util  # find_spec: whether it is there, without importing it (or torch)

    if importlib.util.find_spec(package) is None:
        raise UserError(key, value, f"needs the {package} package, which is not installed here: "
                                    f"pip install 'fsdp-jobs[{extra}]'")


def validate_trackers(t: TrainConfig) -> None:
    """train.tensorboard, train.wandb.*: names W&B shows and puts in URLs keep to a safe alphabet."""
    if t.tensorboard:
        _installed("train.tensorboard", True, "tensorboard", "tensorboard")
    w = t.wandb
    for key in ("project", "entity"):
        if w[key] is not None and not WANDB_NAME.fullmatch(str(w[key])):
            raise UserError(f"train.wandb.{key}", w[key], "a W&B name may hold letters, digits, . _ - "
                                                         "(at most 128, not starting with . or -)")
    choice("train.wandb.mode", w.mode, WANDB_MODES, optional=True)
    if w.enabled:
        _installed("train.wandb.enabled", True, "wandb", "wandb")


FT_MODES = ("none", "replica")


def validate_fault_tolerance(ft: FaultToleranceConfig) -> None:
    """fault_tolerance.*: the keys alone (what they allow together with the mesh: fsdp_jobs/planning/plan.py)."""
    choice("fault_tolerance.mode", ft.mode, FT_MODES)
    if ft.mode == "none":
        return
    _installed("fault_tolerance", ft.mode, "torchft", "ft")  # as typed: fault_tolerance=replica
    positive("fault_tolerance.min_replicas", ft.min_replicas)
    finite("fault_tolerance.heartbeat_timeout_s", ft.heartbeat_timeout_s, 0.2, 3600)
    finite("fault_tolerance.join_timeout_s", ft.join_timeout_s, 0, 3600)
    finite("fault_tolerance.timeout_s", ft.timeout_s, 1, 3600)
    if not isinstance(ft.quorum_tick_ms, int) or isinstance(ft.quorum_tick_ms, bool) \
            or not 1 <= ft.quorum_tick_ms <= 10_000:
        raise UserError("fault_tolerance.quorum_tick_ms", ft.quorum_tick_ms, "must be an integer from 1 to 10000")
    if ft.lighthouse_port is not None and not 1 <= ft.lighthouse_port <= 65535:
        raise UserError("fault_tolerance.lighthouse_port", ft.lighthouse_port, "must be a TCP port 1-65535 or null")


def validate(cfg: JobConfig) -> None:
    """Per-key checks the types alone do not express. Raises UserError on the first bad key (in this order)."""
    positive("nodes", cfg.nodes)
    positive("gpus_per_node", cfg.gpus_per_node)
    check_sizes(cfg.nodes, cfg.gpus_per_node)
    if cfg.name is not None:
        check_name("name", cfg.name)
    _validate_fsdp(cfg)
    _validate_model(cfg)
    _validate_train(cfg)
    _validate_fault(cfg)
    _validate_data(cfg)
    _validate_cluster(cfg)


def _validate_fsdp(cfg: JobConfig) -> None:
    f = cfg.fsdp
    choice("fsdp.strategy", f.strategy, STRATEGIES)
    sgs = f.shard_group_size
    if not (sgs is None or sgs == "auto" or (isinstance(sgs, int) and not isinstance(sgs, bool) and sgs >= 1)):
        raise UserError("fsdp.shard_group_size", sgs, "allowed: an integer >= 1, auto, or null (one node)")
    for k in ("param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype"):
        auto = ("auto",) if k in ("param_dtype", "reduce_dtype") else ()
        choice(f"fsdp.mixed_precision.{k}", f.mixed_precision[k], DTYPES + auto, optional=True)
    for k in ("param_dtype", "reduce_dtype"):
        if f.mixed_precision[k] == "float16":  # gradients underflow without a loss scaler
            raise UserError(f"fsdp.mixed_precision.{k}", "float16", "needs loss scaling, which is not "
                            "implemented; use bfloat16")
    choice("fsdp.backward_prefetch", f.backward_prefetch, BACKWARD_PREFETCH, optional=True)
    if f.wrap.min_params is not None:
        positive("fsdp.wrap.min_params", f.wrap.min_params)


def _validate_model(cfg: JobConfig) -> None:
    m = cfg.model
    for k in ("dim", "n_layers", "n_heads", "ffn_dim", "vocab_size", "max_seq_len"):
        positive(f"model.{k}", m[k])
    choice("model.dtype", m.dtype, ("float32", "bfloat16"))
    finite("model.norm_eps", m.norm_eps, 0, low_open=True)
    finite("model.rope_theta", m.rope_theta, 0, low_open=True)
    if m.dim % m.n_heads:
        raise UserError("model.dim", m.dim, f"must be divisible by model.n_heads={m.n_heads}")
    if m.n_kv_heads is not None and (m.n_kv_heads < 1 or m.n_heads % m.n_kv_heads):
        raise UserError("model.n_kv_heads", m.n_kv_heads, f"must divide model.n_heads={m.n_heads}")
    if m._target_ == ModelConfig._target_ and (m.dim // m.n_heads) % 2:  # the built-in model's rotary embedding
        raise UserError("model.dim", m.dim, f"gives {m.dim // m.n_heads} channels per head (model.dim / model.n_heads="
                                            f"{m.n_heads}), which must be even: the rotary embedding turns pairs of them")


def _validate_train(cfg: JobConfig) -> None:
    t = cfg.train
    positive("train.steps", t.steps)
    positive("train.seed", t.seed, minimum=0)  # numpy's generators take no negative seed
    positive("train.batch_per_rank", t.batch_per_rank)
    if t.global_batch_size is not None:
        positive("train.global_batch_size", t.global_batch_size)
    if t.micro_batch_per_rank is not None:
        positive("train.micro_batch_per_rank", t.micro_batch_per_rank)
        if t.global_batch_size is None:
            raise UserError("train.micro_batch_per_rank", t.micro_batch_per_rank,
                            "needs train.global_batch_size (accumulation keeps a global batch constant)")
    positive("train.log_interval", t.log_interval)
    positive("train.warmup_steps", t.warmup_steps, minimum=0)
    choice("train.lr_schedule", t.lr_schedule, LR_SCHEDULES)
    choice("train.on_nonfinite", t.on_nonfinite, ON_NONFINITE)
    finite("train.lr", t.lr, 0, low_open=True)
    finite("train.min_lr_ratio", t.min_lr_ratio, 0, 1)
    finite("train.weight_decay", t.weight_decay, 0)
    finite("train.grad_clip", t.grad_clip, 0)  # 0 = off
    if len(t.betas) != 2:
        raise UserError("train.betas", list(t.betas), "must be two numbers, e.g. [0.9,0.95]")
    for i, beta in enumerate(t.betas):
        finite(f"train.betas[{i}]", beta, 0, 1, high_open=True)
    top = FLOAT32_MAX * (1 - t.betas[0])  # AdamW's first step: lr / (1 - beta1), a float32
    if t.lr > top:
        raise UserError("train.lr", t.lr, f"is more than AdamW's float32 step can hold with train.betas[0]={t.betas[0]}"
                                          f" (lr / (1 - beta1) overflows): at most {top:.3g}")
    finite("train.collective_timeout_s", t.collective_timeout_s, 10, TIMEDELTA_MAX_S)
    validate_trackers(t)
    _validate_float8(cfg)


def _validate_float8(cfg: JobConfig) -> None:
    t = cfg.train
    choice("train.float8_recipe", t.float8_recipe, FLOAT8_RECIPES)
    if not t.float8:
        return
    if cfg.cluster.device == "cpu" and not os.environ.get(faults.FLOAT8_EMULATE_ENV):
        raise UserError("train.float8=true", None, "needs a GPU with float8 tensor cores (compute capability >= 8.9), "
                                                   "and cluster.device=cpu (this backend's default): "
                                                   "cluster.device=cuda on a GPU machine, or drop train.float8")
    if cfg.fault_tolerance.mode == "replica" and t.float8_recipe == "tensorwise":
        # torchft's live recovery sends plain tensors only; tensorwise's weights are torchao's wrapper subclass
        raise UserError("train.float8_recipe", t.float8_recipe, "with fault_tolerance=replica: rowwise (torchft's "
                        "live recovery cannot send tensorwise's float8 weights)")
    if t.float8_recipe == "rowwise" and compute_dtype(cfg, "cuda") != "bfloat16":
        raise UserError("train.float8_recipe", t.float8_recipe, "needs bfloat16 compute (torch's rowwise float8 "
                        "matmul returns bfloat16): fsdp.mixed_precision.param_dtype=bfloat16, or tensorwise")
    _installed("train.float8=true", None, "torchao", "float8")


def _validate_fault(cfg: JobConfig) -> None:
    t = cfg.train
    fc = cfg.fault
    positive("fault.max_hang_restarts", fc.max_hang_restarts, minimum=0)
    # the watchdog must fire well before a collective times out and fails the rank with a less useful error
    limit = t.collective_timeout_s / 2
    finite("fault.startup_timeout_s", fc.startup_timeout_s, 10, limit)
    if fc.hang_timeout_s is not None:
        finite("fault.hang_timeout_s", fc.hang_timeout_s, 5, limit)
    finite("fault.straggler_ratio", fc.straggler_ratio, 1, low_open=True)
    positive("fault.straggler_checks", fc.straggler_checks)
    finite("fault.preflight_slow_ratio", fc.preflight_slow_ratio, 1, low_open=True)
    if cfg.preflight not in (True, False, "only"):
        raise UserError("preflight", cfg.preflight, "allowed: false, true (check, then train if every node "
                                                    "passed), only (check alone)")
    if cfg.preflight is True and (cfg.script or cfg.module):
        raise UserError("preflight", True, "runs before the built-in trainer; with script=/module= use "
                                           "preflight=only first, then submit the script")
    validate_fault_tolerance(cfg.fault_tolerance)
    _cross_group_timeout_below_the_watchdog(cfg.fault_tolerance, fc)


def _cross_group_timeout_below_the_watchdog(ft: FaultToleranceConfig, fc: FaultConfig) -> None:
    """A survivor waiting on a silent group must fail its step (and go on without it) before its own hang
    watchdog takes the wait for a hang and restarts it from the checkpoint (pitfall 20)."""
    if ft.mode == "none":
        return
    watchdog_s = fc.hang_timeout_s or HANG_TIMEOUT_FLOOR_S
    if fc.watchdog and ft.timeout_s > watchdog_s / 2:
        said = f"fault.hang_timeout_s={fc.hang_timeout_s:g}" if fc.hang_timeout_s else f"at least {watchdog_s:g} s"
        raise UserError("fault_tolerance.timeout_s", ft.timeout_s,
                        f"must be at most half the hang watchdog's timeout ({said}): a group waiting on a silent "
                        "peer must fail its step before its watchdog restarts it; lower it or raise fault.hang_timeout_s")


def _validate_data(cfg: JobConfig) -> None:
    f, m = cfg.fsdp, cfg.model
    c = cfg.checkpoint
    validate_interval(cfg)
    positive("checkpoint.keep_last", c.keep_last)
    d = cfg.data
    positive("data.seq_len", d.seq_len)
    if d.seq_len > m.max_seq_len:
        raise UserError("data.seq_len", d.seq_len, f"must be <= model.max_seq_len={m.max_seq_len}")
    if d._target_.endswith(".TokenFile") and not d.path:
        raise UserError("data.path", d.path, "data=token_file needs the token file: data.path=/path/tokens.bin")
    validate_byo(cfg)  # script=/module=/model=hf: before the import-path checks, which name transformers
    for key, target in (("model._target_", m._target_), ("data._target_", d._target_),
                        *(("fsdp.wrap.transformer_blocks", b) for b in f.wrap.transformer_blocks)):
        check_target(key, target)
        _importable(key, target)
    # as the ranks call them (fsdp_jobs/runtime/shard.py, data.py), read from their source, not imported
    targets.check_callable("model._target_", m._target_, targets.MODEL_SHAPE_KEYS, m.kwargs, "model.kwargs")
    targets.check_callable("data._target_", d._target_, targets.DATA_KEYS, d.kwargs, "data.kwargs")
    for block in f.wrap.transformer_blocks:
        targets.check_class("fsdp.wrap.transformer_blocks", block)


def validate_interval(cfg: JobConfig) -> None:
    """checkpoint.interval: a number of steps, or auto where the job's own saves and failures can choose it."""
    c = cfg.checkpoint
    if c.memory_interval != "auto" and (not isinstance(c.memory_interval, int) or isinstance(c.memory_interval, bool)
                                        or c.memory_interval < 0):
        raise UserError("checkpoint.memory_interval", c.memory_interval,
                        "allowed: a number of steps >= 0 (0 = no in-memory snapshots) or auto")
    sdc = cfg.fault.sdc_check_interval
    if sdc != "auto" and (not isinstance(sdc, int) or isinstance(sdc, bool) or sdc < 0):
        raise UserError("fault.sdc_check_interval", sdc, "allowed: a number of steps >= 0 (0 = no replica "
                        "agreement checks) or auto (as often as 1% of the step time allows, and before each checkpoint)")
    again = cfg.fault.sdc_recompute_interval
    if not isinstance(again, int) or isinstance(again, bool) or again < 0:
        raise UserError("fault.sdc_recompute_interval", again, "allowed: a number of steps >= 0 (0 = no step is "
                        "taken again to be compared)")
    spike = cfg.fault.sdc_spike_factor
    if isinstance(spike, bool) or not isinstance(spike, (int, float)) or not (spike == 0 or 1 < spike < float("inf")):
        raise UserError("fault.sdc_spike_factor", spike, "allowed: a number above 1 (a step above that many times the "
                        "median loss or gradient norm is a spike) or 0 (off)")
    if not isinstance(c.start_over_max_steps, int) or isinstance(c.start_over_max_steps, bool) or c.start_over_max_steps < 0:
        raise UserError("checkpoint.start_over_max_steps", c.start_over_max_steps,
                        "allowed: a number of steps >= 0 (0 = never start over when every checkpoint is unusable)")
    if c.mtbf_hours is not None:
        finite("checkpoint.mtbf_hours", c.mtbf_hours, 0, low_open=True)
    if c.interval != "auto":
        if not isinstance(c.interval, int) or isinstance(c.interval, bool) or c.interval < 0:
            raise UserError("checkpoint.interval", c.interval, "allowed: a number of steps >= 0 (0 = only at the "
                                                               "end) or auto (chosen from measured save and "
                                                               "failure costs)")
        return
    if cfg.script or cfg.module:
        raise UserError("checkpoint.interval", "auto", "is the built-in trainer's: your script decides when it "
                                                       "calls job.checkpoint.save; set a number of steps")
    if cfg.fault_tolerance.mode == "replica":
        raise UserError("checkpoint.interval", "auto", "cannot be computed with fault_tolerance=replica: a failed "
                                                       "group recovers from its peers, so a failure costs no "
                                                       "checkpointed work to weigh saves against; set a number "
                                                       "of steps")


def _validate_cluster(cfg: JobConfig) -> None:
    cl = cfg.cluster
    check_env_names("cluster.env", cl.env)
    check_env_names("cluster.secret_env", cl.secret_env)
    for key in ("gpu_memory_gb", "peak_tflops", "peak_tflops_fp32"):
        if cl[key] is not None:
            finite(f"cluster.{key}", cl[key], 0, low_open=True)
    choice("cluster.backend", cl.backend, backends.names())
    choice("cluster.device", cl.device, ("auto", "cpu", "cuda"))
    positive("cluster.stop_grace_s", cl.stop_grace_s)
    positive("cluster.max_restarts", cl.max_restarts, minimum=0)
    if cl.min_nodes is not None and not (1 <= cl.min_nodes <= cfg.nodes):
        raise UserError("cluster.min_nodes", cl.min_nodes, f"must be between 1 and nodes={cfg.nodes}")
    if cl.max_nodes is not None and (not isinstance(cl.max_nodes, int) or isinstance(cl.max_nodes, bool)
                                     or not cfg.nodes <= cl.max_nodes <= MAX_NODES):
        raise UserError("cluster.max_nodes", cl.max_nodes,
                        f"must be an integer from nodes={cfg.nodes} to {MAX_NODES}, or null (the job cannot grow)")
    check_spare_nodes(cfg)
    if not 0 < cl.memory_fraction <= 1:
        raise UserError("cluster.memory_fraction", cl.memory_fraction, "must be in (0, 1]")
    if cl.rdzv_port is not None and not 1 <= cl.rdzv_port <= 65535:
        raise UserError("cluster.rdzv_port", cl.rdzv_port, "must be a TCP port 1-65535 or null")
    module = backends.config_module(cl.backend)
    module.validate(cl)  # the chosen backend's own keys (launchers/<name>/config.py)
    if hasattr(module, "validate_job"):  # and what it refuses of the others (a mode it has no place for)
        module.validate_job(cfg)
    check_snapshot_memory(cfg, backends.node_memory(cfg))  # what its nodes' memory, as its keys say, holds


def check_spare_nodes(cfg: Any) -> None:
    """cluster.spare_nodes=K: K more agents than the rendezvous admits. A job that may grow (max_nodes > nodes)
    would take the spares as growth at once (they would join the wait list, not the redundancy list), and
    replica groups have one rendezvous per group: both refused in one line."""
    cl = cfg.cluster
    spares = cl.get("spare_nodes") or 0
    if spares == 0:
        return
    if not isinstance(spares, int) or isinstance(spares, bool) or not 0 <= spares <= MAX_NODES - cfg.nodes:
        raise UserError("cluster.spare_nodes", spares, f"must be an integer from 0 to {MAX_NODES - cfg.nodes}")
    if cl.backend not in backends.spare_backends():
        raise UserError("cluster.spare_nodes", spares, f"cluster={cl.backend} does not start spare nodes yet; "
                        f"allowed with cluster={'|'.join(backends.spare_backends())}, or 0")
    if (cl.get("max_nodes") or cfg.nodes) != cfg.nodes:
        raise UserError("cluster.spare_nodes", spares, f"spares need cluster.max_nodes unset or = nodes={cfg.nodes} "
                        "(agents beyond max_nodes wait as spares; below it they would grow the job)")
    if cfg.fault_tolerance.mode == "replica":
        raise UserError("cluster.spare_nodes", spares, "not with fault_tolerance=replica (one rendezvous per group)")
    if cfg.script or cfg.module:
        # a spare that was never needed ends with the job when the built-in trainer's state record says it
        # completed (launchers/node/agent.py, pitfall 16); a script of one's own writes no such record, so
        # the spare's torchrun would exit 1 and fail a job that completed
        raise UserError("cluster.spare_nodes", spares, "only with the built-in trainer, not with script=/module= "
                        "(a spare learns that the job completed from the trainer's state record); use 0")
