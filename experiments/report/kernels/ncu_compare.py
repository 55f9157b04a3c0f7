"""The kernel report's predictions beside a GPU run's Nsight Compute section reports (ncu --section ... text).

    python -m experiments.report.kernels.ncu_compare REPORT.json NCU_DIR [--geometry qwen35_122b_a10b]

For every kernel ncu profiled (`ncu_launches`: one dict per profiled launch of a `*.ncu.txt` file) it finds the
report's row of the same kernel, target sm_<CC> and grid size (programs at the report's point) and sets side by
side: registers per thread, theoretical occupancy, dynamic shared memory per block, and instructions per warp.
ncu's section set prints no instruction count; it is derived as issued warp-instructions per cycle per scheduler
x schedulers (4 per SM x "# SMs") x "SM Active Cycles" / warps (grid size x block size / 32). ncu prints the issue
rate to two digits, so this derived count carries up to ~1 % rounding. The report's side is path_min, the shortest
storing path (a normal step: ncu profiled the first launches of a cycle, h = 0 and 1).

The checked-in evidence: results/h200/route-check-20261204T130226Z-feec103/ncu (GDN at Qwen3.5-122B, b256, L = 16,
Triton 3.6.0); tests/report/test_kernel_report.py holds the report to it within 10 %.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

_HEADER = re.compile(r"^\s{2}(\w+) \(([\d, ]+)\)x\(([\d, ]+)\), .*CC (\d+)\.(\d+)")
_METRIC = re.compile(r"^\s{4}(\S.*?)\s{2,}(\S+(?:/\S+)?)?\s+([\d,.]+)\s*$")
UNITS = {"byte/block": 1, "Kbyte/block": 1000, "Mbyte/block": 1e6}
SCHEDULERS = 4


def ncu_launches(path: Path) -> list[dict[str, Any]]:
    """[{kernel, cc, grid, block, metrics: {name: (unit, value)}}] of one ncu section report."""
    out: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        if m := _HEADER.match(line):
            grid = tuple(int(x) for x in m.group(2).split(","))
            block = tuple(int(x) for x in m.group(3).split(","))
            out.append({"kernel": m.group(1), "cc": int(m.group(4)) * 10 + int(m.group(5)), "grid": grid,
                        "block": block, "metrics": {}})
        elif out and (m := _METRIC.match(line)):
            out[-1]["metrics"][m.group(1).strip()] = (m.group(2) or "", float(m.group(3).replace(",", "")))
    return out


def measured(launch: dict[str, Any]) -> dict[str, float]:
    """registers, occupancy (fraction), dyn_shared (bytes) and instructions per warp of one profiled launch."""
    m = launch["metrics"]
    threads = 1
    for x in launch["block"]:
        threads *= x
    programs = 1
    for x in launch["grid"]:
        programs *= x
    warps = programs * -(-threads // 32)
    unit, smem = m["Dynamic Shared Memory Per Block"]
    issued = m["Issued Warp Per Scheduler"][1] * SCHEDULERS * m["# SMs"][1] * m["SM Active Cycles"][1]
    return {"registers": m["Registers Per Thread"][1], "occupancy": m["Theoretical Occupancy"][1] / 100,
            "dyn_shared": smem * UNITS.get(unit, 1), "insts_per_warp": issued / warps, "programs": programs}


def compare(rows: list[dict[str, Any]], ncu_dir: Path, geometry: str | None = None) -> list[dict[str, Any]]:
    """One row per profiled launch with a matching report row: each quantity measured, predicted and their ratio."""
    out = []
    for path in sorted(ncu_dir.glob("*.ncu.txt")):
        for launch in ncu_launches(path):
            meas = measured(launch)
            match = [r for r in rows if r.get("kernel") == launch["kernel"] and r.get("target") == f"sm_{launch['cc']}"
                     and r.get("programs") == meas["programs"] and (geometry is None or r.get("geometry") == geometry)]
            if not match:
                continue
            r = match[0]
            pred = {"registers": r["registers"], "occupancy": r["occupancy"], "dyn_shared": r["dyn_shared"],
                    "insts_per_warp": r["path_min"]}
            row = {"file": path.name, "kernel": launch["kernel"], "method": r["method"], "programs": meas["programs"]}
            for k, v in pred.items():
                row[f"{k}_ncu"], row[f"{k}_report"] = round(meas[k], 4), v
                row[f"{k}_ratio"] = round(v / meas[k], 4) if meas[k] else None
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="the kernel report's --json output")
    p.add_argument("ncu_dir", type=Path, help="a directory of ncu section reports (*.ncu.txt)")
    p.add_argument("--geometry", help="only rows of this geometry")
    args = p.parse_args(argv)
    data = json.loads(args.report.read_text())
    rows = compare(data["rows"] if isinstance(data, dict) else data, args.ncu_dir, args.geometry)
    for r in rows:
        print(json.dumps(r))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
