"""Plots of the whole-model experiments of one run (called by scripts/plots.py when the run has them):

    serving_throughput_*.png   tokens/s vs batch for ar / native / replayssm (/ commit_replay), per model, T and
                               acceptance (the blog's Fig. 8); p20/p80 bands
    serving_concurrency_*.png  max concurrency per mode under the run's HBM budget (the blog's Fig. 11)
    e2e_breakdown_*.png        ms per decode step stacked by SSM / attention / MLP+MoE / other, baseline vs
                               ReplaySSM, per batch (composed steps say so in the title)
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from hybrid_summary import load
from plots import _band, _groups, _log2_batch, _save, _slug, _title

MODE_ORDER = ["ar", "native", "commit_replay", "replayssm"]
PARTS = [("ssm_us", "SSM"), ("attention_us", "attention"), ("mlp_us", "MLP/MoE"), ("other_us", "other")]


def plot_serving(run, out_dir: Path) -> list[Path]:
    rows = load(run.path, "serving_rows.csv")
    paths = []
    if rows.empty:
        return paths
    rows = rows.assign(tps_lo=rows["tokens_per_s"] * rows["median_us"] / rows["p80_us"],
                       tps_hi=rows["tokens_per_s"] * rows["median_us"] / rows["p20_us"])
    ar = rows[rows["mode"] == "ar"]
    spec = rows[rows["mode"] != "ar"]
    for setting, group in _groups(spec, ["model", "tp", "context_len", "spec_T", "acceptance", "act_dtype"]):
        fig, ax = plt.subplots(figsize=(6, 4))
        base = ar[(ar["model"] == setting["model"]) & (ar["tp"] == setting["tp"])
                  & (ar["context_len"] == setting["context_len"])]
        for mode in MODE_ORDER:
            g = base if mode == "ar" else group[group["mode"] == mode]
            g = g[~g["at_max_concurrency"].astype(str).eq("True")] if "at_max_concurrency" in g else g
            if not g.empty:
                _band(ax, g["batch"], g["tokens_per_s"], g["tps_lo"], g["tps_hi"], mode)
        _log2_batch(ax)
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens / s (batch x mean accepted / step)")
        ax.legend(fontsize=7)
        fig.suptitle(_title(run, "Speculative serving throughput", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "serving_throughput_" + _slug(*setting.values())))
    for setting, group in _groups(rows, ["model", "tp", "spec_T"]):
        if pd.isna(setting["spec_T"]):
            continue
        modes = group.drop_duplicates("mode").set_index("mode")
        ar_rows = rows[(rows["mode"] == "ar") & (rows["model"] == setting["model"]) & (rows["tp"] == setting["tp"])]
        conc = {m: (ar_rows if m == "ar" else modes.loc[[m]])["max_concurrency"].iloc[0]
                for m in MODE_ORDER if (m == "ar" and not ar_rows.empty) or m in modes.index}
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar(list(conc), list(conc.values()), color="tab:blue")
        for i, v in enumerate(conc.values()):
            ax.annotate(f"{int(v)}", (i, v), ha="center", va="bottom", fontsize=7)
        source = group["hbm_source"].iloc[0]
        ax.set_ylabel(f"max concurrent sequences\n(HBM budget {group['hbm_budget_bytes'].iloc[0] / 1e9:.0f} GB, "
                      f"{source})", fontsize=7)
        fig.suptitle(_title(run, "Max concurrency per mode", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "serving_concurrency_" + _slug(*setting.values())))
    return paths


def plot_e2e_breakdown(run, out_dir: Path) -> list[Path]:
    rows = load(run.path, "e2e_rows.csv")
    paths = []
    if rows.empty:
        return paths
    for setting, group in _groups(rows, ["model", "tp", "context_len", "act_dtype"]):
        group = group.sort_values(["batch", "method"])
        labels = [f"bs{b}\n{'ReplaySSM' if m == 'replay_ar' else 'baseline'}"
                  for b, m in zip(group["batch"], group["method"])]
        fig, ax = plt.subplots(figsize=(max(4, 0.8 * len(group) + 2), 4))
        bottom = pd.Series(0.0, index=group.index)
        for col, name in PARTS:
            ms = group[col].fillna(0) / 1e3
            ax.bar(labels, ms, bottom=bottom, label=name)
            bottom += ms
        ax.set_ylabel("ms per decode step")
        ax.legend(fontsize=7)
        what = "Decode step breakdown" + (" (composed)" if group["composed"].astype(str).eq("True").any() else "")
        fig.suptitle(_title(run, what, setting), fontsize=9)
        paths.append(_save(fig, out_dir, "e2e_breakdown_" + _slug(*setting.values())))
    return paths


def plot_hybrid(run, out_dir: Path) -> list[Path]:
    return plot_serving(run, out_dir) + plot_e2e_breakdown(run, out_dir)
