"""Both models on the meta device: fsdp-jobs' llama3_1b (fsdp_jobs.models.llama.Transformer, as `bench step`
builds it) and torchtitan's llama3 at the flavor run_tt.py registers ("1B"), tied and untied. Prints the
parameter counts, each side's per-block tensor shapes and FLOPs per token; exits 1 if the tied torchtitan model
and the project's differ in parameter count or in any weight's shape. No GPU; run from the repo root with the
wheels and the source tree on PYTHONPATH."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import run_tt  # noqa: E402


def shapes(model: torch.nn.Module, rename: dict[str, str]) -> dict[str, tuple]:
    out = {}
    for name, p in model.named_parameters():  # a tied weight once
        for a, b in rename.items():
            name = name.replace(a, b)
        out[name] = tuple(p.shape)
    return out


def main() -> int:
    run_tt._stub_datasets()
    from fsdp_jobs.bench.common import model_config
    from fsdp_jobs.models.llama import Transformer as ProjectTransformer
    from fsdp_jobs.runtime.metrics import flops_per_token
    from torchtitan.models.llama3.model.model import Transformer as TTTransformer

    cfg = {k: v for k, v in model_config("llama3_1b").items() if k != "_target_"}
    with torch.device("meta"):
        proj = ProjectTransformer(**cfg)
    args = run_tt.model_flavors()["1B"]
    args.max_seq_len = 2048  # what update_from_config sets from training.seq_len
    with torch.device("meta"):
        untied = TTTransformer(args)
    run_tt.tie_embeddings()
    with torch.device("meta"):
        tied = TTTransformer(args)

    n = {k: sum(p.numel() for p in m.parameters()) for k, m in
         (("project_llama3_1b", proj), ("torchtitan_1B_tied", tied), ("torchtitan_1B_untied", untied))}
    s_proj = shapes(proj, {})
    s_tt = shapes(tied, {})
    diff = sorted(set(s_proj.items()) ^ set(s_tt.items()))
    seq = 2048
    res = {"torch": torch.__version__, "project_config": cfg, "params": n,
           "tied_weight_shared": tied.output.weight is tied.tok_embeddings.weight,
           "ffn_hidden": tuple(tied.layers["0"].feed_forward.w1.weight.shape),
           "flops_per_token_project_formula": flops_per_token(n["project_llama3_1b"], cfg["n_layers"], cfg["dim"], seq),
           "shape_differences_project_vs_tt_tied": diff[:20],
           "block0_project": {k: v for k, v in s_proj.items() if k.startswith("layers.0.")},
           "block0_torchtitan": {k: v for k, v in s_tt.items() if k.startswith("layers.0.")}}
    print("SHAPES " + json.dumps(res, default=str))
    return 0 if not diff and n["project_llama3_1b"] == n["torchtitan_1B_tied"] else 1


if __name__ == "__main__":
    sys.exit(main())
