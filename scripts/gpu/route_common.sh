# Sourced by route_check.sh and tune_check.sh (not run by itself): what both do on the GPU box.
# Needs OUT, PY, WHEELS set and the repository root as the working directory.

# setup_run: a scratch WORK dir, the log tee'd into OUT/log.txt, the wheel bundle installed offline into WORK/site
setup_run() {
    WORK="$(mktemp -d)"
    exec > >(tee "$OUT/log.txt") 2>&1
    "$PY" -m pip install --no-index --no-deps --target "$WORK/site" "$WHEELS"/*.whl -q || exit 1
    export PYTHONPATH="$PWD:$WORK/site"
}

# route_sweep: kernel_decode at Qwen3.5-122B and Kimi-Linear (TP1), batch 256 / 512, L = 16, baseline_ar and
# replay_ar on both routes (the paper sweep's settings, short timing windows); the run directory -> OUT/rows.tar.gz
route_sweep() {
    "$PY" -m experiments.kernel_decode sweep=paper timing.warmup_ms=10 timing.rep_ms=40 "sweep.state_dtype=[float32]" \
        "sweep.act_dtype=[bfloat16]" "sweep.models=[qwen35_122b_a10b,kimi_linear_48b_a3b]" "sweep.batch=[256,512]" \
        "sweep.buffer_len=[16]" "method.names=[baseline_ar,replay_ar]" "out_dir=$WORK/results" progress=false \
        "hydra.run.dir=$WORK/hydra"
    tar czf "$OUT/rows.tar.gz" -C "$WORK" results
}
