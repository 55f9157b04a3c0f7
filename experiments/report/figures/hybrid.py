"""Figures of the whole-model experiments of one run (e2e_rows.csv, serving_rows.csv); figures/plots.py calls
`plot_hybrid` for a run that has them, and `main` (scripts/report/hybrid_plots.py) draws them alone.
Look: experiments/report/figures/style.py.

    serving_throughput_*   tokens/s vs batch for standard decode, native spec, commit-replay spec and
                           ReplaySSM spec, per model, T and acceptance (the blog's Fig. 8); p20-p80 bands
    serving_concurrency_*  max concurrent sequences per mode under the run's HBM budget (the blog's Fig. 11)
    e2e_breakdown_*        ms per decode step stacked by SSM / attention / MLP+MoE / other, baseline vs
                           ReplaySSM, per batch (a step composed from one block per layer kind says so)

Output: RUN_DIR/plots/<name>.png and .pdf, captions in RUN_DIR/plots/FIGURES.md.

CLI: python scripts/report/hybrid_plots.py RUN_DIR [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.report.figures import style as fs
from experiments.report.hybrid import load
from experiments.report.runs import load_run

MODE_ORDER = ["ar", "native", "commit_replay", "replayssm"]
PARTS = [("ssm_us", "SSM mixers"), ("attention_us", "attention"), ("mlp_us", "MLP / MoE"), ("other_us", "other")]
PART_COLORS = [fs.OKABE_ITO["blue"], fs.OKABE_ITO["orange"], fs.OKABE_ITO["green"], fs.OKABE_ITO["grey"]]


def _groups(df: pd.DataFrame, keys: list[str]):
    keys = [k for k in keys if k in df.columns]
    for values, group in df.groupby(keys, dropna=False, sort=True):
        yield dict(zip(keys, values if isinstance(values, tuple) else (values,))), group


def _true(col: pd.Series) -> pd.Series:
    return col.astype(str).str.lower().eq("true")


def _where(run, rows: pd.DataFrame) -> str:
    composed = _true(rows["composed"]).any() if "composed" in rows else False
    text = (f"Random weights at the model's dimensions, {rows['backend'].iloc[0]} backend, "
            f"{rows['state_dtype'].iloc[0]} state, {rows['act_dtype'].iloc[0]} activations, "
            f"context {fs.integer(rows['context_len'].iloc[0])} tokens")
    if composed:
        text += ("; the step is composed from one built block per layer kind scaled by the layer pattern's "
                 f"counts ({rows['composition'].iloc[0]})")
    return text + f". Measured on {run.hardware}, run {run.run_id}."


def plot_serving(run, figs: fs.FigureSet) -> list[Path]:
    rows = load(run.path, "serving_rows.csv")
    paths: list[Path] = []
    if rows.empty:
        return paths
    rows = rows.assign(tps_lo=rows["tokens_per_s"] * rows["median_us"] / rows["p80_us"],
                       tps_hi=rows["tokens_per_s"] * rows["median_us"] / rows["p20_us"])
    ar = rows[rows["mode"] == "ar"]
    spec = rows[rows["mode"] != "ar"]
    for setting, group in _groups(spec, ["model", "tp", "context_len", "spec_T", "acceptance", "act_dtype"]):
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.8))
        base = ar[(ar["model"] == setting["model"]) & (ar["tp"] == setting["tp"])
                  & (ar["context_len"] == setting["context_len"])]
        data = {}
        for mode in MODE_ORDER:
            g = base if mode == "ar" else group[group["mode"] == mode]
            g = g[~_true(g["at_max_concurrency"])] if "at_max_concurrency" in g else g
            if not g.empty:
                data[mode] = g.sort_values("batch")
        twins = fs.coincide({m: g["tokens_per_s"].to_numpy() for m, g in data.items()})
        handles = []
        for i, (mode, g) in enumerate(data.items()):
            label = fs.name(mode) + (f" (= {fs.short_name(twins[mode])})" if mode in twins else "")
            handles.append(fs.series(ax, g["batch"], g["tokens_per_s"], g["tps_lo"], g["tps_hi"], label=label,
                                     color=fs.color(mode), marker=fs.MARKERS[i], hollow_all=mode in twins,
                                     linestyle="-." if mode == "ar" else "-"))
        fs.batch_axis(ax, rows["batch"][rows["model"] == setting["model"]])
        ax.set_xlabel("Batch size")
        ax.set_ylabel("Tokens/s")
        fs.legend_below(fig, handles, ncol=2)
        title = f"Speculative serving: {fs.model_name(setting['model'], setting['tp'])}"
        fig.suptitle(title)
        T = fs.integer(setting["spec_T"])
        caption = (f"Whole-model decode throughput against the batch size: standard decode (one token per step) and "
                   f"speculative decoding with window T = {T} (draft by one MTP module + verify of the whole model on "
                   f"T tokens + commit; tokens/s = batch x mean accepted tokens / step time), acceptance "
                   f"{setting['acceptance']}. " + ("; ".join(f"{fs.name(a)} and {fs.name(b)} coincide"
                                                             for a, b in twins.items()) + (". " if twins else ""))
                   + _where(run, group))
        paths.append(figs.save(fig, "serving_throughput_" + fs.slug(*setting.values()), title, caption))
    for setting, group in _groups(rows, ["model", "tp", "spec_T"]):
        if pd.isna(setting["spec_T"]):
            continue
        modes = group.drop_duplicates("mode").set_index("mode")
        ar_rows = rows[(rows["mode"] == "ar") & (rows["model"] == setting["model"]) & (rows["tp"] == setting["tp"])]
        conc = {m: (ar_rows if m == "ar" else modes.loc[[m]])["max_concurrency"].iloc[0]
                for m in MODE_ORDER if (m == "ar" and not ar_rows.empty) or m in modes.index}
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.75))
        names = [fs.name(m).replace(" spec", "\nspec").replace(" decode", "\ndecode") for m in conc]
        ax.bar(names, list(conc.values()), color=[fs.color(m) for m in conc], width=0.6)
        for i, v in enumerate(conc.values()):
            ax.annotate(f"{int(v):,}", (i, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                        textcoords="offset points")
        ax.set_ylim(0, max(conc.values()) * 1.15)
        ax.grid(axis="x", visible=False)
        ax.set_ylabel("Max concurrent sequences")
        title = f"Max concurrency: {fs.model_name(setting['model'], setting['tp'])}"
        fig.suptitle(title)
        first = group.iloc[0]
        caption = (f"Sequences that fit the HBM budget per serving mode (T = {fs.integer(setting['spec_T'])} for the "
                   f"speculative modes), from the analytic footprint (experiments/hybrid/footprint.py: weights + KV at "
                   f"max_model_len {fs.integer(first['max_model_len'])} + SSM states + ReplaySSM buffers / rings + "
                   f"conv states): budget {first['hbm_budget_bytes'] / 1e9:.0f} GB ({first['hbm_source']}). "
                   f"Not a measurement of memory. Run {run.run_id}.")
        paths.append(figs.save(fig, "serving_concurrency_" + fs.slug(*setting.values()), title, caption))
    return paths


def plot_e2e_breakdown(run, figs: fs.FigureSet) -> list[Path]:
    rows = load(run.path, "e2e_rows.csv")
    paths: list[Path] = []
    if rows.empty:
        return paths
    for setting, group in _groups(rows, ["model", "tp", "context_len", "act_dtype"]):
        group = group.sort_values(["batch", "method"])
        batches = sorted(group["batch"].unique())
        methods = [m for m in ("baseline_ar", "replay_ar") if m in set(group["method"])]
        fig, ax = plt.subplots(figsize=fs.figsize(1, 0.8))
        width = 0.8 / max(len(methods), 1)
        handles = []
        for j, method in enumerate(methods):
            g = group[group["method"] == method].set_index("batch").reindex(batches)
            x = np.arange(len(batches)) + (j - (len(methods) - 1) / 2) * width
            bottom = np.zeros(len(batches))
            for (col, part), c in zip(PARTS, PART_COLORS):
                ms = g[col].fillna(0).to_numpy() / 1e3
                bars = ax.bar(x, ms, width * 0.92, bottom=bottom, color=c, edgecolor="white", linewidth=0.4,
                              hatch="//" if method == "replay_ar" else None, label=part if j == 0 else None)
                if j == 0:
                    handles.append(bars)
                bottom += ms
            for xi, total in zip(x, bottom):
                ax.annotate("R" if method == "replay_ar" else "B", (xi, total), ha="center", va="bottom",
                            fontsize=6, xytext=(0, 1), textcoords="offset points")
        ax.set_xticks(np.arange(len(batches)), [fs.integer(b) for b in batches])
        ax.grid(axis="x", visible=False)
        ax.set_xlabel("Batch size")
        ax.set_ylabel("ms per decode step")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        hatch = plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="//",
                              label="hatched (R): ReplaySSM; plain (B): baseline")
        fs.legend_below(fig, handles + [hatch], ncol=2)
        composed = _true(group["composed"]).any()
        title = f"Step breakdown: {fs.model_name(setting['model'], setting['tp'])}"
        fig.suptitle(title)
        L = group.loc[group["method"] == "replay_ar", "buffer_len"].dropna().unique()
        caption = ("Milliseconds per whole-model decode step, stacked by component (the shares come from a separate "
                   "profiled pass with a device sync around every sub-layer, applied to the unprofiled step time); "
                   "left bar of each batch: the state-caching baseline (B), right bar: ReplaySSM (R"
                   + (f", L = {', '.join(fs.integer(v) for v in L)}" if len(L) else "") + ")"
                   + ("; composed step" if composed else "") + ". " + _where(run, group))
        paths.append(figs.save(fig, "e2e_breakdown_" + fs.slug(*setting.values()), title, caption))
    return paths


def plot_hybrid(run, figs: fs.FigureSet) -> list[Path]:
    return plot_serving(run, figs) + plot_e2e_breakdown(run, figs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/plots")
    args = parser.parse_args(argv)
    fs.apply_style()
    run = load_run(args.run_dir)
    out = args.out or run.path / "plots"
    figs = fs.FigureSet(out, header=f"Figures of run `{run.run_id}` ({run.hardware}).")
    paths = plot_hybrid(run, figs)
    if not paths:
        print(f"{args.run_dir}: no e2e_rows.csv / serving_rows.csv rows with status ok: nothing to draw",
              file=sys.stderr)
        return 1
    figs.write_index()
    print(f"{len(paths)} figures (PNG + PDF) written to {out}; captions in {out / 'FIGURES.md'}")
    for p in paths:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
