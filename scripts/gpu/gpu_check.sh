#!/usr/bin/env bash
# scripts/gpu/gpu_check.sh [--plan | --dry-run] OUT_DIR: GPU first contact in one command, <= 8 minutes on one
# H100/H200 with Triton's compiles included. --plan prints the stages and their limits (and `total: N s`) and
# runs nothing; --dry-run runs every stage that needs no GPU on this machine (a CPU box) and prints the exact
# GPU commands it skips, so a broken script is caught before it meets the GPU.
#
# Stages, most valuable first; each one is time-boxed (its process group is killed at its limit, 5 s grace)
# and writes its results the moment it ends, so a kill keeps everything before it:
#   env       nvidia-smi, NVML, torch / triton / CUDA versions, the measured device copy bandwidth -> env.json;
#             says clearly whether torch / triton are the pair make test-gpu-stack tests (constraints-gpustack.txt,
#             its `# gpu-box:` line: torch 2.11.0+cu130 with triton 3.6.0) -> env.json "stack"
#   wheels    only with WHEELS=DIR (scripts/gpu/gpu_bundle.sh): verify DIR/MANIFEST.tsv (sha256, size), install
#             offline into a site dir that later stages import first, then import every module the harness
#             needs; a missing one fails the stage naming `gpu_bundle.sh DIR --full`
#   launch    the launch floor at batch 1 (python -m experiments.launch_floor): a minimal Triton kernel and each
#             method's step on the headline geometries, under CUDA graphs (do_bench_cudagraph), eager
#             (do_bench) and back-to-back on the host clock -> launch_floor.csv (+ launch_floor.json in
#             results.tar.gz). It pays first launches first, in 8 parallel processes: Triton's JIT compiles and,
#             under Triton 3.6.0, the C launcher it builds with gcc per kernel signature (3.7 builds none)
#   tests     the cheapest tests that need a GPU (GPU_TESTS: node ids of `gpu`-marked tests, bf16 Triton and
#             graph capture first, one production-geometry case per kernel family, cheapest first), bounded:
#             no new test starts after T_TESTS - 15 s; tests.log gets a line when each test starts and ends (a
#             kill leaves the one that hung), plus pytest.xml at the end. A session the budget stopped with no
#             test failed is recorded as `budget: N not started` (the plugin's exit 10), not as failed
#   headline  AR decode at batch 64/256/512 for Nemotron-3-Super-120B (L = 8, 16) and Qwen3.5-122B (L = 16)
#             at TP1, fp32 state, bf16 activations, both routes, baseline + ReplaySSM + installed peers; spec
#             verify+commit at T = 4 (batch 128, 512) and T = 6 (batch 128) for the three spec methods
#   e2e       whole-model decode step of Nemotron-3-Nano-4B and Qwen3.5-4B at batch 256, and serving at T = 4
#             for Nemotron-3-Nano-4B (batch 128), native spec and ReplaySSM only: the same run directory
#   dram      DRAM bytes read/written per kernel from the hardware counters (ncu), beside replayssm/traffic.py's
#             bytes (scripts/kernels/dram_traffic.py $DRAM_ARGS: baseline_ar, replay_ar and replay_spec at
#             batch 64, L = 8, 13 s per ncu run) -> dram.csv; unreadable counters: said, on
#   report    aggregate, hybrid summary, tables and the claims report over whatever the earlier stages wrote
#             (each program runs even if one before it failed), then the plots in the time left; plots cut at
#             the limit leave the claims table written and the stage says `partial: plots cut`
# OUT_DIR ends up with at most 8 files: summary.txt (stages, claims table, DRAM table), stages.tsv, env.json,
# tests.log, dram.csv, launch_floor.csv, results.tar.gz (the run directory + pytest.xml + launch_floor.json),
# logs.tar.gz (every stage's log); while a stage runs also stage.log (its log, live; gone once packed).
# They are refreshed after every stage.
# Triton 3.6.0 builds a C launcher (gcc, ~1.5 s each on a 2-core CPU) for each kernel signature at its first
# launch: the launch stage builds those of batch 1, in parallel, and every later stage's limit holds its own.
# stages.tsv's `launchers` column counts the launchers each stage built (new __triton_launcher*.so files in
# Triton's cache, TRITON_CACHE_DIR or ~/.triton/cache): the figure to resize the limits with after first contact.
# A failing or timed-out stage is recorded and the next one still runs; the exit code is 1 if any failed. A stage
# that stops short on purpose (exit 10: the tests budget, the report's plots) is recorded with what it says in
# WORK/stage.note (`budget: N not started`, `partial: plots cut`) and is not a failure.
# The limits come from the first H200 contact (results/h200/gpu-check-20261204T071425Z-7253b5e, stages.tsv):
# env 5 s, wheels 13 s, launch 32 s of 35, tests cut by their 70 s budget after 12 passed (59 not started),
# headline 59 s of 115, e2e cut at 50 (e2e_decode's 4 rows took 35 s, serving did not finish), dram cut at 30
# (3 of 5 ncu runs, one past its 12 s), report cut at 25 in the plots (REPORT.md's claims table was written).
# The kernel report (registers, spills: scripts/kernels/kernel_report.py) is an AOT build that runs on a CPU: no stage.
#
# Environment: PY (default python), STAGES (subset), T_<STAGE> (seconds; e.g. T_TESTS=90), WHEELS, TEST_SELECT,
# LAUNCH_ARGS (extra experiments.launch_floor arguments, e.g. --jobs 4), TESTED_STACK (the pair to expect;
# default the `# gpu-box:` line of constraints-gpustack.txt),
# GPU_TESTS (pytest node ids of the tests stage), PYTEST_ARGS, HEADLINE_ARGS / E2E_ARGS (extra Hydra overrides),
# DRAM_ARGS (dram_traffic.py's arguments), WORK (scratch dir, default a mktemp dir).
set -uo pipefail

MODE=run
case "${1:-}" in
    --plan) MODE=plan; shift ;;
    --dry-run) MODE=dry; shift ;;
esac
if [[ $MODE != plan && $# -ne 1 ]]; then
    echo "usage: bash scripts/gpu/gpu_check.sh [--plan | --dry-run] OUT_DIR" >&2
    exit 2
fi
cd "$(dirname "$0")/../.."
STAGES="${STAGES:-env wheels launch tests headline e2e dram report}"
GRACE=5
# 8 stages x (limit + 5 s grace + 5 s packing) <= 480 s. Sized from the first H200 contact (header): env and
# wheels used a third of theirs (-5, -10), launch nearly all (+5), headline half (-30); tests run 14 chosen
# GPU tests instead of 91 keyword matches (-25: 45 s of tests, cheapest first); e2e gets room for its decode
# rows (35 s) and a 2-mode serving point (+25); dram 3 ncu runs of <= 13 s (+15); report its plots (+15).
declare -A LIMIT=([env]="${T_ENV:-15}" [wheels]="${T_WHEELS:-30}" [launch]="${T_LAUNCH:-40}"
                  [tests]="${T_TESTS:-60}" [headline]="${T_HEADLINE:-85}" [e2e]="${T_E2E:-75}" [dram]="${T_DRAM:-45}"
                  [report]="${T_REPORT:-40}")
declare -A WHAT=([env]="nvidia-smi, NVML, versions, measured device copy bandwidth"
                 [wheels]="offline install of WHEELS=DIR + import check (only with WHEELS)"
                 [launch]="launch floor b1: minimal kernel + each method, graph/eager/host; 3.6 launcher builds"
                 [tests]="the cheapest GPU tests (bf16 Triton, graph capture, production shapes), per-test record"
                 [headline]="AR decode b64/256/512 Super-120B L8/16 + Qwen3.5-122B, Kimi-Linear L16 (both routes); spec T4 b128/512, T6 b128"
                 [e2e]="e2e decode Nano-4B + Qwen3.5-4B b256; serving T4 Nano-4B b128 native + ReplaySSM"
                 [dram]="ncu DRAM bytes read/written: baseline_ar, replay_ar, replay_spec vs the byte model"
                 [report]="aggregate, tables, claims report on what ran; plots in the time left")
# The tests stage: `gpu`-marked tests (they need a CUDA device) in this order, cheapest first by the first
# contact's tests.log (bf16 ~1 s each; a production-geometry case 5-11 s; the harness graph timing 13 s); the
# Mamba-2 ones had not started there. One parametrization of each production-geometry test: the rest add
# minutes of compiles (`make test-gpu-stack` builds every kernel AOT on a CPU). GPU_TESTS=... replaces the list.
DEFAULT_GPU_TESTS="tests/replayssm/gdn/test_gdn_decode.py::test_bf16_on_gpu
tests/replayssm/kda/test_kda_decode.py::test_bf16_on_gpu
tests/baselines/test_gdn_recurrent.py::test_bf16_on_gpu
tests/replayssm/mamba2/test_decode.py::test_cuda_bf16_and_fp32_parity
tests/replayssm/mamba2/test_decode.py::test_cuda_graph_capture
tests/replayssm/mamba2/test_spec.py::test_triton_bf16_matches_torch_on_gpu
tests/replayssm/gdn/test_gdn_spec.py::test_gpu_production_geometry[act_dtype0-state_dtype0]
tests/baselines/test_gdn_spec_baselines.py::test_gpu_production_geometry[native-act_dtype0-state_dtype0]
tests/baselines/test_gdn_spec_baselines.py::test_gpu_production_geometry[commit_replay-act_dtype0-state_dtype0]
tests/experiments/test_harness.py::test_gpu_graph_timing_on_tiny_models"
GPU_TESTS="${GPU_TESTS:-$(paste -sd' ' <<< "$DEFAULT_GPU_TESTS")}"
PACK_S=5           # packing after each stage: small tar/gzip of text files
if [[ $MODE == dry ]]; then        # a shared CPU box runs the CPU forms of the sweeps: wider limits unless given
    LIMIT[env]="${T_ENV:-60}" LIMIT[wheels]="${T_WHEELS:-90}" LIMIT[launch]="${T_LAUNCH:-240}"
    LIMIT[headline]="${T_HEADLINE:-300}" LIMIT[e2e]="${T_E2E:-240}"
    LIMIT[report]="${T_REPORT:-150}"
fi

if [[ $MODE == plan ]]; then
    total=0
    printf '%-9s %8s  %s\n' stage limit_s what
    for s in $STAGES; do
        [[ -n "${LIMIT[$s]:-}" ]] || { echo "unknown stage $s" >&2; exit 2; }
        printf '%-9s %8s  %s\n' "$s" "${LIMIT[$s]}" "${WHAT[$s]}"
        total=$((total + LIMIT[$s] + GRACE + PACK_S))
    done
    [[ " $STAGES " == *" tests "* ]] && echo "(tests stage: pytest -m gpu $GPU_TESTS)"
    echo "(each stage: its limit + ${GRACE} s kill grace + ${PACK_S} s packing)"
    echo "total: ${total} s"
    exit 0
fi

mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
WORK="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}"
mkdir -p "$WORK/logs" "$WORK/results"
PY="${PY:-python}"
RUN_ID="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
TEST_SELECT="${TEST_SELECT:-}"         # an extra -k expression over GPU_TESTS (default none)
DRAM_ARGS="${DRAM_ARGS:---methods baseline_ar,replay_ar,replay_spec --batch 64 --buffer-len 8 --timeout 13}"
PYTEST_ARGS="${PYTEST_ARGS:--q -x}"
SKIPPED_GPU=()
FAILED=()
DRY_RUN=$([[ $MODE == dry ]] && echo 1 || echo 0)
if (( DRY_RUN )); then
    # a dry run: no interpreter (the CPU sweeps time the torch backend), no CUDA test device
    export TRITON_INTERPRET=0 PYTHONHASHSEED=0
    unset REPLAYSSM_TEST_DEVICE
else
    export TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda PYTHONHASHSEED=0
fi
export PYTHONPATH="$PWD:$PWD/scripts/gpu${PYTHONPATH:+:$PYTHONPATH}"
# First contact times the default launch configs (no tuning: it would take the stages' minutes) and reads no
# launch table (replayssm/launch_table.py: off), so its rows say launch_source=default; env.json records it.
export REPLAYSSM_LAUNCH_TABLES=off
export OUT WORK PY RUN_ID TEST_SELECT GPU_TESTS DRAM_ARGS PYTEST_ARGS DRY_RUN SITE="$WORK/site" \
    T_TESTS="${LIMIT[tests]}" T_REPORT="${LIMIT[report]}"
export HEADLINE_ARGS="${HEADLINE_ARGS:-}" E2E_ARGS="${E2E_ARGS:-}" LAUNCH_ARGS="${LAUNCH_ARGS:-}"
# the torch/Triton pair make test-gpu-stack tests for the GPU box (constraints-gpustack.txt, `# gpu-box:` line)
TESTED_STACK="${TESTED_STACK:-$(sed -n 's/^# gpu-box: *//p' constraints-gpustack.txt 2>/dev/null | head -n 1)}"
export TESTED_STACK
# where Triton caches its builds: each stage counts the C launchers it built there (Triton 3.6.0)
TRITON_CACHE="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
printf 'stage\tstatus\tseconds\tlimit_s\tlaunchers\n' > "$OUT/stages.tsv"
: > "$OUT/tests.log"

want() { [[ " $STAGES " == *" $1 "* ]]; }

# pack: OUT's <= 8 files from WORK, after every stage (a kill keeps what the finished stages wrote)
pack() {
    [[ -d "$WORK/results" ]] && tar -C "$WORK" -czf "$OUT/results.tar.gz.tmp" results \
        $(cd "$WORK" && ls pytest.xml launch_floor.json 2>/dev/null) \
        && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"
    tar -C "$WORK" -czf "$OUT/logs.tar.gz.tmp" logs && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
    [[ -f "$WORK/env.json" ]] && cp "$WORK/env.json" "$OUT/env.json"
    [[ -f "$WORK/dram.csv" ]] && cp "$WORK/dram.csv" "$OUT/dram.csv"
    [[ -f "$WORK/launch_floor.csv" ]] && cp "$WORK/launch_floor.csv" "$OUT/launch_floor.csv"
    {
        echo "gpu_check $RUN_ID ($(date -u +%FT%TZ)), mode $MODE"
        column -t -s $'\t' "$OUT/stages.tsv" 2>/dev/null || cat "$OUT/stages.tsv"
        [[ -f "$WORK/env.json" ]] && \
            grep -E '"(gpu_name|torch|triton|cuda|copy_GBps|driver|stack_note)"' "$WORK/env.json"
        [[ -f "$WORK/launch_floor.csv" ]] && { echo "launch floor (ms per call, batch 1):"; \
            awk -F, 'NR > 1 && $14 == "ok" {printf "  %-36s %-6s %9.4f\n", $1, $7, $8}' "$WORK/launch_floor.csv"; }
        echo "tests: $(grep -c $'\tpassed' "$OUT/tests.log") passed, $(grep -c $'\tfailed' "$OUT/tests.log") failed," \
            "$(grep -c $'\tskipped' "$OUT/tests.log") skipped," \
            "$(sed -n 's/^# time budget .* spent: \([0-9]*\) tests not started$/\1/p' "$OUT/tests.log" | tail -n 1 \
               | grep . || echo 0) not started (budget)"
        run_dir="$(ls -d "$WORK"/results/*/"$RUN_ID" 2>/dev/null | head -n 1)"
        [[ -n "$run_dir" && -f "$run_dir/REPORT.md" ]] && grep '^|' "$run_dir/REPORT.md"
        [[ -f "$WORK/dram.csv" ]] && { echo; column -t -s, "$WORK/dram.csv" 2>/dev/null || cat "$WORK/dram.csv"; }
        (( ${#SKIPPED_GPU[@]} )) && printf 'skipped (GPU): %s\n' "${SKIPPED_GPU[@]}"
    } > "$OUT/summary.txt" 2>/dev/null
    return 0
}

# run_stage NAME CMD...: time-boxed (the whole process group is killed), logged live to OUT/stage.log,
# recorded in stages.tsv, then archived into logs.tar.gz with the rest.
run_stage() {
    local name=$1 limit=${LIMIT[$1]} t0=$SECONDS rc status launchers
    shift
    printf '\n==== [%s] limit %ss: %s\n' "$name" "$limit" "$*"
    touch "$WORK/stage.stamp"
    rm -f "$WORK/stage.note"
    timeout -k "$GRACE" "$limit" bash -c "$(declare -f env_stage wheels_stage launch_stage tests_stage sweep \
        headline_stage e2e_stage dram_stage report_stage run_dir); \"\$@\"" stage "$@" 2>&1 | tee "$OUT/stage.log"
    rc=${PIPESTATUS[0]}
    launchers=$(find "$TRITON_CACHE" -name '__triton_launcher*.so' -newer "$WORK/stage.stamp" 2>/dev/null | wc -l)
    case $rc in
        0) status=ok ;;
        10) status="$(cat "$WORK/stage.note" 2>/dev/null || echo partial)" ;;     # stopped short on purpose
        124|137) status=timeout ;;
        *) status="failed(rc=$rc)" ;;
    esac
    # a failure or a kill in a stage that had also noted something (tests: the budget) keeps both
    [[ $rc -ne 0 && $rc -ne 10 && -s "$WORK/stage.note" ]] && status="$status; $(cat "$WORK/stage.note")"
    mv "$OUT/stage.log" "$WORK/logs/$name.log"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$limit" "$launchers" >> "$OUT/stages.tsv"
    [[ $rc -eq 0 || $rc -eq 10 ]] || FAILED+=("$name:$status")
    pack
}

# skip_gpu NAME CMD: --dry-run's record of a GPU-only command: printed, in stages.tsv and summary.txt
skip_gpu() {
    local name=$1
    shift
    SKIPPED_GPU+=("[$name] $*")
    printf '\n==== [%s] skipped (needs a GPU): %s\n' "$name" "$*"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "skipped-gpu" 0 0 0 >> "$OUT/stages.tsv"
}

run_dir() { ls -d "$WORK"/results/*/"$RUN_ID" 2>/dev/null | head -n 1; }

env_stage() {
    nvidia-smi || echo "nvidia-smi not available"
    "$PY" - "$WORK/env.json" <<'PYEOF'
import importlib, json, os, platform, sys
info = {"python": sys.version.split()[0], "platform": platform.platform(),
        "launch_tables": f"REPLAYSSM_LAUNCH_TABLES={os.environ.get('REPLAYSSM_LAUNCH_TABLES')}: first contact "
                         "runs every kernel's default launch config (rows: launch_source=default)"}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu_name=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                    gpu_memory_bytes=p.total_memory, l2_bytes=getattr(p, "L2_cache_size", None))
        from experiments.harness.timing import measure_copy_GBps
        info["copy_GBps"] = measure_copy_GBps("cuda", 1 << 30)     # 1 GiB device copy, read + write counted
except Exception as exc:  # noqa: BLE001 - report whatever is broken
    info["torch_error"] = repr(exc)
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    clock = pynvml.nvmlDeviceGetMaxClockInfo
    info["nvml"] = {"driver": pynvml.nvmlSystemGetDriverVersion(), "name": pynvml.nvmlDeviceGetName(h),
                    "memory_total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                    "max_sm_clock_mhz": clock(h, pynvml.NVML_CLOCK_SM),
                    "max_mem_clock_mhz": clock(h, pynvml.NVML_CLOCK_MEM)}
except Exception as exc:  # noqa: BLE001
    info["nvml"] = f"unavailable: {type(exc).__name__}: {exc}"
modules = {}
for name in ("triton", "hydra", "omegaconf", "pandas", "numpy", "matplotlib", "tqdm", "pynvml", "pytest",
             "pytest_benchmark", "xdist", "einops", "mamba_ssm", "fla", "flashinfer"):
    try:
        mod = importlib.import_module(name)
        modules[name] = getattr(mod, "__version__", "present")
    except Exception as exc:  # noqa: BLE001
        modules[name] = f"absent: {type(exc).__name__}"
info["modules"] = modules
# the torch/Triton pair: the one make test-gpu-stack tests (AOT builds + interpreter), or said clearly it is not
tested = dict(item.split("==", 1) for item in os.environ.get("TESTED_STACK", "").split() if "==" in item)
box = {"torch": info.get("torch", "absent"), "triton": modules.get("triton")}
match = bool(tested) and all(box.get(k) == v for k, v in tested.items())
pair = lambda d: f"torch {d.get('torch')} with triton {d.get('triton')}"
info["stack"] = {"tested_pair": pair(tested), "box_pair": pair(box), "match": match}
info["stack_note"] = (f"{pair(box)}: the pair tested here (make test-gpu-stack)" if match else
                      f"NOT THE TESTED PAIR: this box has {pair(box)}; make test-gpu-stack tests {pair(tested)} "
                      "(constraints-gpustack.txt). Kernels may build or run differently: results are still recorded")
json.dump(info, open(sys.argv[1], "w"), indent=2, default=str)
print(json.dumps(info, indent=2, default=str))
print(f"stack: {info['stack_note']}")
PYEOF
}

launch_stage() {
    local extra
    read -r -a extra <<< "$LAUNCH_ARGS"
    if (( DRY_RUN )); then       # CPU: the entries it would time, then every one of them on the tiny models
        "$PY" -m experiments.launch_floor --plan && \
            TRITON_INTERPRET=1 "$PY" -m experiments.launch_floor --device cpu --jobs 1 --out "$WORK" \
            ${extra[@]+"${extra[@]}"}
        return
    fi
    "$PY" -m experiments.launch_floor --out "$WORK" ${extra[@]+"${extra[@]}"}
}

wheels_stage() {   # wheels_stage DIR: check every file of DIR/MANIFEST.tsv, install offline into $SITE, import
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
    sys.exit(f"wheels: {manifest} not found (make the bundle with scripts/gpu/gpu_bundle.sh DIR)")
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
    # every module the harness imports, from the bundle's site first: a gap names the bundle that has it
    PYTHONPATH="$SITE:$PYTHONPATH" "$PY" - "$1" "$SITE" <<'PYEOF'
import importlib, sys
bundle, site = sys.argv[1], sys.argv[2]
NEEDED = ["torch", "triton", "numpy", "pandas", "matplotlib", "yaml", "tqdm", "pynvml", "packaging", "einops",
          "hydra", "omegaconf", "antlr4", "pytest", "pytest_benchmark",
          "experiments.kernel.run", "experiments.hybrid.run", "experiments.accuracy", "replayssm.traffic",
          "experiments.report.claims", "experiments.report.figures.plots"]
missing = []
for name in NEEDED:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        missing.append(f"{name} ({type(exc).__name__}: {str(exc)[:80]})")
try:                                      # the peers as the harness imports them (mamba_ssm: its Triton op only)
    from baselines.peers import peer_status
    for name, status in peer_status().items():
        print(f"wheels: peer {name}: {status}")
except Exception as exc:  # noqa: BLE001
    missing.append(f"baselines.peers ({type(exc).__name__}: {str(exc)[:80]})")
hydra = importlib.import_module("hydra") if "hydra" not in " ".join(missing) else None
if hydra is not None and "site-packages" in hydra.__file__ and not hydra.__file__.startswith(site):
    print(f"wheels: note: hydra from {hydra.__file__}, not the bundle")
if missing:
    sys.exit(f"wheels: the harness needs modules this box lacks: {'; '.join(missing)}. Make the bundle with "
             f"`bash scripts/gpu/gpu_bundle.sh {bundle} --full` (every dependency beyond torch/triton) and rerun.")
print(f"wheels: all {len(NEEDED)} harness modules import")
# the pair the bundle was made for (MANIFEST.tsv's `# box-stack:` line, gpu_bundle.sh) against this box's
import pathlib
made_for = [ln.split(":", 1)[1].split() for ln in (pathlib.Path(bundle) / "MANIFEST.tsv").read_text().splitlines()
            if ln.startswith("# box-stack:")]
if made_for and "torch" not in " ".join(missing) and "triton" not in " ".join(missing):
    import torch, triton
    want = dict(x.split("==", 1) for x in made_for[0] if "==" in x)
    have = {"torch": torch.__version__, "triton": triton.__version__}
    if all(have.get(k) == v for k, v in want.items()):
        print(f"wheels: the bundle was made for this box's pair (torch {have['torch']}, triton {have['triton']})")
    else:
        print(f"wheels: NOT THE TESTED PAIR: the bundle was made for {' '.join(made_for[0])}, this box has "
              f"torch=={have['torch']} triton=={have['triton']} (the bundle installs neither; results are recorded)")
PYEOF
}

tests_stage() {
    local extra=() args ids rc left
    read -r -a args <<< "$PYTEST_ARGS"
    read -r -a ids <<< "$GPU_TESTS"
    # pyproject's addopts name --benchmark-disable, which needs pytest-benchmark: drop them when it is absent
    "$PY" -c "import pytest_benchmark" 2>/dev/null || extra+=(-o "addopts=-ra")
    [[ -n "$TEST_SELECT" ]] && extra+=(-k "$TEST_SELECT")
    GPU_CHECK_TEST_LOG="$OUT/tests.log" GPU_CHECK_TEST_BUDGET_S="$((T_TESTS - 15))" GPU_CHECK_TEST_T0="$(date +%s)" \
        "$PY" -m pytest "${ids[@]}" -m gpu -p no:randomly -p no:cacheprovider -p gpu_check_testlog \
        --junitxml="$WORK/pytest.xml" ${extra[@]+"${extra[@]}"} ${args[@]+"${args[@]}"}
    rc=$?
    # the plugin's budget line (`# time budget 45 s spent: N tests not started`) -> the stage's status
    left="$(sed -n 's/^# time budget .* spent: \([0-9]*\) tests not started$/\1/p' "$OUT/tests.log" | tail -n 1)"
    [[ -n "$left" ]] && echo "budget: $left not started" > "$WORK/stage.note"
    return $rc
}

# sweep EXPERIMENT ARGS...: the first sweep creates the run, the later ones join it (resume=)
sweep() {
    local experiment=$1 where dir
    shift
    dir="$(run_dir)"
    if [[ -n "$dir" ]]; then where="resume=$dir"; else where="run_id=$RUN_ID"; fi
    "$PY" -m "experiments.$experiment" "out_dir=$WORK/results" "$where" progress=false \
        "hydra.run.dir=$WORK/hydra/$experiment" "$@"
}

headline_stage() {
    local extra
    read -r -a extra <<< "$HEADLINE_ARGS"
    if (( DRY_RUN )); then       # CPU: the smoke sweep (tiny models, torch backend: conf/sweep/smoke.yaml on_cpu)
        sweep kernel_decode sweep=smoke ${extra[@]+"${extra[@]}"} && \
            sweep kernel_spec sweep=smoke ${extra[@]+"${extra[@]}"}
        return
    fi
    # short timing windows: 20 headline points must fit with their compiles; rows record the settings
    local common=(sweep=paper timing.warmup_ms=10 timing.rep_ms=40 "sweep.state_dtype=[float32]"
                  "sweep.act_dtype=[bfloat16]")
    sweep kernel_decode "${common[@]}" "sweep.models=[nemotron3_super_120b]" "sweep.batch=[64,256,512]" \
        "sweep.buffer_len=[8,16]" method=all ${extra[@]+"${extra[@]}"} || return 1
    sweep kernel_decode "${common[@]}" "sweep.models=[qwen35_122b_a10b,kimi_linear_48b_a3b]" \
        "sweep.batch=[64,256,512]" "sweep.buffer_len=[16]" method=all ${extra[@]+"${extra[@]}"} || return 1
    sweep kernel_spec "${common[@]}" "sweep.models=[nemotron3_super_120b,qwen35_122b_a10b,kimi_linear_48b_a3b]" \
        "sweep.batch=[128,512]" "sweep.spec_T=[4]" "sweep.acceptance=[{kind: rate, p: 0.8}]" \
        "method.names=[baseline_spec,replay_spec,commit_replay_spec]" ${extra[@]+"${extra[@]}"} || return 1
    sweep kernel_spec "${common[@]}" "sweep.models=[nemotron3_super_120b,qwen35_122b_a10b]" \
        "sweep.batch=[128]" "sweep.spec_T=[6]" "sweep.acceptance=[{kind: rate, p: 0.8}]" \
        "method.names=[baseline_spec,replay_spec,commit_replay_spec]" ${extra[@]+"${extra[@]}"}
}

e2e_stage() {
    local extra
    read -r -a extra <<< "$E2E_ARGS"
    if (( DRY_RUN )); then       # CPU: the e2e / serving CPU sweeps, one tiny model, one batch
        sweep e2e_decode sweep=e2e_cpu "sweep.models=[tiny_mamba2]" "sweep.batch=[1]" ${extra[@]+"${extra[@]}"} && \
            sweep serving sweep=serving_cpu "sweep.models=[tiny_mamba2]" "sweep.batch=[1]" ${extra[@]+"${extra[@]}"}
        return
    fi
    sweep e2e_decode sweep=paper_e2e "sweep.models=[nemotron3_nano_4b,qwen35_4b]" "sweep.batch=[256]" \
        "sweep.context_len=[1024]" timing.warmup_ms=10 timing.rep_ms=40 ${extra[@]+"${extra[@]}"} || return 1
    # serving: the claims' pair (ReplaySSM over native spec) only; ar and commit_replay did not fit first contact
    sweep serving sweep=paper_serving "sweep.models=[nemotron3_nano_4b]" "sweep.batch=[128]" "sweep.spec_T=[4]" \
        "sweep.modes=[native,replayssm]" "sweep.acceptance=[{kind: rate, p: 0.8}]" sweep.at_concurrency=false \
        timing.warmup_ms=10 timing.rep_ms=40 ${extra[@]+"${extra[@]}"}
}

dram_stage() {
    local args
    read -r -a args <<< "$DRAM_ARGS"
    "$PY" scripts/kernels/dram_traffic.py --out "$WORK/dram.csv" "${args[@]}"
}

report_stage() {
    local dir rc=0 prog left
    dir="$(run_dir)"
    if [[ -z "$dir" ]]; then
        echo "no run directory under $WORK/results (did the sweeps run?)"
        return 1
    fi
    # whatever the earlier stages wrote (a cut e2e leaves no whole-model rows, a cut headline fewer points): each
    # program runs even if one before it failed; aggregate first (the others read its summary)
    for prog in "aggregate.py $dir" "hybrid_summary.py $dir" "tables.py $dir --quiet" "claims.py $dir"; do
        # shellcheck disable=SC2086
        "$PY" scripts/report/$prog || { echo "report: scripts/report/$prog failed"; rc=1; }
    done
    [[ -f "$dir/REPORT.md" ]] && grep '^|' "$dir/REPORT.md"   # the claims table: this GPU against the paper
    # the plots last, in the time left (SECONDS counts from this stage's shell): cut, they leave the table above
    left=$((T_REPORT - SECONDS - 2))
    if (( left < 3 )); then
        echo "report: no time left for the plots"
        (( rc )) || { echo "partial: plots not drawn" > "$WORK/stage.note"; rc=10; }
    else
        timeout -k 1 "$left" "$PY" scripts/report/plots.py "$dir"
        case $? in
            0) ;;
            124|137) echo "report: plots cut after ${left} s"
                     (( rc )) || { echo "partial: plots cut" > "$WORK/stage.note"; rc=10; } ;;
            *) echo "report: scripts/report/plots.py failed"; rc=1 ;;
        esac
    fi
    return $rc
}

want env && run_stage env env_stage
if want wheels && [[ -n "${WHEELS:-}" ]]; then
    WHEELS="$(cd "$WHEELS" && pwd)"
    run_stage wheels wheels_stage "$WHEELS"
    [[ -d "$SITE" ]] && export PYTHONPATH="$SITE:$PYTHONPATH"
fi
if want launch; then
    (( DRY_RUN )) && skip_gpu launch_gpu "$PY -m experiments.launch_floor --out WORK (CUDA: graph, eager, host" \
        "at batch 1 on the headline geometries); here: --plan, then the host mode on the tiny models (interpreter)"
    run_stage launch launch_stage
fi
if want tests; then
    if (( DRY_RUN )); then
        skip_gpu tests "TRITON_INTERPRET=0 REPLAYSSM_TEST_DEVICE=cuda $PY -m pytest $GPU_TESTS -m gpu" \
            "-p gpu_check_testlog --junitxml=pytest.xml $PYTEST_ARGS"
    else
        run_stage tests tests_stage
    fi
fi
if want headline; then
    (( DRY_RUN )) && skip_gpu headline_gpu "sweep=paper: Super-120B / Qwen3.5-122B, b64/256/512, L8/16, T4/T6 (the" \
        "GPU commands are headline_stage in this script); here: sweep=smoke on the CPU"
    run_stage headline headline_stage
fi
if want e2e; then
    (( DRY_RUN )) && skip_gpu e2e_gpu "sweep=paper_e2e Nano-4B + Qwen3.5-4B b256; sweep=paper_serving Nano-4B T4" \
        "b128; here: the CPU sweeps on tiny_mamba2"
    run_stage e2e e2e_stage
fi
if want dram; then
    if (( DRY_RUN )); then
        skip_gpu dram "$PY scripts/kernels/dram_traffic.py --out dram.csv $DRAM_ARGS (ncu)"
    else
        run_stage dram dram_stage
    fi
fi
want report && run_stage report report_stage
pack

if (( ${#SKIPPED_GPU[@]} )); then
    printf '\n==== dry run: GPU commands skipped here (run them on the GPU box: bash scripts/gpu/gpu_check.sh OUT)\n'
    printf '  %s\n' "${SKIPPED_GPU[@]}"
fi
printf '\n==== summary (%s)\n' "$OUT/summary.txt"
cat "$OUT/summary.txt"
echo "files: $(cd "$OUT" && ls | tr '\n' ' ')"
if (( ${#FAILED[@]} )); then
    echo "FAILED: ${FAILED[*]}"
    exit 1
fi
echo "all stages passed"
