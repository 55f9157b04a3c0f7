#!/usr/bin/env bash
# `make reproduce`: sweep -> aggregate -> tables -> plots -> claims report, on whatever this box has.
#
#   GPU (torch.cuda.is_available()): the paper sweep of both kernel experiments (sweep=paper, hardware
#       auto-detected, the five production models; Ultra at TP2 as in the paper), into ONE run directory.
#   CPU: the embedded default: the CPU micro-benchmarks (make bench-cpu) and the CPU sweeps of both
#       experiments (sweep=cpu, backend=cpu: the fused C/OpenMP kernels), the tree-speculation sweep
#       (sweep=tree_cpu, its own run <RUN_ID>-tree), then the same scripts. CPU numbers are labelled as such.
#
# Then the whole-model experiments e2e_decode and serving (experiments/hybrid; GPU: sweep=paper_e2e /
# paper_serving, CPU: e2e_cpu / serving_cpu, a few minutes) join the same run with resume=.
# All experiments write into one run (kernel_spec resumes the kernel_decode run directory), so every ratio,
# including "spec over standard decode", comes from rows of one run. The run lands in
# results/<hardware>/<run-id>/ with rows.csv, env.json, summary.csv, TABLES.md, plots/ and REPORT.md; the
# accuracy study (experiments/accuracy.py) joins it too, as accuracy.csv.
#
# Resume: `RUN_ID=<id> make reproduce` after a kill continues the run results/*/<id>/ (every experiment with
# resume=: points already in it are skipped, none is written twice; the run directory is locked while a
# process writes it), then rewrites the report from all its rows.
# Time: on a GPU the estimate of the paper sweep (experiments/budget_estimate.py) is printed first;
# BUDGET_MIN=N runs each experiment's points that answer the published claims first and stops before the next
# point once N minutes (less 2 for the report) have passed, then writes the report over what ran.
# Several GPUs: GPUS=N (local, Hydra's joblib launcher, one process per GPU) or SHARDS=N LAUNCHER=slurm
# (conf/hydra/launcher/slurm.yaml, hydra-submitit-launcher): each kernel / whole-model experiment runs as a
# Hydra multirun of N shards (a point's shard: its config_hash mod N), all writing the one run directory.
#
# Launch configs: on a GPU without a launch table (replayssm/launch_tables/) the claims' points are tuned first
# (experiments/tune.py); every run's env.json names the table its rows read (launch_source=tuned).
# Environment: TUNE (1: tune when the GPU has no table, 0: never), PY (python to use; default .venv/bin/python), RESULTS (default results), RUN_ID (default
# reproduce-<UTC time>-<git sha>), BUDGET_MIN, GPUS, SHARDS, LAUNCHER (joblib | slurm), PAPER_MODELS (GPU model list, Hydra syntax), SWEEP (override the sweep
# name), EXTRA (extra Hydra overrides for both experiments, e.g. "sweep.batch=[1,64]"); the vLLM stage:
# ENGINE_SWEEP (default vllm_paper), ENGINE_MODELS (default [nemotron3_nano_4b,qwen35_4b]), ENGINE_EXTRA; stages:
# PRODUCTION=0 / FORMATS=0 skip the production-shape / state-format sweeps.
set -euo pipefail

cd "$(dirname "$0")/.."
# the report programs (scripts/report/*.py) import the experiments package: importable from here even when
# PY is a python without this checkout installed (a GPU box with PY=python)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PY:-.venv/bin/python}"
RESULTS="${RESULTS:-results}"
SHA="$(git rev-parse --short=7 HEAD 2>/dev/null || echo nogit)"
RUN_ID="${RUN_ID:-reproduce-$(date -u +%Y%m%dT%H%M%SZ)-${SHA}}"
PAPER_MODELS="${PAPER_MODELS:-[nemotron3_nano_4b,nemotron3_super_120b,nemotron3_ultra_550b@tp2,qwen35_4b,qwen35_122b_a10b,kimi_linear_48b_a3b]}"
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
MISSING=()
START=$(date +%s)
# Budget and shards: Hydra overrides every experiment gets (BUDGET_ARGS) and the kernel / whole-model ones run
# as a multirun of SHARDS jobs (SHARD_ARGS).
BUDGET_ARGS=()
if [[ -n "${BUDGET_MIN:-}" ]]; then
    [[ "$BUDGET_MIN" =~ ^[0-9]+$ ]] || { echo "reproduce: BUDGET_MIN=$BUDGET_MIN: expected whole minutes" >&2; exit 2; }
    BUDGET_ARGS=("budget.deadline=$((START + BUDGET_MIN * 60 - 120))" "budget.claims_first=true")
fi
SHARDS="${SHARDS:-${GPUS:-1}}"
LAUNCHER="${LAUNCHER:-joblib}"
SHARD_ARGS=()
if (( SHARDS > 1 )); then
    case "$LAUNCHER" in
        joblib) SHARD_ARGS=(--multirun hydra/launcher=joblib "hydra.launcher.n_jobs=${SHARDS}") ;;
        slurm) SHARD_ARGS=(--multirun hydra/launcher=slurm) ;;
        *) echo "reproduce: LAUNCHER=$LAUNCHER: expected joblib or slurm" >&2; exit 2 ;;
    esac
    SHARD_ARGS+=("shard.count=${SHARDS}" "shard.index=range(0,${SHARDS})")
fi
# where Hydra writes its own logs for one experiment (a multirun: its sweep dir, shared by the shards)
hydra_dir() {
    if (( SHARDS > 1 )); then echo "hydra.sweep.dir=outputs/reproduce/${RUN_ID}/$1"; else
        echo "hydra.run.dir=outputs/reproduce/${RUN_ID}/$1"; fi
}

stage() { printf '\n==== %s\n' "$*" >&2; }

# A stage whose module is not in the tree yet is reported and skipped; a stage that exists and fails stops
# the script (set -e).
have_module() {
    "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null
}
skip_missing() {
    printf '!!!! stage "%s" skipped: %s is not there (not written yet?)\n' "$1" "$2" >&2
    MISSING+=("$1")
}

if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "reproduce: $PY cannot import torch; run 'make venv' first or set PY=<python with torch>" >&2
    exit 2
fi
GPU="$("$PY" -c 'import torch; print(torch.cuda.is_available())')"
if [[ "$GPU" == "True" ]]; then
    SWEEP="${SWEEP:-paper}"
    MODEL_ARGS=("sweep.models=${PAPER_MODELS}")
    CPU_DECODE_ARGS=() CPU_SPEC_ARGS=()
    # Real kernels on the GPU: never the interpreter.
    export TRITON_INTERPRET=0
    stage "GPU: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))'); sweep=${SWEEP}; run ${RUN_ID}"
    # the estimate before any work (point counts x calibrated per-point costs); informational, never fatal
    "$PY" -m experiments.budget_estimate || echo "reproduce: no estimate (experiments/budget_estimate.py failed)" >&2
    (( SHARDS > 1 )) && echo "reproduce: ${SHARDS} shards (${LAUNCHER}): about 1/${SHARDS} of the device time each" >&2
    # Launch tables (replayssm/launch_tables/<gpu>.json): a GPU model without one tunes the launch configs of
    # the claims' points first (python -m experiments.tune: every kernel, baselines and ReplaySSM alike; the
    # estimate above counts it), then the sweeps read it; a committed table is reused as it is. TUNE=0 skips
    # tuning (every row then says launch_source=default).
    if [[ "${TUNE:-1}" == 1 ]]; then
        if "$PY" -c 'import sys; from replayssm import launch_table as t; from replayssm.checks import kernel_arch
sys.exit(0 if t.has_table(t.device_name(kernel_arch("cuda"))) else 1)'; then
            stage "launch table: this GPU's table exists: reused (replayssm/launch_tables/)"
        else
            stage "launch table: none for this GPU: python -m experiments.tune (the claims' points of sweep=${SWEEP})"
            "$PY" -m experiments.tune -- "sweep=${SWEEP}" ${MODEL_ARGS[@]+"${MODEL_ARGS[@]}"} \
                ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
        fi
    fi
else
    SWEEP="${SWEEP:-cpu}"
    MODEL_ARGS=()           # sweep=cpu lists its own models (tiny ones and TP8 splits of the large ones)
    # Cold CPU points stream 100+ MB per step from DRAM, so one sample is already long: fewer samples (7 for
    # decode, 5 after 1 warm-up for spec, not 11) and 18 spec steps (the 3 flushes history 8 needs) keep the
    # run within a few minutes on 2 cores, and the spec experiment runs batch 8 only (DRAM-bound there;
    # batch 32 alone would take ~5 minutes, batch 1 is cache-resident). Recorded in each run's env.json
    # (timing) and config.yaml like every other setting.
    CPU_DECODE_ARGS=("timing.cpu_repeats=7")
    CPU_SPEC_ARGS=("timing.cpu_repeats=5" "timing.cpu_warmup=1" "timing.spec_steps=18" "sweep.batch=[8]")
    stage "CPU: no CUDA device; the embedded CPU default (cpu backend, sweep=${SWEEP}); run ${RUN_ID}"
fi

# ---------------------------------------------------------------------------------------------- sweeps
RUN_DIR=""
find_run_dir() {
    local found
    found="$(ls -d "${RESULTS}"/*/"${RUN_ID}" 2>/dev/null | head -n 1 || true)"
    [[ -n "$found" ]] && RUN_DIR="$found"
    return 0
}
find_run_dir                       # RUN_ID of an earlier (killed) run: every experiment resumes it
[[ -n "$RUN_DIR" ]] && stage "resuming ${RUN_DIR}: points already in it are skipped"
# A new CPU run measures its own cold-point probe (the bandwidth plateau that sizes the layer stacks) with its
# first sweep; the later stages reuse that measurement from the per-machine cache. A probe cached by another
# process (make bench-cpu refreshes it) may have sampled a busier machine and would size this run's stacks.
if [[ "$GPU" != "True" && -z "$RUN_DIR" ]]; then
    CPU_DECODE_ARGS+=("timing.cpu_cold_probe=fresh")
fi

# One kernel sweep into the run: the experiment's CPU timing arguments, then shards, budget and extra arguments.
# Usage: kernel_sweep EXPERIMENT SWEEP HYDRA_DIR_NAME [override ...]
kernel_sweep() {
    local experiment="$1" sweep="$2" hydra_name="$3"
    shift 3
    local -a cpu_args=()
    # ${a[@]+"${a[@]}"}: an empty array expands to nothing under set -u on every bash
    if [[ "$experiment" == kernel_spec ]]; then
        cpu_args=(${CPU_SPEC_ARGS[@]+"${CPU_SPEC_ARGS[@]}"})
    else
        cpu_args=(${CPU_DECODE_ARGS[@]+"${CPU_DECODE_ARGS[@]}"})
    fi
    "$PY" -m "experiments.${experiment}" ${SHARD_ARGS[@]+"${SHARD_ARGS[@]}"} "sweep=${sweep}" "$@" progress=false \
        "$(hydra_dir "$hydra_name")" ${cpu_args[@]+"${cpu_args[@]}"} ${BUDGET_ARGS[@]+"${BUDGET_ARGS[@]}"} \
        ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
}

for experiment in kernel_decode kernel_spec; do
    if ! have_module "experiments.${experiment}"; then
        skip_missing "sweep ${experiment}" "module experiments.${experiment}"
        continue
    fi
    if [[ -z "$RUN_DIR" ]]; then
        where=("out_dir=${RESULTS}" "run_id=${RUN_ID}")
    else
        where=("resume=${RUN_DIR}")                # the second experiment joins the same run
    fi
    stage "sweep: python -m experiments.${experiment} sweep=${SWEEP} ${where[*]}"
    kernel_sweep "$experiment" "$SWEEP" "$experiment" ${MODEL_ARGS[@]+"${MODEL_ARGS[@]}"} "${where[@]}"
    find_run_dir
done

# The production shape (conf/sweep/production.yaml, production_cpu.yaml on a CPU): the headline models with
# the rows' cursors staggered over the cycle beside aligned, and a pool four times the batch, into the same
# run; its aligned points at pool = batch equal points of the sweep above and resume from them. PRODUCTION=0
# skips it; a SWEEP other than the defaults (smoke, a custom grid) skips it too.
if [[ "$GPU" == "True" ]]; then PROD_SWEEP="production"; else PROD_SWEEP="production_cpu"; fi
if [[ "${PRODUCTION:-1}" == 1 && -n "$RUN_DIR" && ( "$SWEEP" == paper || "$SWEEP" == cpu ) ]]; then
    for experiment in kernel_decode kernel_spec; do
        have_module "experiments.${experiment}" || continue
        stage "production shape: python -m experiments.${experiment} sweep=${PROD_SWEEP} resume=${RUN_DIR}"
        kernel_sweep "$experiment" "$PROD_SWEEP" "${experiment}-production" "resume=${RUN_DIR}"
    done
fi

# Kernel rows at every state format (conf/sweep/state_formats.yaml: float32 .. float16_sr / bfloat16_sr .. int8 /
# float8_e4m3fn, baseline and ReplaySSM AR at the headline batches on a GPU; tiny models on torch on a CPU), into
# the same run; a (route, format) without kernels is a recorded refusal. FORMATS=0 skips it, as does a custom SWEEP.
if [[ "${FORMATS:-1}" == 1 && -n "$RUN_DIR" && ( "$SWEEP" == paper || "$SWEEP" == cpu ) ]] \
        && have_module experiments.kernel_decode; then
    stage "state formats: python -m experiments.kernel_decode sweep=state_formats resume=${RUN_DIR}"
    kernel_sweep kernel_decode state_formats kernel_decode-formats "resume=${RUN_DIR}" \
        "method.names=[baseline_ar,replay_ar]"
fi

# ------------------------------------------------- whole-model experiments (experiments/hybrid), same run
# e2e_decode (a hybrid model's decode step, baseline vs ReplaySSM AR) and serving (speculative serving with an
# MTP drafter, modes ar / native / replayssm / commit_replay) join the run directory like kernel_spec does.
# GPU: sweep=paper_e2e / paper_serving; CPU: e2e_cpu / serving_cpu (tiny models + Nano-4B, Super-120B, Qwen3.5-122B at TP8,
# composed). HYBRID_EXTRA: extra Hydra overrides for these two (their sweep keys differ from the kernels').
read -r -a HYBRID_ARGS <<< "${HYBRID_EXTRA:-}"
for experiment in e2e_decode serving; do
    if ! have_module "experiments.${experiment}"; then
        skip_missing "sweep ${experiment}" "module experiments.${experiment}"
        continue
    fi
    name="${experiment%_decode}"                     # e2e | serving
    if [[ "$GPU" == "True" ]]; then hsweep="paper_${name}"; else hsweep="${name}_cpu"; fi
    if [[ -z "$RUN_DIR" ]]; then
        where=("out_dir=${RESULTS}" "run_id=${RUN_ID}")
    else
        where=("resume=${RUN_DIR}")
    fi
    stage "sweep: python -m experiments.${experiment} sweep=${hsweep} ${where[*]}"
    "$PY" -m "experiments.${experiment}" ${SHARD_ARGS[@]+"${SHARD_ARGS[@]}"} "sweep=${hsweep}" "${where[@]}" \
        progress=false "$(hydra_dir "$experiment")" ${BUDGET_ARGS[@]+"${BUDGET_ARGS[@]}"} \
        ${HYBRID_ARGS[@]+"${HYBRID_ARGS[@]}"}
    find_run_dir
done

if [[ -z "$RUN_DIR" ]]; then
    echo "reproduce: no run directory ${RESULTS}/*/${RUN_ID} was produced (stages missing: ${MISSING[*]:-none})" >&2
    exit 1
fi

# ------------------------------------------------------- accuracy study (experiments/accuracy.py), same run
# Joins the kernel sweeps' run directory (resume=): accuracy.csv beside rows.csv, its own env/config copy.
# GPU: sweep=accuracy_paper (10,000 steps, Triton); CPU: sweep=accuracy_cpu (2,000 steps, torch, every state
# format, the new ones over 1,000 long_memory steps; ~5 min on
# 2 cores). ACC_SWEEP overrides the sweep name. EXTRA is not passed: its keys are the kernel sweeps'.
if have_module "experiments.accuracy"; then
    if [[ "$GPU" == "True" ]]; then ACC_SWEEP="${ACC_SWEEP:-accuracy_paper}"; else ACC_SWEEP="${ACC_SWEEP:-accuracy_cpu}"; fi
    stage "accuracy: python -m experiments.accuracy sweep=${ACC_SWEEP} resume=${RUN_DIR}"
    "$PY" -m experiments.accuracy "sweep=${ACC_SWEEP}" "resume=${RUN_DIR}" progress=false \
        "hydra.run.dir=outputs/reproduce/${RUN_ID}/accuracy" ${BUDGET_ARGS[@]+"${BUDGET_ARGS[@]}"}
else
    skip_missing "accuracy study" "module experiments.accuracy"
fi

# ------------------------------------------ tree speculation (experiments/kernel_tree.py), CPU sweep
# Its own run (tree rows carry the tree shape and acceptance columns): results/tree/cpu/<RUN_ID>-tree/ with
# tree_table.md and tree_tokens_per_s.png. No GPU path yet (the tree kernels are AOT-built, not timed).
if [[ "$GPU" != "True" ]]; then
    if have_module "experiments.kernel_tree"; then
        TREE_DIR="${RESULTS}/tree/cpu/${RUN_ID}-tree"
        if [[ -f "$TREE_DIR/tree_rows.csv" ]]; then        # a resumed run: the tree sweep (~2 min) already ran
            stage "tree: ${TREE_DIR} exists (kernel_tree has no per-point resume): kept as it is"
        else
            rm -rf "$TREE_DIR"                               # a killed tree sweep: it is short, run it again
            stage "tree: python -m experiments.kernel_tree sweep=tree_cpu run_id=${RUN_ID}-tree"
            "$PY" -m experiments.kernel_tree sweep=tree_cpu "out_dir=${RESULTS}" "run_id=${RUN_ID}-tree" \
                "hydra.run.dir=outputs/reproduce/${RUN_ID}/kernel_tree"
        fi
        "$PY" scripts/report/tree_plots.py "$TREE_DIR"
    else
        skip_missing "tree speculation" "module experiments.kernel_tree"
    fi
fi

# ------------------------------------------------------------------ CPU micro-benchmarks (make bench-cpu)
if [[ "$GPU" != "True" ]]; then
    if [[ -d benchmarks ]] && ls benchmarks/test_*.py >/dev/null 2>&1; then
        stage "CPU micro-benchmarks (make bench-cpu): log and JSON into ${RUN_DIR}"
        TRITON_INTERPRET=1 "$PY" -m pytest benchmarks -q -p no:randomly --benchmark-enable \
            --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
            --benchmark-json="${RUN_DIR}/bench_cpu.json" -s 2>&1 | tee "${RUN_DIR}/bench_cpu.txt"
    else
        skip_missing "CPU micro-benchmarks" "benchmarks/test_*.py"
    fi
fi

# ------------------------------------------- real engine: vLLM's own benchmarks (experiments/vllm_bench.py)
# Its own run directory (engine rows carry extra columns); without vLLM or a GPU every point is a skipped row
# with the reason and the exact commands (fast). A failure here is reported and the report still gets written.
ENGINE_DIR=""
if have_module "experiments.vllm_bench"; then
    ENGINE_RUN_ID="${RUN_ID}-vllm"
    ENGINE_LOG="outputs/reproduce/${RUN_ID}/vllm_bench.log"
    mkdir -p "$(dirname "$ENGINE_LOG")"
    stage "engine: python -m experiments.vllm_bench engine_sweep=${ENGINE_SWEEP:-vllm_paper} (ENGINE_MODELS, ENGINE_EXTRA)"
    read -r -a ENGINE_ARGS <<< "${ENGINE_EXTRA:-}"
    ENGINE_DIR="$(ls -d "${RESULTS}"/*/"${ENGINE_RUN_ID}" 2>/dev/null | head -n 1 || true)"
    if [[ -n "$ENGINE_DIR" ]]; then engine_where="resume=${ENGINE_DIR}"; else engine_where="run_id=${ENGINE_RUN_ID}"; fi
    if "$PY" -m experiments.vllm_bench "engine_sweep=${ENGINE_SWEEP:-vllm_paper}" \
        "engine_sweep.models=${ENGINE_MODELS:-[nemotron3_nano_4b,qwen35_4b]}" "out_dir=${RESULTS}" \
        "$engine_where" progress=false "hydra.run.dir=outputs/reproduce/${RUN_ID}/vllm_bench" \
        ${ENGINE_ARGS[@]+"${ENGINE_ARGS[@]}"} > "$ENGINE_LOG" 2>&1; then
        ENGINE_DIR="$(ls -d "${RESULTS}"/*/"${ENGINE_RUN_ID}" 2>/dev/null | head -n 1 || true)"
        tail -n 3 "$ENGINE_LOG" >&2
    else
        printf '!!!! engine stage failed (see %s); the report is written without it\n' "$ENGINE_LOG" >&2
    fi
    if [[ -n "$ENGINE_DIR" ]]; then
        "$PY" scripts/report/aggregate.py "$ENGINE_DIR"
        "$PY" scripts/report/tables.py "$ENGINE_DIR" --quiet
    fi
else
    skip_missing "engine benchmarks" "module experiments.vllm_bench"
fi

# ----------------------------------------------------------------------------- results -> report
if [[ "$GPU" == "True" ]]; then       # the launch table the rows read, beside them (provenance of "tuned")
    TABLE="$("$PY" -c 'from replayssm import launch_table as t; from replayssm.checks import kernel_arch
print(t.table_path(t.device_name(kernel_arch("cuda"))))')"
    [[ -f "$TABLE" ]] && cp "$TABLE" "$RUN_DIR/launch_table.json"
fi
stage "aggregate: ${RUN_DIR}/summary.csv"
"$PY" scripts/report/aggregate.py "$RUN_DIR"
stage "whole-model ratios: ${RUN_DIR}/hybrid_summary.csv"
"$PY" scripts/report/hybrid_summary.py "$RUN_DIR"
stage "tables: ${RUN_DIR}/TABLES.md"
"$PY" scripts/report/tables.py "$RUN_DIR"
stage "plots: ${RUN_DIR}/plots/"
"$PY" scripts/report/plots.py "$RUN_DIR"
stage "claims: ${RUN_DIR}/REPORT.md"
"$PY" scripts/report/claims.py "$RUN_DIR" ${ENGINE_DIR:+"$ENGINE_DIR"}     # engine rows answer e2e/serving claims

echo
echo "run directory: ${RUN_DIR}"
echo "report:        ${RUN_DIR}/REPORT.md"
if [[ -n "$ENGINE_DIR" ]]; then
    echo "engine run:    ${ENGINE_DIR}"
fi
if (( ${#MISSING[@]} )); then
    echo "skipped stages (not in the tree yet): ${MISSING[*]}" >&2
fi
