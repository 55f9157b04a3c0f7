"""Markdown tables of one run: medians, speedups, achieved bandwidth, spec throughput and acceptance.

Reads only the run's files (rows.csv, env.json; summary.csv is recomputed from rows so it is never stale).
Every table is headed by the run's hardware, versions and commit, so a table pasted elsewhere still says
where it was measured.

CLI: python scripts/report/tables.py RUN_DIR [--out FILE]   (prints to stdout; writes RUN_DIR/TABLES.md by default)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from experiments.report import accuracy, hybrid
from experiments.report.engine import ENGINE_LEVEL, engine_table
from experiments.report.runs import (
    EXCLUDED_VERDICTS,
    SPEC_METHODS,
    SPEEDUP_METRICS,
    Run,
    describe_env,
    load_run,
    primary_rows,
    summarize,
)


def _cell(value, fmt: str | None = None) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        if fmt:
            return format(value, fmt)
        if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown_table(df: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """A GitHub-markdown table; numeric columns right-aligned. `formats` maps column -> format spec."""
    formats = formats or {}
    if df.empty:
        return "_(no rows)_\n"
    cols = list(df.columns)
    body = [[_cell(v, formats.get(c)) for c, v in zip(cols, row)] for row in df.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in cols]
    widths = [max(len(str(c)), *(len(r[i]) for r in body)) for i, c in enumerate(cols)]

    def line(cells):
        return "| " + " | ".join(s.rjust(w) if n else s.ljust(w) for s, w, n in zip(cells, widths, numeric)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if n else ("-" * (w + 2)) for w, n in zip(widths, numeric)) + "|"
    return "\n".join([line([str(c) for c in cols]), rule, *(line(r) for r in body)]) + "\n"


def env_line(run: Run) -> str:
    """One line naming hardware, versions and commit: the header of every table."""
    env = describe_env(run.env, run.path)
    parts = [f"**{env['hardware']}** ({env['kind']})"]
    for name in ("torch", "triton", "cuda", "driver", "python"):
        if env[name]:
            parts.append(f"{name} {env[name]}")
    if env["commit"]:
        dirty = " (dirty)" if env["dirty"] in (True, "true", "True", 1) else ""
        parts.append(f"commit {str(env['commit'])[:12]}{dirty}")
    parts.append(f"run `{run.run_id}`")
    if env["kind"] == "cpu":
        parts.append("CPU numbers (each row names its backend): not comparable to GPU claims")
    return " · ".join(parts)


def _section(title: str, run: Run, table: str, note: str = "") -> str:
    note = f"{note}\n\n" if note else ""
    return f"### {title}\n\n_{env_line(run)}_\n\n{note}{table}\n"


def _dtypes(df: pd.DataFrame) -> pd.Series:
    return df["state_dtype"].astype(str) + "/" + df["act_dtype"].astype(str)


def medians_table(run: Run, spec: bool) -> str:
    """Per-row medians with the p20..p80 band, flush step, achieved GB/s and % of peak, for the AR
    experiments (spec=False) or the spec ones (spec=True, with their standard-decode reference rows)."""
    rows = run.rows[run.rows["experiment"].astype(str).str.contains("spec") == spec]
    if "level" in rows.columns:                       # engine rows have no kernel medians: engine section
        rows = rows[rows["level"].astype(str) != ENGINE_LEVEL]
    if rows.empty:
        return "_(no rows)_\n"
    rows = rows.assign(dtypes=_dtypes(rows)).sort_values(["model", "tp", "batch", "spec_T", "buffer_len", "method"],
                                                         na_position="first")
    cols = ["experiment", "model", "tp", "batch", "buffer_len", "spec_T", "acceptance", "route", "dtypes",
            "backend", "method", "launch_source", "status", "median_us", "p20_us", "p80_us", "flush_us",
            "mean_accepted", "achieved_GBps", "pct_peak_measured", "pct_peak_datasheet"]
    table = rows[[c for c in cols if c in rows]].dropna(axis=1, how="all")
    return markdown_table(table, {"median_us": ".1f", "p20_us": ".1f", "p80_us": ".1f", "flush_us": ".1f",
                                  "mean_accepted": ".2f", "achieved_GBps": ".3g", "pct_peak_measured": ".3g",
                                  "pct_peak_datasheet": ".3g"})


def _fill_text(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """Pivots drop rows whose index keys are NA: a key column with any NA (or text) becomes text, "" for NA;
    complete numeric keys stay numbers so they sort as numbers."""
    fills = {}
    for k in cols:
        if not pd.api.types.is_numeric_dtype(df[k]) or df[k].isna().any():
            fills[k] = df[k].map(_cell).astype(str)
    return df.assign(**fills)


def _ratio_cell(row) -> str:
    """"1.42x [1.38-1.47]"; a ratio the byte model does not bound (aggregate's verdict) is not shown as a
    speedup: "not bandwidth-bound (3.09x vs byte model 1.57x)"."""
    verdict = row.get("verdict")
    if isinstance(verdict, str) and verdict in EXCLUDED_VERDICTS:
        model = f" vs byte model {row['bytes_ratio']:.2f}x" if pd.notna(row.get("bytes_ratio")) else ""
        return f"{verdict} ({row['value']:.2f}x{model})" + _launch_suffix(row)
    band = f" [{row['lo']:.2f}-{row['hi']:.2f}]" if pd.notna(row["lo"]) and pd.notna(row["hi"]) else ""
    return f"{row['value']:.2f}x{band}" + _launch_suffix(row)


def _launch_suffix(row) -> str:
    """" (default N.NNx)" beside a ratio against a tuned baseline (vLLM PR #48018's `tuned (default)`), and
    " [partner untuned]" when a tuned method met a default-config partner (aggregate's launch_note)."""
    out = ""
    if pd.notna(row.get("value_default")):
        out += f" (default {row['value_default']:.2f}x)"
    note = row.get("launch_note")
    if isinstance(note, str) and note:
        out += f" [{note}]"
    return out


def bound_table(ratios: pd.DataFrame) -> str:
    """Every speedup of the run beside its byte-model bound: measured, byte model, measured / byte model and
    aggregate's verdict (within byte model / not bandwidth-bound / cache-resident)."""
    r = ratios[ratios["metric"].isin(SPEEDUP_METRICS)]
    if r.empty:
        return "_(no speedups in this run)_\n"
    cols = ["metric", "model", "tp", "batch", "buffer_len", "route", "spec_T", "acceptance", "num_method",
            "den_method", "value", "value_default", "bytes_ratio", "measured_over_model", "verdict", "launch_note"]
    cols = [c for c in cols if c in r]
    table = r[cols].replace({"launch_note": {"": None}}).rename(columns={
                                    "value": "measured", "value_default": "vs default baseline",
                                    "launch_note": "launch", "bytes_ratio": "byte model",
                                    "measured_over_model": "measured / model"})
    table = table.sort_values(["metric", "model", "tp", "batch", "buffer_len", "spec_T"], na_position="first")
    return markdown_table(table.dropna(axis=1, how="all"),
                          {"measured": ".2f", "vs default baseline": ".2f", "byte model": ".2f",
                           "measured / model": ".2f"})


def ar_speedup_table(ratios: pd.DataFrame) -> str:
    """Speedup baseline_ar / replay_ar: one row per (model, batch, ...), one column per buffer_len and route."""
    ar = ratios[ratios["metric"] == "ar_speedup"]
    if ar.empty:
        return "_(no AR speedups in this run)_\n"
    ar = ar.assign(dtypes=_dtypes(ar), cell=ar.apply(_ratio_cell, axis=1), L=ar["buffer_len"].map(_cell))
    index = ["experiment", "model", "tp", "route", "dtypes", "backend", "timing_mode", "batch"]
    ar = _fill_text(ar, index)
    wide = ar.pivot_table(index=index, columns="L", values="cell", aggfunc="first").reset_index()
    settings = sorted(ar["L"].unique(), key=lambda v: float(v) if v.replace(".", "", 1).isdigit() else math.inf)
    wide = wide[index + settings].rename(columns={v: f"L={v}" for v in settings}).sort_values(["model", "batch"])
    wide.columns.name = None
    return markdown_table(wide)


def spec_table(run: Run, ratios: pd.DataFrame) -> str:
    """Spec throughput per method with mean accepted length and the ratios, one row per point."""
    spec = primary_rows(run.rows[(run.rows["method"].isin(SPEC_METHODS)) & (run.rows["status"] == "ok")])
    if spec.empty:
        return "_(no spec rows in this run)_\n"
    index = ["model", "tp", "batch", "spec_T", "acceptance", "backend"]
    spec = _fill_text(spec, index)
    tps = spec.pivot_table(index=index, columns="method", values="tokens_per_s", aggfunc="max").add_prefix("tok/s ")
    acc = spec.groupby(index)["mean_accepted"].mean().rename("mean accepted")
    wide = pd.concat([acc, tps], axis=1).reset_index()
    for metric in ("spec_vs_native", "spec_vs_commit", "spec_vs_ar"):
        r = ratios[ratios["metric"] == metric]
        if r.empty:
            continue
        r = _fill_text(r, index)
        cells = r.assign(**{metric: r.apply(_ratio_cell, axis=1)}).groupby(index)[metric].first()
        wide = wide.merge(cells.reset_index(), on=index, how="left")
    fmt = {c: ".0f" for c in wide.columns if c.startswith("tok/s")}
    return markdown_table(wide.sort_values(["model", "spec_T", "batch"]), {**fmt, "mean accepted": ".2f"})


def bench_cpu_table(run: Run) -> str | None:
    """The CPU micro-benchmarks (make bench-cpu) that `make reproduce` stores as bench_cpu.json in the run
    directory: per-step medians (a ReplaySSM flush cycle divided by its L steps) and baseline / ReplaySSM
    per family. None when the run has no such file."""
    path = run.path / "bench_cpu.json"
    if not path.is_file():
        return None
    records = []
    for b in json.loads(path.read_text()).get("benchmarks", []):
        info, stats = b.get("extra_info", {}), b.get("stats", {})
        steps = info.get("steps") or (info.get("buffer_len", 1) if "cycle" in str(info.get("per", "")) else 1)
        records.append({"benchmark": b.get("name"), "family": b.get("param"), "model": info.get("model"),
                        "batch": info.get("batch"), "L": info.get("buffer_len"),
                        "ms per step": stats.get("median", math.nan) * 1e3 / steps,
                        "IQR ms per step": stats.get("iqr", math.nan) * 1e3 / steps,
                        "rounds": stats.get("rounds"), "flush ms": info.get("flush_ms"), "form": info.get("form")})
    table = pd.DataFrame(records)
    if table.empty:
        return None
    per_step = table.set_index("benchmark")["ms per step"]
    table["baseline / replay"] = [
        per_step.get(f"test_baseline_ar[{family}]", math.nan) / per_step[name]
        if str(name).startswith("test_replay_ar") else math.nan
        for name, family in zip(table["benchmark"], table["family"])]
    return markdown_table(table, {"ms per step": ".2f", "IQR ms per step": ".2f", "flush ms": ".2f",
                                  "baseline / replay": ".2f"})


def counts_table(counts: pd.DataFrame) -> str:
    return markdown_table(counts.sort_values(["experiment", "method", "status"]))


PHASE_COLUMNS = ["cache_resident", "ms_per_step", "verify_ms", "commit_ms", "tokens_per_s", "ssm_share",
                 "ssm_bytes"]
PHASE_FORMATS = {"ms_per_step": ".3f", "verify_ms": ".3f", "commit_ms": ".3f", "tokens_per_s": ".1f",
                 "ssm_share": ".2f", "ssm_bytes": ".3f"}


def _present(df: pd.DataFrame, cols: list[str]) -> list[str]:
    """The phase columns in ms (older rows without verify_us / commit_us / bytes: those columns left out)."""
    for us, ms in (("verify_us", "verify_ms"), ("commit_us", "commit_ms"), ("draft_us", "draft_ms")):
        if us in df:
            df[ms] = df[us] / 1e3
    if "ssm_byte_share" in df:
        df["ssm_bytes"] = df["ssm_byte_share"]
    cols = ["draft_ms" if c == "draft_us" else c for c in cols]
    return [c for c in cols if c in df]


KEYS = ["model", "tp", "batch", "context_len"]


def _whole_ratios(run: Run) -> pd.DataFrame:
    ratios = hybrid.hybrid_ratios(run.path)
    if not ratios.empty and "verdict" in ratios:
        ratios = ratios.assign(verdict=ratios["verdict"].fillna(""))
    return ratios


def e2e_table(run: Run, ratios: pd.DataFrame | None = None) -> pd.DataFrame:
    """The e2e_decode rows (ok) as reported: ms/step and its phases, tokens/s, the SSM shares, and the same-run
    speedup beside ReplaySSM's rows; empty when the run has no e2e_rows.csv."""
    e2e = hybrid.load(run.path, "e2e_rows.csv").copy()
    if e2e.empty:
        return e2e
    ratios = _whole_ratios(run) if ratios is None else ratios
    t = e2e[KEYS + ["method", "buffer_len", "composed"] + _present(e2e, PHASE_COLUMNS)].copy()
    sp = ratios[ratios["metric"] == "ar_speedup"] if not ratios.empty else pd.DataFrame(columns=KEYS + ["value"])
    t = t.merge(sp[KEYS + ["value"]].assign(method="replay_ar").rename(columns={"value": "speedup"}),
                on=KEYS + ["method"], how="left")
    return t.sort_values(KEYS + ["method"])


def serving_table(run: Run, ratios: pd.DataFrame | None = None) -> pd.DataFrame:
    """The serving rows (ok) as reported: per mode ms/step and its phases, tokens/s, max concurrency, and
    ReplaySSM's same-run ratios over native spec and AR (none for a cache-resident pair); empty without
    serving_rows.csv."""
    sv = hybrid.load(run.path, "serving_rows.csv").copy()
    if sv.empty:
        return sv
    ratios = _whole_ratios(run) if ratios is None else ratios
    t = sv[KEYS + ["mode", "spec_T", "mean_accepted"] + _present(sv, ["draft_us"] + PHASE_COLUMNS)
           + ["max_concurrency", "at_max_concurrency"]].copy()
    for metric, name in (("spec_vs_native", "vs native"), ("spec_vs_ar", "vs ar"),
                         ("concurrency", "concurrency vs native")):
        r = ratios[ratios["metric"] == metric] if not ratios.empty else pd.DataFrame(columns=KEYS + ["value"])
        if "verdict" in r:
            r = r[r["verdict"].fillna("") == ""]          # cache-resident pairs: no speedup shown
        r = r[KEYS + ["value"]].drop_duplicates(KEYS).rename(columns={"value": name})
        t = t.merge(r.assign(mode="replayssm"), on=KEYS + ["mode"], how="left")
    return t.sort_values(KEYS + ["mode"])


def whole_model_tables(run: Run) -> list[str]:
    """The e2e_decode and serving sections (e2e_rows.csv / serving_rows.csv of the run; none when absent):
    per row ms/step, tokens/s and the SSM layers' share, with the same-run ratio beside ReplaySSM's rows
    (experiments/report/hybrid.py pairs them)."""
    ratios = _whole_ratios(run)
    parts = []
    e2e = e2e_table(run, ratios)
    if not e2e.empty:
        parts.append(_section("Whole model: decode step (e2e_decode, random weights)", run,
                              markdown_table(e2e, PHASE_FORMATS | {"speedup": ".2f"}),
                              "ms/step of the whole decode step (SSM mixers, attention over the KV cache, MLP/MoE, "
                              "LM head) = verify (the forward) + commit (cursor / state advance), in ms; ssm_share = "
                              "the SSM layers' share of the time, ssm_bytes = their share of the step's analytic "
                              "bytes (weights + KV + SSM state and buffers); speedup = baseline_ar ms/step / "
                              "replay_ar ms/step of this run, left empty for a cache-resident pair (its SSM states "
                              "sat in the last-level cache: no measure of the bandwidth argument). composed = the "
                              "step is built from one block per layer kind and scaled by the pattern's counts."))
    sv = serving_table(run, ratios)
    if not sv.empty:
        parts.append(_section("Whole model: speculative serving (serving, random weights)", run,
                              markdown_table(sv,
                                             PHASE_FORMATS | {"mean_accepted": ".2f", "draft_ms": ".3f",
                                                              "vs native": ".2f", "vs ar": ".2f",
                                                              "concurrency vs native": ".2f"}),
                              "ms/step = draft (the MTP drafter's T - 1 passes) + verify (the model on the window) + "
                              "commit (SSM commit, conv shift, cursors), in ms; tokens/s = batch x mean accepted / "
                              "ms/step; a cache-resident pair shows no ratio; max_concurrency = "
                              "sequences that fit the HBM budget by the analytic footprint (weights + KV + SSM "
                              "states + buffers/rings); the ratios are ReplaySSM's over native / ar rows of this run."))
    return parts


def accuracy_tables(run: Run) -> list[str]:
    """The accuracy study's sections (accuracy.csv of the run; none when absent): the bf16-state table
    "ReplaySSM vs baseline error at 1k / 10k steps" and the growth exponents (experiments/report/accuracy.py)."""
    df = accuracy.load_accuracy(run.path)
    if df is None:
        return []
    bf16 = accuracy.bf16_table(df)
    unreached = [n for n in accuracy.TARGET_STEPS
                 if f"out base {n // 1000}k" in bf16 and bf16[f"out base {n // 1000}k"].isna().all()]
    bf16 = bf16[[c for c in bf16.columns if not any(c.endswith(f" {n // 1000}k") for n in unreached)]]
    fmt = {c: ".3g" for c in bf16.columns if c not in ("family", "model", "workload", "act", "L")}
    reach = f" Not reached in this run (columns left out): {', '.join(f'{n:,}' for n in unreached)} steps." \
        if unreached else ""
    growth = accuracy.growth_exponents(df)
    verdict = accuracy.claim_verdict(df)
    return [
        _section("bf16 state: ReplaySSM vs baseline error at 1k / 10k steps", run,
                 markdown_table(bf16, fmt) if len(bf16) else "(no bf16-state baseline_ar / replay_ar rows)",
                 "Relative error vs the float64 recurrence, median over rows x heads: `out` = the step's outputs "
                 "(pooled since the previous checkpoint), `state` = the committed state (ReplaySSM: materialised). "
                 "base/replay > 1: ReplaySSM is more accurate." + reach + " "
                 f"Fork claim ({accuracy.CLAIM_TEXT}): **{verdict['verdict']}**; {verdict['value']}."),
        _section("Accuracy: growth exponent of the error vs steps (log-log least squares)", run,
                 markdown_table(growth, {c: ".3g" for c in growth.columns if c.endswith(("_last", "_exponent"))}),
                 f"Slope of log(error median) on log(step) over checkpoints with step >= {accuracy.FIT_FROM}: "
                 "0 = flat, 0.5 = random-walk accumulation, 1 = linear drift. state_vs_writes_exponent: the "
                 "state error against the state's rounding writes (replay_ar: flushes = step // L; baseline_ar: "
                 f"steps), checkpoints with >= {accuracy.MIN_WRITES} writes."),
    ] + accuracy_drift_tables(run, df) + fp8_drift_tables(run, df)


def accuracy_drift_tables(run: Run, df: pd.DataFrame | None = None) -> list[str]:
    """The drift table "ReplaySSM vs baseline per dtype" (report/accuracy.py drift_table), in TABLES.md and
    REPORT.md; none without baseline_ar / replay_ar accuracy rows."""
    df = accuracy.load_accuracy(run.path) if df is None else df
    drift = accuracy.drift_table(df) if df is not None else pd.DataFrame()
    if drift.empty:
        return []
    fmt = {c: ".3g" for c in drift.columns if c.startswith(("state err", "base/", "exp "))}
    return [_section("Accuracy drift: ReplaySSM vs baseline per state format (state error vs state writes)", run,
                     markdown_table(drift, fmt),
                     "State error = median over rows x heads of the committed state's relative L2 error vs float64 "
                     "at the last common checkpoint (`step`); ReplaySSM rounds its checkpoint once per flush "
                     "(writes replay = step // L), the baseline its state once per step (writes base = step). "
                     "base/replay > 1: ReplaySSM's state is closer. `exp steps` / `exp writes`: log-log slope of "
                     f"the state error vs steps (step >= {accuracy.FIT_FROM}) / vs writes (also >= "
                     f"{accuracy.MIN_WRITES} writes). Formats other than float32 / float16 / bfloat16 ran on the "
                     "torch / ref backends only. " + accuracy.sqrt_note(drift))]


def fp8_drift_tables(run: Run, df: pd.DataFrame) -> list[str]:
    """The experimental fp8 checkpoint's drift vs flushes (report/accuracy.py fp8_drift); none without its rows."""
    drift = accuracy.fp8_drift(df)
    if drift.empty:
        return []
    verdict = accuracy.fp8_claim_verdict(df)
    return [_section("Experimental fp8 checkpoint (e4m3 + per-head scale): state error vs flushes", run,
                     markdown_table(drift, {c: ".3g" for c in ("state_err", "drift_exponent", "coef")}),
                     "replay_ar with a float8_e4m3fn checkpoint (torch/ref backends only; experimental): the "
                     "materialised state's error median at the last checkpoint, its log-log slope against flushes "
                     "(step // L, checkpoints with >= 4 flushes) and coef = error / sqrt(flushes). Third-party claim "
                     f"({accuracy.FP8_CLAIM_TEXT}, GDN rows): **{verdict['verdict']}**; {verdict['value']}.")]


def render(run: Run) -> str:
    """The whole markdown document for one run."""
    summary = summarize(run.rows)
    env = describe_env(run.env, run.path)
    head = [f"# ReplaySSM Bench tables: run `{run.run_id}`", "", env_line(run), ""]
    if env["kind"] == "cpu":
        head += ["> CPU run: timings on a CPU (`backend` column: `cpu` fused C/OpenMP kernels, `torch` eager). "
                 "They show the method's behaviour on this machine, not GPU kernel performance; compare them with "
                 "nothing but each other.", ""]
    parts = [
        _section("Row status (non-ok rows are excluded from every ratio)", run, counts_table(summary.counts)),
        _section("AR decode: medians, achieved bandwidth, % of peak", run, medians_table(run, spec=False),
                 "median_us per decode step (ReplaySSM: mean over whole flush cycles); p20/p80 band; "
                 "flush_us: the flush step alone; GB/s decimal."),
        _section("AR decode speedup: baseline_ar / replay_ar [p20/p80 band]", run, ar_speedup_table(summary.ratios)),
        _section("Speedups vs their byte-model bounds", run, bound_table(summary.ratios),
                 "byte model: the traffic model's partner / method bytes per token for the same pair (the speedup a "
                 "purely bandwidth-bound method reaches). A speedup more than 10% above it is *not bandwidth-bound* "
                 "and a pair whose stack sat in the last-level cache is *cache-resident*: neither is reported as "
                 "a speedup (tables, REPORT.md)."),
        _section("Speculative decoding: medians, achieved bandwidth, % of peak", run, medians_table(run, spec=True)),
        _section("Speculative decoding: tokens/s, mean accepted length and ratios", run,
                 spec_table(run, summary.ratios),
                 "spec_vs_native = replay_spec / baseline_spec; spec_vs_commit = replay_spec / commit_replay_spec; "
                 "spec_vs_ar = replay_spec / standard AR decode (batch / step time)."),
    ]
    engine = engine_table(run.rows)
    if not engine.empty:
        parts.append(_section("Real engine: vLLM's own benchmarks (level=engine, experiments/vllm_bench.py)", run,
                              markdown_table(engine, {"tokens_per_s": ".1f", "requests_per_s": ".2f",
                                                      "acceptance_length": ".2f", "max_concurrency": ".1f"}),
                              "output tok/s, TTFT/TPOT (ms) and acceptance length as vLLM reported them; "
                              "max_concurrency from the engine's KV-cache log; engine ratios (experiment vllm_bench) "
                              "are in summary.csv and the AR speedup table."))
    parts += whole_model_tables(run)
    parts += accuracy_tables(run)
    bench = bench_cpu_table(run)
    if bench is not None:
        parts.append(_section("CPU micro-benchmarks (make bench-cpu: production geometry, backend per row)", run, bench,
                              "pytest-benchmark medians from bench_cpu.json of this run; each method in its fastest "
                              "form (eager or torch.compile, named in `form`)."))
    return "\n".join(head) + "\n" + "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="markdown file (default RUN_DIR/TABLES.md)")
    parser.add_argument("--quiet", action="store_true", help="do not print the tables")
    args = parser.parse_args(argv)
    run = load_run(args.run_dir)
    text = render(run)
    out = args.out or args.run_dir / "TABLES.md"
    out.write_text(text)
    if not args.quiet:
        print(text)
    print(f"tables written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
