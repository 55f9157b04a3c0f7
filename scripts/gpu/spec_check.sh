#!/usr/bin/env bash
# scripts/gpu/spec_check.sh [--plan | --dry-run] OUT_DIR: the ring-verify issue's GPU call, <= 8 minutes with the
# wheels: the spec kernel tests of both ring forms on the GPU (gate), experiments.tune of the spec kernels at T = 4
# (native spec, commit-replay, ReplaySSM fused and verify_fold), the tuned kernel_spec sweep (b256 / b512, T = 4 / 8,
# aligned and staggered cursors; conf/sweep/gpu_kernel_spec.yaml), the serving step at b512 T = 4 (Qwen3.5-122B and
# Nemotron-3-Super at TP4, native vs ReplaySSM verify_fold; conf/sweep/gpu_serving_spec.yaml), kernel_table.md last.
# WHEELS as for route_check.sh. A wrapper of `python -m experiments.gpu_check --set spec_check`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-$(command -v python3 || command -v python)}"
export PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m experiments.gpu_check --set spec_check "$@"
