#!/usr/bin/env bash
# scripts/gpu/route_check.sh OUT_DIR: the GDN / KDA replay routes side by side on one GPU, with the evidence for
# where the time goes. Needs the wheel bundle (WHEELS, default gpu_wheels: scripts/gpu/gpu_bundle.sh) and ncu.
#   1. kernel_decode at Qwen3.5-122B and Kimi-Linear (TP1), batch 256 / 512, L = 16: baseline_ar and replay_ar on
#      both routes, graph timing, cold L2 (the paper sweep's settings, short timing windows)
#   2. ncu at Qwen3.5-122B batch 256: DRAM bytes against the byte model and the section report (speed of light,
#      occupancy, warp states, memory workload) of the first two step-kernel launches, per method and route
# Files in OUT_DIR: rows.tar.gz (the run directory), dram.csv, ncu.tar.gz (the section reports), log.txt.
set -uo pipefail
OUT="$1"; PY="${PY:-python3}"; WHEELS="${WHEELS:-gpu_wheels}"
cd "$(dirname "$0")/../.."
source scripts/gpu/route_common.sh
setup_run
route_sweep
for route in output_only state_and_output; do
    methods=replay_ar; [[ $route == output_only ]] && methods=baseline_ar,replay_ar
    "$PY" scripts/kernels/dram_traffic.py --out "$WORK/dram-$route.csv" --model qwen35_122b_a10b --batch 256 \
        --buffer-len 16 --route "$route" --methods "$methods" --timeout 90 \
        --sections SpeedOfLight,Occupancy,LaunchStats,WarpStateStats,MemoryWorkloadAnalysis,SchedulerStats
done
{ cat "$WORK/dram-output_only.csv"; tail -n +2 "$WORK/dram-state_and_output.csv"; } > "$OUT/dram.csv"
tar czf "$OUT/ncu.tar.gz" -C "$WORK" $(cd "$WORK" && ls *.ncu.txt)
