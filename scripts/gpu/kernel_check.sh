#!/usr/bin/env bash
# scripts/gpu/kernel_check.sh [--plan | --dry-run] OUT_DIR: the kernel-redesign issues' GPU call, <= 8 minutes
# with the wheels: the kernel tests on the GPU (gate), experiments.tune on both sides (baseline and ReplaySSM, AR
# and spec kernels), the tuned kernel_decode / kernel_spec sweeps at the headline points (b256 / b512, L = 16,
# T = 4 / 8; Qwen3.5-122B, Kimi-Linear, Nemotron-3-Super: conf/sweep/gpu_kernel_{decode,spec}.yaml), ncu on the
# ReplaySSM steps, and kernel_table.md last. WHEELS as for route_check.sh.
# A wrapper of `python -m experiments.gpu_check --set kernel_check` (experiments/gpu_check/stages.py).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-$(command -v python3 || command -v python)}"
export PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m experiments.gpu_check --set kernel_check "$@"
