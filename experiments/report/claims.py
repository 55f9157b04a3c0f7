"""REPORT.md: each published claim beside the nearest measurement of this run, with the gap.

For every claim of experiments/published.py (the two headline rows first) the report gives its conditions and
source, our value from the run's own ratios (computed by aggregate.py from rows of one run), which rows that
value comes from, and the gap. A claim with no matching rows says "not measured in this run": nothing is
ever filled in. The byte-model row is analytic (replayssm.traffic), labelled so. A CPU run is labelled as
CPU numbers (with the backend its rows name), not comparable to the GPU claims.

A run with no rows, or none ok, opens the report with "NOTHING WAS MEASURED" (statuses, first failure),
says so on stderr and exits 1; failed rows beside ok ones are counted at the top of the report.

CLI: python scripts/report/claims.py RUN_DIR [RUN_DIR ...] [--out FILE]   (default RUN_DIR/REPORT.md of the first)
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

import pandas as pd

from experiments.published import CLAIMS, Claim
from experiments.report import accuracy, record
from experiments.report.engine import ENGINE_EXPERIMENT
from experiments.report.hybrid import WHOLE_MODEL_EXPERIMENTS, concurrency_claim_rows, hybrid_ratios, whole_model_claim
from experiments.report.runs import EXCLUDED_VERDICTS, SPEEDUP_METRICS, Run, describe_env, load_run, summarize
from experiments.report.tables import accuracy_drift_tables, bench_cpu_table, env_line, markdown_table

NOT_MEASURED = "not measured in this run"
ROW_FILES = ("rows.csv", "e2e_rows.csv", "serving_rows.csv", "accuracy.csv")   # every table a run can hold
FAILED = ("error", "oom", "wrong")


def census(runs: list[Run]) -> dict:
    """Status counts over every row file of the runs, and the first failure's message: the report says
    loudly when nothing (or not everything) was measured instead of listing every claim as not measured."""
    counts: dict[str, int] = {}
    first = None
    for run in runs:
        for name in ROW_FILES:
            path = run.path / name
            if not path.is_file():
                continue
            df = pd.read_csv(path, usecols=lambda c: c in ("status", "message"))
            if "status" not in df:
                continue
            for status, n in df["status"].fillna("unknown").value_counts().items():
                counts[status] = counts.get(status, 0) + int(n)
            bad = df[df["status"].isin(FAILED)]
            if first is None and len(bad):
                first = f"{name}: {str(bad['message'].iloc[0])[:200]}" if "message" in bad else name
    return {"counts": counts, "total": sum(counts.values()), "ok": counts.get("ok", 0),
            "failed": sum(counts.get(s, 0) for s in FAILED), "first_failure": first}


def census_text(c: dict) -> str | None:
    """The one line the report opens with when something is wrong; None when every row is ok/skipped."""
    statuses = ", ".join(f"{k}={v}" for k, v in sorted(c["counts"].items()))
    if c["total"] == 0:
        return ("NOTHING WAS MEASURED: the run has no rows (no row in rows.csv, e2e_rows.csv, serving_rows.csv or "
                "accuracy.csv).")
    if c["ok"] == 0:
        return (f"NOTHING WAS MEASURED: none of the {c['total']} rows is ok ({statuses}); first failure: "
                f"{c['first_failure']}")
    if c["failed"]:
        return (f"{c['failed']} of {c['total']} rows failed ({statuses}); claims are answered from the ok rows "
                f"only. First failure: {c['first_failure']}")
    return None
PROXY_NOTE = {"serving": "SSM-layer proxy for a serving claim", "e2e": "end-to-end claim"}


def _base_model(model) -> str:
    """"nemotron3_super_120b@tp8" -> "nemotron3_super_120b" (the harness may tag TP in the name)."""
    return str(model).split("@")[0]


def _scores(df: pd.DataFrame, claim: Claim) -> pd.DataFrame:
    """Distance of each row from the claim's conditions, most important first (lexicographic)."""
    model = df["model"].map(_base_model)
    if claim.models:      # the claim's own models first, then other models of its family (tiny, TP splits)
        s_model = (~model.isin(claim.models)).astype(int)
    else:
        s_model = pd.Series(0, index=df.index)

    def log_gap(column: pd.Series, target) -> pd.Series:
        if target is None:
            return pd.Series(0.0, index=df.index)
        return column.map(lambda v: abs(math.log2(v / target)) if pd.notna(v) and v > 0 else 99.0)

    buffer = df["buffer_len"].where(df["buffer_len"].notna(), df["history_len"])
    return pd.DataFrame({
        "s_model": s_model,
        "s_batch": log_gap(df["batch"], claim.batch),
        "s_buffer": log_gap(buffer, claim.buffer_len) if claim.metric != "best_buffer_len" else 0.0,
        "s_T": (df["spec_T"] - claim.spec_T).abs().fillna(99) if claim.spec_T else 0.0,
        "s_tp": (df["tp"].fillna(1) != 1).astype(int),
        "s_dtype": (df["state_dtype"].astype(str) != "float32").astype(int),
        "s_backend": (df["backend"].astype(str) != "triton").astype(int),
        "s_timing": (df["timing_mode"].astype(str) != "graph").astype(int) + (df["l2"].astype(str) != "cold"),
    }, index=df.index)


def best_buffer_rows(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per AR setting and batch, the buffer_len with the highest ar_speedup (value = that buffer_len)."""
    ar = ratios[ratios["metric"] == "ar_speedup"]
    if ar.empty:
        return ar
    keys = ["run_id", "experiment", "family", "model", "tp", "batch", "route", "state_dtype", "act_dtype",
            "backend", "timing_mode", "l2"]
    idx = ar.assign(**{k: ar[k].astype(str) for k in keys}).groupby(keys, dropna=False)["value"].idxmax()
    best = ar.loc[idx.to_numpy()]
    return best.assign(metric="best_buffer_len", speedup=best["value"], value=best["buffer_len"])


ENGINE_FIRST_LEVELS = ("e2e", "serving")
ENGINE_NOTE = "real engine: vLLM's own benchmark"


def engine_preferred(cand: pd.DataFrame, claim: Claim) -> pd.DataFrame | None:
    """Preference hook for end-to-end and serving claims: real-engine ratios of the claim's metric
    (experiments/vllm_bench.py, experiments/report/engine.py) answer it whenever the runs have any; otherwise None
    and the claim's own experiment (e2e / serving rows, else the SSM-layer proxy) decides.
    Order: engine rows > e2e/serving rows > SSM-layer proxy."""
    if claim.level not in ENGINE_FIRST_LEVELS or cand.empty:
        return None
    engine = cand[cand["experiment"] == ENGINE_EXPERIMENT]
    return engine if not engine.empty else None


def nearest_rows(ratios: pd.DataFrame, claim: Claim) -> pd.DataFrame:
    """The rows of `ratios` nearest to the claim's conditions: per model the closest setting; across
    models, only the models that match the claim best. Only rows of the claim's metric, experiment and
    family (when it names one) qualify; empty when the run has none."""
    if claim.metric == "best_buffer_len":
        cand = best_buffer_rows(ratios)
    else:
        cand = ratios[ratios["metric"] == claim.metric]
    engine = engine_preferred(cand, claim)
    if engine is not None:
        cand = engine
    elif claim.experiment is not None and not cand.empty:
        cand = cand[cand["experiment"] == claim.experiment]
    if claim.method is not None and not cand.empty:
        cand = cand[cand["num_method"] == claim.method]
    if claim.family is not None and not cand.empty:
        cand = cand[cand["family"] == claim.family]       # a GDN claim is never answered by Mamba-2 rows
    if cand.empty:
        return cand
    scores = _scores(cand, claim)
    cols = list(scores.columns)
    cand = pd.concat([cand, scores], axis=1)
    picked = []
    for _, group in cand.groupby(["run_id", "model"], dropna=False):
        best = group.sort_values(cols).iloc[0][cols]
        picked.append(group[(group[cols] == best).all(axis=1)])
    near = pd.concat(picked)
    return near[near["s_model"] == near["s_model"].min()]


def _fmt(v: float, kind: str) -> str:
    return f"L={v:g}" if kind == "argmax" else f"{v:.2f}x"


def _pub(v: float) -> str:
    """A published number as published: 3.0, 1.8, 1.43 (at least one decimal)."""
    text = f"{v:g}"
    return text if "." in text else f"{text}.0"


def measured_value(rows: pd.DataFrame, claim: Claim) -> tuple[float, float]:
    """(lo, hi) of our value: a maximum for "up to" claims, the spread across models/settings otherwise."""
    values = rows["value"].astype(float)
    if claim.kind == "up_to":
        return values.max(), values.max()
    if claim.kind == "argmax":
        mode = values.mode()
        return mode.min(), mode.max()
    return values.min(), values.max()


def gap_text(lo: float, hi: float, claim: Claim) -> str:
    """How far our value is from the published one (ratio and difference)."""
    if claim.kind == "argmax":
        return "same best setting" if lo <= claim.hi <= hi else f"differs (published L={claim.hi:g})"
    if claim.kind == "range" and claim.lo is not None:
        if hi < claim.lo:
            return f"below the range: {hi:.2f} vs {claim.lo:.2f} ({hi / claim.lo:.2f}x of its low end)"
        if lo > claim.hi:
            return f"above the range: {lo:.2f} vs {claim.hi:.2f} ({lo / claim.hi:.2f}x of its high end)"
        return "overlaps the published range"
    if claim.kind == "point" and lo < hi and lo <= claim.hi <= hi:
        return f"published value lies within our spread ({lo:.2f}-{hi:.2f})"
    ours = hi if claim.kind == "up_to" or hi < claim.hi else lo    # the end nearest the published value
    return f"{ours / claim.hi:.2f}x of published ({ours - claim.hi:+.2f})"


def _values(series: pd.Series) -> str:
    vals = sorted({str(_base_model(v)) if not isinstance(v, float) or not v.is_integer() else str(int(v))
                   for v in series.dropna()})
    return ",".join(vals) if vals else "-"


def rows_text(rows: pd.DataFrame, claim: Claim) -> str:
    """Which rows the value comes from, and where they differ from the claim's conditions."""
    parts = [f"{len(rows)} pair(s): model {_values(rows['model'])}", f"batch {_values(rows['batch'])}"]
    if rows["buffer_len"].notna().any():
        parts.append(f"L {_values(rows['buffer_len'])}")
    if rows["history_len"].notna().any():
        parts.append(f"history {_values(rows['history_len'])}")
    if rows["spec_T"].notna().any():
        parts.append(f"T {_values(rows['spec_T'])}")
    if rows["acceptance"].notna().any():
        parts.append(f"acceptance {_values(rows['acceptance'])}")
    parts.append(f"{_values(rows['state_dtype'])}/{_values(rows['act_dtype'])}")
    parts.append(f"backend {_values(rows['backend'])}, {_values(rows['timing_mode'])}, L2 {_values(rows['l2'])}")
    parts.append(f"run {_values(rows['run_id'])}")
    off = []
    if claim.batch is not None and not (rows["batch"] == claim.batch).all():
        off.append(f"batch {claim.batch}")
    if claim.spec_T is not None and not (rows["spec_T"] == claim.spec_T).all():
        off.append(f"T={claim.spec_T}")
    if claim.models and not rows["model"].map(_base_model).isin(claim.models).all():
        off.append("model " + "/".join(claim.models))
    if off:
        parts.append("**differs from the claim's " + ", ".join(off) + "**")
    return "; ".join(parts)


def byte_model_rows(claim: Claim) -> tuple[str, str, float | None, float | None]:
    """The analytic byte ratio of every production model (fp32 state, bf16 activations, buffer L)."""
    try:
        traffic = importlib.import_module("replayssm.traffic")
        from replayssm.geometry import GDN_MODELS, MAMBA2_MODELS
    except ImportError as exc:
        return NOT_MEASURED + f" (replayssm.traffic not importable: {exc})", "", None, None
    L = claim.buffer_len or 16
    ratios = {}
    for name, geom in MAMBA2_MODELS.items():
        ratios[name] = traffic.mamba2_baseline_ar(geom).total / traffic.mamba2_replay_ar_cycle(geom, L).total
    for name, geom in GDN_MODELS.items():
        ratios[name] = traffic.gdn_baseline_ar(geom).total / traffic.gdn_replay_ar_cycle(geom, L).total
    lo, hi = min(ratios.values()), max(ratios.values())
    detail = ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items())
    return (f"{lo:.2f}x-{hi:.2f}x (analytic, replayssm.traffic; not a measurement)",
            f"byte model at L={L}, fp32 state, bf16 activations, whole flush cycles: {detail}", lo, hi)


def short_conditions(claim: Claim) -> str:
    """The claim's conditions in a few words for the summary table (the details list has the full text)."""
    who = {"mamba2": "Nemotron-3 (Mamba-2)", "gdn": "Qwen3.5 (GDN)"}.get(claim.family or "", "all models")
    if claim.models and len(claim.models) == 1:
        who = claim.models[0]
    parts = [who, claim.level]
    parts += [f"bs {claim.batch}"] if claim.batch else []
    parts += [f"L={claim.buffer_len}"] if claim.buffer_len else []
    parts += [f"T={claim.spec_T}"] if claim.spec_T else []
    parts += [claim.hardware] if claim.hardware else []
    return " · ".join(parts)


def launch_labels(near: pd.DataFrame, claim: Claim) -> list[str]:
    """What the pairs' launch configs were (aggregate's launch columns): "vs tuned baseline; vs default
    <value>" when the partner ran tuned configs and was also timed under its defaults (like vLLM PR #48018's
    `tuned (default)`); "partner untuned" whenever a tuned method met an untuned partner; nothing when every
    side ran its defaults (or the rows predate the launch columns)."""
    out = []
    if "den_launch_source" not in near:
        return out
    den_tuned = near["den_launch_source"].isin(("tuned", "mixed"))
    if den_tuned.any():
        out.append("vs tuned baseline" if den_tuned.all() else "vs tuned baseline where one exists")
        if "value_default" in near and near["value_default"].notna().any():
            v = near["value_default"].dropna().astype(float)
            lo, hi = _fmt(v.min(), claim.kind), _fmt(v.max(), claim.kind)
            out.append(f"vs default baseline {hi if lo == hi else f'{lo}-{hi}'}")
    notes = sorted(set(near.get("launch_note", pd.Series(dtype=str)).dropna().astype(str)) - {""})
    out += [f"{n}: a tuned method against a default-config partner" if n == "partner untuned" else n for n in notes]
    return out


def evaluate(claim: Claim, ratios: pd.DataFrame, cpu: bool) -> dict:
    """One report row: published value, measured value, rows used, gap."""
    if claim.lo is not None:
        published = f"{_pub(claim.lo)}-{_pub(claim.hi)}x"
    elif claim.kind == "argmax":
        published = f"L={claim.hi:g}"
    else:
        published = ("up to " if claim.kind == "up_to" else "") + f"{_pub(claim.hi)}x"
    row = {"claim": claim.text, "published": published, "conditions": short_conditions(claim),
           "measured": NOT_MEASURED, "gap": "-", "rows": "", "claim_obj": claim}
    if claim.metric == "byte_model":
        row["measured"], row["rows"], lo, hi = byte_model_rows(claim)
        if lo is not None:
            row["gap"] = gap_text(lo, hi, claim) + " (analytic)"
        return row
    # A speedup above its byte-model bound (>10%) or from a cache-resident stack is no measurement of the
    # bandwidth argument: it never answers a claim; the nearest such pairs are named instead.
    excluded = ratios["verdict"].isin(EXCLUDED_VERDICTS) if "verdict" in ratios else pd.Series(False, ratios.index)
    near = nearest_rows(ratios[~excluded], claim)
    flagged = nearest_rows(ratios[excluded], claim) if excluded.any() else ratios.iloc[:0]
    if near.empty:
        if not flagged.empty:
            row["measured"] = (NOT_MEASURED + ": the nearest pairs are " + _verdicts(flagged)
                               + ", not reported as a speedup")
            row["rows"] = rows_text(flagged, claim) + "; " + _bound_text(flagged)
        return row
    lo, hi = measured_value(near, claim)
    lo_text, hi_text = _fmt(lo, claim.kind), _fmt(hi, claim.kind)
    value = hi_text if lo_text == hi_text else f"{lo_text}-{hi_text}"
    labels = [PROXY_NOTE[claim.level]] if claim.level in PROXY_NOTE else []
    analytic = (near["experiment"] == "footprint").all()
    if (near["experiment"] == ENGINE_EXPERIMENT).all():
        labels = [ENGINE_NOTE]
    elif analytic:
        labels = ["analytic: vLLM's allocator modelled on B300 for the claim's models, not a measurement"]
    elif claim.experiment in WHOLE_MODEL_EXPERIMENTS:   # whole-model rows, not the SSM-layer proxy
        labels = ["whole model, random weights"]
    if cpu and not analytic:                          # the rows name their backend (cpu kernels or torch)
        backends = sorted(near["backend"].dropna().astype(str).unique()) if "backend" in near else []
        labels += [f"CPU {'/'.join(backends) or 'torch'} backend"]
    labels = launch_labels(near, claim) + labels
    row["measured"] = value + (f" ({'; '.join(labels)})" if labels else "")
    row["gap"] = gap_text(lo, hi, claim) + (" — CPU: not comparable" if cpu and not analytic else "")
    row["rows"] = rows_text(near, claim)
    if claim.metric == "ar_speedup" and near["bytes_ratio"].notna().any():
        row["rows"] += f"; byte model for these pairs {_values(near['bytes_ratio'].round(2))}x"
    if claim.metric in SPEEDUP_METRICS and near["bytes_ratio"].notna().any():
        row["bound"] = _bound_text(near)
        row["rows"] += "; " + row["bound"]
    if not flagged.empty:
        row["rows"] += f"; nearer pairs left out ({_verdicts(flagged)}): {_bound_text(flagged)}"
    return row


def accuracy_claim(claim: Claim, runs: list[Run], cpu: bool) -> dict:
    """The bf16-state accuracy claim: verdict and ratios from the runs' accuracy.csv (experiments/report/accuracy.py),
    "not measured in this run" when no run has bf16-state baseline_ar and replay_ar rows."""
    frames = [df for df in (accuracy.load_accuracy(r.path) for r in runs) if df is not None]
    verdict = accuracy.claim_verdict(pd.concat(frames, ignore_index=True) if frames else None)
    measured = verdict["value"] if verdict["verdict"] == NOT_MEASURED else \
        f"{verdict['value']}" + (" (CPU torch backend)" if cpu else "")
    return {"claim": claim.text, "published": "qualitative", "conditions": short_conditions(claim),
            "measured": measured, "gap": verdict["verdict"] if verdict["verdict"] != NOT_MEASURED else "-",
            "rows": verdict["rows"], "claim_obj": claim}


def _verdicts(rows: pd.DataFrame) -> str:
    return " / ".join(sorted(set(rows["verdict"].dropna().astype(str))))


def _bound_text(rows: pd.DataFrame) -> str:
    """"measured 1.71x vs byte model 1.75x (0.98 of it)" per pair, the pairs' spread when several."""
    meas, model = rows["value"].astype(float), rows["bytes_ratio"].astype(float)
    share = (meas / model).dropna()
    if share.empty:
        return "byte model: n/a"
    if len(rows) == 1:
        return f"measured {meas.iloc[0]:.2f}x vs byte model {model.iloc[0]:.2f}x ({share.iloc[0]:.2f} of it)"
    return (f"measured {meas.min():.2f}-{meas.max():.2f}x vs byte model {model.min():.2f}-{model.max():.2f}x "
            f"(measured / model {share.min():.2f}-{share.max():.2f})")


def fp8_claims(claim: Claim, runs: list[Run], cpu: bool) -> dict:
    """The third-party fp8-checkpoint claims: drift verdict from the runs' accuracy.csv (experiments/report/accuracy.py
    fp8_claim_verdict); the end-to-end logprob claim is never measured by this harness."""
    frames = [df for df in (accuracy.load_accuracy(r.path) for r in runs) if df is not None]
    if claim.metric == "fp8_checkpoint_drift":
        verdict = accuracy.fp8_claim_verdict(pd.concat(frames, ignore_index=True) if frames else None)
    else:
        verdict = {"verdict": NOT_MEASURED, "value": NOT_MEASURED, "rows": ""}   # needs a whole model's logits
    measured = verdict["value"] + (" (CPU torch backend)" if cpu and verdict["verdict"] != NOT_MEASURED else "")
    return {"claim": claim.text, "published": "1% x sqrt(flushes)" if claim.metric == "fp8_checkpoint_drift"
            else f"{claim.lo:g}-{claim.hi:g}", "conditions": short_conditions(claim), "measured": measured,
            "gap": verdict["verdict"] if verdict["verdict"] != NOT_MEASURED else "-", "rows": verdict["rows"],
            "claim_obj": claim}


ACCURACY_CLAIMS = {"bf16_state_accuracy": accuracy_claim, "fp8_checkpoint_drift": fp8_claims,
                   "fp8_checkpoint_logprob": fp8_claims}


def claims_table(runs: list[Run]) -> tuple[pd.DataFrame, list[dict]]:
    """Every claim of CLAIMS (in order) answered from the runs' rows: the table REPORT.md shows (#, claim,
    published, conditions, measured here, byte-model bound, gap) and the per-claim details behind it."""
    ratios = pd.concat([summarize(r.rows).ratios for r in runs], ignore_index=True)
    whole = [hybrid_ratios(r.path) for r in runs]            # e2e_rows.csv / serving_rows.csv, where present
    ratios = pd.concat([ratios] + [w for w in whole if not w.empty], ignore_index=True)
    concurrency = [c for c in CLAIMS if c.metric == "concurrency"]
    if concurrency:                                  # analytic, at the claim's conditions (hybrid_summary)
        ratios = pd.concat([ratios, concurrency_claim_rows(concurrency[0])], ignore_index=True)
    cpu = any(describe_env(r.env, r.path)["kind"] == "cpu" for r in runs)
    evaluated = [ACCURACY_CLAIMS[c.metric](c, runs, cpu) if c.metric in ACCURACY_CLAIMS
                 else evaluate(whole_model_claim(c, ratios), ratios, cpu) for c in CLAIMS]
    table = pd.DataFrame([{"#": i + 1, "claim": ("**" + e["claim"] + "**") if e["claim_obj"].headline else e["claim"],
                           "published": e["published"], "conditions": e["conditions"],
                           "measured here": e["measured"], "byte-model bound": e.get("bound", "-"),
                           "gap": e["gap"]}
                          for i, e in enumerate(evaluated)])
    return table, evaluated


def render(runs: list[Run]) -> str:
    envs = [describe_env(r.env, r.path) for r in runs]
    cpu = any(e["kind"] == "cpu" for e in envs)
    lines = ["# ReplaySSM Bench: published claims vs this run", ""]
    lines += [f"- {env_line(r)}" for r in runs] + [""]
    loud = census_text(census(runs))
    if loud:
        lines += [f"> **{loud}**", ""]
    if cpu:
        lines += ["> **CPU run.** The measured values below are CPU numbers (each names its backend: `cpu` the "
                  "fused C/OpenMP kernels, `torch` the eager PyTorch form) on "
                  f"{', '.join(sorted({e['hardware'] for e in envs}))}: they are NOT comparable to the published "
                  "GPU claims (H100 / B300 kernels). They say whether the method's ordering holds here, nothing "
                  "about GPU performance.", ""]
    else:
        hw = ", ".join(sorted({e["hardware"] for e in envs}))
        lines += [f"> Measured on {hw}; the claims were made on H100 and B300 (see each claim's conditions). "
                  "Kernel-level values are SSM-layer measurements; serving and end-to-end claims are only "
                  "approximated by them.", ""]
    lines += ["Our value is taken from the rows nearest to each claim's conditions (model, batch, buffer, T), "
              "ratios only between rows of one run; where the rows differ from the claim's conditions the "
              "details say so. Headline rows first.", "",
              "Every measured speedup stands beside its byte-model bound (the traffic model's bytes ratio for the "
              "same pairs). A pair more than 10% above its bound (not bandwidth-bound) or timed from a "
              "cache-resident stack never answers a claim; the details name it.", "",
              "Launch configs: where a baseline ran this GPU's tuned launch table (experiments/tune.py), the value "
              "is against the tuned baseline and the default baseline's value stands beside it (`vs default "
              "baseline`); a tuned method paired with an untuned partner says so.", ""]
    table, evaluated = claims_table(runs)
    lines += [markdown_table(table), "## Conditions, sources and the rows behind each value", ""]
    for i, e in enumerate(evaluated):
        c = e["claim_obj"]
        lines += [f"{i + 1}. **{c.text}** — published {e['published']}",
                  f"   - conditions: {c.conditions}; hardware: {c.hardware}; level: {c.level}",
                  f"   - source: {c.source}"]
        if c.note:
            lines.append(f"   - note: {c.note}")
        lines.append(f"   - measured here: {e['measured']}")
        if e["rows"]:
            lines.append(f"   - rows: {e['rows']}")
        lines.append("")
    drift = [t for run in runs for t in accuracy_drift_tables(run)]
    if drift:
        lines += ["## Accuracy drift per state format (experiments/accuracy.py)", "", *drift]
    for run in runs:
        bench = bench_cpu_table(run)
        if bench is not None:
            lines += [f"## CPU micro-benchmarks of run `{run.run_id}` (make bench-cpu)", "",
                      "Production geometry at batch 32, L=16, on this CPU (the backend column says which); "
                      "not part of the claim rows above (no GPU kernel was timed).", "", bench]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: REPORT.md in the first run dir")
    parser.add_argument("--cells", type=Path, default=None,
                        help="published cells CSV (default: results/published/cells.csv via experiments.report.record)")
    args = parser.parse_args(argv)
    runs = [load_run(d) for d in args.run_dirs]
    out = args.out or args.run_dirs[0] / "REPORT.md"
    # the published record: published_vs_run.csv into each run dir, two sections after the claims' (unchanged)
    sections = record.write_record(runs, cells_path=str(args.cells) if args.cells else None)
    out.write_text(render(runs) + "\n\n" + "\n".join(sections))
    print(f"report written to {out}")
    c = census(runs)
    loud = census_text(c)
    if loud:
        print(loud, file=sys.stderr)
    return 1 if c["ok"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
