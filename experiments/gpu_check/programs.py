"""Stage programs that are more than one command (formerly bash functions of gpu_check.sh).

    python -m experiments.gpu_check.programs tests  --out OUT --work WORK --run-id ID -- NODE_ID...
    python -m experiments.gpu_check.programs report --out OUT --work WORK --run-id ID
    python -m experiments.gpu_check.programs table  --out OUT --work WORK --run-id ID
    python -m experiments.gpu_check.programs concat --out OUT --work WORK --run-id ID DEST SRC...

Each reads its stage's deadline from GPU_CHECK_STAGE_DEADLINE (unix seconds, set by the runner) and, when it
stops short on purpose, writes why to GPU_CHECK_NOTE and exits 10 (the runner records the note, no failure).

tests: pytest on the node ids with `-m gpu` and scripts/gpu/gpu_check_testlog.py: OUT/tests.log gets a line
when each test starts and ends (a kill leaves the one that hung), WORK/pytest.xml at the end; no test starts
in the last 15 s of the stage; a session that budget stopped with no failure notes `budget: N not started`.
report: aggregate, hybrid summary, tables and the claims report over whatever the earlier stages wrote (each
runs even if one before it failed), then the plots in the time left (`partial: plots cut` when they are).
table: kernel_check's last word, WORK/kernel_table.md: each kernel point's time with the tuned table and with
the default launch config, its speed-up over the baseline beside the byte model's, and ncu's figures.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTIAL_RC = 10
TESTS_MARGIN_S = 15          # no test starts this close to the stage's limit: its log and XML get written


def _deadline() -> float:
    return float(os.environ.get("GPU_CHECK_STAGE_DEADLINE") or time.time() + 3600)


def _note(text: str) -> None:
    path = os.environ.get("GPU_CHECK_NOTE")
    if path:
        Path(path).write_text(text + "\n")


def run_dir(work: Path, run_id: str) -> Path | None:
    found = sorted(work.glob(f"results/*/{run_id}"))
    return found[0] if found else None


# ------------------------------------------------------------------------------------------------ tests

def tests(args, ids: list[str]) -> int:
    extra = []
    try:                      # pyproject's addopts name --benchmark-disable, which needs pytest-benchmark
        import pytest_benchmark  # noqa: F401
    except ImportError:
        extra += ["-o", "addopts=-ra"]
    if os.environ.get("TEST_SELECT"):
        extra += ["-k", os.environ["TEST_SELECT"]]
    log = args.out / "tests.log"
    log.touch()
    now = time.time()
    env = dict(os.environ, GPU_CHECK_TEST_LOG=str(log), GPU_CHECK_TEST_T0=f"{now:.3f}",
               GPU_CHECK_TEST_BUDGET_S=f"{max(0.0, _deadline() - now - TESTS_MARGIN_S):.1f}")
    cmd = [sys.executable, "-m", "pytest", *ids, "-m", "gpu", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-p", "gpu_check_testlog", f"--junitxml={args.work / 'pytest.xml'}", *extra,
           *os.environ.get("PYTEST_ARGS", "-q -x").split()]
    print("$ " + " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    # the plugin's budget line (`# time budget 45 s spent: N tests not started`) -> the stage's note
    left = re.findall(r"^# time budget .* spent: (\d+) tests not started$", log.read_text(), re.M)
    if left:
        _note(f"budget: {left[-1]} not started")
    return rc


# ----------------------------------------------------------------------------------------------- report

def report(args) -> int:
    d = run_dir(args.work, args.run_id)
    if d is None:
        print(f"no run directory under {args.work / 'results'} (did the sweeps run?)")
        return 1
    rc = 0
    # whatever the earlier stages wrote: each program runs even if one before it failed; aggregate first (the
    # others read its summary)
    for prog in (["aggregate.py", d], ["hybrid_summary.py", d], ["tables.py", d, "--quiet"], ["claims.py", d]):
        if subprocess.run([sys.executable, f"scripts/report/{prog[0]}", *map(str, prog[1:])], cwd=ROOT).returncode:
            print(f"report: scripts/report/{prog[0]} failed")
            rc = 1
    if (d / "REPORT.md").is_file():           # the claims table: this GPU against the paper
        print("\n".join(ln for ln in (d / "REPORT.md").read_text().splitlines() if ln.startswith("|")))
    left = _deadline() - time.time() - 2      # the plots last, in the time left: cut, they leave the table above
    if left < 3:
        print("report: no time left for the plots")
        if not rc:
            _note("partial: plots not drawn")
            rc = PARTIAL_RC
        return rc
    try:
        if subprocess.run([sys.executable, "scripts/report/plots.py", str(d)], cwd=ROOT, timeout=left).returncode:
            print("report: scripts/report/plots.py failed")
            rc = 1
    except subprocess.TimeoutExpired:
        print(f"report: plots cut after {left:.0f} s")
        if not rc:
            _note("partial: plots cut")
            rc = PARTIAL_RC
    return rc


# ------------------------------------------------------------------------------------------------ table

NCU_FIGURES = ("Registers Per Thread", "Dynamic Shared Memory Per Block", "Theoretical Occupancy",
               "Achieved Occupancy", "Executed Ipc Active", "Executed Instructions", "DRAM Throughput", "Duration")


def _rows(d: Path | None) -> list[dict]:
    if d is None or not (d / "rows.csv").is_file():
        return []
    with open(d / "rows.csv") as f:
        return list(csv.DictReader(f))


def _f(x: str) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def kernel_table(rows: list[dict]) -> list[str]:
    """One line per ok point (the tuned or default row the sweep timed first), with the default launch
    config's time where the run timed it too (its config_hash ends in -default) and, for the ReplaySSM rows,
    the speed-up over the baseline of the same point beside the byte model's."""
    ok = [r for r in rows if r.get("status") == "ok"]
    default = {r["config_hash"].removesuffix("-default"): r for r in ok if r["config_hash"].endswith("-default")}
    main = [r for r in ok if not r["config_hash"].endswith("-default")]
    base_of = {"replay_ar": "baseline_ar", "replay_spec": "baseline_spec", "commit_replay_spec": "baseline_spec"}

    def point(r: dict) -> tuple:
        return (r["experiment"], r["model"], r["batch"], r.get("spec_T", ""), r.get("acceptance", ""))
    base = {point(r): r for r in main if r["method"] in ("baseline_ar", "baseline_spec")}
    out = ["| experiment | model | batch | L/T | method | route | us | default us | launch | GB/s | vs baseline "
           "| byte model |", "|---|---|---:|---|---|---|---:|---:|---|---:|---:|---:|"]
    for r in sorted(main, key=lambda r: (r["experiment"], r["model"], int(r["batch"]), r.get("spec_T", ""),
                                         r["method"], r.get("route", ""))):
        us, b = _f(r["median_us"]), base.get(point(r)) if r["method"] in base_of else None
        speed = f"{_f(b['median_us']) / us:.2f}x" if b and us else ""
        model = (f"{_f(b['bytes_model']) / _f(r['bytes_model']):.2f}x" if b and _f(b["bytes_model"])
                 and _f(r["bytes_model"]) else "")
        lt = f"L={r['buffer_len']}" if r.get("buffer_len") else f"T={r['spec_T']}" if r.get("spec_T") else ""
        d = default.get(r["config_hash"])
        default_us = f"{_f(d['median_us']):.1f}" if d else ""
        out.append(f"| {r['experiment']} | {r['model']} | {r['batch']} | {lt} | {r['method']} | {r.get('route', '')} "
                   f"| {us:.1f} | {default_us} | {r.get('launch_source', '')} "
                   f"| {_f(r.get('achieved_GBps')) or 0:.0f} | {speed} | {model} |")
    return out


def ncu_figures(work: Path) -> list[str]:
    """The first profiled kernel's figures of each ncu section report under WORK (dram_traffic --sections)."""
    out = []
    for path in sorted(work.rglob("*.ncu.txt")):
        text, seen = path.read_text(errors="replace"), {}
        kernel = re.search(r"^  (\S+) \(\d+, \d+, \d+\)x", text, re.M)
        for name in NCU_FIGURES:
            m = re.search(rf"^\s+{re.escape(name)}\s+(\S+)\s+(\S+)\s*$", text, re.M)
            if m:
                seen[name] = f"{m.group(2)} {m.group(1)}"
        out.append(f"- {path.name}: {kernel.group(1) if kernel else '(no kernel profiled)'}: "
                   + "; ".join(f"{k} {v}" for k, v in seen.items()))
    return out


def table(args) -> int:
    rows = _rows(run_dir(args.work, args.run_id))
    lines = [f"# kernel_check {args.run_id}", ""]
    lines += kernel_table(rows) if rows else ["_(no rows: the sweeps did not run)_"]
    dram = args.work / "dram.csv"
    if dram.is_file():
        with open(dram) as f:
            lines += ["", "ncu DRAM bytes (dram.csv):", ""]
            lines += [f"- {r['method']} {r['route']} {r['model']} b{r['batch']}: {r['status']} "
                      f"{r['measured_over_model'] or r['message']}" for r in csv.DictReader(f)]
    figures = ncu_figures(args.work)
    if figures:
        lines += ["", "ncu sections (first profiled launch):", "", *figures]
    text = "\n".join(lines) + "\n"
    (args.work / "kernel_table.md").write_text(text)
    print(text, end="")
    return 0 if rows else 1


def concat(args, dest: str, sources: list[str]) -> int:
    """CSV files of one header -> one (route_check's per-route DRAM tables); missing sources are said."""
    header, body = None, []
    for src in sources:
        path = args.work / src
        if not path.is_file():
            print(f"concat: {path} missing")
            continue
        lines = path.read_text().splitlines()
        header = header or lines[:1]
        body += lines[1:]
    if header is None:
        return 1
    (args.work / dest).write_text("\n".join(header + body) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_check.programs", description=__doc__.split("\n")[0])
    ap.add_argument("program", choices=("tests", "report", "table", "concat"))
    ap.add_argument("files", nargs="*", help="concat: DEST SRC... (WORK-relative)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--run-id", required=True)
    args = ap.parse_args(argv)
    if args.program == "tests":
        return tests(args, rest)
    if args.program == "report":
        return report(args)
    if args.program == "table":
        return table(args)
    return concat(args, args.files[0], args.files[1:])


if __name__ == "__main__":
    sys.exit(main())
