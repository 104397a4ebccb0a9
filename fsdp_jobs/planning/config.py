"""The job's config schema: structured dataclasses Hydra validates `conf/` and overrides against.

Every knob a user can set lives here with a comment, and in `conf/`; a backend's own `cluster.*` keys
live in its package (launchers/<name>/config.py), as subclasses of ClusterConfig. Nothing here imports torch,
nor anything of the project: the checks of the keys (validation.py) and the modules they use name these types
without an import cycle. Checks that need more than one key (does the shard group divide the world?) live in
`plan.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard")
DTYPES = ("float32", "bfloat16", "float16")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST")
LR_SCHEDULES = ("cosine", "linear", "constant")
ON_NONFINITE = ("stop", "rollback")
FLOAT8_RECIPES = ("tensorwise", "rowwise")  # torchao's recipe names (fsdp_jobs/runtime/float8.py)
WANDB_MODES = ("online", "offline")
WANDB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


class Keys:
    """Item access as well as attributes: `fsdp_jobs.job` scripts read `job.config["train"]["steps"]` (the
    config was a mapping before it was typed, and a user's script must keep working), and the planning code
    reads both the composed DictConfig and these dataclasses alike."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: str) -> bool:
        return hasattr(self, key)


@dataclass
class ModelConfig(Keys):
    name: str = "tiny"
    # any importable nn.Module class; it is called with the shape keys below that its
    # signature accepts, plus `kwargs`, under the meta device
    _target_: str = "fsdp_jobs.models.llama.Transformer"
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # grouped-query attention; None = n_heads
    ffn_dim: int = 384
    vocab_size: int = 512
    max_seq_len: int = 2048  # RoPE table length; must be >= data.seq_len
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    dtype: str = "float32"  # storage dtype of the sharded parameters (FSDP2 keeps them in this)
    kwargs: Dict[str, Any] = field(default_factory=dict)  # extra arguments for a custom _target_
    # model=hf: a local directory of safetensors weights loaded into the sharded model on a fresh start
    pretrained: Optional[str] = None


@dataclass
class MixedPrecisionConfig(Keys):
    # auto = bfloat16 compute with float32 gradient reduction on GPU, full precision on CPU
    param_dtype: Optional[str] = "auto"  # dtype of the all-gathered params used for compute
    reduce_dtype: Optional[str] = "auto"  # dtype of the gradient reduce-scatter / all-reduce
    output_dtype: Optional[str] = None  # cast the root module's outputs to this
    buffer_dtype: Optional[str] = None  # FSDP1 name; FSDP2 has no buffer policy, buffers are cast once


@dataclass
class WrapConfig(Keys):
    # which submodules become their own FSDP unit: classes by import path ...
    transformer_blocks: List[str] = field(default_factory=list)
    # ... or every module holding at least this many not-yet-wrapped parameters.
    # Both empty = the model class's own `fsdp_wrap_classes`, else the root alone.
    min_params: Optional[int] = None


@dataclass
class FSDPConfig(Keys):
    strategy: str = "hybrid_shard"  # one of STRATEGIES (the names FSDP1/Accelerate users know)
    # hybrid strategies only: ranks per shard group. None = one node (gpus_per_node);
    # "auto" = the smallest group whose model state fits cluster.gpu_memory_gb * memory_fraction
    shard_group_size: Any = None
    reshard_after_forward: Optional[bool] = None  # None = the strategy's default
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    cpu_offload: bool = False  # keep sharded params/grads/optimizer state in host memory
    activation_checkpointing: bool = False  # recompute each wrapped block in the backward
    wrap: WrapConfig = field(default_factory=WrapConfig)
    forward_prefetch: bool = False  # FSDP1 name; FSDP2: explicitly prefetch the next block
    backward_prefetch: Optional[str] = "BACKWARD_PRE"  # FSDP1 name; FSDP2 always prefetches pre-backward
    # FSDP1 options with no FSDP2 meaning: accepted, noted, ignored
    limit_all_gathers: Optional[bool] = None
    sync_module_states: Optional[bool] = None
    use_orig_params: Optional[bool] = None


@dataclass
class WandbConfig(Keys):
    """Weights & Biases (`pip install 'fsdp-jobs[wandb]'`): one W&B run per job, resumed by every restart,
    requeue and resize on the same step axis (fsdp_jobs/runtime/trackers.py)."""

    enabled: bool = False
    project: str = "fsdp-jobs"
    entity: Optional[str] = None  # None = your W&B default entity
    mode: Optional[str] = None  # online / offline; None = $WANDB_MODE where the ranks run, else online


@dataclass
class TrainConfig(Keys):
    steps: int = 300  # optimizer steps in total (a resumed run continues up to this)
    seed: int = 0  # init, data order and dropout all derive from it
    batch_per_rank: int = 4  # sequences per rank per step when global_batch_size is null
    # sequences per step over all ranks; set it to keep the optimisation the same when the node
    # count changes (it must then be a multiple of the world size)
    global_batch_size: Optional[int] = None
    # sequences per rank per forward/backward when global_batch_size is set: each step accumulates
    # global_batch_size / (world x micro_batch_per_rank) micro batches, so the global batch (and the
    # optimisation) stays the same when an elastic job shrinks. None = no accumulation
    micro_batch_per_rank: Optional[int] = None
    compile: bool = False  # torch.compile each wrapped block (before sharding, as torchtitan does)
    # the linear layers' matmuls in float8 (torchao; GPUs of compute capability >= 8.9: fsdp_jobs/runtime/float8.py)
    float8: bool = False
    float8_recipe: str = "tensorwise"  # one of FLOAT8_RECIPES: tensorwise (fastest) or rowwise (more accurate)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    lr_schedule: str = "cosine"  # one of LR_SCHEDULES
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    # a step whose loss or gradient norm is NaN or infinite: "stop" (the job fails, its checkpoints all of
    # finite weights) or "rollback" (reload the newest checkpoint and skip the batches since; a third
    # rollback in one attempt stops). Never a checkpoint of the weights such a step produced.
    on_nonfinite: str = "stop"
    log_interval: int = 25  # progress line every N steps (the metrics record gets every step)
    # a collective that waits longer fails the rank (NCCL's default is 10 min, gloo's 30); the hang
    # watchdog (fault.*) fires well before it
    collective_timeout_s: float = 600
    # scalars in the run dir's TensorBoard folder (`pip install 'fsdp-jobs[tensorboard]'`); None = where it is installed
    tensorboard: Optional[bool] = None
    wandb: WandbConfig = field(default_factory=WandbConfig)


# the derived hang timeout's floor (launchers/node/watchdog.py hang_timeout): no rank advanced for this long
HANG_TIMEOUT_FLOOR_S = 60.0


@dataclass
class FaultConfig(Keys):
    """A rank that stops making progress without dying (a deadlock, a stopped process, a GPU or NIC that no
    longer answers): each node's watchdog (launchers/node/watchdog.py) sees its ranks' heartbeats stop, dumps
    every local rank's stack into the run's logs (a hang's folder), names the rank that stopped first, and restarts the
    workers, which resume from the newest checkpoint."""

    watchdog: bool = True
    # no rank advanced for this long = a hang. None = derived: max(60 s, 10 x the slowest recent step). A rank
    # stopped by a signal is one after 2 s; a pause of the whole node is none (ARCHITECTURE pitfall 32)
    hang_timeout_s: Optional[float] = None
    # ... before the first steps, and while a checkpoint is saved or loaded (these may take long)
    startup_timeout_s: float = 300
    # at most this many restarts after hangs; each also uses one of torchrun's (cluster.max_restarts)
    max_hang_restarts: int = 3
    # a node whose compute per step (step time minus waiting in collectives) is this many times the median
    # node's is a straggler: `status` and `compare` name it, and its watchdog warns in the log ...
    straggler_ratio: float = 1.5
    # ... once it has stayed one for this many checks in a row, 10 s apart (fsdp_jobs/rundir/stragglers.py)
    straggler_checks: int = 3
    # preflight=true|only (README: Preflight): a node this many times worse than the median node on any
    # measure (matmul TFLOPS, write MB/s, free memory) is named and the job stops before training
    preflight_slow_ratio: float = 2.0
    # silent data corruption (fsdp_jobs/runtime/sdc.py): under HSDP with 2+ replica groups every replica of each
    # shard is compared (a fingerprint of its parameter and optimizer shards), and before each checkpoint;
    # auto = every m steps, m a multiple of checkpoint.memory_interval whose measured cost is at most 1% of the
    # step time (every snapshot where that interval is a number); N = every N steps; 0 = off. A checked step keeps
    # an in-memory snapshot: a mismatch rolls the job back to it
    sdc_check_interval: Union[int, str] = "auto"
    # ... and where no replicas are compared (full_shard on one group; the check above off), every N steps the
    # step is taken again from a copy of the state made before it, and each rank compares its own two results
    # (fsdp_jobs/runtime/recheck.py): it catches a corruption that lands in a checked step (about 1 in N of them)
    # at the cost of about one step in N; 0 = off
    sdc_recompute_interval: int = 0
    # a step whose loss or gradient norm (with train.grad_clip) is above this many times the median of the last 32
    # logged steps' is a spike (fsdp_jobs/runtime/sentinel.py): within two steps the replicas are compared, or
    # where none are compared 2 steps are each taken twice (on a GPU only where sdc_recompute_interval > 0;
    # fault_tolerance=replica: only said); at most once in 32 steps; 0 = off
    sdc_spike_factor: float = 10.0


@dataclass
class FaultToleranceConfig(Keys):
    """fault_tolerance=replica (README: Lose a node, keep training; fsdp_jobs/runtime/replicas.py): each
    HSDP replica group (a shard group of whole nodes) is a torchft replica with its own torchrun; a torchft
    lighthouse, started by the backend, forms a quorum of the live groups at every step. A failed group is
    dropped from the quorum and the others keep stepping; it restarts on its own and recovers the model
    and optimizer live from a healthy peer. Needs `pip install 'fsdp-jobs[ft]'` (torchft)."""

    mode: str = "none"  # none | replica
    # a step commits only with at least this many replica groups in it (torchft min_replica_size, the
    # lighthouse's --min_replicas); fewer leave the survivors waiting for one to come back
    min_replicas: int = 1
    # a group that stops answering the lighthouse this long is dropped from the quorum: the pause every
    # other group takes when one dies (torchft's heartbeat timeout; its default is 5 s)
    heartbeat_timeout_s: float = 5.0
    # at the job's start, how long a group waits for the others before it trains with fewer (a group that
    # comes later recovers live from the others, as after a failure)
    join_timeout_s: float = 60.0
    # a cross-group all-reduce, a quorum or a live recovery that takes longer fails the step (the group
    # retries it with the replicas then alive). At most half the hang watchdog's timeout: a group gone
    # without a connection reset (a dead host, a cut link) leaves the others in gloo until this expires,
    # and a survivor's watchdog that fired first restarted it cold (ARCHITECTURE.md, pitfall 20)
    timeout_s: float = 30.0
    quorum_tick_ms: int = 100  # how often the lighthouse looks for a quorum while a group is missing
    lighthouse_port: Optional[int] = None  # None = 29510, or a free one where the job shares this machine's ports


@dataclass
class CheckpointConfig(Keys):
    # steps between checkpoints; 0 = only at the end (and on preemption); auto = the interval that loses the
    # least to saves and failures, from this job's measured save time, step time and failures (Young/Daly:
    # fsdp_jobs/runtime/interval.py), chosen again at every attempt and after every save
    interval: Union[int, str] = 50
    # checkpoint.interval=auto before the job has seen a failure: its mean time between failures in hours;
    # null = 6,000 h per node / nodes (Llama 3's measured rate: fsdp_jobs/runtime/interval.py NODE_MTBF_H)
    mtbf_hours: Optional[float] = None
    keep_last: int = 2  # committed checkpoints kept; older ones are deleted
    async_save: bool = False  # overlap the disk write with training (DCP thread mode)
    resume: bool = True  # start from the newest complete checkpoint of the run, if any
    save_final: bool = True  # checkpoint after the last step
    # steps between in-memory snapshots of every rank's state (node-local memory, fsdp_jobs/runtime/snapshots.py):
    # a failure resumes from the newest one instead of the last checkpoint; auto = every step if a snapshot
    # costs at most 2% of a step, else the smallest interval that does; 0 = off
    memory_interval: Union[int, str] = "auto"
    # every checkpoint of the run failed its checks: start over from step 0 if that redoes at most this many
    # steps (the newest unusable checkpoint's step), else stop and say so; 0 = always stop
    start_over_max_steps: int = 1000


@dataclass
class DataConfig(Keys):
    name: str = "synthetic"
    # a dataset class: called with seed, seq_len, vocab_size (if it takes them) and kwargs;
    # item i must depend only on (seed, i) so the order survives resumes and resizes
    _target_: str = "fsdp_jobs.runtime.data.SyntheticTokens"
    seq_len: int = 64
    path: Optional[str] = None  # token file for fsdp_jobs.runtime.data.TokenFile
    token_dtype: str = "uint16"  # element type of the token file
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # a resume continues at its checkpoint's data position: true lets it go on in a data.path that changed
    # since the run was submitted (another file, or the same one rewritten), which is refused otherwise
    allow_changed: bool = False


@dataclass
class JobConfig(Keys):
    name: Optional[str] = None  # run name; the same name resumes the same run. None = generated
    nodes: int = 2
    gpus_per_node: int = 2  # ranks per node (on CPU: processes per simulated node)
    dry_run: bool = False  # print the plan and the launch commands, run nothing
    # check every node before training (fsdp_jobs/runtime/preflight.py): false; true = the checks, then
    # training only if every node passed; only = the checks alone (also before a script=/module= job)
    preflight: Any = False
    run_root: str = "runs"  # run directories go under here
    sweep: Optional[str] = None  # set by -m: the sweep this run is a member of (its dir under run_root)
    model: ModelConfig = field(default_factory=ModelConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    cluster: Any = None  # a backend's ClusterConfig subclass (launchers/<name>/config.py), chosen by cluster=
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # your own training instead of the built-in trainer (fsdp_jobs/planning/byo.py): a torchrun-ready script, whose
    # directory is copied into the run dir at submission, or a module run as `python -m`
    script: Optional[str] = None
    module: Optional[str] = None
    script_args: List[str] = field(default_factory=list)  # its command-line arguments


def job_config(job: Dict[str, Any]) -> JobConfig:
    """The job record (fsdp_jobs.rundir.runs.load_job) through the typed schema: each key checked against its type,
    and a key an older job record lacks takes the schema's default. `cluster` stays an open node: its schema
    is the backend's, registered by name (fsdp_jobs/planning/backends.py), and JobConfig types it Any.

    An OmegaConf DictConfig: an attribute read costs microseconds, so code on the step's path converts it
    once (OmegaConf.to_object: the plain dataclasses, as the ranks' Trainer does)."""
    from omegaconf import OmegaConf

    return OmegaConf.merge(OmegaConf.structured(JobConfig), job or {})  # type: ignore[return-value]


def rank_config(job: Dict[str, Any]) -> JobConfig:
    """job_config converted once to the plain dataclasses: what the ranks read, some keys on every step, where
    a DictConfig's attribute read costs microseconds and a dataclass's nanoseconds. `cluster` (the backend's
    schema, read at bring-up only) stays an open DictConfig: attribute reads, as the planning code makes them."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(job_config(job))
    cfg.cluster = OmegaConf.create(cfg.cluster or {})  # type: ignore[union-attr]
    return cfg  # type: ignore[return-value]
