"""PNG plots of one run: AR speedup vs batch and vs buffer length (the bell curve), spec tokens/s vs batch
per window T, and achieved bandwidth as % of peak; p20/p80 bands drawn with fill_between.

Reads only the run's files; every title names the hardware and the run id. Output: RUN_DIR/plots/*.png.

CLI: python scripts/plots.py RUN_DIR
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from aggregate import AR_METHODS, SPEC_METHODS, Run, load_run, summarize, throughput  # noqa: E402

# One figure per "setting": rows differing in any of these are never drawn on the same axes.
SETTING_KEYS = ["experiment", "model", "tp", "state_dtype", "act_dtype", "backend", "timing_mode", "l2"]
DPI = 120


def _slug(*parts) -> str:
    text = "_".join(str(p) for p in parts if p is not None and str(p) not in ("", "nan", "<NA>"))
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-") or "all"


def _groups(df: pd.DataFrame, keys: list[str]):
    """groupby that keeps NA keys (CPU rows have no tp or l2 sometimes) and yields a dict of the keys."""
    keys = [k for k in keys if k in df.columns]
    for values, group in df.groupby(keys, dropna=False, sort=True):
        yield dict(zip(keys, values if isinstance(values, tuple) else (values,))), group


def _title(run: Run, what: str, setting: dict) -> str:
    desc = " ".join(f"{k}={v}" for k, v in setting.items() if k != "model" and pd.notna(v))
    return f"{what}: {setting.get('model')}\n{run.hardware} · run {run.run_id}\n" + textwrap.fill(desc, 90)


def _log2_batch(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(True, which="both", alpha=0.3)


def _band(ax, x, y, lo, hi, label: str, **style) -> None:
    order = x.argsort()
    x, y, lo, hi = (s.to_numpy()[order] for s in (x, y, lo, hi))
    (line,) = ax.plot(x, y, marker="o", label=label, **style)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


def _save(fig, out_dir: Path, name: str) -> Path:
    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_ar_speedup(run: Run, ratios: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Left: speedup vs batch, one line per buffer_len (and route). Right: speedup vs buffer_len, one line
    per batch: the bell curve (short buffers flush often, long ones read more per step)."""
    ar = ratios[ratios["metric"] == "ar_speedup"]
    paths = []
    for setting, group in _groups(ar, SETTING_KEYS):
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
        for (route, L), g in group.groupby([group["route"].fillna(""), "buffer_len"], sort=True):
            label = f"L={L:g}" + (f" {route}" if route else "")
            _band(left, g["batch"], g["value"], g["lo"], g["hi"], label, linestyle="--" if "state" in route else "-")
        for (route, batch), g in group.groupby([group["route"].fillna(""), "batch"], sort=True):
            label = f"batch {batch:g}" + (f" {route}" if route else "")
            _band(right, g["buffer_len"], g["value"], g["lo"], g["hi"], label,
                  linestyle="--" if "state" in route else "-")
        for ax, xlabel in ((left, "batch"), (right, "buffer length L")):
            ax.axhline(1.0, color="grey", linewidth=1)
            _log2_batch(ax)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("speedup baseline_ar / replay_ar (x)")
            ax.legend(fontsize=7, ncol=2)
        fig.suptitle(_title(run, "AR decode speedup", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "ar_speedup_" + _slug(*setting.values())))
    return paths


def _method_tps(rows: pd.DataFrame) -> pd.DataFrame:
    ar = rows["method"].isin(AR_METHODS)
    tps, lo, hi = throughput(rows, per_token=False)
    ar_tps, ar_lo, ar_hi = throughput(rows, per_token=True)
    return rows.assign(tps=tps.where(~ar, ar_tps), tps_lo=lo.where(~ar, ar_lo), tps_hi=hi.where(~ar, ar_hi))


def plot_spec_throughput(run: Run, out_dir: Path) -> list[Path]:
    """tokens/s vs batch, one panel per window T, one line per method; standard AR decode (baseline_ar of
    the same run) drawn in every panel for reference."""
    rows = run.rows[run.rows["status"] == "ok"]
    spec = rows[rows["method"].isin(SPEC_METHODS)]
    keys = [k for k in SETTING_KEYS if k != "experiment"]
    paths = []
    for setting, group in _groups(spec, keys + ["acceptance"]):
        ar = rows[rows["method"] == "baseline_ar"]
        for k in keys:
            ar = ar[(ar[k] == setting[k]) | (ar[k].isna() & pd.isna(setting[k]))]
        # the spec experiment's own reference rows first (timed beside the spec methods), then any other
        ar = ar.assign(_own=ar["experiment"].isin(group["experiment"].unique())).sort_values("_own", ascending=False)
        ar = _method_tps(ar.drop_duplicates(subset=["batch"]))
        Ts = sorted(group["spec_T"].dropna().unique())
        fig, axes = plt.subplots(1, max(len(Ts), 1), figsize=(4.5 * max(len(Ts), 1), 4.5), squeeze=False)
        for ax, T in zip(axes[0], Ts):
            g = _method_tps(group[group["spec_T"] == T])
            for method, gm in g.groupby("method", sort=True):
                gm = gm.groupby("batch", as_index=False)[["tps", "tps_lo", "tps_hi"]].max()
                _band(ax, gm["batch"], gm["tps"], gm["tps_lo"], gm["tps_hi"], method)
            if not ar.empty:
                _band(ax, ar["batch"], ar["tps"], ar["tps_lo"], ar["tps_hi"], "standard decode (baseline_ar)",
                      color="black", linestyle=":")
            _log2_batch(ax)
            ax.set_yscale("log")
            ax.set_title(f"T={T:g}", fontsize=9)
            ax.set_xlabel("batch")
            ax.set_ylabel("tokens/s (one SSM layer)")
            ax.legend(fontsize=7)
        fig.suptitle(_title(run, "Spec verify+commit throughput", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "spec_tokens_" + _slug(*setting.values())))
    return paths


def plot_bandwidth(run: Run, out_dir: Path) -> list[Path]:
    """% of peak bandwidth (measured copy peak; datasheet when that is missing; GB/s when both are)
    vs batch, one line per method and setting."""
    rows = run.rows[(run.rows["status"] == "ok") & (run.rows["median_us"] > 0)]
    paths = []
    for setting, group in _groups(rows, SETTING_KEYS):
        choices = (("pct_peak_measured", "% of measured copy bandwidth"), ("pct_peak_datasheet", "% of datasheet peak"),
                   ("achieved_GBps", "GB/s (decimal)"))
        column, ylabel = next(((c, y) for c, y in choices if group[c].notna().any()), (None, None))
        if column is None:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.8))
        labels = group["method"].astype(str)
        for extra, fmt in (("buffer_len", " L={:g}"), ("spec_T", " T={:g}"), ("acceptance", " acc={}"),
                           ("route", " {}")):
            labels = labels + group[extra].map(lambda v, f=fmt: f.format(v) if pd.notna(v) else "")
        for label, g in group.assign(_label=labels).groupby("_label", sort=True):
            g = g.groupby("batch", as_index=False).agg(y=(column, "max"), med=("median_us", "min"),
                                                       p20=("p20_us", "min"), p80=("p80_us", "min"))
            g = g[g["y"].notna()]
            if g.empty:
                continue
            _band(ax, g["batch"], g["y"], g["y"] * g["med"] / g["p80"], g["y"] * g["med"] / g["p20"], label)
        _log2_batch(ax)
        ax.set_xlabel("batch")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6, ncol=2)
        fig.suptitle(_title(run, "Achieved bandwidth", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "bandwidth_" + _slug(*setting.values())))
    return paths


def plot_accuracy(run: Run, out_dir: Path) -> list[Path]:
    """The accuracy study (accuracy.csv, experiments/accuracy.py): error vs float64 against decoded steps,
    log-log, one figure per model x workload x precision (state/activation dtype), one line per method; left
    the outputs, right the committed state (median over rows x heads, p99 as a dotted line)."""
    import accuracy

    df = accuracy.load_accuracy(run.path)
    if df is None:
        return []
    df = accuracy.ok_rows(df)
    paths = []
    for setting, group in _groups(df, ["model", "workload", "state_dtype", "act_dtype"]):
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharex=True)
        for label, g in group.groupby("label", sort=True):
            g = g.sort_values("step")
            for ax, what in zip(axes, ("out", "state")):
                (line,) = ax.plot(g["step"], g[f"{what}_err_median"], marker="o", markersize=3, label=label)
                ax.plot(g["step"], g[f"{what}_err_p99"], linestyle=":", color=line.get_color())
        for ax, what in zip(axes, ("outputs", "committed state")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("tokens decoded")
            ax.set_ylabel(f"relative error of the {what} vs float64")
        axes[0].legend(fontsize=6)
        fig.suptitle(_title(run, "Accuracy vs float64 (median solid, p99 dotted)", setting), fontsize=9)
        paths.append(_save(fig, out_dir, "accuracy_" + _slug(*setting.values())))
    return paths


def plot_run(run_dir: Path | str) -> list[Path]:
    """All plots of one run into RUN_DIR/plots/; returns the PNG paths."""
    run = load_run(run_dir)
    out_dir = run.path / "plots"
    out_dir.mkdir(exist_ok=True)
    ratios = summarize(run.rows).ratios
    from hybrid_plots import plot_hybrid  # whole-model experiments (e2e_rows.csv, serving_rows.csv)

    return (plot_ar_speedup(run, ratios, out_dir) + plot_spec_throughput(run, out_dir) + plot_bandwidth(run, out_dir)
            + plot_accuracy(run, out_dir) + plot_hybrid(run, out_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    paths = plot_run(args.run_dir)
    print(f"{len(paths)} plots written to {args.run_dir / 'plots'}")
    for p in paths:
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
