"""The kernel report's command line (scripts/kernels/kernel_report.py runs `main`): arguments, the Markdown
tables of the kernel rows and the step rows, the CSV / JSON / issue-table outputs and the exit status (1 on a
spill or a build error). What is built and how it is measured lives in recipes.py, aot.py and predict.py."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.report.kernels import aot, predict
from experiments.report.kernels.aot import TARGETS
from experiments.report.kernels.recipes import (
    COLUMNS,
    EXTRA_COLUMNS,
    RECIPES,
    STEP_COLUMNS,
    failures,
    run_report,
)
from replayssm.checks import interpreter_active
from replayssm.geometry import GDN_MODELS, KDA_MODELS, MAMBA2_MODELS, get_geometry


def _short(text: str, width: int = 90) -> str:
    text = text.split(". ")[0]
    return text if len(text) <= width else text[:width - 3] + "..."


def format_table(rows: list[dict[str, Any]], columns: list[str] = COLUMNS) -> str:
    """A Markdown pipe table (long statuses cut short: the CSV/JSON and stderr have them whole)."""
    cells = [[_short(str(r.get(c, ""))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    return "\n".join([line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    all_models = sorted({**MAMBA2_MODELS, **GDN_MODELS, **KDA_MODELS})
    p = argparse.ArgumentParser(description=aot.__doc__.split("\n\n")[0])
    p.add_argument("--geometry", action="append", choices=all_models, help="model (repeatable; default all)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel split of every geometry (default 1)")
    p.add_argument("--target", action="append", type=int, choices=TARGETS, help="sm arch (repeatable; default both)")
    p.add_argument("--method", action="append", choices=[r.method for r in RECIPES], help="recipe (repeatable)")
    p.add_argument("--fp32-state-only", action="store_true", help="skip the fp16-state builds of the AR kernels")
    p.add_argument("--bf16-state", action="store_true", help="also build a bfloat16-state variant of every recipe")
    p.add_argument("--state-formats", action="store_true",
                   help="also build every state format a recipe's kernels store besides the plain ones (float16_sr, "
                        "bfloat16_sr, int8, float8_e4m3fn: replayssm/state_format.py)")
    p.add_argument("--spec-tiles", action="store_true",
                   help="build every candidate of the Mamba-2 spec tile space (mamba2.replay_spec)")
    p.add_argument("--tune-space", action="store_true",
                   help="build every candidate of every tuning space (experiments/tune.py); spills are reported")
    p.add_argument("--batch", type=int, default=256, help="the point of the issue floor and byte time (default 256)")
    p.add_argument("--buffer-len", type=int, nargs="+", default=[16], help="AR buffer lengths L (default 16)")
    p.add_argument("--spec-T", type=int, nargs="+", default=[4], help="spec windows T (default 4)")
    p.add_argument("--history", type=int, default=16, help="spec history length (default 16)")
    p.add_argument("--l2norm", choices=["model", "on", "off"], default="model",
                   help="q / k L2 norm in the GDN / KDA kernels (default: conf/model's use_qk_l2norm, as benchmarked)")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    p.add_argument("--json", type=Path, help="also write the rows as JSON (kernel rows, then the steps under 'steps')")
    p.add_argument("--issue-table", type=Path,
                   help="write the step kernels' instruction counts as the issue table (replayssm/issue_table.py)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if interpreter_active():
        print("kernel_report: unset TRITON_INTERPRET: under the interpreter @triton.jit makes interpreted "
              "functions, which run on the CPU instead of being captured", file=sys.stderr)
        return 2
    names = args.geometry or sorted({**MAMBA2_MODELS, **GDN_MODELS, **KDA_MODELS})
    geometries = {(n if args.tp == 1 else f"{n}@tp{args.tp}"): get_geometry(n, args.tp) for n in names}
    targets = args.target or list(TARGETS)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel_report_") as tmp:
        rows = run_report(geometries, targets, args.method, args.fp32_state_only, Path(tmp),
                          log=lambda s: print(s, file=sys.stderr, flush=True), bf16_state=args.bf16_state,
                          spec_tiles=args.spec_tiles, tune_space=args.tune_space, batch=args.batch,
                          buffer_lens=tuple(args.buffer_len), windows=tuple(args.spec_T), history=args.history,
                          l2norm={"model": None, "on": True, "off": False}[args.l2norm],
                          state_formats=args.state_formats)
    step_rows = predict.steps(rows, args.buffer_len[0], args.spec_T[0], args.history)
    print(format_table(rows))
    print("\nSteps at the benchmark point (issue floor: normal step and cycle mean; byte time over "
          "predict.COPY_BPS):\n")
    print(format_table(step_rows, STEP_COLUMNS))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS + EXTRA_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, "ldg": json.dumps(r.get("ldg", {}))} for r in rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "steps": step_rows}, indent=1, default=str))
    if args.issue_table:
        command = "python scripts/kernels/kernel_report.py " + " ".join(sys.argv[1:] if argv is None else argv)
        predict.write_issue_table(args.issue_table, predict.issue_table_entries(rows, geometries), command)
    bad = failures(rows)
    missing = sorted({r["method"] for r in rows if r["status"].startswith("missing")})
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.0f} s; "
          f"missing recipes (not built yet): {', '.join(missing) or 'none'}")
    if bad:
        print(f"FAIL: {len(bad)} row(s) spill or do not build:", file=sys.stderr)
        for r in bad:
            print(f"  {r['target']} {r['geometry']} {r['method']} {r['kernel']}: {r['status']}", file=sys.stderr)
        return 1
    return 0


