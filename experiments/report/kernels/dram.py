"""Measured DRAM traffic beside the byte model (replayssm/traffic.py): one point per method, read from the
GPU's hardware counters with Nsight Compute.

    python scripts/kernels/dram_traffic.py --out dram.csv [--model nemotron3_super_120b --batch 256 --buffer-len 16]

For each method it runs `ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum
--csv` on this module's `--step` mode, which builds the point (one layer, the harness's workload and cache),
runs one warm-up cycle (Triton compiles there), then profiles exactly one cycle between
torch.cuda.profiler.start/stop: L steps of a ReplaySSM AR point (a whole flush cycle), one step of the others,
`spec_T`-token verify + commit for the spec methods. The counters of every kernel in that range are summed and
set beside the byte model's bytes for the same cycle. Where ncu is absent or the counters cannot be read
(ERR_NVGPUCTRPERM, no GPU) each row says so (status=unavailable) and the script still exits 0.
Columns: method, route, model, batch, steps, kernels, dram_read_bytes, dram_write_bytes, dram_bytes,
model_bytes, measured_over_model, status, message.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]          # the repository: ncu's child runs there
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
AR_METHODS = ("baseline_ar", "replay_ar")
SPEC_METHODS = ("baseline_spec", "replay_spec", "commit_replay_spec")
COLUMNS = ["method", "route", "model", "batch", "steps", "kernels", "dram_read_bytes", "dram_write_bytes",
           "dram_bytes", "model_bytes", "measured_over_model", "status", "message"]
STEP_MODULE = "experiments.report.kernels.dram"     # what ncu runs in --step mode (python -m)
UNIT = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 2**10, "mibyte": 2**20, "gibyte": 2**30}


def _point(args, method: str):
    """The harness point (and its plan) for `method` at the requested geometry."""
    from experiments.harness.entry import config_dict, load_config
    from experiments.harness.points import expand

    exp = "kernel_spec" if method in SPEC_METHODS else "kernel_decode"
    over = [f"sweep.models=[{args.model}]", f"sweep.batch=[{args.batch}]", f"method.names=[{method}]",
            f"sweep.routes=[{args.route}]", "sweep.l2=warm", "sweep.timing_mode=eager", "sweep.backend=triton",
            f"sweep.buffer_len=[{args.buffer_len}]", f"sweep.spec_T=[{args.spec_T}]",
            f"sweep.history_len=[{args.buffer_len}]", "sweep.acceptance=[{kind: rate, p: 0.8}]"]
    plan = expand(config_dict(load_config(exp, ["sweep=paper", *over])))
    return plan, [p for p in plan.points if p.method == method][0]


def step_mode(args) -> int:
    """Run inside ncu: one warm-up cycle, then one profiled cycle; print the byte model's bytes."""
    import torch

    from experiments.harness.methods import REGISTRY
    from experiments.harness.workload import Workload
    from experiments.kernel.run import Stack

    plan, p = _point(args, args.step)
    m = REGISTRY[p.method]
    wl = Workload(plan.models[p.model_key], p, p.device, torch.Generator().manual_seed(0))
    acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
    settings = dict(plan.timing, max_layers=1, spec_steps=1)
    stack = Stack(m, wl, p, acc, settings, {"l2_bytes": None})
    if m.kind == "spec":
        stack.steps = 1
    cycle = stack.cycle(m.api(p.family))
    cycle()                                          # compile + warm-up, outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    cycle()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    counts = stack.counts.cpu() if stack.counts is not None else None
    traffic = m.traffic(p, wl, counts)
    model = traffic.total * p.batch * stack.steps if traffic is not None else float("nan")
    print(f"MODEL_BYTES {model} STEPS {stack.steps} ROUTE {p.route or ''}")
    return 0


def parse_ncu_csv(text: str) -> tuple[int, float, float]:
    """(kernels, read bytes, write bytes) summed over every kernel of ncu's --csv output (long format: one
    row per kernel and metric, with its unit)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    kernels, total = set(), {name: 0.0 for name in METRICS}
    for row in reader:
        name = row.get("Metric Name")
        if name not in total:
            continue
        value = float(str(row.get("Metric Value", "0")).replace(",", ""))
        total[name] += value * UNIT.get(str(row.get("Metric Unit", "byte")).lower(), 1)
        kernels.add(row.get("ID"))
    return len(kernels), total[METRICS[0]], total[METRICS[1]]


def _step_argv(args, method: str) -> list[str]:
    """ncu's target: this module in --step mode for `method` at the requested point, every child process."""
    return ["--target-processes", "all", sys.executable, "-m", STEP_MODULE, "--step", method, "--model", args.model,
            "--batch", str(args.batch), "--buffer-len", str(args.buffer_len), "--spec-T", str(args.spec_T),
            "--route", args.route]


def _run(cmd: list[str], args) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"))


def measure(args, method: str, ncu: str | None) -> dict:
    row = {c: "" for c in COLUMNS} | {"method": method, "model": args.model, "batch": args.batch}
    if ncu is None:
        return row | {"status": "unavailable", "message": "ncu not found on PATH (Nsight Compute)"}
    cmd = [ncu, "--profile-from-start", "off", "--metrics", ",".join(METRICS), "--csv", *_step_argv(args, method)]
    try:
        proc = _run(cmd, args)
    except subprocess.TimeoutExpired:
        return row | {"status": "unavailable", "message": f"ncu run exceeded {args.timeout} s"}
    out = proc.stdout + proc.stderr
    if "ERR_NVGPUCTRPERM" in out:
        return row | {"status": "unavailable", "message": "ERR_NVGPUCTRPERM: this user may not read GPU counters"}
    model = next((ln.split() for ln in proc.stdout.splitlines() if ln.startswith("MODEL_BYTES")), None)
    kernels, rd, wr = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or model is None or kernels == 0:
        tail = " | ".join(out.strip().splitlines()[-3:])[:300]
        return row | {"status": "unavailable", "message": f"ncu rc={proc.returncode}, {kernels} kernels: {tail}"}
    model_bytes = float(model[1])
    return row | {"route": model[5] if len(model) > 5 else "", "steps": model[3], "kernels": kernels,
                  "dram_read_bytes": rd, "dram_write_bytes": wr, "dram_bytes": rd + wr, "model_bytes": model_bytes,
                  "measured_over_model": (rd + wr) / model_bytes if model_bytes else "", "status": "ok"}


def profile_sections(args, method: str, ncu: str) -> Path:
    """Nsight Compute's section report (text) of `method`'s main kernels (--kernel-regex, the first
    --launch-count launches of the profiled cycle): why a kernel sits below the bandwidth (occupancy, warp stall
    reasons, memory throughput). Written beside --out as <out stem>-<method>[-<route>].ncu.txt."""
    route = f"-{args.route}" if method == "replay_ar" else ""
    path = args.out.with_name(f"{args.out.stem}-{method}{route}.ncu.txt")
    cmd = [ncu, "--profile-from-start", "off", *(a for sec in args.sections.split(",") for a in ("--section", sec)),
           "--kernel-name", f"regex:{args.kernel_regex}", "--launch-count", str(args.launch_count),
           *_step_argv(args, method)]
    try:
        proc = _run(cmd, args)
        path.write_text(f"$ {' '.join(cmd)}\nrc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        path.write_text(f"$ {' '.join(cmd)}\nncu run exceeded {args.timeout} s\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="CSV to write (one row per method)")
    ap.add_argument("--step", help=argparse.SUPPRESS)             # inner mode, run by ncu
    ap.add_argument("--model", default="nemotron3_super_120b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--buffer-len", type=int, default=16)
    ap.add_argument("--spec-T", type=int, default=4)
    ap.add_argument("--route", default="output_only")
    ap.add_argument("--methods", default=",".join(AR_METHODS + SPEC_METHODS))
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--sections", help="also write ncu's report of these sections per method (comma-separated, "
                                       "e.g. SpeedOfLight,Occupancy,WarpStateStats,MemoryWorkloadAnalysis)")
    ap.add_argument("--kernel-regex", default="step_kernel|ssu|recurrent", help="--sections: which kernels")
    ap.add_argument("--launch-count", type=int, default=2, help="--sections: how many launches of them")
    args = ap.parse_args(argv)
    if args.step:
        return step_mode(args)
    if args.out is None:
        ap.error("--out is required")
    ncu = shutil.which("ncu")
    rows = []
    with open(args.out, "w", newline="") as f:                   # each method's row as soon as it is known
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for method in args.methods.split(","):
            rows.append(measure(args, method, ncu))
            writer.writerow(rows[-1])
            f.flush()
            r = rows[-1]
            print(f"{method:<20} {r['status']:<12} dram {r['dram_bytes'] or '-'} B vs model {r['model_bytes'] or '-'}"
                  f" B {r['message']}")
            if args.sections and ncu is not None:
                print(f"{method:<20} sections -> {profile_sections(args, method, ncu)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
