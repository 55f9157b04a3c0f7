#!/usr/bin/env bash
# scripts/gpu_check.sh [--dry-run] OUT_DIR: the one command to run on a GPU box (or a lent machine with no
# registry). --dry-run runs every stage that needs no GPU on this machine (a CPU box) and prints the exact
# GPU commands it skips, so a broken script is caught before it meets the GPU.
#
# Stages, each time-boxed and logged to OUT_DIR/logs/<stage>.log (the default limits fit a 10-minute window):
#   env      nvidia-smi, torch / triton / CUDA versions, which Python deps import     -> OUT_DIR/env.json
#   wheels   only with WHEELS=DIR (made by scripts/gpu_bundle.sh): every file of DIR/MANIFEST.tsv is checked
#            (sha256, size) and installed offline (pip install --no-index --no-deps --target OUT_DIR/site);
#            later stages import OUT_DIR/site first. In --dry-run, a wheel this Python cannot install (the
#            cp312 binaries on a 3.11 box) is checked (hash, size, cp312 manylinux x86_64 tag) but not installed.
#   tests    REPLAYSSM_TEST_DEVICE=cuda pytest tests -x -q, real kernels (TRITON_INTERPRET=0), bf16 included
#            (--dry-run: skipped, printed)
#   sweeps   python -m experiments.kernel_decode sweep=smoke, then kernel_spec into the same run
#            -> OUT_DIR/results/<hardware>/<run-id>/{rows.csv, env.json}   (--dry-run: sweep=smoke on the CPU,
#            which picks the tiny models and the torch backend itself: conf/sweep/smoke.yaml on_cpu)
#   scripts  aggregate, tables, claims, plots on that run (summary.csv, TABLES.md, REPORT.md, plots/)
#   report   python scripts/kernel_report.py --csv OUT_DIR/kernel_report.csv (AOT build: registers, spills; runs
#            on a CPU too; --dry-run builds one geometry for sm_90 unless KR_ARGS says otherwise)
# A failing or timed-out stage is recorded and the next one still runs; the exit code is 1 if any failed.
#
# Environment: PY (default python), STAGES (subset, e.g. "env tests"), T_ENV T_WHEELS T_TESTS T_SWEEP
# T_SCRIPTS T_REPORT (seconds per stage), PYTEST_ARGS (default "-x -q"), SWEEP (default smoke), SWEEP_ARGS
# (extra Hydra overrides for both sweeps, e.g. "sweep.batch=[1,256]"), WHEELS, KR_ARGS (kernel_report args).
set -uo pipefail

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY_RUN=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: bash scripts/gpu_check.sh [--dry-run] OUT_DIR" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
mkdir -p "$1/logs"
OUT="$(cd "$1" && pwd)"
PY="${PY:-python}"
STAGES="${STAGES:-env wheels tests sweeps scripts report}"
if (( DRY_RUN )); then
    KR_ARGS="${KR_ARGS:---geometry nemotron3_super_120b --target 90 --fp32-state-only}"
    # a shared CPU box is slower and noisier than the GPU box's host: wider limits unless given
    T_SWEEP="${T_SWEEP:-180}" T_SCRIPTS="${T_SCRIPTS:-90}" T_REPORT="${T_REPORT:-150}"
else
    KR_ARGS="${KR_ARGS:-}"
fi
SKIPPED_GPU=()
T_ENV="${T_ENV:-30}" T_WHEELS="${T_WHEELS:-60}" T_TESTS="${T_TESTS:-240}" T_SWEEP="${T_SWEEP:-75}"
T_SCRIPTS="${T_SCRIPTS:-45}" T_REPORT="${T_REPORT:-60}"
SWEEP="${SWEEP:-smoke}"
RUN_ID="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
PYTEST_ARGS="${PYTEST_ARGS:--x -q}"
SWEEP_ARGS="${SWEEP_ARGS:-}"
# The stages run in a child bash under `timeout` (which cannot run shell functions): export what they read.
export OUT PY SWEEP SWEEP_ARGS RUN_ID PYTEST_ARGS

# Real kernels, on the GPU, with the repo's packages importable without an install. A dry run on a CPU
# box: no interpreter either (the CPU smoke sweep times the torch backend, the kernel report captures real
# launches: both need TRITON_INTERPRET unset), no CUDA test device.
if (( DRY_RUN )); then
    export TRITON_INTERPRET=0 PYTHONHASHSEED=0
    unset REPLAYSSM_TEST_DEVICE
else
    export TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda PYTHONHASHSEED=0
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DRY_RUN SITE="$OUT/site"

FAILED=()
printf 'stage\tstatus\tseconds\tlimit_s\n' > "$OUT/stages.tsv"

want() { [[ " $STAGES " == *" $1 "* ]]; }

# run_stage NAME LIMIT CMD...: time-boxed (the whole process group is killed), tee'd to logs/NAME.log,
# recorded in stages.tsv. CMD may be one of the functions below: they are handed to the child bash.
run_stage() {
    local name=$1 limit=$2 t0=$SECONDS rc status
    shift 2
    printf '\n==== [%s] limit %ss: %s\n' "$name" "$limit" "$*"
    timeout -k 10 "$limit" bash -c "$(declare -f env_report wheels_stage pytest_stage sweep_stage scripts_stage); \"\$@\"" \
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

wheels_stage() {   # wheels_stage DIR: check every file of DIR/MANIFEST.tsv, install it offline into $SITE
    "$PY" - "$1" "$SITE" "$DRY_RUN" <<'PYEOF' || return 1
import hashlib, subprocess, sys
from pathlib import Path
try:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename
except ImportError:                       # pip vendors packaging
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
bundle, site, dry = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"
manifest = bundle / "MANIFEST.tsv"
if not manifest.is_file():
    sys.exit(f"wheels: {manifest} not found (make the bundle with scripts/gpu_bundle.sh DIR)")
lines = [ln for ln in manifest.read_text().splitlines() if ln and not ln.startswith("#")]
header, rows = lines[0].split("\t"), [dict(zip(lines[0].split("\t"), ln.split("\t"))) for ln in lines[1:]]
if header[:5] != ["name", "version", "sha256", "size", "file"]:
    sys.exit(f"wheels: unexpected manifest header {header}")
here, install, checked, bad = set(sys_tags()), [], [], []
listed = {r["file"] for r in rows}
extra = sorted(p.name for p in bundle.glob("*.whl") if p.name not in listed)
if extra:
    bad.append(f"wheels in {bundle} but not in the manifest: {extra}")
for r in rows:
    path = bundle / r["file"]
    if not path.is_file():
        bad.append(f"{r['file']}: missing")
        continue
    data = path.read_bytes()
    if len(data) != int(r["size"]) or hashlib.sha256(data).hexdigest() != r["sha256"]:
        bad.append(f"{r['file']}: size/sha256 differ from the manifest")
        continue
    tags = parse_wheel_filename(r["file"])[3]
    if tags & here:
        install.append(path)
    elif dry and all(t.interpreter == "cp312" and "x86_64" in t.platform for t in tags):
        checked.append(r["file"])          # for the GPU box's CPython 3.12: hash and tag checked only
    else:
        bad.append(f"{r['file']}: no tag this Python can install ({sorted(map(str, tags))[:2]} ...)")
if bad:
    sys.exit("wheels: " + "; ".join(bad))
print(f"wheels: {len(rows)} manifest entries verified (sha256, size)")
for name in checked:
    print(f"  checked only (cp312 binary, not installable on this Python): {name}")
if install:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
           "--target", str(site), "--upgrade", *map(str, install)]
    print("  " + " ".join(cmd))
    subprocess.run(cmd, check=True)
print(f"wheels: installed {len(install)} into {site}")
PYEOF
    # the bundle's copies must be the ones imported (OUT/site is first on PYTHONPATH for later stages)
    if [[ -d "$SITE/hydra" ]]; then
        PYTHONPATH="$SITE:$PYTHONPATH" "$PY" -c "import hydra, omegaconf; assert hydra.__file__.startswith('$SITE'), \
hydra.__file__; print('wheels: hydra', hydra.__version__, 'omegaconf', omegaconf.__version__, 'from', '$SITE')"
    fi
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

# skip_gpu NAME CMD: --dry-run's record of a GPU-only stage: the exact command, printed and in stages.tsv
skip_gpu() {
    local name=$1
    shift
    SKIPPED_GPU+=("[$name] $*")
    printf '\n==== [%s] skipped (needs a GPU): %s\n' "$name" "$*"
    printf '%s\t%s\t%s\t%s\n' "$name" "skipped-gpu" 0 0 >> "$OUT/stages.tsv"
}

want env && run_stage env "$T_ENV" env_report
if want wheels && [[ -n "${WHEELS:-}" ]]; then
    WHEELS="$(cd "$WHEELS" && pwd)"
    run_stage wheels "$T_WHEELS" wheels_stage "$WHEELS"
    [[ -d "$SITE" ]] && export PYTHONPATH="$SITE:$PYTHONPATH"
fi
if want tests; then
    if (( DRY_RUN )); then
        skip_gpu tests "TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda $PY -m pytest tests -p no:randomly" \
            "-p no:cacheprovider --junitxml=$OUT/pytest.xml $PYTEST_ARGS"
    else
        run_stage tests "$T_TESTS" pytest_stage
    fi
fi
if want sweeps; then
    if (( DRY_RUN )); then
        for experiment in kernel_decode kernel_spec; do
            skip_gpu "gpu_sweep_$experiment" "TRITON_INTERPRET=0 $PY -m experiments.$experiment sweep=$SWEEP" \
                "out_dir=$OUT/results (on a GPU: the large models, backend=triton, CUDA graphs, cold L2)"
        done
    fi
    run_stage sweep_kernel_decode "$T_SWEEP" sweep_stage kernel_decode
    run_stage sweep_kernel_spec "$T_SWEEP" sweep_stage kernel_spec
fi
want scripts && run_stage scripts "$T_SCRIPTS" scripts_stage
if want report; then
    read -r -a kr_args <<< "$KR_ARGS"
    run_stage kernel_report "$T_REPORT" "$PY" scripts/kernel_report.py ${kr_args[@]+"${kr_args[@]}"} \
        --csv "$OUT/kernel_report.csv" --json "$OUT/kernel_report.json"
fi

if (( ${#SKIPPED_GPU[@]} )); then
    printf '\n==== dry run: GPU commands skipped here (run them on the GPU box: bash scripts/gpu_check.sh OUT)\n'
    printf '  %s\n' "${SKIPPED_GPU[@]}"
fi
printf '\n==== summary (%s)\n' "$OUT/stages.tsv"
column -t -s $'\t' "$OUT/stages.tsv" 2>/dev/null || cat "$OUT/stages.tsv"
if (( ${#FAILED[@]} )); then
    echo "FAILED: ${FAILED[*]}"
    exit 1
fi
echo "all stages passed"
