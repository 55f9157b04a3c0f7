#!/usr/bin/env bash
# scripts/gpu/gpu_check.sh [--plan | --dry-run] OUT_DIR: GPU first contact in one command, <= 8 minutes on one
# H100/H200 with Triton's compiles included: env, wheels (WHEELS=DIR), launch floor, GPU tests, headline and
# e2e sweeps, DRAM counters, report, each stage time-boxed and OUT_DIR packed after each (at most 8 files).
# A wrapper of `python -m experiments.gpu_check --set gpu_check`: the stages, their limits and their commands
# are experiments/gpu_check/stages.py, the sweeps conf/sweep/gpu_*.yaml; --plan prints them, --dry-run runs
# their CPU forms here. Environment as documented in experiments/gpu_check/__init__.py (PY, WHEELS, STAGES,
# T_<STAGE>, WORK, GPU_TESTS, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PY:-$(command -v python3 || command -v python)}"
export PY PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m experiments.gpu_check --set gpu_check "$@"
