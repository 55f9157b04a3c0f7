"""Table and figure of a kernel_tree run: tokens/s per tree shape, beside the chain control and the baselines.

    python scripts/report/tree_plots.py results/tree/cpu/<run_id>

Writes <run dir>/tree_table.md (per model and shape: accepted tokens per step, verify + commit time, tokens/s
of ReplaySSM's tree ring, its ratio to the chain control (chain4 on the ring) and to the native tree, the
byte-model ratio native / ring, and the baselines' tokens/s) and <run dir>/tree_tokens_per_s.png (tokens/s
vs tree shape, one panel per model, one line per method). Every number comes from tree_rows.csv of that one
run; the table header says what the run measured on (env.json), so CPU numbers are never read as GPU ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

METHOD_LABELS = {"replay_tree": "ReplaySSM tree ring", "replay_chain": "ReplaySSM chain API",
                 "native_tree": "native tree (snapshot per node)", "commit_replay_tree": "commit-replay tree",
                 "stree": "STree (activation replay)"}


def load(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    rows = run_dir / "tree_rows.csv"
    if not rows.exists():
        raise ValueError(f"{rows} does not exist: pass a kernel_tree run directory (results/tree/cpu/<run_id>)")
    env_path = run_dir / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    return pd.read_csv(rows), env


def _backends(df: pd.DataFrame) -> str:
    """What the rows ran on, per method (runs before the backend column were all torch)."""
    if "backend" not in df:
        return "backend torch"
    per = df.groupby("backend").method.unique()
    return "backends " + "; ".join(f"{b}: {', '.join(m)}" for b, m in per.items())


def table(df: pd.DataFrame, env: dict) -> str:
    ok = df[df.status == "ok"]
    ring = ok[ok.method == "replay_tree"].copy()
    wide = ok.pivot_table(index=["model", "shape", "batch", "history_len", "p_node"], columns="method",
                          values="tokens_per_s").reset_index()
    ring = ring.merge(wide, on=["model", "shape", "batch", "history_len", "p_node"], how="left")
    where = (f"{env.get('device', '?')} ({env.get('cpu_name', '?')}, {env.get('threads', '?')} thread(s)), "
             f"torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, commit {str(env.get('git_sha'))[:8]}"
             f"{' (dirty)' if env.get('git_dirty') else ''}")
    lines = [f"Tree speculation, one SSM layer, {_backends(ok)}, measured on {where}.", "",
             "| model | shape | N | depth | accepted/step | step us | tok/s ring | vs chain | vs native | "
             "bytes native/ring | tok/s native | tok/s commit-replay | tok/s STree |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def cell(r, col, fmt="{:.0f}"):
        v = r.get(col)
        return "-" if v is None or pd.isna(v) else fmt.format(v)

    for _, r in ring.sort_values(["model", "N", "shape"]).iterrows():
        def f(col, fmt="{:.0f}", r=r):
            return cell(r, col, fmt)
        lines.append(f"| {r.model} | {r['shape']} | {r.N} | {r.depth} | {r.accepted_per_step:.2f} | {r.step_us:.0f} | "
                     f"{r.tokens_per_s:.0f} | {f('speedup_vs_chain', '{:.2f}')} | {f('speedup_vs_native', '{:.2f}')} | "
                     f"{f('byte_ratio_native_over_method', '{:.2f}')} | {f('native_tree')} | "
                     f"{f('commit_replay_tree')} | {f('stree')} |")
    bad = df[df.status != "ok"]
    if len(bad):
        lines += ["", f"{len(bad)} point(s) failed: " + "; ".join(f"{r.model} {r['shape']} {r.method}: {r.error}"
                                                              for _, r in bad.iterrows())]
    return "\n".join(lines) + "\n"


def figure(df: pd.DataFrame, path: Path) -> None:
    ok = df[df.status == "ok"]
    models = list(dict.fromkeys(ok.model))
    shapes = list(dict.fromkeys(ok.sort_values("N")["shape"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        sub = ok[ok.model == model]
        for method, label in METHOD_LABELS.items():
            m = sub[sub.method == method].groupby("shape").tokens_per_s.median()
            if len(m):
                xs = [s for s in shapes if s in m.index]
                ax.plot(xs, [m[s] for s in xs], marker="o", label=label)
        ax.set_title(model, fontsize=9)
        ax.set_yscale("log")
        ax.set_xlabel("tree shape")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    axes[0][0].set_ylabel("tokens/s (one layer)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        df, env = load(args.run_dir)
    except ValueError as exc:
        print(f"tree_plots: {exc}", file=sys.stderr)
        return 2
    text = table(df, env)
    (args.run_dir / "tree_table.md").write_text(text)
    figure(df, args.run_dir / "tree_tokens_per_s.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
