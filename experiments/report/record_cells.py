"""The published cells beside one run: read_cells and published_vs_run.csv (one row per cell).

Every published cell (results/published/cells.csv: one number per row, columns CELL_COLUMNS) gets one row of
RUN_DIR/published_vs_run.csv with

    value_published   the cell's value
    value_measured    the nearest ratio of this run, only where the run's hardware is the cell's (else empty, and
                      measured_note says why)
    value_model       the per-step time model at the cell's own model, hardware, dtype, batch, L, T, history
                      (experiments/report/record_model.py over replayssm/step_time.py), its terms (bytes_s,
                      flops_s, launch_s, other_s, total_s, baseline_total_s: seconds per step of the ReplaySSM side
                      and the baseline's total), regime and model_note; model_over_published and, where they are
                      more than 1.25x apart, missing_term
    value_model_run_hw / regime_run_hw   on a GPU run: the same model at the run's own hardware
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.published import CELL_COLUMNS, load_cells
from experiments.report import record_model as rm
from experiments.report.hybrid import hybrid_ratios
from experiments.report.runs import EXCLUDED_VERDICTS, Run, describe_env, summarize
from replayssm import step_time as st

TERMS = ("bytes_s", "flops_s", "launch_s", "issue_s", "other_s", "total_s", "baseline_total_s")
OUT_COLUMNS = (list(CELL_COLUMNS) + ["value_published", "value_measured", "measured_note", "value_model"]
               + list(TERMS) + ["regime", "model_note", "model_over_published", "missing_term",
                                "value_model_run_hw", "regime_run_hw"])
OUT_NAME = "published_vs_run.csv"
DTYPE_NAME = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16", "bf16": "bfloat16",
              "bfloat16": "bfloat16", "int8": "int8", "fp8_e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn",
              "float8_e4m3fn": "float8_e4m3fn"}
# (level, mode, baseline) -> (summary metric, experiments whose rows answer it)
MEASURED_METRIC = {("kernel", "ar"): ("ar_speedup", ("kernel_decode",)), ("e2e", "ar"): ("ar_speedup", ("e2e_decode",)),
                   ("kernel", "spec"): ("spec_vs_native", ("kernel_spec",)),
                   ("serving", "spec"): ("spec_vs_native", ("serving",))}


def read_cells(path: Path | str | None = None) -> pd.DataFrame:
    """The published cells. `path` None: the committed record, validated (experiments.published.load_cells);
    a path (claims.py --cells): that file as it is; an absent file gives an empty table with the columns."""
    if path is None:
        return load_cells()
    p = Path(path)
    if not p.is_file():
        return pd.DataFrame(columns=list(CELL_COLUMNS))
    df = pd.read_csv(p, dtype={"state_dtype": str, "baseline": str, "note": str})
    for col in CELL_COLUMNS:
        if col not in df:
            df[col] = pd.NA
    return df


def run_hardware(run: Run) -> tuple[str, str]:
    """(the run's hardware profile key as the cells spell it, device kind): ("h100", "gpu"), ("cpu", "cpu")."""
    d = describe_env(run.env, run.path)
    text = d["hardware"].lower()
    for key in st.HARDWARE:
        if key in text.replace(" ", ""):
            return key, d["kind"]
    return ("cpu" if d["kind"] == "cpu" else text), d["kind"]


def run_launch_floor(run: Run | None) -> float:
    """Seconds per launch: this GPU run's own measurement (experiments/launch_floor.py's launch_floor.csv, in the
    run directory or, as scripts/gpu/gpu_check.sh leaves it, in the work directory above results/<hw>/<run-id>),
    else the documented figure step_time.LAUNCH_FLOOR_S."""
    if run is not None:
        for d in (run.path, run.path.parent.parent.parent):
            got = st.launch_floor_from_csv(d / "launch_floor.csv")
            if got:
                return got
    return st.LAUNCH_FLOOR_S


def run_ratios(run: Run) -> pd.DataFrame:
    """Every ratio of the run (kernel rows' summary and the whole-model rows'), verdict-flagged ones dropped."""
    frames = [summarize(run.rows).ratios]
    whole = hybrid_ratios(run.path)
    if not whole.empty:
        frames.append(whole)
    df = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
        else pd.DataFrame()
    if df.empty:
        return df
    if "verdict" in df:
        df = df[~df["verdict"].isin(EXCLUDED_VERDICTS)]
    return df


def _num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def nearest_measured(cell: dict, ratios: pd.DataFrame) -> tuple[float | None, str]:
    """The nearest ratio of the run to the cell (same model, metric, state dtype, T; nearest batch and buffer in
    log distance) and what it is; (None, why) when nothing answers it."""
    key = (str(cell.get("level")), str(cell.get("mode")))
    if key not in MEASURED_METRIC or str(cell.get("metric")) != "speedup":
        return None, "no run: no measurement of this kind in the harness"
    metric, experiments = MEASURED_METRIC[key]
    if key[1] == "spec" and str(cell.get("baseline")) in ("no_spec", "ar", "standard"):
        metric = "spec_vs_ar"
    if ratios.empty:
        return None, "the run has no ratios"
    df = ratios[(ratios["metric"] == metric) & ratios["experiment"].isin(experiments)
                & (ratios["model"].astype(str).str.split("@").str[0] == str(cell.get("model")))]
    raw = cell.get("state_dtype")
    raw = "fp32" if raw is None or (isinstance(raw, float) and math.isnan(raw)) or str(raw) == "" else str(raw)
    dtype = DTYPE_NAME.get(raw.lower())
    if dtype is None:                   # never compare a cell with a run row at another state format
        return None, f"no run: state {raw} is not a format this harness runs"
    if "state_dtype" in df:
        df = df[df["state_dtype"].astype(str) == dtype]
    T = _num(cell.get("spec_T"))
    if T is not None and "spec_T" in df:
        df = df[pd.to_numeric(df["spec_T"], errors="coerce") == T]
    df = df[pd.to_numeric(df["value"], errors="coerce").notna()]
    if df.empty:
        return None, f"no run: no {metric} row of {cell.get('model')} at {dtype} state in this run"
    score = pd.Series(0.0, index=df.index)
    for col in ("batch", "buffer_len", "history_len"):
        want = _num(cell.get(col))
        if want and col in df:
            got = pd.to_numeric(df[col], errors="coerce").fillna(want)
            score += np.abs(np.log(got.clip(lower=1) / want))
    best = df.loc[score.idxmin()]
    return float(best["value"]), (f"{best['experiment']} {metric} batch {best.get('batch')} "
                                  f"L {best.get('buffer_len')} (nearest)")


def published_vs_run(run: Run | None, cells: pd.DataFrame, floor: float | None = None) -> pd.DataFrame:
    """One row per cell (OUT_COLUMNS). `run` None: the model only. `floor`: the launch floor (the run's own
    launch_floor.csv where it has one, else step_time.LAUNCH_FLOOR_S)."""
    hw, kind = run_hardware(run) if run is not None else ("", "")
    if floor is None:
        floor = run_launch_floor(run)
    ratios = run_ratios(run) if run is not None else pd.DataFrame()
    out = []
    for cell in cells.to_dict("records"):
        row = {c: cell.get(c) for c in CELL_COLUMNS}
        row["value_published"] = cell.get("value")
        cell_hw = str(cell.get("hardware") or "").lower()
        if run is None:
            row["value_measured"], row["measured_note"] = None, "no run"
        elif cell_hw != hw:
            row["value_measured"], row["measured_note"] = None, f"run hardware {hw or 'unknown'} is not {cell_hw}"
        else:
            row["value_measured"], row["measured_note"] = nearest_measured(cell, ratios)
        m = rm.model_cell(cell, floor=floor)
        row.update({k: m.get(k) for k in ("value_model", "regime", "model_note") + TERMS})
        pub, mod = _num(cell.get("value")), _num(m.get("value_model"))
        row["model_over_published"] = mod / pub if pub and mod else None
        row["missing_term"] = rm.missing_term(cell, m)
        if kind == "gpu" and hw in st.HARDWARE and cell_hw != hw:
            mh = rm.model_cell(cell, hw_override=hw, floor=floor)
            row["value_model_run_hw"], row["regime_run_hw"] = mh.get("value_model"), mh.get("regime")
        out.append(row)
    return pd.DataFrame(out, columns=OUT_COLUMNS)


def write_published_vs_run(run: Run, cells: pd.DataFrame) -> tuple[Path, pd.DataFrame]:
    df = published_vs_run(run, cells)
    path = run.path / OUT_NAME
    df.to_csv(path, index=False)
    return path, df


def describe(row) -> str:
    parts = [str(row.get("model")), str(row.get("hardware")), str(row.get("state_dtype") or "")]
    for col, tag in (("batch", "bs"), ("spec_T", "T"), ("history_len", "B")):
        v = _num(row.get(col))
        if v is not None:
            parts.append(f"{tag}{int(v)}")
    if row.get("baseline") not in (None, "") and not (isinstance(row.get("baseline"), float)):
        parts.append(f"vs {row.get('baseline')}")
    return " ".join(p for p in parts if p and p != "nan")
