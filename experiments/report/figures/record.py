"""Figures of the published record: for each source table its published values (black-edged stars, labelled with
their source), the per-step time model (a line through a dense batch grid, replayssm/step_time.py via
experiments/report/record_model.py) and this run's measured points where the run's hardware is the cell's.

    speedup vs batch    one figure per (source, table) whose cells give a batch: one colour per series (hardware,
                        state dtype, baseline, model, T, history: whichever vary in the table); e.g. kernel and
                        end-to-end speedup per hardware and dtype, GDN spec speedup per T, history 16 vs 32
    concurrency         published caps beside the vLLM-allocator model's, per model and path

`figures(run, figs, cells)` adds them to a FigureSet (figures/plots.py plot_run calls it with the default cells).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from experiments.report import record_model as rm
from experiments.report.figures import style as fs
from experiments.report.record_cells import published_vs_run, read_cells, run_launch_floor
from experiments.report.runs import Run

SERIES_KEYS = ("model", "hardware", "state_dtype", "baseline", "spec_T", "history_len", "buffer_len", "level")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _label(keys: tuple, values: tuple) -> str:
    parts = []
    for k, v in zip(keys, values):
        if v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in ("", "nan"):
            continue
        tag = {"spec_T": "T=", "history_len": "B=", "buffer_len": "L=", "baseline": "vs "}.get(k, "")
        parts.append(tag + (fs.model_name(v) if k == "model" else fs.integer(v)))
    return ", ".join(parts) or "published"


def _grid(batches: list[float]) -> list[int]:
    lo, hi = int(min(batches)), int(max(batches))
    out, b = [], 1
    while b <= hi:
        if b >= lo:
            out.append(b)
        b *= 2
    return sorted(set(out) | {int(x) for x in batches})


def _title(source: str, table: str) -> str:
    """The house style's short one-line title, within one column at 8 pt (<= 52 characters); the caption names
    the table in full."""
    text = f"{source}: {table}"
    return text if len(text) <= 52 else text[:49].rstrip() + "..."


def _run_text(run: Run | None) -> str:
    return f"run `{run.run_id}` ({run.hardware})" if run is not None else "no run"


def speedup_figure(df: pd.DataFrame, source: str, table: str, figs: fs.FigureSet, floor: float,
                   run: Run | None = None):
    """One speedup-vs-batch figure of one source table (rows of published_vs_run)."""
    varying = [k for k in SERIES_KEYS if df[k].astype(str).nunique() > 1]
    n = df.groupby(varying, dropna=False).ngroups if varying else 1
    # one column (the house width); the legend sits below the axes, so the figure grows by one line per entry
    fig, ax = plt.subplots(figsize=(fs.ONE_COLUMN, 2.4 + 0.16 * (n + 3)))
    handles = []
    all_b = pd.to_numeric(df["batch"], errors="coerce").dropna().tolist()
    groups = df.groupby(varying, sort=True, dropna=False) if varying else [((), df)]
    for i, (vals, g) in enumerate(groups):
        vals = vals if isinstance(vals, tuple) else (vals,)
        color = fs.CYCLE[i % len(fs.CYCLE)]
        marker = MARKERS[i % len(MARKERS)]
        g = g.assign(_b=pd.to_numeric(g["batch"], errors="coerce")).sort_values("_b")
        label = _label(tuple(varying), vals)
        ax.plot(g["_b"], g["value_published"], linestyle="none", marker="*", markersize=8, color=color,
                markeredgecolor="black", markeredgewidth=0.5, zorder=4)
        cell = g.iloc[0].to_dict()
        xs = _grid(g["_b"].dropna().tolist())
        ys = [rm.model_cell({**cell, "batch": b}, floor=floor).get("value_model") for b in xs]
        if any(y is not None for y in ys):
            ax.plot(xs, [np.nan if y is None else y for y in ys], color=color, linestyle="--", linewidth=1.0,
                    zorder=2)
        meas = g[pd.to_numeric(g["value_measured"], errors="coerce").notna()]
        if len(meas):
            ax.plot(meas["_b"], meas["value_measured"], linestyle="none", marker=marker, color=color, zorder=3)
        handles.append(Line2D([], [], color=color, linestyle="--", marker="*", markeredgecolor="black",
                              markersize=7, label=label))
    ax.axhline(1.0, color="black", linewidth=0.6, zorder=1)
    fs.batch_axis(ax, all_b)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup (x)")
    ax.set_title(_title(source, table))
    handles += [Line2D([], [], linestyle="none", marker="*", markersize=7, color="white", markeredgecolor="black",
                       label=f"star: published ({source})"),
                Line2D([], [], linestyle="--", color="black", label="dashed: per-step time model"),
                Line2D([], [], linestyle="none", marker="o", color="black", label="filled: measured by this run")]
    fs.legend_below(fig, handles)
    caption = (f"{source}, table '{table}': each published cell (star) beside the per-step time model at the same "
               "model, hardware, state dtype, buffer, T and history (dashed, replayssm/step_time.py: bytes over "
               "datasheet bandwidth, FLOPs over the SIMT peak, plus a launch floor per kernel; no parameter fitted "
               f"to these cells; launch floor {floor * 1e6:.2f} us) and this run's nearest measurement where its "
               f"hardware is the cell's (filled markers, {_run_text(run)}; none on a CPU run). A series without a "
               "dashed line is not modelled: its regime and reason are in published_vs_run.csv.")
    return figs.save(fig, fs.slug("record", source, table), _title(source, table), caption)


def concurrency_figure(df: pd.DataFrame, source: str, table: str, figs: fs.FigureSet, run: Run | None = None):
    fig, ax = plt.subplots(figsize=fs.figsize(1, 0.7))
    def path(r) -> str:
        return "native" if "native" in (str(r["note"]) + str(r["baseline"])).lower() else "ReplaySSM"
    labels = [f"{fs.model_name(r['model'])}\n{path(r)}" for r in df.to_dict("records")]
    x = np.arange(len(df))
    ax.bar(x - 0.2, df["value_published"], width=0.4, color=fs.OKABE_ITO["grey"], edgecolor="black",
           label=f"published ({source})")
    ax.bar(x + 0.2, pd.to_numeric(df["value_model"], errors="coerce"), width=0.4, color=fs.OKABE_ITO["blue"],
           label="model (vLLM allocator, experiments/hybrid/footprint.py)")
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("max concurrent requests")
    ax.set_title(_title(source, table))
    fs.legend_below(fig, list(ax.get_legend_handles_labels()[0]))
    caption = (f"{source}, table '{table}': published maximum decode concurrency beside the analytic model of vLLM's "
               "hybrid allocator (experiments/hybrid/footprint.py) at the cell's (B, T) and hardware; drawn with "
               f"{_run_text(run)}, which measures no cap.")
    return figs.save(fig, fs.slug("record", source, table), _title(source, table), caption)


def figures(run: Run | None, figs: fs.FigureSet, cells: pd.DataFrame | None = None) -> list:
    """Every source table's figure; none when there are no cells."""
    cells = read_cells() if cells is None else cells
    if cells.empty:
        return []
    fs.apply_style()
    df = published_vs_run(run, cells)
    floor = run_launch_floor(run)
    paths = []
    for (source, table), g in df.groupby(["source", "table"], sort=True):
        sp = g[(g["metric"] == "speedup") & pd.to_numeric(g["batch"], errors="coerce").notna()]
        if sp["batch"].nunique() >= 2:
            paths.append(speedup_figure(sp, source, table, figs, floor, run))
        conc = g[g["metric"] == "max_concurrency"]
        if len(conc):
            paths.append(concurrency_figure(conc, source, table, figs, run))
    return paths
