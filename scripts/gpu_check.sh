#!/usr/bin/env bash
# scripts/gpu_check.sh OUT_DIR: the one command to run on a GPU box (or a lent machine with no registry).
#
# Stages, each time-boxed and logged to OUT_DIR/logs/<stage>.log (the default limits fit a 10-minute window):
#   env      nvidia-smi, torch / triton / CUDA versions, which Python deps import     -> OUT_DIR/env.json
#   wheels   only with WHEELS=dir: pip install --no-index --find-links dir $WHEEL_PKGS (default hydra-core
#            omegaconf; their antlr4 runtime must be in dir too)
#   tests    REPLAYSSM_TEST_DEVICE=cuda pytest tests -x -q, real kernels (TRITON_INTERPRET=0), bf16 included
#   sweeps   python -m experiments.kernel_decode sweep=smoke, then kernel_spec into the same run
#            -> OUT_DIR/results/<hardware>/<run-id>/{rows.csv, env.json}
#   scripts  aggregate, tables, claims, plots on that run (summary.csv, TABLES.md, REPORT.md, plots/)
#   report   python scripts/kernel_report.py --csv OUT_DIR/kernel_report.csv (AOT build: registers, spills)
# A failing or timed-out stage is recorded and the next one still runs; the exit code is 1 if any failed.
#
# Environment: PY (default python), STAGES (subset, e.g. "env tests"), T_ENV T_WHEELS T_TESTS T_SWEEP
# T_SCRIPTS T_REPORT (seconds per stage), PYTEST_ARGS (default "-x -q"), SWEEP (default smoke), SWEEP_ARGS
# (extra Hydra overrides for both sweeps, e.g. "sweep.batch=[1,256]"), WHEELS, WHEEL_PKGS.
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: bash scripts/gpu_check.sh OUT_DIR" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p "$1/logs"
OUT="$(cd "$1" && pwd)"
PY="${PY:-python}"
STAGES="${STAGES:-env wheels tests sweeps scripts report}"
T_ENV="${T_ENV:-30}" T_WHEELS="${T_WHEELS:-60}" T_TESTS="${T_TESTS:-240}" T_SWEEP="${T_SWEEP:-75}"
T_SCRIPTS="${T_SCRIPTS:-45}" T_REPORT="${T_REPORT:-60}"
SWEEP="${SWEEP:-smoke}"
RUN_ID="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
PYTEST_ARGS="${PYTEST_ARGS:--x -q}"
SWEEP_ARGS="${SWEEP_ARGS:-}"
# The stages run in a child bash under `timeout` (which cannot run shell functions): export what they read.
export OUT PY SWEEP SWEEP_ARGS RUN_ID PYTEST_ARGS

# Real kernels, on the GPU, with the repo's packages importable without an install.
export TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda PYTHONHASHSEED=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

FAILED=()
printf 'stage\tstatus\tseconds\tlimit_s\n' > "$OUT/stages.tsv"

want() { [[ " $STAGES " == *" $1 "* ]]; }

# run_stage NAME LIMIT CMD...: time-boxed (the whole process group is killed), tee'd to logs/NAME.log,
# recorded in stages.tsv. CMD may be one of the functions below: they are handed to the child bash.
run_stage() {
    local name=$1 limit=$2 t0=$SECONDS rc status
    shift 2
    printf '\n==== [%s] limit %ss: %s\n' "$name" "$limit" "$*"
    timeout -k 10 "$limit" bash -c "$(declare -f env_report pytest_stage sweep_stage scripts_stage); \"\$@\"" \
        stage "$@" 2>&1 | tee -a "$OUT/logs/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) status=ok ;;
        124|137) status=timeout ;;
        *) status="failed(rc=$rc)" ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$limit" >> "$OUT/stages.tsv"
    [[ $rc -eq 0 ]] || FAILED+=("$name:$status")
    return 0
}

env_report() {
    nvidia-smi || echo "nvidia-smi not available"
    nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1 || true
    "$PY" - "$OUT/env.json" <<'PYEOF'
import importlib, json, platform, sys
info = {"python": sys.version.split()[0], "platform": platform.platform()}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu_name=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                    gpu_memory_bytes=p.total_memory, l2_bytes=getattr(p, "L2_cache_size", None))
except Exception as exc:  # noqa: BLE001 - report whatever is broken
    info["torch_error"] = repr(exc)
modules = {}
for name in ("triton", "hydra", "omegaconf", "pandas", "numpy", "matplotlib", "tqdm", "pynvml", "pytest",
             "pytest_benchmark", "xdist", "mamba_ssm", "fla", "flashinfer"):
    try:
        mod = importlib.import_module(name)
        modules[name] = getattr(mod, "__version__", "present")
    except Exception as exc:  # noqa: BLE001
        modules[name] = f"absent: {type(exc).__name__}"
info["modules"] = modules
json.dump(info, open(sys.argv[1], "w"), indent=2, default=str)
print(json.dumps(info, indent=2, default=str))
PYEOF
}

pytest_stage() {
    local extra=() args
    read -r -a args <<< "$PYTEST_ARGS"
    # pyproject's addopts name --benchmark-disable, which needs pytest-benchmark: drop them when it is absent
    "$PY" -c "import pytest_benchmark" 2>/dev/null || extra+=(-o "addopts=-ra")
    "$PY" -m pytest tests -p no:randomly -p no:cacheprovider --junitxml="$OUT/pytest.xml" \
        ${extra[@]+"${extra[@]}"} ${args[@]+"${args[@]}"}
}

sweep_stage() {    # sweep_stage EXPERIMENT: the first creates the run, the second resumes it
    local experiment=$1 run_dir where extra
    read -r -a extra <<< "$SWEEP_ARGS"
    run_dir="$(ls -d "$OUT"/results/*/"$RUN_ID" 2>/dev/null | head -n 1 || true)"
    if [[ -n "$run_dir" ]]; then where="resume=$run_dir"; else where="run_id=$RUN_ID"; fi
    "$PY" -m "experiments.$experiment" "sweep=$SWEEP" "out_dir=$OUT/results" "$where" progress=false \
        "hydra.run.dir=$OUT/hydra/$experiment" ${extra[@]+"${extra[@]}"}
}

scripts_stage() {
    local run_dir
    run_dir="$(ls -d "$OUT"/results/*/"$RUN_ID" 2>/dev/null | head -n 1 || true)"
    if [[ -z "$run_dir" ]]; then
        echo "no run directory under $OUT/results (did the sweeps run?)"
        return 1
    fi
    "$PY" scripts/aggregate.py "$run_dir" && "$PY" scripts/tables.py "$run_dir" --quiet \
        && "$PY" scripts/claims.py "$run_dir" && "$PY" scripts/plots.py "$run_dir" || return 1
    grep '^|' "$run_dir/REPORT.md"       # the claims table: what this GPU measured against the paper
}

want env && run_stage env "$T_ENV" env_report
if want wheels && [[ -n "${WHEELS:-}" ]]; then
    read -r -a pkgs <<< "${WHEEL_PKGS:-hydra-core omegaconf}"
    run_stage wheels "$T_WHEELS" "$PY" -m pip install --no-index --find-links "$WHEELS" "${pkgs[@]}"
fi
want tests && run_stage tests "$T_TESTS" pytest_stage
if want sweeps; then
    run_stage sweep_kernel_decode "$T_SWEEP" sweep_stage kernel_decode
    run_stage sweep_kernel_spec "$T_SWEEP" sweep_stage kernel_spec
fi
want scripts && run_stage scripts "$T_SCRIPTS" scripts_stage
want report && run_stage kernel_report "$T_REPORT" "$PY" scripts/kernel_report.py --csv "$OUT/kernel_report.csv" \
    --json "$OUT/kernel_report.json"

printf '\n==== summary (%s)\n' "$OUT/stages.tsv"
column -t -s $'\t' "$OUT/stages.tsv" 2>/dev/null || cat "$OUT/stages.tsv"
if (( ${#FAILED[@]} )); then
    echo "FAILED: ${FAILED[*]}"
    exit 1
fi
echo "all stages passed"
