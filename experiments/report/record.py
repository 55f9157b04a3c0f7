"""REPORT.md's "Published record" (agreement of the model and the run with each source table) and the entry point
claims.py calls: `write_record` writes published_vs_run.csv into every run directory (record_cells.py) and returns
this section and "Where ReplaySSM loses" (record_loses.py), appended after the claims' own sections, unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from experiments.report import record_loses
from experiments.report import record_model as rm
from experiments.report.record_cells import (
    OUT_NAME,
    describe,
    published_vs_run,
    read_cells,
    run_launch_floor,
    write_published_vs_run,
)
from experiments.report.runs import Run
from experiments.report.tables import markdown_table
from replayssm import step_time as st

__all__ = ["read_cells", "published_vs_run", "write_record", "agreement_table", "OUT_NAME"]


def log_gap(df: pd.DataFrame) -> pd.Series:
    """|log(model / published)| where both are positive numbers."""
    r = pd.to_numeric(df["model_over_published"], errors="coerce")
    return np.abs(np.log(r.where(r > 0)))


def agreement_table(df: pd.DataFrame, worst: int = 2) -> pd.DataFrame:
    """Per (source, table) and overall: cells, measured by the run, modelled, median |log(model/published)|,
    within 1.25x, and the largest disagreements."""
    rows = []
    gaps = log_gap(df)

    def one(name_source, name_table, sub, g):
        mod = g.notna()
        worst_rows = sub.assign(_g=g).loc[mod].sort_values("_g", ascending=False).head(worst)
        text = "; ".join(f"{describe(r)}: {r['value_published']:.3g} vs {r['value_model']:.3g}"
                         + (f" ({r['missing_term']})" if r["missing_term"] else "")
                         for _, r in worst_rows.iterrows() if r["_g"] > math.log(rm.DISAGREE))
        return {"source": name_source, "table": name_table, "cells": len(sub),
                "measured here": int(pd.to_numeric(sub["value_measured"], errors="coerce").notna().sum()),
                "modelled": int(mod.sum()),
                "median abs(log(model/pub))": float(g[mod].median()) if mod.any() else None,
                "within 1.25x": f"{int((g[mod] <= math.log(rm.DISAGREE)).sum())}/{int(mod.sum())}",
                "largest disagreements": text or "-"}

    for (src, tab), sub in df.groupby(["source", "table"], sort=True, dropna=False):
        rows.append(one(src, tab, sub, gaps.loc[sub.index]))
    if len(df):
        rows.append(one("**all**", "", df, gaps))
    return pd.DataFrame(rows)


def published_record_section(df: pd.DataFrame, cells_path: str, floor: float) -> list[str]:
    lines = ["## Published record", ""]
    if df.empty:
        return lines + [f"No published cells were found ({cells_path}): nothing to compare.", ""]
    n_src = df["source"].nunique()
    lines += [f"{len(df)} published cells from {n_src} sources ({cells_path}), each beside this run's nearest "
              "measurement (only where the run's hardware is the cell's) and the per-step time model "
              "(replayssm/step_time.py: bytes over the datasheet bandwidth, FLOPs over the SIMT peak, plus "
              f"{floor * 1e6:.2f} us per kernel launch; whole-model cells add the other layers' weight and KV bytes "
              "and launches). No model parameter is fitted to these cells. Row by row: "
              f"`{OUT_NAME}` in this run's directory.", "",
              markdown_table(agreement_table(df), {"median abs(log(model/pub))": ".3f"}), ""]
    return lines + parameters(floor)


def parameters(floor: float) -> list[str]:
    """The model's parameters, each with its source (none fitted to the cells)."""
    hw = pd.DataFrame([{"hardware": h.name, "HBM TB/s": h.hbm_Bps / 1e12, "FP32 SIMT TFLOP/s": h.simt_fp32_flops / 1e12,
                        "BF16 tensor TFLOP/s": h.tensor_flops / 1e12, "HBM GB": h.hbm_bytes / 1e9,
                        "ridge FLOP/B": h.ridge, "source": h.source} for h in st.HARDWARE.values()])
    own = abs(floor - st.LAUNCH_FLOOR_S) > 1e-12
    launches = ", ".join(f"{f} {m}{' ' + r if r else ''} {n}" for (f, m, r), n in st.LAUNCHES.items())
    return ["Model parameters (replayssm/step_time.py, experiments/report/record_model.py):", "",
            markdown_table(hw, {"HBM TB/s": ".3g", "FP32 SIMT TFLOP/s": ".3g", "BF16 tensor TFLOP/s": ".4g",
                                "HBM GB": ".0f", "ridge FLOP/B": ".1f"}), "",
            f"- launch floor {floor * 1e6:.2f} us per kernel: "
            + ("this GPU run's own launch_floor.csv (the minimal kernel under CUDA graphs)" if own
               else st.LAUNCH_FLOOR_SOURCE),
            "- kernel launches per layer step (this repo's launchers), plus one cursor kernel for "
            f"{' / '.join(st.CURSOR_LAUNCHES)} (per layer in kernel cells, once per model step in whole-model cells): "
            f"{launches}",
            f"- assumed (no source states them): context {rm.CONTEXT_LEN} tokens for the KV term; kernels per other "
            f"sub-layer {rm.KERNELS_PER_SUBLAYER}; accepted tokens where a spec cell states none: ceil(T/2); "
            f"{rm.ACCEPT_SOURCE}", ""]


def write_record(runs: list[Run], cells: pd.DataFrame | None = None, cells_path: str | None = None) -> list[str]:
    """published_vs_run.csv into every run directory; REPORT.md's two sections (lines) for the first run."""
    if cells is None:
        cells = read_cells(cells_path)
    label = cells_path or "results/published/cells.csv"
    frames = [write_published_vs_run(r, cells)[1] for r in runs]
    df = frames[0] if frames else published_vs_run(None, cells)
    run = runs[0] if runs else None
    floor = run_launch_floor(run)
    return published_record_section(df, label, floor) + record_loses.section(df, run, floor)
