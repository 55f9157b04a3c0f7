"""The blog's Figures 6-11, one to one, from one run's rows, with the published values as labelled reference
markers (experiments/report/figures/published.py: value, hardware, source). Look: experiments/report/figures/style.py.

    fig6_kernel_speedup     AR kernel speedup per model at batch 256 (nearest batch the run has), buffer 8
                            (Mamba-2) / 16 (GDN) as published (nearest the run has); byte-model bound; published
                            family ranges
    fig7_buffer_length      AR kernel speedup vs buffer length at batch 64 and 256 (nearest), per model;
                            the published best L per family
    fig8_serving_*          throughput over standard decoding vs batch, native spec and ReplaySSM spec (whole
                            model: serving_rows.csv; else the SSM-layer proxy of kernel_spec), T = 4
    fig9_spec_cost_*        cost of one verify+commit step relative to a standard decode step vs window T; the
                            band spans all-reject to all-accept where the run has both (acceptance fixed:0 and
                            fixed:all), else the measured acceptance models are points
    fig10_levels            ReplaySSM spec over native spec at kernel, verify-forward and whole-step level
    fig11_concurrency       max concurrency, ReplaySSM spec over native spec, per model

A panel whose rows the run lacks is not drawn (the captions index says which). Nothing is filled in: every
measured mark is a ratio of rows of this run; every star or bar in black is published, labelled so.

Output: RUN_DIR/plots/fig*.png and .pdf with captions in RUN_DIR/plots/FIGURES.md.
CLI: python scripts/report/paper_figures.py RUN_DIR [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.report.figures import style as fs
from experiments.report.figures.published import references
from experiments.report.hybrid import hybrid_ratios, load
from experiments.report.runs import EXCLUDED_VERDICTS, Run, load_run, primary_rows, summarize

PUBLISHED_L = {"mamba2": 8, "gdn": 16}
FAMILY_NAME = {"mamba2": "Mamba-2", "gdn": "GDN"}


def _nearest(values, target: float) -> float:
    values = np.asarray(sorted(set(float(v) for v in values if v == v)))
    return float(values[np.argmin(np.abs(np.log(values) - np.log(target)))])


def _route_pref(df: pd.DataFrame) -> pd.DataFrame:
    """Output-only where the run has it (the fork's Mamba-2 default), else what there is."""
    out = df[df["route"] == "output_only"]
    return out if not out.empty else df


def _hollow(df: pd.DataFrame) -> np.ndarray:
    return (df["verdict"].isin(EXCLUDED_VERDICTS)).to_numpy() if "verdict" in df else np.zeros(len(df), bool)


def _where(run: Run) -> str:
    return f"Measured on {run.hardware}, run {run.run_id}."


def _range(ax, x, lo, hi, label=None, color="black", width=0.12):
    ax.plot([x, x], [lo, hi], color=color, linewidth=2.2, solid_capstyle="butt", label=label, zorder=4)
    ax.plot([x - width, x + width], [lo, lo], color=color, linewidth=1)
    ax.plot([x - width, x + width], [hi, hi], color=color, linewidth=1)


def _star(ax, x, y, label=None, color="black"):
    ax.plot([x], [y], marker="*", markersize=8, color=color, markeredgecolor="black", linestyle="none",
            label=label, zorder=5)


def _ref_handles(refs) -> list:
    out, seen = [], set()
    for r in refs:
        text = f"{r.label} ({r.hardware})"
        if text in seen:
            continue
        seen.add(text)
        if r.value is not None:
            out.append(plt.Line2D([], [], marker="*", markersize=8, color="black", linestyle="none", label=text))
        elif r.lo is not None:
            out.append(plt.Line2D([], [], color="black", linewidth=2.2, label=text))
        else:
            out.append(plt.Line2D([], [], color="black", linestyle="--", linewidth=0.8, label=text))
    return out


# ------------------------------------------------------------------------------------------------ Fig 6

def fig6(run: Run, ratios: pd.DataFrame, figs: fs.FigureSet) -> list[Path]:
    ar = ratios[(ratios["metric"] == "ar_speedup") & (ratios["experiment"] == "kernel_decode")]
    if ar.empty:
        return []
    picked = []
    for _, g in ar.groupby(["model", "tp"], sort=True):
        g = _route_pref(g)
        b = _nearest(g["batch"], 256)
        g = g[g["batch"] == b]
        L = _nearest(g["buffer_len"], PUBLISHED_L.get(g["family"].iloc[0], 16))
        picked.append(g[g["buffer_len"] == L].iloc[0])
    df = pd.DataFrame(picked).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=fs.figsize(1, (1.7 + 0.42 * len(df)) / fs.ONE_COLUMN))   # legend + one row per bar
    y = np.arange(len(df))[::-1]
    hollow = _hollow(df)
    colors = [fs.color("replay_ar") if f == "mamba2" else fs.OKABE_ITO["vermillion"] for f in df["family"]]
    ax.barh(y, df["value"], 0.55, color=["white" if h else c for h, c in zip(hollow, colors)], edgecolor=colors,
            linewidth=1.2, xerr=[df["value"] - df["lo"], df["hi"] - df["value"]], ecolor="black", capsize=2,
            error_kw={"linewidth": 0.8})
    ax.plot(df["bytes_ratio"], y, linestyle="none", marker="|", markersize=12, color="black", markeredgewidth=1.4)
    refs = references("fig6")
    for yi, fam in zip(y, df["family"]):
        for r in refs:
            if r.family == fam:
                ax.plot([r.lo, r.hi], [yi - 0.38, yi - 0.38], color="black", linewidth=2.2, solid_capstyle="butt")
    ax.axvline(1.0, color="black", linewidth=0.6)
    ax.set_yticks(y, [f"{fs.model_name(m, tp)}\nbatch {fs.integer(b)}, L = {fs.integer(L)}"
                      for m, tp, b, L in zip(df["model"], df["tp"], df["batch"], df["buffer_len"])], fontsize=6.5)
    ax.set_ylim(-0.7, len(df) - 0.4)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("Kernel speedup over baseline (×)")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=fs.color("replay_ar"), label="Mamba-2, this run"),
               plt.Rectangle((0, 0), 1, 1, facecolor=fs.OKABE_ITO["vermillion"], label="GDN, this run"),
               plt.Line2D([], [], marker="|", markersize=8, color="black", linestyle="none",
                          label="byte-model bound")]
    if hollow.any():
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black",
                                     label="hollow: cache-resident / not bw-bound"))
    family_range = plt.Line2D([], [], color="black", linewidth=2.2,
                              label=f"published range of the family ({refs[0].hardware})")
    fs.legend_below(fig, handles + [family_range], ncol=2)
    title = "Kernel speedup per model"
    fig.suptitle(title)
    caption = ("ReplaySSM over the state-caching baseline, one SSM layer, autoregressive decode, per model: the "
               "blog's Fig. 6 at batch 256 with buffer length 8 (Nemotron-3, Mamba-2) / 16 (Qwen3.5, GDN); each "
               "bar uses the run's batch and L nearest those (named under the bar) and the output-only route where "
               "measured. Error bars: the ratio at p20 and p80; vertical ticks: the byte-model bound; black bars "
               "under each: the published range over the family's models (the blog's Fig. 6 gives ranges, not "
               "per-model values; H100 for the 4B models, B300 for the large ones). "
               + _where(run))
    return [figs.save(fig, "fig6_kernel_speedup", title, "The blog's Fig. 6: " + caption)]


# ------------------------------------------------------------------------------------------------ Fig 7

def fig7(run: Run, ratios: pd.DataFrame, figs: fs.FigureSet) -> list[Path]:
    ar = ratios[(ratios["metric"] == "ar_speedup") & (ratios["experiment"] == "kernel_decode")]
    if ar.empty or ar["buffer_len"].nunique() < 2:
        return []
    fig, ax = plt.subplots(figsize=fs.figsize(1, 0.95))
    handles, any_flag, i = [], False, 0
    for (model, tp), g in ar.groupby(["model", "tp"], sort=True):
        g = _route_pref(g)
        for target, style in ((64, "--"), (256, "-")):
            b = _nearest(g["batch"], target)
            gb = g[g["batch"] == b].sort_values("buffer_len")
            if target == 64 and b == _nearest(g["batch"], 256):
                continue                                   # one batch serves both: drawn once
            flag = _hollow(gb)
            any_flag |= bool(flag.any())
            handles.append(fs.series(ax, gb["buffer_len"], gb["value"], gb["lo"], gb["hi"], color=fs.color(None, i),
                                     flagged=flag, linestyle=style, marker=fs.MARKERS[i % len(fs.MARKERS)],
                                     label=f"{fs.model_name(model, tp)}, batch {fs.integer(b)}"))
            i += 1
    refs = references("fig7")
    for r in refs:
        ax.axvline(r.x, color="black", linestyle="--" if r.family == "mamba2" else "-.", linewidth=0.8)
    ref_handles = [plt.Line2D([], [], color="black", linestyle="--" if r.family == "mamba2" else "-.",
                              linewidth=0.8, label=f"{r.label} = {r.x} ({r.hardware})") for r in refs]
    ax.axhline(1.0, color="black", linewidth=0.6)
    fs.batch_axis(ax, list(ar["buffer_len"]) + [r.x for r in refs])
    ax.set_xlabel("Buffer length L")
    ax.set_ylabel("Kernel speedup (×)")
    fs.legend_below(fig, handles + ref_handles + ([fs.hollow_handle()] if any_flag else []), ncol=1)
    title = "Speedup vs buffer length"
    fig.suptitle(title)
    caption = ("ReplaySSM over the baseline against the buffer length L, one SSM layer, autoregressive decode, at "
               "the run's batch sizes nearest 64 (dashed) and 256 (solid), output-only route where measured. "
               "Vertical lines: the published best buffer length (the bell curve's peak: 8 for Nemotron-3, 16 for "
               "Qwen3.5, blog Fig. 7, H100 / B300; the blog gives no per-L values). " + _where(run))
    return [figs.save(fig, "fig7_buffer_length", title, "The blog's Fig. 7: " + caption)]


# ------------------------------------------------------------------------------------------------ Fig 8

def _serving_over_ar(run: Run) -> tuple[pd.DataFrame, str]:
    """mode, model, tp, batch, spec_T, value = mode tokens/s / standard decode tokens/s (same batch)."""
    rows = load(run.path, "serving_rows.csv")
    if not rows.empty:
        rows = rows[~rows["at_max_concurrency"].astype(str).str.lower().eq("true")]
        ar = rows[rows["mode"] == "ar"][["model", "tp", "batch", "context_len", "tokens_per_s"]]
        spec = rows[rows["mode"] != "ar"].merge(ar, on=["model", "tp", "batch", "context_len"], suffixes=("", "_ar"))
        return spec.assign(value=spec["tokens_per_s"] / spec["tokens_per_s_ar"]), "whole model (serving_rows.csv)"
    ratios = summarize(run.rows).ratios
    k = ratios[ratios["metric"].isin(["spec_vs_ar", "native_spec_vs_ar"])]
    mode = k["metric"].map({"spec_vs_ar": "replayssm", "native_spec_vs_ar": "native"})
    return k.assign(mode=mode), "SSM-layer proxy (kernel_spec rows; no serving_rows.csv in this run)"


def fig8(run: Run, figs: fs.FigureSet) -> list[Path]:
    df, level = _serving_over_ar(run)
    if df.empty:
        return []
    paths = []
    refs = references("fig8")
    for (model, tp, T), g in df.groupby(["model", "tp", "spec_T"], sort=True):
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.95))
        handles = []
        for i, mode in enumerate(["native", "commit_replay", "replayssm"]):
            gm = g[g["mode"] == mode].groupby("batch", as_index=False)["value"].max()
            if not gm.empty:
                handles.append(fs.series(ax, gm["batch"], gm["value"], color=fs.color(mode), label=fs.name(mode),
                                         marker=fs.MARKERS[i]))
        def ref_style(r):
            ours = r.label.startswith("ReplaySSM")
            return dict(marker="*" if ours else "P", markersize=8 if ours else 6, linestyle="none",
                        markeredgecolor="black", markeredgewidth=0.6, color=fs.color("replayssm" if ours else "native"))

        for r in refs:
            if r.value is not None:
                ax.plot([r.x], [r.value], zorder=5, **ref_style(r))
            else:
                ax.axhspan(r.lo, r.hi, color=fs.color("replayssm"), alpha=0.12, linewidth=0)
        ref_handles = [plt.Line2D([], [], label=f"published: {r.label.replace(' (PR #49887)', '')} (B300)",
                                  **ref_style(r))
                       for r in {r.label: r for r in refs if r.value is not None}.values()]
        ref_handles += [plt.Rectangle((0, 0), 1, 1, color=fs.color("replayssm"), alpha=0.12,
                                      label=f"published: ReplaySSM spec {r.lo}-{r.hi}x ({r.hardware.split(',')[0]})")
                        for r in refs if r.value is None]
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle="-.")
        fs.batch_axis(ax, list(g["batch"]) + [r.x for r in refs if r.x is not None])
        ax.set_xlabel("Batch size")
        ax.set_ylabel("Over standard decoding (×)")
        fs.legend_below(fig, handles + ref_handles, ncol=1)
        title = f"Spec serving: {fs.model_name(model, tp)}"
        fig.suptitle(title)
        caption = (f"Tokens/s of native speculative decoding and ReplaySSM speculative decoding (window T = "
                   f"{fs.integer(T)}) over standard decoding (the dash-dot line at 1x) at the same batch size; "
                   f"{level}. Published (vLLM PR #49887, Qwen3.5-122B, T = 4; hardware not in its table, taken as the "
                   "blog's B300 NVFP4 setup): stars, ReplaySSM spec over no-spec decoding; plus signs, the native "
                   "path, computed as (ReplaySSM / no-spec) / (ReplaySSM / native) from the PR's two tables; shaded: "
                   "the blog's Fig. 8 range 1.87-1.96x (B300, NVFP4, GSM8K, MTP drafter). " + _where(run))
        paths.append(figs.save(fig, f"fig8_serving_{fs.slug(model, tp, T)}", title, "The blog's Fig. 8: " + caption))
    return paths


# ------------------------------------------------------------------------------------------------ Fig 9

def fig9(run: Run, figs: fs.FigureSet) -> list[Path]:
    rows = primary_rows(run.rows[run.rows["status"] == "ok"])
    spec = rows[rows["experiment"] == "kernel_spec"]
    if spec.empty:
        return []
    paths = []
    refs = references("fig9")
    for (model, tp), g in spec.groupby(["model", "tp"], sort=True):
        b = _nearest(g[g["method"] != "baseline_ar"]["batch"], 128)
        g = g[g["batch"] == b]
        # the standard step: kernel_spec's own baseline_ar (timed beside the spec methods), else another
        # experiment's of this run at the same model, TP and batch
        own = g[g["method"] == "baseline_ar"]["median_us"]
        other = rows[(rows["method"] == "baseline_ar") & (rows["model"] == model) & (rows["tp"] == tp)
                     & (rows["batch"] == b)]["median_us"]
        ar = own.min() if len(own) else other.min()
        if not ar > 0:
            continue
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.95))
        handles, notes = [], []
        for i, method in enumerate(["baseline_spec", "commit_replay_spec", "replay_spec"]):
            gm = g[g["method"] == method]
            gm = gm.assign(cost=gm["median_us"] / ar)
            if gm.empty:
                continue
            by = gm.groupby(["spec_T", "acceptance"], as_index=False)["cost"].min()
            per_T = by.groupby("spec_T")["cost"]
            accs = set(by["acceptance"])
            band = {"fixed:0", "fixed:all"} <= {str(a) for a in accs}
            if band:
                ends = by[by["acceptance"].isin(["fixed:0", "fixed:all"])].groupby("spec_T")["cost"]
                lo, hi = ends.min(), ends.max()
                mid = (lo + hi) / 2
                handles.append(fs.series(ax, mid.index, mid.to_numpy(), lo.to_numpy(), hi.to_numpy(),
                                         color=fs.color(method), label=fs.name(method), marker=fs.MARKERS[i]))
            else:
                med = per_T.median()
                accs_text = ", ".join(sorted(str(a).replace(":", " ") for a in accs))
                handles.append(fs.series(ax, med.index, med.to_numpy(), color=fs.color(method),
                                         label=f"{fs.short_name(method)} (acceptance {accs_text})",
                                         marker=fs.MARKERS[i]))
                notes.append(fs.name(method))
        for r in refs:
            c = fs.color("baseline_spec" if r.value is not None else "replay_spec")
            if r.value is not None:
                _star(ax, r.x, r.value, color=c)
            else:
                _range(ax, r.x + 0.15, r.lo, r.hi, color=c, width=0.08)
        ref_handles = [plt.Line2D([], [], marker="*", markersize=8, linestyle="none", markeredgecolor="black",
                                  color=fs.color("baseline_spec"), label="published: native spec (B300)"),
                       plt.Line2D([], [], color=fs.color("replay_spec"), linewidth=2.2,
                                  label="published: ReplaySSM spec, reject-accept (B300)")]
        ax.axhline(1.0, color="black", linewidth=0.6, linestyle="-.")
        Ts = sorted(set(g["spec_T"].dropna()) | {r.x for r in refs})
        fs.batch_axis(ax, Ts, log=False)
        ax.set_xlim(min(Ts) - 0.6, max(Ts) + 0.6)
        ax.set_xlabel("Speculative window T")
        ax.set_ylabel("Cost / standard decode step (×)")
        fs.legend_below(fig, handles + ref_handles, ncol=1)
        title = f"Spec step cost: {fs.model_name(model, tp)}"
        fig.suptitle(title)
        caption = (f"Time of one verify+commit step of each speculative method over one standard decode step of the "
                   f"baseline (the dash-dot line), one SSM layer, batch {fs.integer(b)} (the run's batch nearest the "
                   "blog's 128), against the window T. "
                   + ("Bands span all-reject (acceptance fixed:0) to all-accept (fixed:all). " if not notes else
                      f"The run has no all-reject / all-accept rows for {', '.join(notes)}: those are the measured "
                      "acceptance models (legend), no band. ")
                   + "Published: the blog's Qwen3.5-122B values at T = 6 (native spec 4.85x; ReplaySSM 1.27-1.72x "
                   "from all-reject to all-accept), batch 128, buffer 16, NVFP4 on one B300 (blog Fig. 9). "
                   + _where(run))
        paths.append(figs.save(fig, f"fig9_spec_cost_{fs.slug(model, tp)}", title, "The blog's Fig. 9: " + caption))
    return paths


# ----------------------------------------------------------------------------------------------- Fig 10

def fig10(run: Run, ratios: pd.DataFrame, whole: pd.DataFrame, figs: fs.FigureSet) -> list[Path]:
    kernel = ratios[(ratios["metric"] == "spec_vs_native") & (ratios["experiment"] == "kernel_spec")]
    step = whole[whole["metric"] == "spec_vs_native"] if not whole.empty else whole
    if kernel.empty and step.empty:
        return []
    levels = ["kernel", "verify forward", "whole step"]
    fig, ax = plt.subplots(figsize=fs.figsize(1, 0.95))
    handles, models = [], sorted(set(kernel.get("model", [])) | set(step.get("model", [])))
    any_flag = False
    for level, df in (("kernel", kernel), ("whole step", step)):
        x0 = levels.index(level)
        for (model, _tp), g in df.groupby(["model", "tp"], sort=True) if not df.empty else []:
            g = g[(g["spec_T"] == 4)] if (g["spec_T"] == 4).any() else g
            row = g.loc[(np.log(g["batch"]) - np.log(256)).abs().idxmin()]
            k = models.index(model)
            x = x0 + (k - (len(models) - 1) / 2) * 0.12
            flag = row.get("verdict") in EXCLUDED_VERDICTS
            any_flag |= flag
            ax.plot([x], [row["value"]], marker=fs.MARKERS[k % len(fs.MARKERS)], color=fs.color(None, k),
                    markerfacecolor="white" if flag else fs.color(None, k), linestyle="none", zorder=3)
            ax.annotate(f"b{fs.integer(row['batch'])}", (x, row["value"]), fontsize=5, xytext=(3, 0),
                        textcoords="offset points", va="center")
    for k, m in enumerate(models):
        tps = set(kernel[kernel["model"] == m]["tp"]) | set(step[step["model"] == m]["tp"]) if not step.empty else \
            set(kernel[kernel["model"] == m]["tp"])
        handles.append(plt.Line2D([], [], marker=fs.MARKERS[k % len(fs.MARKERS)], color=fs.color(None, k),
                                  linestyle="none", label=fs.model_name(m, next(iter(tps), 1))))
    for r in references("fig10"):
        _range(ax, levels.index(r.x) + 0.42, r.lo, r.hi, width=0.05)
    ax.text(1, 1.0, "not measured\n(no verify-forward rows)", ha="center", va="bottom", fontsize=6, color="0.3")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(3), levels)
    ax.set_xlim(-0.5, 2.7)
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("ReplaySSM / native spec (×)")
    r0 = references("fig10")[0]
    ref = plt.Line2D([], [], color="black", linewidth=2.2, label=f"published range ({r0.hardware})")
    fs.legend_below(fig, handles + [ref] + ([fs.hollow_handle()] if any_flag else []), ncol=2)
    title = "Kernel to whole step"
    fig.suptitle(title)
    caption = ("ReplaySSM speculative decoding over the native speculative path (T = 4 where measured) at three "
               "levels: the SSM kernel (verify+commit of one layer, tokens/s ratio, kernel_spec rows), the verify "
               "forward pass (not measured by this harness) and the whole decode step (draft + verify + commit of "
               "the whole model, serving rows); one marker per model at the run's batch nearest 256 (label b<N>). "
               "Black bars: the published ranges (blog Fig. 10, window 4, B300: kernel 2.28-3.33x, verify forward "
               "1.23-1.69x, whole step 1.20-1.58x). " + _where(run))
    return [figs.save(fig, "fig10_levels", title, "The blog's Fig. 10: " + caption)]


# ----------------------------------------------------------------------------------------------- Fig 11

def fig11(run: Run, ratios: pd.DataFrame, whole: pd.DataFrame, figs: fs.FigureSet) -> list[Path]:
    step = whole[whole["metric"] == "concurrency"] if not whole.empty else whole
    kernel = ratios[(ratios["metric"] == "concurrency") & (ratios["experiment"] == "kernel_spec")]
    src, level = (step, "whole model (footprint incl. weights and KV, serving_rows.csv)") if not step.empty else \
        (kernel, "SSM state only (kernel_spec footprints; weights and KV not counted)")
    if src.empty:
        return []
    df = src.drop_duplicates(["model", "tp"]).sort_values(["model", "tp"]).reset_index(drop=True)
    refs = references("fig11")
    span = next(r for r in refs if r.lo is not None)
    star_refs = [r for r in refs if r.value is not None]
    n = len(df) + len(star_refs)
    fig, ax = plt.subplots(figsize=fs.figsize(1, (1.5 + 0.36 * n) / fs.ONE_COLUMN))
    y = np.arange(n)[::-1]
    ax.barh(y[:len(df)], df["value"], 0.55, color=fs.color("replayssm"))
    for yi, v in zip(y, df["value"]):
        ax.annotate(f"{v:.2f}x", (v, yi), ha="left", va="center", fontsize=6.5, xytext=(2, 0),
                    textcoords="offset points")
    ax.axvspan(span.lo, span.hi, color="black", alpha=0.12, linewidth=0)
    for yi, r in zip(y[len(df):], star_refs):
        _star(ax, r.value, yi)
        ax.annotate(f"{r.value:.2f}x", (r.value, yi), ha="left", va="center", fontsize=6.5, xytext=(4, 0),
                    textcoords="offset points")
    ax.axvline(1.0, color="black", linewidth=0.6)
    labels = [fs.model_name(m, tp) for m, tp in zip(df["model"], df["tp"])]
    labels += [f"{fs.model_name(r.model)}\n(published, {r.hardware.split(',')[0]})" for r in star_refs]
    ax.set_yticks(y, labels, fontsize=6.5)
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(span.hi, df["value"].max()) * 1.2)
    ax.set_xlabel("ReplaySSM / native spec (×)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=fs.color("replayssm"), label="this run"),
               plt.Rectangle((0, 0), 1, 1, color="black", alpha=0.12,
                             label=f"published {span.lo}-{span.hi}x ({span.hardware})"),
               plt.Line2D([], [], marker="*", markersize=8, color="black", linestyle="none",
                          label="published per model (B300)")]
    fs.legend_below(fig, handles, ncol=2)
    title = "Max concurrency vs native spec"
    fig.suptitle(title)
    T = df["spec_T"].dropna()
    caption = (f"Sequences that fit one memory budget with ReplaySSM speculative decoding over the native "
               f"speculative path (window T = {fs.integer(T.iloc[0]) if len(T) else '?'}), per model: {level}; "
               "analytic footprints, not a measurement of memory. Shaded: the blog's Fig. 11 range 3.0-3.3x (fixed "
               "HBM budget, window 4, B300); stars: vLLM PR #47576 (B = 16, T = 4, max_model_len 2048, one B300: "
               "Nemotron-3-Super-120B 694 vs 213 sequences, Qwen3.5-122B 702 vs 233). " + _where(run))
    return [figs.save(fig, "fig11_concurrency", title, "The blog's Fig. 11: " + caption)]


# ------------------------------------------------------------------------------------------------ driver

def figures(run: Run, figs: fs.FigureSet) -> list[Path]:
    """Figs. 6-11 of a loaded run into `figs` (figures/plots.py calls this with its own FigureSet)."""
    ratios = summarize(run.rows).ratios
    whole = hybrid_ratios(run.path)
    return (fig6(run, ratios, figs) + fig7(run, ratios, figs) + fig8(run, figs) + fig9(run, figs)
            + fig10(run, ratios, whole, figs) + fig11(run, ratios, whole, figs))


def paper_figures(run_dir: Path | str, out_dir: Path | str | None = None) -> list[Path]:
    fs.apply_style()
    run = load_run(run_dir)
    figs = fs.FigureSet(Path(out_dir) if out_dir else run.path / "plots",
                        header=f"Figures of run `{run.run_id}` ({run.hardware}).")
    paths = figures(run, figs)
    if paths:
        figs.write_index()
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/plots")
    args = parser.parse_args(argv)
    paths = paper_figures(args.run_dir, args.out)
    if not paths:
        print(f"{args.run_dir}: no rows any of Figs. 6-11 needs (status ok): nothing drawn", file=sys.stderr)
        return 1
    out = args.out or args.run_dir / "plots"
    print(f"{len(paths)} paper figures (PNG + PDF) written to {out}; captions in {out / 'FIGURES.md'}")
    for p in paths:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
