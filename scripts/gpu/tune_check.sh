#!/usr/bin/env bash
# scripts/gpu/tune_check.sh OUT_DIR [MODEL...]: tune the AR kernels (baseline_ar and replay_ar on both routes, batch
# 256, L = 16) at MODELs (default qwen35_122b_a10b) with experiments.tune, then time kernel_decode at Qwen3.5-122B
# and Kimi-Linear, batch 256 / 512, with that table (rows say launch_source tuned where an entry applied).
# Files in OUT_DIR: the launch table (tables/<device>.json), rows.tar.gz (the run directory), log.txt.
set -uo pipefail
OUT="$1"; shift; PY="${PY:-python3}"; WHEELS="${WHEELS:-gpu_wheels}"
MODELS=("${@:-qwen35_122b_a10b}")
cd "$(dirname "$0")/../.."
source scripts/gpu/route_common.sh
setup_run
export REPLAYSSM_LAUNCH_TABLES="$OUT/tables"
geo=(); for m in "${MODELS[@]}"; do geo+=(--geometry "$m"); done
"$PY" -m experiments.tune --experiment kernel_decode --all "${geo[@]}" -- "sweep.batch=[256]" "sweep.buffer_len=[16]" \
    "method.names=[baseline_ar,replay_ar]" "sweep.state_dtype=[float32]" "sweep.act_dtype=[bfloat16]"
route_sweep
