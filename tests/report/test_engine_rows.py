"""Engine rows (level=engine) through aggregate / tables / claims: ratios within one run from what the engine
reported, non-ok rows kept out, and the claims report preferring engine rows for end-to-end and serving
claims (engine > e2e/serving > SSM-layer proxy) while kernel claims never use them."""

from __future__ import annotations

import random

import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.published import CLAIMS
from experiments.report import claims, tables
from experiments.report import runs as aggregate
from experiments.vllm.run import ENGINE_COLUMNS

GPU_ENV = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "torch": "2.13.0", "git_sha": "feedbeef",
           "level": "engine", "engine": {"version": "0.31.0", "dialect": "fork"}}


def engine_rows(run_id: str, rng: random.Random, batches=(256, 512)) -> tuple[list[dict], dict]:
    """Rows of every mode (serve bench, Qwen3.5-4B-like GDN model) with random engine-reported values."""
    rows, tps = [], {}
    for n in batches:
        for mode in ("standard", "native_spec", "replayssm_ar", "replayssm_spec"):
            spec = "spec" in mode
            value = rng.uniform(1000, 20000)
            tps[(mode, n)] = value
            row = {c: None for c in ENGINE_COLUMNS}
            row.update(experiment="vllm_bench", level="engine", family="gdn", model="qwen35_122b_a10b", tp=1,
                       method=f"vllm:{mode}", mode=mode, bench="serve", backend="vllm", batch=n, max_num_seqs=n,
                       spec_T=4 if spec else None, buffer_len=16 if mode == "replayssm_ar" else None,
                       history_len=16 if mode == "replayssm_spec" else None, dataset="random", temperature=0.0,
                       input_len=128, output_len=256, num_prompts=4 * n, tokens_per_s=value,
                       output_tokens_per_s=value, acceptance_length=3.1 if spec else None,
                       max_concurrency=rng.uniform(50, 700), status="ok", message="", run_id=run_id,
                       config_hash=f"{run_id}-{mode}-{n}")
            tps[("conc", mode, n)] = row["max_concurrency"]
            rows.append(row)
    return rows, tps


def test_engine_ratios_are_ratios_of_reported_values(tmp_path, rng):
    rows, tps = engine_rows("eng", rng)
    rows[-1]["status"] = "error"                 # replayssm_spec at 512 failed: no ratio may use it
    run = aggregate.load_run(syn.write_run(tmp_path, rows, hardware="h200", run_id="eng", env=GPU_ENV))
    s = aggregate.summarize(run.rows)
    eng = s.ratios[s.ratios["experiment"] == "vllm_bench"].set_index(["metric", "batch"])
    assert eng.loc[("ar_speedup", 256), "value"] == pytest.approx(tps[("replayssm_ar", 256)] / tps[("standard", 256)])
    assert eng.loc[("spec_vs_native", 256), "value"] == pytest.approx(
        tps[("replayssm_spec", 256)] / tps[("native_spec", 256)])
    assert eng.loc[("spec_vs_ar", 256), "value"] == pytest.approx(tps[("replayssm_spec", 256)] / tps[("standard", 256)])
    assert eng.loc[("concurrency", 256), "value"] == pytest.approx(
        tps[("conc", "replayssm_spec", 256)] / tps[("conc", "native_spec", 256)])
    assert ("spec_vs_native", 512) not in eng.index and ("ar_speedup", 512) in eng.index
    counts = s.counts.set_index(["method", "status"])
    assert counts.loc[("vllm:replayssm_spec", "error"), "in_ratios"] == 0
    text = tables.render(run)
    assert "Real engine: vLLM's own benchmarks" in text and "vllm:" not in text.split("Real engine")[0].split(
        "AR decode: medians")[1].split("###")[0]


def test_engine_pairs_never_cross_runs(tmp_path, rng):
    a, _ = engine_rows("run-a", rng, batches=(256,))
    b, _ = engine_rows("run-b", rng, batches=(256,))
    a = [r for r in a if r["mode"] != "standard"]          # run-a has no standard row: no ar_speedup there
    runs = [aggregate.load_run(syn.write_run(tmp_path / d, rows, hardware="h200", run_id=d, env=GPU_ENV))
            for d, rows in (("run-a", a), ("run-b", b))]
    s = aggregate.summarize(aggregate.concat_rows(runs))
    ar = s.ratios[(s.ratios["metric"] == "ar_speedup") & (s.ratios["experiment"] == "vllm_bench")]
    assert list(ar["run_id"]) == ["run-b"]


def test_claims_prefer_engine_rows_for_e2e_and_serving_claims(tmp_path, rng):
    rows, tps = engine_rows("eng", rng)
    kernel = syn.write_run(tmp_path / "k", syn.ar_rows(run_id="kern") + syn.spec_rows(run_id="kern"),
                           hardware="h200", run_id="kern", env=GPU_ENV)
    eng = syn.write_run(tmp_path / "e", rows, hardware="h200", run_id="eng", env=GPU_ENV)
    out = tmp_path / "REPORT.md"
    assert claims.main([str(kernel), str(eng), "--out", str(out)]) == 0
    measured = syn.measured_by_claim(out.read_text())
    by_key = {c.key: measured[c.text] for c in CLAIMS}
    expect = tps[("replayssm_spec", 512)] / tps[("native_spec", 512)]
    assert by_key["spec_vs_native"].startswith(f"{expect:.2f}x") and claims.ENGINE_NOTE in by_key["spec_vs_native"]
    ar = tps[("replayssm_ar", 512)] / tps[("standard", 512)]               # the claim's batch: 512
    assert by_key["e2e_ar"].startswith(f"{ar:.2f}x") and claims.ENGINE_NOTE in by_key["e2e_ar"]
    assert claims.ENGINE_NOTE in by_key["concurrency"] and claims.ENGINE_NOTE in by_key["spec_vs_standard"]
    for key in ("kernel_ar_nemotron3", "spec_kernel_vs_native", "headline_decode"):    # kernel claims: kernel rows
        assert claims.ENGINE_NOTE not in by_key[key], key
    # without engine rows the same serving claim falls back to the SSM-layer proxy of the kernel run
    assert claims.main([str(kernel), "--out", str(out)]) == 0
    assert claims.ENGINE_NOTE not in syn.measured_by_claim(out.read_text())[next(c.text for c in CLAIMS
                                                                     if c.key == "spec_vs_native")]
