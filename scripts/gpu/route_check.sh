#!/usr/bin/env bash
# scripts/gpu/route_check.sh [--plan | --dry-run] OUT_DIR: the GDN / KDA replay routes side by side on one GPU,
# with the evidence for where the time goes: kernel_decode at Qwen3.5-122B and Kimi-Linear (TP1), b256 / b512,
# L = 16, baseline_ar and replay_ar on both routes (conf/sweep/gpu_route.yaml), then ncu at Qwen3.5-122B b256:
# DRAM bytes against the byte model and the section report of the step kernels, per route. Needs the wheel
# bundle (WHEELS, default ./gpu_wheels: scripts/gpu/gpu_bundle.sh) and ncu.
# A wrapper of `python -m experiments.gpu_check --set route_check` (experiments/gpu_check/stages.py).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-$(command -v python3 || command -v python)}"
export PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m experiments.gpu_check --set route_check "$@"
