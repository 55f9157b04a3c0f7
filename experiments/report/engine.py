"""Ratios of real-engine rows (level=engine, experiments/vllm_bench.py): ReplaySSM modes over vLLM's own modes.

Every ratio pairs two ok rows of the SAME run at the same engine point (model, tp, max-num-seqs, bench,
dataset, lengths, temperature); the value is the ratio of what vLLM's benchmark reported, never a derived
number. There is no p20/p80 band for an engine row (one benchmark run each): lo = hi = value.
    ar_speedup         replayssm_ar output tok/s / standard output tok/s
    spec_vs_native     replayssm_spec tok/s / native_spec tok/s
    spec_vs_ar         replayssm_spec tok/s / standard tok/s
    native_spec_vs_ar  native_spec tok/s / standard tok/s
    concurrency        replayssm_spec / native_spec "Maximum concurrency" from the engine's own KV-cache log
aggregate.summarize adds these to summary.csv (experiment vllm_bench); claims.py prefers them for end-to-end
and serving claims.
"""

from __future__ import annotations

import pandas as pd

ENGINE_LEVEL = "engine"
ENGINE_EXPERIMENT = "vllm_bench"
# (metric, numerator method, denominator method, measure column)
ENGINE_PAIRINGS = (
    ("ar_speedup", "vllm:replayssm_ar", "vllm:standard", "tokens_per_s"),
    ("spec_vs_native", "vllm:replayssm_spec", "vllm:native_spec", "tokens_per_s"),
    ("spec_vs_ar", "vllm:replayssm_spec", "vllm:standard", "tokens_per_s"),
    ("native_spec_vs_ar", "vllm:native_spec", "vllm:standard", "tokens_per_s"),
    ("concurrency", "vllm:replayssm_spec", "vllm:native_spec", "max_concurrency"),
)
POINT = ["_source", "run_id", "model", "tp", "batch", "bench", "dataset", "input_len", "output_len", "temperature"]
UNITS = {"tokens_per_s": "x (engine output tok/s ratio)", "max_concurrency": "x (engine max concurrency ratio)"}


def engine_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The ok engine rows of `rows` (empty when the run has none, e.g. a kernel-only run)."""
    if "level" not in rows.columns or "bench" not in rows.columns:
        return rows.iloc[0:0]
    return rows[(rows["level"].astype(str) == ENGINE_LEVEL) & (rows["status"] == "ok")]


def engine_ratios(rows: pd.DataFrame, columns) -> tuple[pd.DataFrame, list]:
    """(summary rows in `columns`, the `_rid`s of the rows used) for every engine pairing of `rows`."""
    eng = engine_rows(rows)
    frames, used = [], []
    if eng.empty:
        return pd.DataFrame(columns=list(columns)), used
    keyed = eng.assign(**{f"__{k}": eng[k].astype(str) for k in POINT if k in eng.columns})
    on = [f"__{k}" for k in POINT if k in eng.columns]
    for metric, num_m, den_m, measure in ENGINE_PAIRINGS:
        num = keyed[keyed["method"] == num_m]
        den = keyed[keyed["method"] == den_m]
        num, den = num[pd.to_numeric(num[measure], errors="coerce") > 0], den[pd.to_numeric(den[measure],
                                                                                          errors="coerce") > 0]
        if num.empty or den.empty:
            continue
        m = num.merge(den[on + [measure, "method", "_rid", "backend"]], on=on, suffixes=("", "_den"))
        if m.empty:
            continue
        out = m.reindex(columns=list(columns)).copy()
        out["metric"], out["experiment"] = metric, ENGINE_EXPERIMENT
        out["num_method"], out["den_method"] = m["method"], m["method_den"]
        out["num_backend"], out["den_backend"] = m["backend"], m["backend_den"]
        out["num_value"] = pd.to_numeric(m[measure])
        out["den_value"] = pd.to_numeric(m[f"{measure}_den"])
        out["value"] = out["num_value"] / out["den_value"]
        out["lo"] = out["hi"] = out["value"]
        out["value_unit"] = UNITS[measure]
        frames.append(out)
        used += m["_rid"].tolist() + m["_rid_den"].tolist()
    if not frames:
        return pd.DataFrame(columns=list(columns)), used
    return pd.concat(frames, ignore_index=True).reindex(columns=list(columns)), used


def engine_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The engine rows as reported (tables.py): one line per model x mode x bench x max-num-seqs."""
    cols = ["model", "mode", "bench", "max_num_seqs", "dataset", "status", "tokens_per_s", "requests_per_s",
            "ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms", "acceptance_length",
            "max_concurrency", "engine_version", "dialect"]
    if "level" not in rows.columns:
        return pd.DataFrame(columns=cols)
    eng = rows[rows["level"].astype(str) == ENGINE_LEVEL]
    return eng.reindex(columns=cols).sort_values(["model", "bench", "mode", "max_num_seqs"], kind="stable")
