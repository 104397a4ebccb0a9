#!/usr/bin/env bash
# Side by side on one GPU: fsdp-jobs' own trainer (`bench step`, llama3_1b) and torchtitan 0.2.2 (PyPI) training
# its llama3 at the same shape (tied embeddings, 1,235,814,400 params), seq 2048, local batch 4, FSDP2 with bf16
# params and fp32 reduce, no activation checkpointing, AdamW, synthetic tokens, no checkpoints.
#
#   bash deploy/gpu-sidebyside/device_sidebyside.sh          # from the repo root on the device machine; carry [".whl"]
#
# Variants, in this order; each under `timeout`, the whole script inside SBS_DEADLINE_S (default 380 s); the
# optional ones (SBS_EXTRAS=1, the default) start only if the time left allows them:
#   a_bench       python -m fsdp_jobs.bench step --device cuda --model llama3_1b --seq-len 2048 --batch 4
#                 --repeats 1 --steps $SBS_STEPS   (the job through its CLI, then the hand-written FSDP2 loop)
#   tt_nocompile  torchtitan, tied, eager, AdamW fused (torchtitan's default implementation)
#   tt_compile    the same with --compile.enable (per-block torch.compile + compiled loss, torchtitan's default)
#   proj_compile  [extra] the fsdp-jobs job with train.compile=true (its own per-block torch.compile)
#   tt_foreach    [extra] torchtitan eager with --optimizer.implementation foreach (the project's AdamW setting)
#   tt_untied     [extra] torchtitan eager, stock untied llama3 (1.50 B params) with its stock FSDP units
#   proj_f8       [SBS_FLOAT8=1, the default] the job compiled with train.float8=true (tensorwise, float8 all-gather)
#   tt_f8         torchtitan compiled with its float8 converter, tensorwise, float8 all-gather, scales precomputed
#   proj_f8_rowwise, tt_f8_rowwise: the same with the rowwise recipe (no float8 all-gather: torchao has none for it)
# tt_f8 precomputes its scales after each step (torchtitan's fastest tensorwise setting); the job does not yet
# (each weight's scale is taken at its all-gather): the comparison is against torchtitan's best.
# All of them: about SBS_DEADLINE_S=560 on an H100 (an estimate, not yet run); SBS_EXTRAS=0 skips the other extras.
# Logs go to $OUT (at most 11 files), then a compact summary (also $OUT/summary.txt).
set -u
T0=$SECONDS
OUT=${OUT:-/tmp/sbs_out}
mkdir -p "$OUT"
DEADLINE=${SBS_DEADLINE_S:-380}
EXTRAS=${SBS_EXTRAS:-1}
F8=${SBS_FLOAT8:-1}   # the float8 variants (the wheels need torchao; a GPU of compute capability >= 8.9)
STEPS=${SBS_STEPS:-60}
TT_FLAVOR=${SBS_TT_FLAVOR:-1B}    # tiny, SBS_SEQ=128 and TT_CPU=1: a CPU rehearsal of the torchtitan runs
SEQ=${SBS_SEQ:-2048}
BATCH=${SBS_BATCH:-4}
LOG_FREQ=${SBS_LOG_FREQ:-10}
SUM=$OUT/summary.txt
: > "$SUM"
export PYTHONUNBUFFERED=1

say() { echo "$*" | tee -a "$SUM"; }
left() { echo $(( DEADLINE - (SECONDS - T0) )); }

# every process this script starts inherits SBS_MARK: the cleanup ends only those
export SBS_MARK="sbs-$$-$RANDOM"
gpu_cleanup() {  # a process of this script's that still holds the GPU (a rank in its own session, say)
  command -v nvidia-smi >/dev/null || return 0
  local pid pids=""
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -dc '0-9\n' | sort -u); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "SBS_MARK=$SBS_MARK" && pids="$pids $pid"
  done
  [ -z "$pids" ] && return 0
  say "  cleanup: the GPU is still held by this script's pid(s)$pids: TERM, then KILL"
  kill -TERM $pids 2>/dev/null; sleep 5; kill -KILL $pids 2>/dev/null; sleep 1
}

# run NAME CAP_S MIN_S LOGFILE CMD...: skipped when fewer than MIN_S seconds are left; else under
# timeout (its process group: the command's children too) of min(CAP_S, time left)
run() {
  local name=$1 cap=$2 min=$3 logf=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then
    say "[$name] skipped: ${l}s left of ${DEADLINE}s (it needs about ${min}s)"; return 99
  fi
  local t=$(( cap < l ? cap : l )) s=$SECONDS rc
  say "[$name] start at +$((SECONDS - T0))s, timeout ${t}s"
  timeout -k 15 "$t" "$@" > "$logf" 2>&1 < /dev/null
  rc=$?
  say "[$name] rc=$rc after $((SECONDS - s))s$([ $rc -eq 124 ] || [ $rc -eq 137 ] && echo ' (TIMED OUT)')"
  [ $rc -ne 0 ] && tail -n 4 "$logf" | sed 's/^/  | /' | cut -c1-400 | tee -a "$SUM"
  gpu_cleanup
  return $rc
}

# ---------------------------------------------------------------- (i) wheels
say "== install $(ls .whl | xargs)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | grep -v -i "warning" | tail -n 3
# the project as installed (launchers/ is the package fsdp_jobs.launchers: pyproject's package-dir), without
# building a wheel on a machine with no network: the packages copied into that layout, conf/ beside them
rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r fsdp_jobs conf /tmp/proj/ && cp -r launchers /tmp/proj/fsdp_jobs/launchers
export PYTHONPATH=/tmp/site:/tmp/proj PYTHONSAFEPATH=1  # not the checkout: -m would put it first
if ls /tmp/site | grep -q -E '^(torch|numpy)$'; then say "!! /tmp/site holds a torch or numpy: remove it from .whl"; fi

# ---------------------------------------------------------------- (ii) machine
say "== machine"
{ nvidia-smi -L
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name(0))"
  python3 -c "import importlib.metadata as m; print(' | '.join(f'{p} {m.version(p)}' for p in ('typing_extensions', 'numpy', 'triton', 'tensorboard', 'hydra-core', 'omegaconf', 'torchtitan', 'tyro', 'torchdata')))"
} 2>&1 | tee -a "$SUM"

# both models on meta: same parameter count and shapes (also the import check for torchtitan, tyro, the project)
TT_PYTHONPATH=$PYTHONPATH
if ! python3 deploy/gpu-sidebyside/check_shapes.py > /tmp/shapes.txt 2>&1; then
  say "!! check_shapes failed: $(tail -n 1 /tmp/shapes.txt | cut -c1-300)"
  if grep -q -E "ImportError|ModuleNotFoundError|AttributeError" /tmp/shapes.txt; then
    say "   retrying with the fallback wheels (deploy/gpu-sidebyside/fallback: typing_extensions) ahead of the machine's"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_fb \
      deploy/gpu-sidebyside/fallback/*.whl 2>&1 | grep -v -i warning | tail -n 2
    TT_PYTHONPATH=/tmp/site_fb:$PYTHONPATH
    PYTHONPATH=$TT_PYTHONPATH python3 deploy/gpu-sidebyside/check_shapes.py > /tmp/shapes.txt 2>&1 || say "!! still failing: $(tail -n 1 /tmp/shapes.txt | cut -c1-300)"
  fi
fi
python3 - /tmp/shapes.txt <<'EOF' 2>&1 | tee -a "$SUM"
import json, sys
line = next((l for l in open(sys.argv[1]) if l.startswith("SHAPES ")), None)
if line:
    r = json.loads(line[7:])
    print("shapes: params", r["params"], "| tied shared:", r["tied_weight_shared"], "| ffn", r["ffn_hidden"],
          "| differences:", r["shape_differences_project_vs_tt_tied"] or "none", "| FLOPs/token", r["flops_per_token_project_formula"])
EOF
say "== setup took $((SECONDS - T0))s"

# ---------------------------------------------------------------- (iii) the variants
run a_bench 200 90 "$OUT/a_bench.log" \
  python3 -m fsdp_jobs.bench step --device cuda --model llama3_1b --seq-len 2048 --batch 4 --repeats 1 --steps "$STEPS"

TT=(python3 deploy/gpu-sidebyside/run_tt.py --model.name llama3_fsdpjobs --model.flavor "$TT_FLAVOR"
    --training.local_batch_size "$BATCH" --training.seq_len "$SEQ" --training.steps "$STEPS" --training.max_norm 1.0
    --training.mixed_precision_param bfloat16 --training.mixed_precision_reduce float32
    --activation_checkpoint.mode none --optimizer.name AdamW --optimizer.lr 3e-4 --optimizer.weight_decay 0.0
    --lr_scheduler.warmup_steps 0 --metrics.log_freq "$LOG_FREQ" --metrics.disable_color_printing
    --job.dump_folder /tmp/tt_out)
TTENV=(env PYTHONPATH="$TT_PYTHONPATH" TT_FORCE_FSDP=1 TT_SKIP_WINDOWS=2)

run tt_nocompile 150 60 "$OUT/tt_nocompile.log" "${TTENV[@]}" TT_TIE=1 "${TT[@]}"
run tt_compile 240 100 "$OUT/tt_compile.log" "${TTENV[@]}" TT_TIE=1 "${TT[@]}" --compile.enable

# proj NAME ARGS...: the fsdp-jobs job compiled, with ARGS (its PC_RESULT from deploy/gpu-sidebyside/proj_metrics.py)
proj() {
  local name=$1; shift
  rm -rf "/tmp/sbs_$name"
  run "$name" 240 120 "$OUT/$name.log" bash -c "python3 -m fsdp_jobs run_root=/tmp/sbs_$name name=pc \
cluster.device=cuda nodes=1 gpus_per_node=1 model=llama3_1b fsdp=full_shard train.steps=$STEPS data.seq_len=2048 \
train.batch_per_rank=4 train.lr=0.0003 train.grad_clip=1.0 checkpoint.interval=0 checkpoint.save_final=false \
train.log_interval=10 train.warmup_steps=0 cluster.peak_tflops=989 train.compile=true $*; rc=\$?; \
python3 deploy/gpu-sidebyside/proj_metrics.py /tmp/sbs_$name/pc; exit \$rc"
}
TT_F8=(--compile.enable --model.converters float8 --float8.filter_fqns output)

if [ "$EXTRAS" = 1 ]; then
  proj proj_compile
  run tt_foreach 120 60 "$OUT/tt_foreach.log" "${TTENV[@]}" TT_TIE=1 "${TT[@]}" --optimizer.implementation foreach
  run tt_untied 120 60 "$OUT/tt_untied.log" "${TTENV[@]}" TT_TIE=0 "${TT[@]}"
fi
if [ "$F8" = 1 ]; then
  proj proj_f8 train.float8=true
  run tt_f8 240 100 "$OUT/tt_f8.log" "${TTENV[@]}" TT_TIE=1 "${TT[@]}" "${TT_F8[@]}" \
    --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp
  proj proj_f8_rowwise train.float8=true train.float8_recipe=rowwise
  run tt_f8_rowwise 240 100 "$OUT/tt_f8_rowwise.log" "${TTENV[@]}" TT_TIE=1 "${TT[@]}" "${TT_F8[@]}" \
    --float8.recipe_name rowwise
fi
gpu_cleanup

# ---------------------------------------------------------------- (iv) summary
say "== summary (total $((SECONDS - T0))s)"
python3 deploy/gpu-sidebyside/summarize.py "$OUT" 2>&1 | tee -a "$SUM"
exit 0
