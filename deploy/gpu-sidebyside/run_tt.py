"""torchtitan (0.2.2, from PyPI) on one process, offline: its llama3 model at the shape of fsdp-jobs'
llama3_1b, a synthetic random-token dataloader (no tokenizer, no HF dataset), FSDP2 at world size 1.

    python deploy/gpu-sidebyside/run_tt.py [torchtitan CLI args...]      # e.g. --training.steps 60 --compile.enable

Registers a TrainSpec "llama3_fsdpjobs" (llama3's, with model flavors "1B" and "tiny", the synthetic
dataloader, no tokenizer, no state-dict adapter) and runs torchtitan.train.main with it; pass
--model.name llama3_fsdpjobs --model.flavor 1B. Env switches (read here, not by torchtitan):

    TT_TIE=1          tie output.weight to tok_embeddings.weight (the project's llama3_1b does); FSDP units
                      are then each block + the root (which holds the embedding, final norm and output), as
                      the project shards; TT_TIE=0: torchtitan's stock llama3 (untied) and its stock units
    TT_FORCE_FSDP=1   at world size 1 torchtitan applies no FSDP (it trains fp32 params under bf16 autocast);
                      with 1 the same FSDP2 wrapping as at world > 1: bf16 params, fp32 reduce
                      (training.mixed_precision_param/_reduce), fully_shard on a 1-rank mesh, as the project does
    TT_CPU=1          a CPU smoke test (gloo, no memory stats), for a machine with no GPU
    TT_SKIP_WINDOWS=N log windows left out of the summary (default 2: the step-1 window and steps 2..log_freq)

Prints one line `TT_RESULT {json}` at the end: tokens/s and MFU over the measured windows (total tokens /
total time), per-window figures, peak memory (torch.cuda.max_memory_allocated, the project's measure, and
torchtitan's max_reserved), parameter count and FLOPs per token. MFU uses the project's FLOPs per token
(6 N + 12 L d T, N counting a tied weight once; untied: N less the embedding table, which equals
torchtitan's own count) against torchtitan's peak (989e12 on an H100 SXM, the project's default too):
torchtitan's own count leaves out the embedding's parameters, which for a tied model would leave out the
output layer's matmul as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import time
import types

TIE = os.environ.get("TT_TIE", "1") == "1"
FORCE_FSDP = os.environ.get("TT_FORCE_FSDP", "1") == "1"
CPU = os.environ.get("TT_CPU", "0") == "1"
SKIP_WINDOWS = int(os.environ.get("TT_SKIP_WINDOWS", "2"))


def _single_process_env() -> None:
    """What torchrun would set for one rank."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                 ("GROUP_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)


def _stub_datasets() -> None:
    """torchtitan's text dataloader module imports HF `datasets` at import time; the synthetic loader needs
    none of it. Where it does not import (absent, or an incompatible pyarrow), a stub stands in."""
    try:
        import datasets  # noqa: F401
        import datasets.distributed  # noqa: F401
        return
    except Exception as e:  # noqa: BLE001
        print(f"run_tt: HF datasets not importable ({type(e).__name__}: {e}); using a stub", flush=True)
    for name in [m for m in sys.modules if m == "datasets" or m.startswith("datasets.")]:
        del sys.modules[name]

    def _unavailable(*args, **kwargs):
        raise RuntimeError("HF datasets is stubbed out in run_tt.py: use the synthetic dataloader")

    stub, dist_stub = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
    stub.Dataset = type("Dataset", (), {})
    stub.IterableDataset = type("IterableDataset", (), {})
    stub.load_dataset = _unavailable
    dist_stub.split_dataset_by_node = _unavailable
    stub.distributed = dist_stub
    sys.modules["datasets"], sys.modules["datasets.distributed"] = stub, dist_stub


def _cpu_only() -> None:
    """TT_CPU=1: torchtitan picks its device type at import (tools/utils.py); make that 'cpu'."""
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    if not hasattr(torch.cpu, "set_device"):
        torch.cpu.set_device = lambda *a, **k: None


def model_flavors() -> dict:
    """fsdp-jobs conf/model/llama3_1b.yaml: dim 2048, 16 layers, 32 heads, 8 kv heads, ffn 8192, vocab 128256,
    rope_theta 5e5, norm_eps 1e-5, tied embeddings. torchtitan derives the FFN width: 4*dim*2/3 = 5461,
    x1.5 = 8191, rounded up to a multiple of 256 = 8192."""
    from torchtitan.models.llama3.model.args import TransformerModelArgs

    return {
        "1B": TransformerModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                                   ffn_dim_multiplier=1.5, multiple_of=256, rope_theta=500000, norm_eps=1e-5),
        # for a CPU smoke test: 4*256*2/3 = 682 -> 768
        "tiny": TransformerModelArgs(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=2048,
                                     multiple_of=256, rope_theta=500000, norm_eps=1e-5),
    }


def tie_embeddings() -> None:
    """torchtitan's llama3 Transformer with output.weight = tok_embeddings.weight (built on meta, then
    sharded and materialised: FSDP2 keeps the one shared parameter shared)."""
    from torchtitan.models.llama3.model.model import Transformer

    if getattr(Transformer, "_fsdpjobs_tied", False):
        return
    orig_init, orig_init_weights = Transformer.__init__, Transformer.init_weights

    def tied_init(self, model_args):
        orig_init(self, model_args)
        self.output.weight = self.tok_embeddings.weight

    def tied_init_weights(self, buffer_device=None):
        # torchtitan inits the output after the embedding (a smaller std): with one shared weight the
        # last init wins; the tie is asserted, not re-made
        orig_init_weights(self, buffer_device=buffer_device)
        assert self.output.weight is self.tok_embeddings.weight, "tie lost"

    Transformer.__init__, Transformer.init_weights = tied_init, tied_init_weights
    Transformer._fsdpjobs_tied = True


def main() -> None:
    # a timeout's SIGTERM: unwind (so the finally below still prints what was measured), not die at once
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    _single_process_env()
    _stub_datasets()
    if CPU:
        _cpu_only()

    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import torchtitan
    import torchtitan.components.metrics as tt_metrics
    import torchtitan.distributed.utils as tt_dist_utils
    import torchtitan.train as tt_train
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.models import llama3 as tt_llama3
    from torchtitan.models.llama3.infra import parallelize as tt_par
    from torchtitan.protocols import train_spec as tt_spec

    flavors = model_flavors()
    if TIE:
        tie_embeddings()

    # ------------------------------------------------------------------ FSDP2 at world size 1
    def parallelize(model, parallel_dims, job_config):
        # stock: AC -> per-block torch.compile -> FSDP (the last only where the fsdp mesh has > 1 rank)
        model = tt_par.parallelize_llama(model, parallel_dims, job_config)
        if FORCE_FSDP and not parallel_dims.fsdp_enabled:
            mesh = getattr(parallel_dims, "_meshes", {}).get("fsdp")
            if mesh is None:
                from torch.distributed.device_mesh import init_device_mesh

                mesh = init_device_mesh(tt_dist_utils.device_type, (1,), mesh_dim_names=("fsdp",))
            param_dtype = TORCH_DTYPE_MAP[job_config.training.mixed_precision_param]
            reduce_dtype = TORCH_DTYPE_MAP[job_config.training.mixed_precision_reduce]
            if TIE:
                # the shared weight must live in one FSDP unit: blocks, then the root (embedding, norm,
                # output), the project's own wrapping (fsdp_jobs: fsdp_wrap_classes = TransformerBlock)
                mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
                for block in model.layers.values():
                    fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
                fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)  # the project's root
                tt_par.disable_fsdp_gradient_division(model)
            else:
                tt_par.apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                                  pp_enabled=False, cpu_offload=False,
                                  reshard_after_forward_policy=job_config.parallelism.fsdp_reshard_after_forward)
            print(f"run_tt: FSDP2 applied at world size 1 (param {param_dtype}, reduce {reduce_dtype}, "
                  f"{'tied: blocks + root' if TIE else 'stock units'})", flush=True)
        return model

    if FORCE_FSDP:
        def maybe_enable_amp(parallel_dims, mixed_precision_param, device_type):
            return contextlib.nullcontext()  # fully_shard's MixedPrecisionPolicy casts; no autocast on top

        tt_dist_utils.maybe_enable_amp = maybe_enable_amp

    # ------------------------------------------------------------------ synthetic data
    class SyntheticTokens(BaseDataLoader):
        """Uniform random token ids, a pool of 8 batches cycled: ({"input": x}, labels), on CPU (the trainer
        moves them), as torchtitan's own loader yields them."""

        def __init__(self, batch: int, seq_len: int, vocab: int, seed: int = 0) -> None:
            g = torch.Generator().manual_seed(seed)
            rows = torch.randint(0, vocab, (8, batch, seq_len + 1), generator=g)
            self.pool = [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows]
            self.i = 0

        def __iter__(self):
            while True:
                x, y = self.pool[self.i % len(self.pool)]
                self.i += 1
                yield {"input": x}, y

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, state_dict):
            self.i = state_dict["i"]

    def build_dataloader(dp_world_size, dp_rank, tokenizer, job_config, **kwargs):
        args = flavors[job_config.model.flavor]
        return SyntheticTokens(job_config.training.local_batch_size, job_config.training.seq_len,
                               args.vocab_size, seed=dp_rank)

    base = tt_llama3.get_train_spec()
    tt_spec.register_train_spec("llama3_fsdpjobs", dataclasses.replace(
        base, model_args=flavors, parallelize_fn=parallelize, pipelining_fn=None,
        build_dataloader_fn=build_dataloader, build_tokenizer_fn=None, build_validator_fn=None,
        state_dict_adapter=None))

    # ------------------------------------------------------------------ measurements
    peak = {"alloc": 0, "reserved": 0}
    windows: list[dict] = []
    info: dict = {}

    def _mem() -> tuple[int, int]:
        if CPU or not torch.cuda.is_available():
            return 0, 0
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()

    if CPU:
        class NoDeviceMemory:
            device_name, device_capacity_gib = "cpu", 0.0

            def get_peak_stats(self):
                return tt_metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

            def reset_peak_stats(self):
                pass

        tt_metrics.build_device_memory_monitor = lambda: NoDeviceMemory()
        # its barrier(device_ids=[current_device()]) takes no 'cpu'; at world size 1 there is nothing to wait for
        tt_dist_utils.set_pg_timeouts = lambda *a, **k: None
    else:
        orig_reset = tt_metrics.DeviceMemoryMonitor.reset_peak_stats

        def reset_peak_stats(self):
            # torchtitan resets the peaks at every log: keep the run's maximum first
            a, r = _mem()
            peak["alloc"], peak["reserved"] = max(peak["alloc"], a), max(peak["reserved"], r)
            orig_reset(self)

        tt_metrics.DeviceMemoryMonitor.reset_peak_stats = reset_peak_stats

    orig_log = tt_metrics.MetricsProcessor.log

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        # the same window torchtitan times (tokens since the last log / time since the last log)
        dt = time.perf_counter() - self.time_last_log
        ntok = self.ntokens_since_last_log
        a, r = _mem()
        windows.append({"step": step, "tokens": ntok, "seconds": dt, "loss": global_avg_loss,
                        "tps": ntok / dt, "mfu": 100 * self.num_flops_per_token * (ntok / dt) / self.gpu_peak_flops,
                        "max_alloc_gib": a / 2**30, "max_reserved_gib": r / 2**30})
        return orig_log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)

    tt_metrics.MetricsProcessor.log = log

    class Trainer(tt_train.Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            model = self.model_parts[0]
            a = self.model_args
            n_params = sum(p.numel() for p in model.parameters())  # a tied weight once
            # the matmul weights: all but an untied embedding table (a tied one is the output layer's weight)
            n_matmul = n_params - (0 if TIE else model.tok_embeddings.weight.numel())
            seq = job_config.training.seq_len
            fpt = 6 * n_matmul + 12 * a.n_layers * a.dim * seq  # fsdp_jobs.runtime.metrics.flops_per_token
            info.update({
                "torchtitan": getattr(torchtitan, "__version__", "?"), "torch": torch.__version__,
                "device": (torch.cuda.get_device_name(0) if not CPU and torch.cuda.is_available() else "cpu"),
                "flavor": job_config.model.flavor, "tied": TIE,
                "tied_ok": (model.output.weight is model.tok_embeddings.weight) if TIE else None,
                "fsdp_forced_world1": FORCE_FSDP, "compile": bool(job_config.compile.enable),
                "ac": job_config.activation_checkpoint.mode, "optimizer": job_config.optimizer.name,
                "optimizer_impl": job_config.optimizer.implementation,
                "param_dtype": job_config.training.mixed_precision_param,
                "reduce_dtype": job_config.training.mixed_precision_reduce,
                "local_batch": job_config.training.local_batch_size, "seq_len": seq,
                "n_params": n_params, "n_matmul_params": n_matmul, "flops_per_token": fpt,
                "torchtitan_flops_per_token": self.metrics_processor.num_flops_per_token,
                "peak_flops": self.metrics_processor.gpu_peak_flops,
                "param_types": sorted({type(p).__name__ for p in model.parameters()}),
            })
            self.metrics_processor.num_flops_per_token = fpt
            print("run_tt: " + json.dumps(info), flush=True)

    # ------------------------------------------------------------------ run
    ok = True
    try:
        tt_train.main(Trainer)
    except BaseException as e:  # noqa: BLE001  (report, then re-raise)
        ok = False
        print(f"run_tt: torchtitan failed: {type(e).__name__}: {e}", flush=True)
        raise
    finally:
        a, r = _mem()
        peak["alloc"], peak["reserved"] = max(peak["alloc"], a), max(peak["reserved"], r)
        measured = windows[SKIP_WINDOWS:]
        tokens, secs = sum(w["tokens"] for w in measured), sum(w["seconds"] for w in measured)
        tps = tokens / secs if secs > 0 else None
        res = {**info, "ok": ok, "windows_measured": len(measured),
               "steps_measured": (measured[-1]["step"] - (windows[SKIP_WINDOWS - 1]["step"] if SKIP_WINDOWS else 0)
                                  if measured else 0),
               "tokens_per_s": round(tps, 1) if tps else None,
               "mfu_pct": (round(100 * info["flops_per_token"] * tps / info["peak_flops"], 2)
                           if tps and info.get("peak_flops") else None),
               "peak_alloc_gib": round(peak["alloc"] / 2**30, 2),
               "peak_reserved_gib": round(peak["reserved"] / 2**30, 2),
               "windows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in w.items()}
                           for w in windows]}
        print("TT_RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
