"""Figures of one run, ready for a paper: AR speedup vs batch and vs buffer length (the bell curve), spec
tokens/s vs batch per window T, achieved bandwidth, the accuracy study, the whole-model experiments
(figures/hybrid.py) and the blog's Figs. 6-11 (figures/paper.py). Look and conventions: figures/style.py
(sizes, palette, human names, p20-p80 bands, hollow flagged points, dotted byte-model bounds).

Reads only the run's files. Output: RUN_DIR/plots/<name>.png and .pdf, and RUN_DIR/plots/FIGURES.md, the
captions index (the configuration of each figure: hardware, run id, geometry, dtypes, backend, timing).

CLI: python scripts/report/plots.py RUN_DIR [--out DIR] [--no-paper]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.report import accuracy
from experiments.report.figures import paper as paper_figures
from experiments.report.figures import record as record_figures
from experiments.report.figures import style as fs
from experiments.report.figures.hybrid import plot_hybrid
from experiments.report.runs import (
    AR_METHODS,
    EXCLUDED_VERDICTS,
    SPEC_METHODS,
    Run,
    load_run,
    primary_rows,
    summarize,
    throughput,
)

# One figure per "setting": rows differing in any of these are never drawn on the same axes.
SETTING_KEYS = ["experiment", "model", "tp", "geometry", "state_dtype", "act_dtype", "backend", "timing_mode", "l2"]
ROUTE_STYLE = {"output_only": "-", "state_and_output": "--", "": "-"}


def groups(df: pd.DataFrame, keys: list[str]):
    """groupby that keeps NA keys (CPU rows have no tp or l2 sometimes) and yields a dict of the keys."""
    keys = [k for k in keys if k in df.columns]
    if df.empty:
        return
    for values, group in df.groupby(keys, dropna=False, sort=True):
        yield dict(zip(keys, values if isinstance(values, tuple) else (values,))), group


def describe(run: Run, setting: dict) -> str:
    """The configuration sentence of a caption: model, geometry, precision, backend, timing, hardware, run."""
    s = {k: v for k, v in setting.items() if not (v is None or (not isinstance(v, str) and pd.isna(v)))}
    parts = [fs.model_name(s.get("model"), s.get("tp"))]
    if s.get("geometry"):
        parts.append(f"per-rank geometry {s['geometry']}")
    if "state_dtype" in s:
        parts.append(f"{s['state_dtype']} state, {s.get('act_dtype', '?')} activations")
    if "backend" in s:
        parts.append(f"{s['backend']} backend")
    if "timing_mode" in s:
        parts.append(f"{s['timing_mode']} timing, {s.get('l2', '?')} cache policy")
    if s.get("acceptance"):
        parts.append(f"acceptance {s['acceptance']}")
    return f"{'; '.join(parts)}. Measured on {run.hardware}, run {run.run_id}."


def stem(prefix: str, setting: dict) -> str:
    """A figure's file name from its setting (the geometry is in the caption, not the name)."""
    return prefix + fs.slug(*(v for k, v in setting.items() if k != "geometry"))


def flagged(df: pd.DataFrame) -> np.ndarray:
    """Rows (or ratio rows) drawn hollow: cache-resident, or a ratio's verdict that excludes it."""
    out = pd.Series(False, index=df.index)
    if "cache_resident" in df:
        out |= df["cache_resident"].astype(str).str.lower().eq("true")
    if "verdict" in df:
        out |= df["verdict"].isin(EXCLUDED_VERDICTS)
    return out.to_numpy()


# --------------------------------------------------------------------------------------------- AR speedup

def plot_ar_speedup(run: Run, ratios: pd.DataFrame, figs: fs.FigureSet) -> list[Path]:
    """Left: speedup vs batch, one line per buffer length L (solid output-only, dashed state-and-output).
    Right: speedup vs L, one line per batch: the bell curve (short buffers flush often, long ones read more
    per step). Each series with its byte-model bound (dotted)."""
    ar = ratios[ratios["metric"] == "ar_speedup"]
    paths = []
    for setting, group in groups(ar, SETTING_KEYS):
        group = group.assign(route=group["route"].astype(object).where(group["route"].notna(), ""))
        fig, (left, right) = plt.subplots(1, 2, figsize=fs.figsize(2, 0.8), sharey=True)
        handles, any_flag = [], bool(flagged(group).any())
        Ls = sorted(group["buffer_len"].dropna().unique())
        for (route, L), g in group.groupby(["route", "buffer_len"], sort=True):
            c = fs.color(None, Ls.index(L))
            h = fs.series(left, g["batch"], g["value"], g["lo"], g["hi"], color=c, flagged=flagged(g),
                          linestyle=ROUTE_STYLE.get(route, "-"), marker="o" if route != "state_and_output" else "s",
                          label=f"L = {fs.integer(L)}" + (f", {fs.name(route)}" if route else ""))
            fs.bound(left, g["batch"], g["bytes_ratio"], color=c)
            handles.append(h)
        batches = sorted(group["batch"].dropna().unique())
        right_handles = []
        for (route, b), g in group.groupby(["route", "batch"], sort=True):
            c = fs.color(None, len(Ls) + batches.index(b))
            h = fs.series(right, g["buffer_len"], g["value"], g["lo"], g["hi"], color=c, flagged=flagged(g),
                          linestyle=ROUTE_STYLE.get(route, "-"), marker="o" if route != "state_and_output" else "s",
                          label=f"batch {fs.integer(b)}" + (f", {fs.name(route)}" if route else ""))
            fs.bound(right, g["buffer_len"], g["bytes_ratio"], color=c)
            right_handles.append(h)
        for ax, xs, xlabel in ((left, batches, "Batch size"), (right, Ls, "Buffer length L")):
            ax.axhline(1.0, color="black", linewidth=0.6)
            fs.batch_axis(ax, xs)
            ax.set_xlabel(xlabel)
        left.set_ylabel("Speedup over baseline (×)")
        left.set_title("vs batch size")
        right.set_title("vs buffer length")
        extra = [fs.bound_handle()] + ([fs.hollow_handle()] if any_flag else [])
        fs.legend_below(fig, handles + right_handles + extra, ncol=4)
        title = f"AR decode speedup: {fs.model_name(setting.get('model'), setting.get('tp'))}"
        fig.suptitle(title)
        caption = ("Speedup of ReplaySSM over the state-caching baseline in autoregressive decode (baseline time "
                   "per step / ReplaySSM time per step over whole flush cycles, one SSM layer). Left: against the "
                   "batch size, one line per buffer length L; right: against L, one line per batch size. Solid "
                   "lines and circles: output-only route; dashed lines and squares: state-and-output route. "
                   "The black line marks 1x. Bands: the ratio at p20 and p80 of the two timings. "
                   + describe(run, setting))
        paths.append(figs.save(fig, stem("ar_speedup_", setting), title, caption))
    return paths


# --------------------------------------------------------------------------------------------- spec tokens/s

def _method_tps(rows: pd.DataFrame) -> pd.DataFrame:
    ar = rows["method"].isin(AR_METHODS)
    tps, lo, hi = throughput(rows, per_token=False)
    ar_tps, ar_lo, ar_hi = throughput(rows, per_token=True)
    return rows.assign(tps=tps.where(~ar, ar_tps), tps_lo=lo.where(~ar, ar_lo), tps_hi=hi.where(~ar, ar_hi))


def plot_spec_throughput(run: Run, figs: fs.FigureSet) -> list[Path]:
    """tokens/s vs batch, one panel per window T, one line per method; standard decode (the baseline's AR
    step of the same run) in every panel; each ReplaySSM / commit-replay line with its byte-model bound
    (the native spec path's tokens/s x the modelled bytes ratio)."""
    rows = primary_rows(run.rows[run.rows["status"] == "ok"])
    spec = rows[rows["method"].isin(SPEC_METHODS)]
    keys = [k for k in SETTING_KEYS if k != "experiment"]
    paths = []
    for setting, group in groups(spec, keys + ["acceptance"]):
        ar = rows[rows["method"] == "baseline_ar"]
        for k in keys:
            if k in ar:
                ar = ar[(ar[k] == setting[k]) | (ar[k].isna() & pd.isna(setting[k]))]
        # the spec experiment's own reference rows first (timed beside the spec methods), then any other
        ar = ar.assign(_own=ar["experiment"].isin(group["experiment"].unique())).sort_values("_own", ascending=False)
        ar = _method_tps(ar.drop_duplicates(subset=["batch"]))
        Ts = sorted(group["spec_T"].dropna().unique())
        n = max(len(Ts), 1)
        fig, axes = plt.subplots(1, n, figsize=fs.figsize(1 if n == 1 else 2, 0.85 if n == 1 else 0.8),
                                 squeeze=False, sharey=True)
        handles: dict[str, object] = {}
        notes: list[str] = []
        any_flag = False
        for ax, T in zip(axes[0], Ts):
            g = _method_tps(group[group["spec_T"] == T])
            per_method = {m: gm.groupby("batch", as_index=False).agg(
                tps=("tps", "max"), tps_lo=("tps_lo", "max"), tps_hi=("tps_hi", "max"),
                ratio=("byte_model_ratio", "max"), resident=("cache_resident", "first"))
                for m, gm in g.groupby("method", sort=False)}
            order = [m for m in SPEC_METHODS if m in per_method]
            twins = fs.coincide({m: per_method[m]["tps"].to_numpy() for m in order})
            native = per_method.get("baseline_spec")
            for m in order:
                gm = per_method[m]
                flag = gm["resident"].astype(str).str.lower().eq("true").to_numpy()
                any_flag |= bool(flag.any())
                label = fs.name(m) + (f" (= {fs.short_name(twins[m])})" if m in twins else "")
                if m in twins:
                    notes.append(f"{fs.name(m)} and {fs.name(twins[m])} coincide at T = {fs.integer(T)}")
                handles[label] = fs.series(ax, gm["batch"], gm["tps"], gm["tps_lo"], gm["tps_hi"], label=label,
                                           color=fs.color(m), flagged=flag, hollow_all=m in twins,
                                           marker="s" if m in twins else "o")
                if native is not None and m != "baseline_spec":
                    b = gm.merge(native[["batch", "tps"]], on="batch", suffixes=("", "_native"))
                    fs.bound(ax, b["batch"], b["tps_native"] * b["ratio"], color=fs.color(m))
            if not ar.empty:
                flag = flagged(ar)
                any_flag |= bool(flag.any())
                handles["standard"] = fs.series(ax, ar["batch"], ar["tps"], ar["tps_lo"], ar["tps_hi"],
                                                label="Standard decode (baseline)", color="black", flagged=flag,
                                                linestyle="-.", marker="^")
            fs.batch_axis(ax, pd.concat([group["batch"], ar["batch"]]))
            ax.set_yscale("log")
            ax.set_title(f"T = {fs.integer(T)}")
            ax.set_xlabel("Batch size")
        axes[0][0].set_ylabel("Tokens/s (one SSM layer)")
        extra = [fs.bound_handle()] + ([fs.hollow_handle()] if any_flag else [])
        fs.legend_below(fig, list(handles.values()) + extra, ncol=2 if n == 1 else 3)
        title = f"Spec throughput: {fs.model_name(setting.get('model'), setting.get('tp'))}"
        fig.suptitle(title)
        hist = group.loc[group["method"] == "replay_spec", "history_len"].dropna().unique()
        caption = ("Tokens per second of one SSM layer under speculative decoding (batch x mean accepted tokens / "
                   "verify+commit step time), one panel per window T, against the batch size; standard decode "
                   "(the baseline's one-token step) for reference. "
                   + (f"ReplaySSM spec history B = {', '.join(fs.integer(b) for b in hist)}. " if len(hist) else "")
                   + (" ".join(n + "." for n in notes) + " " if notes else "") + describe(run, setting))
        paths.append(figs.save(fig, stem("spec_tokens_", setting), title, caption))
    return paths


# --------------------------------------------------------------------------------------------- bandwidth

def _label(row) -> str:
    parts = [fs.short_name(row["method"])]
    if pd.notna(row.get("buffer_len")):
        parts.append(f"L = {fs.integer(row['buffer_len'])}")
    if pd.notna(row.get("spec_T")):
        parts.append(f"T = {fs.integer(row['spec_T'])}")
    if pd.notna(row.get("history_len")):
        parts.append(f"B = {fs.integer(row['history_len'])}")
    if isinstance(row.get("route"), str) and row["route"]:
        parts.append(fs.name(row["route"]))
    return ", ".join(parts)


def plot_bandwidth(run: Run, figs: fs.FigureSet) -> list[Path]:
    """% of peak bandwidth (measured copy peak; datasheet when that is missing; GB/s when both are) vs batch,
    one line per method and setting; cache-resident points hollow (their bandwidth is the cache's)."""
    rows = primary_rows(run.rows[(run.rows["status"] == "ok") & (run.rows["median_us"] > 0)])
    paths = []
    for setting, group in groups(rows, SETTING_KEYS):
        choices = (("pct_peak_measured", "% of copy bandwidth"), ("pct_peak_datasheet", "% of datasheet peak"),
                   ("achieved_GBps", "GB/s"))
        column, ylabel = next(((c, y) for c, y in choices if group[c].notna().any()), (None, None))
        if column is None:
            continue
        group = group.assign(_label=group.apply(_label, axis=1), _flag=flagged(group))
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.75 + 0.07 * group["_label"].nunique()))
        handles, any_flag = [], False
        replay_labels = sorted(group.loc[group["method"] == "replay_ar", "_label"].unique())
        for i, (label, g) in enumerate(group.groupby("_label", sort=True)):
            method = g["method"].iloc[0]
            c = (fs.L_COLORS[replay_labels.index(label) % len(fs.L_COLORS)] if method == "replay_ar"
                 else fs.color(method, i))
            dashed = g["route"].astype(str).eq("state_and_output").any()
            g = g.groupby("batch", as_index=False).agg(y=(column, "max"), med=("median_us", "min"),
                                                       p20=("p20_us", "min"), p80=("p80_us", "min"),
                                                       flag=("_flag", "max"), method=("method", "first"))
            g = g[g["y"].notna()]
            if g.empty:
                continue
            any_flag |= bool(g["flag"].any())
            handles.append(fs.series(ax, g["batch"], g["y"], g["y"] * g["med"] / g["p80"],
                                     g["y"] * g["med"] / g["p20"], label=label, color=c, flagged=g["flag"],
                                     marker=fs.MARKERS[i % len(fs.MARKERS)], linestyle="--" if dashed else "-"))
        fs.batch_axis(ax, group["batch"])
        ax.set_xlabel("Batch size")
        ax.set_ylabel(ylabel)
        fs.legend_below(fig, handles + ([fs.hollow_handle()] if any_flag else []), ncol=2)
        what = "AR decode" if setting.get("experiment") == "kernel_decode" else "Speculative decoding"
        title = f"Bandwidth: {fs.model_name(setting.get('model'), setting.get('tp'))}"
        fig.suptitle(title)
        caption = (f"{what}: achieved bandwidth ({ylabel}; copy bandwidth = measured with one torch copy): the "
                   "byte model's bytes per step (replayssm/traffic.py) over the "
                   "measured step time, per method, against the batch size; a cache-resident point's bandwidth is "
                   "the cache's, not DRAM/HBM's. " + describe(run, setting))
        paths.append(figs.save(fig, stem("bandwidth_", setting), title, caption))
    return paths


# --------------------------------------------------------------------------------------------- accuracy

def _human_series(label: str, short: bool = False) -> str:
    """"replay_spec T=4 B=16" -> "ReplaySSM spec T = 4 B = 16" (accuracy.method_label's labels)."""
    method = label.split()[0]
    return (fs.short_name(method) if short else fs.name(method)) + label[len(method):].replace("=", " = ")


def plot_accuracy(run: Run, figs: fs.FigureSet) -> list[Path]:
    """The accuracy study (accuracy.csv, experiments/accuracy.py): error vs float64 against decoded tokens,
    log-log, one figure per model x workload x precision, one line per method; left the outputs, right the
    committed state (median over rows x heads solid, p99 dashed). Identical series are marked, not hidden."""
    df = accuracy.load_accuracy(run.path)
    if df is None:
        return []
    df = accuracy.ok_rows(df)
    paths = []
    for setting, group in groups(df, ["model", "workload", "state_dtype", "act_dtype"]):
        fig, axes = plt.subplots(1, 2, figsize=fs.figsize(2, 0.8), sharex=True)
        series = {label: g.sort_values("step") for label, g in group.groupby("label", sort=False)}
        order = sorted(series, key=lambda s: (list(fs.NAMES).index(s.split()[0]) if s.split()[0] in fs.NAMES
                                              else 99, s))
        handles, notes = [], []
        Ls = sorted({s for s in order if s.startswith("replay_ar")})
        for what, ax in zip(("out", "state"), axes):
            twins = fs.coincide({s: np.concatenate([series[s]["step"], series[s][f"{what}_err_median"]])
                                 for s in order})
            for i, s in enumerate(order):
                g, method = series[s], s.split()[0]
                human = _human_series(s)
                twin = _human_series(twins[s], short=True) if s in twins else ""
                label = human + (f" (= {twin})" if s in twins else "")
                # every ReplaySSM AR buffer length its own colour, apart from the spec paths' fixed colours
                c = fs.color(method) if method != "replay_ar" else fs.L_COLORS[Ls.index(s) % len(fs.L_COLORS)]
                h = fs.series(ax, g["step"], g[f"{what}_err_median"], label=label, color=c,
                              marker=fs.MARKERS[i % len(fs.MARKERS)], hollow_all=s in twins)
                ax.plot(g["step"], g[f"{what}_err_p99"], color=c, linestyle="--", linewidth=0.7, alpha=0.8)
                if what == "out":
                    handles.append(h)
                if s in twins:
                    notes.append(f"{human} and {twin} have identical {what.replace('out', 'output')} errors "
                                 "(drawn hollow over it)")
        for ax in axes:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("Tokens decoded")
        axes[0].set_ylabel("Relative error vs float64")
        axes[0].set_title("outputs")
        axes[1].set_title("committed state")
        p99 = plt.Line2D([], [], color="black", linestyle="--", linewidth=0.7, label="dashed: p99 (median solid)")
        fs.legend_below(fig, handles + [p99], ncol=3)
        title = (f"Error vs float64: {fs.model_name(setting['model'])}, {setting['state_dtype']} state, "
                 f"{str(setting['workload']).replace('_', '-')}")
        fig.suptitle(title)
        caption = ("Relative error against the float64 recurrence over a long decode, per method: the outputs (left) "
                   "and the committed (materialised) state (right); solid: the median over rows x heads, dashed: "
                   "the p99. The speculative paths follow a random accept/rollback schedule and are compared with "
                   f"the recurrence over the accepted tokens only. Workload: {setting['workload']}; "
                   f"{setting['state_dtype']} state, {setting['act_dtype']} activations. "
                   + (" ".join(n + "." for n in notes) + " " if notes else "")
                   + f"Computed on {run.hardware}, run {run.run_id}.")
        paths.append(figs.save(fig, stem("accuracy_", setting), title, caption))
    return paths


# ------------------------------------------------------------------------------------------------- driver

def plot_run(run_dir: Path | str, out_dir: Path | str | None = None, paper: bool = True) -> list[Path]:
    """All figures of one run into RUN_DIR/plots/ (or `out_dir`) with their captions index; the PNG paths.
    `paper`: also the blog's Figs. 6-11 (experiments/report/figures/paper.py)."""
    fs.apply_style()
    run = load_run(run_dir)
    figs = fs.FigureSet(Path(out_dir) if out_dir else run.path / "plots",
                        header=f"Figures of run `{run.run_id}` ({run.hardware}).")
    ratios = summarize(run.rows).ratios
    paths = (plot_ar_speedup(run, ratios, figs) + plot_spec_throughput(run, figs) + plot_bandwidth(run, figs)
             + plot_accuracy(run, figs) + plot_hybrid(run, figs))
    if paper:
        paths += paper_figures.figures(run, figs)
    if "status" in run.rows and (run.rows["status"] == "ok").any():      # a run that measured nothing: no figure
        paths += record_figures.figures(run, figs)  # the published record's tables (none without cells.csv)
    if paths:
        figs.write_index()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/plots")
    parser.add_argument("--no-paper", action="store_true", help="skip the blog's Figs. 6-11 (paper_figures.py)")
    args = parser.parse_args(argv)
    paths = plot_run(args.run_dir, args.out, paper=not args.no_paper)
    out = args.out or args.run_dir / "plots"
    print(f"{len(paths)} figures (PNG + PDF) written to {out}; captions in {out / 'FIGURES.md'}")
    for p in paths:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
