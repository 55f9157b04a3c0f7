#!/usr/bin/env bash
# scripts/gpu/tune_check.sh [--plan | --dry-run] OUT_DIR [MODEL...]: tune the AR kernels (baseline_ar and
# replay_ar on both routes, batch 256, L = 16: conf/sweep/gpu_tune_ar.yaml) at MODELs (default Qwen3.5-122B),
# one experiments.tune job per model, method and route side by side, then time kernel_decode at Qwen3.5-122B and
# Kimi-Linear, b256 / b512, with that table (rows say launch_source=tuned where an entry applied). The table
# comes back as OUT_DIR/launch_table.json (not in replayssm/launch_tables). WHEELS as for route_check.sh.
# A wrapper of `python -m experiments.gpu_check --set tune_check` (experiments/gpu_check/stages.py).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-$(command -v python3 || command -v python)}"
export PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
args=() out=0
for a in "$@"; do      # the options and OUT_DIR as given; every further word is a model
    if [[ $a == -* ]]; then args+=("$a")
    elif (( ! out )); then args+=("$a"); out=1
    else args+=(--model "$a"); fi
done
exec "$PY" -m experiments.gpu_check --set tune_check "${args[@]}"
