"""What the kernel report predicts a GPU will do with each compiled kernel at a benchmark point: occupancy, the
issue floor beside the byte model's time, per kernel row and per step; and the committed issue table
(replayssm/issue_table.py) the per-step time model reads.

Per kernel row (recipes.run_report adds these columns):
    programs     launch grid at the point: the recipe's launches are captured at two batches (the recipe's and one
                 more), and each kernel's program count is taken as affine in the batch between them
    blocks_sm / warps_sm / occupancy / limiter   occupancy.occupancy of registers, warps and shared memory
                 (cuobjdump's static + Triton's dynamic + the reserved 1 KB)
    issue_us     programs x warps x path_min (instructions per warp on the shortest storing path, loops x trips)
                 / the issue rate of the target's GPU at the kernel's occupancy (occupancy.issue_seconds;
                 occupancy.TARGET_HARDWARE: the H200 for sm_90, 132 SMs at 1.5 GHz, min(1, warps per scheduler / 6)
                 issues per cycle per scheduler, 0.5 at the GDN step's 3 warps: ncu's reading), stated per row as
                 issue_per_cycle; issue_us_max the same on path_max
    byte_us      the method's whole step at the point, bytes of replayssm/traffic.py's byte model over the copy
                 bandwidth of COPY_BPS (the H200's measured 4.1 TB/s for sm_90): the same on each row of the step
Per step (`steps`): the step's kernels (recipe phase "step") summed: issue_us (every kernel on its shortest
storing path: a normal step), issue_us_cycle (step_time.step_instructions' weighting: the replay AR step's
(L - 1):1 normal / flush mean, a spec verify's flush rows), beside byte_us, and which of them binds.
"""

from __future__ import annotations

import datetime
import math
import runpy
import subprocess
from pathlib import Path
from typing import Any

import triton

from experiments.report.kernels import occupancy as occ
from replayssm import step_time as st

# The step_time method (and route) a recipe's step is, for the byte model and the issue table.
METHOD_OF = {
    "replay": ("replay_ar", "output_only"), "replay[output_only]": ("replay_ar", "output_only"),
    "replay[state_and_output]": ("replay_ar", "state_and_output"), "recurrent": ("baseline_ar", ""),
    "ssu": ("baseline_ar", ""), "replay_spec": ("replay_spec", ""), "recurrent_spec": ("baseline_spec", ""),
    "ssu_spec": ("baseline_spec", ""), "commit_replay": ("commit_replay_spec", ""),
    "replay[output_only_fold]": ("replay_ar", "output_only_fold"),
    "replay_spec[verify_fold]": ("replay_spec", "verify_fold"),
}
# Kernels launched on every step whose programs work only on the rows that fold (the others read their cursor and
# exit): a normal step charges them nothing, the cycle their longest path on the folding share of programs. The
# shortest *storing* path of such a kernel is the fold itself, so path_min would charge the fold to every step.
# The early exit (a cursor load and a compare, ~1-2 % of the fold's path) is left out.
FOLD_ONLY_KERNELS = ("ar_fold_kernel", "mamba2_ar_fold_kernel", "m2_spec_fold_kernel", "spec_fold_kernel")
COPY_BPS = {90: (4.146e12, "the H200's measured copy bandwidth (results/h200/gpu-check-20261204T071425Z-7253b5e)"),
            100: (8.0e12, "the B300's datasheet HBM bandwidth (no measured copy)")}
ROW_COLUMNS = ["dyn_shared", "blocks_sm", "warps_sm", "occupancy", "limiter", "sass", "shfl", "bar", "lds", "sts",
               "mma", "mufu", "path_min", "path_max", "loops", "point", "programs", "step_launches", "issue_per_cycle",
               "issue_us", "issue_us_max", "byte_us"]


def step_method(recipe_method: str) -> tuple[str, str] | None:
    """("replay_ar", "output_only") for "gdn.replay", ...; None for a recipe the byte model has no step for."""
    return METHOD_OF.get(recipe_method.split(".", 1)[1])


def programs(grid: tuple[int, ...]) -> int:
    return math.prod(grid) if grid else 1


def affine(p_at: int, p_next: int, batch: int) -> tuple[int, int]:
    """(programs per row, fixed programs) from the program counts at `batch` and batch + 1."""
    per_row = p_next - p_at
    return per_row, p_at - per_row * batch


def point_label(method: tuple[str, str] | None, batch: int, L: int, T: int, history: int) -> str:
    if method is None or method[0] == "baseline_ar":
        return f"b{batch}"
    return f"b{batch} L{L}" if method[0] == "replay_ar" else f"b{batch} T{T} hist{history}"


def byte_seconds(geom, method: tuple[str, str] | None, batch: int, target: int, L: int, T: int, history: int,
                 state_bytes: int) -> float | None:
    """The method's step at the point: the byte model's bytes (every draft accepted for spec) over COPY_BPS."""
    if method is None:
        return None
    try:
        route = method[1] if method[0] == "replay_ar" and method[1] else "output_only"   # a ring form: same bytes
        tr = st.layer_traffic(geom, method[0], L=L, route=route, T=T, B_hist=history, state_bytes=state_bytes)
    except (ValueError, AttributeError):
        return None
    return batch * tr.total / COPY_BPS[target][0]


def annotate(row: dict[str, Any], per_row: int, fixed: int, batch: int, target: int, method, byte_s) -> dict:
    """The occupancy, issue-floor and byte-time columns of one kernel row (a row that did not build gets none)."""
    if row.get("registers", -1) <= 0 or row.get("num_warps", 0) <= 0:
        return row
    o = occ.occupancy(row["registers"], row["num_warps"],
                      occ.block_shared(row.get("shared", 0), row.get("dyn_shared", 0), target), target)
    hw = st.hardware(occ.TARGET_HARDWARE[target])
    n = per_row * batch + fixed
    issue = {k: occ.issue_seconds(n * row["num_warps"] * row[p], hw, o.warps) * 1e6
             for k, p in (("issue_us", "path_min"), ("issue_us_max", "path_max"))} if o.warps else {}
    return {**row, "blocks_sm": o.blocks, "warps_sm": o.warps, "occupancy": round(o.occupancy, 4),
            "limiter": o.limiter, "programs": n, "programs_per_row": per_row, "programs_fixed": fixed,
            "issue_per_cycle": round(hw.issue_per_cycle(o.warps), 3),
            **{k: round(v, 2) for k, v in issue.items()},
            "byte_us": None if byte_s is None else round(byte_s * 1e6, 2)}


def steps(rows: list[dict[str, Any]], L: int, T: int, history: int) -> list[dict[str, Any]]:
    """One row per (target, geometry, method, state, variant) step: its kernels' issue floors summed (normal step
    and cycle mean), the byte time, and which binds."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if not r.get("step_launches") or r.get("issue_us") is None:
            continue
        variant = ",".join(v for v in str(r.get("variant", "")).split(",") if v.startswith(("tiles=", "tune=")))
        key = (r["target"], r["geometry"], r["method"], r["state"], variant, r.get("L"), r.get("T"))
        s = out.setdefault(key, {"target": r["target"], "geometry": r["geometry"], "method": r["method"],
                                 "state": r["state"], "variant": variant, "point": r.get("point"), "kernels": [],
                                 "issue_us": 0.0, "issue_us_cycle": 0.0, "byte_us": r.get("byte_us")})
        method = step_method(r["method"])
        w_max = st.longest_path_share(method[0] if method else "", L, T, None, history)
        k = r["step_launches"]
        normal = 0.0 if r["kernel"] in FOLD_ONLY_KERNELS else r["issue_us"]
        s["kernels"].append(r["kernel"])
        s["issue_us"] += k * normal
        s["issue_us_cycle"] += k * ((1 - w_max) * normal + w_max * r["issue_us_max"])
    for s in out.values():
        s["issue_us"], s["issue_us_cycle"] = round(s["issue_us"], 2), round(s["issue_us_cycle"], 2)
        s["kernels"] = "+".join(s["kernels"])
        s["bound"] = "" if s["byte_us"] is None else "issue" if s["issue_us_cycle"] > s["byte_us"] else "bytes"
    return list(out.values())


def _git_commit() -> str:
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[3])
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parents[3]).stdout.strip()
        return proc.stdout.strip() + (" (dirty)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def issue_table_entries(rows: list[dict[str, Any]], geometries: dict[str, Any]) -> dict[tuple, list[tuple]]:
    """{(arch, geometry key, method, route, L, T, B_hist, state bytes): [(kernel, warps, programs per row, fixed,
    path_min, path_max), ...]} of the step kernels of every default-config row (tile / tune variants left out)."""
    out: dict[tuple, list[tuple]] = {}
    first_point: dict[tuple, tuple] = {}      # a baseline's key has no L: its rows at the first L only
    for r in rows:
        method = step_method(r["method"])
        if (method is None or not r.get("step_launches") or r.get("path_min", -1) < 0 or r["status"] != "ok"
                or str(r.get("variant", "")).startswith(("tiles=", "tune="))):
            continue
        state_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}[r["state"]]
        key = (int(r["target"].removeprefix("sm_")), st.geometry_key(geometries[r["geometry"]]),
               *st.issue_key(method[0], method[1] or "output_only", r["L"], r["T"], r["history"], state_bytes))
        if first_point.setdefault(key, (r["L"], r["T"])) != (r["L"], r["T"]):
            continue
        entry = (r["kernel"], r["num_warps"], r["warps_sm"], r["programs_per_row"], r["programs_fixed"],
                 0 if r["kernel"] in FOLD_ONLY_KERNELS else r["path_min"], r["path_max"])
        out.setdefault(key, []).extend([entry] * r["step_launches"])
    return out


def write_issue_table(path: Path, entries: dict[tuple, list[tuple]], command: str) -> None:
    """replayssm/issue_table.py: the entries as a Python literal, with the Triton version and commit that made them.
    An existing table made by the same Triton keeps its other entries (one command per target or model set)."""
    if path.exists():
        old = runpy.run_path(str(path))
        if old.get("TRITON") == triton.__version__ and old.get("STEPS"):
            entries = {**{k: list(v) for k, v in old["STEPS"].items()}, **entries}
            command = f"{old['COMMAND']}; {command}" if command not in old["COMMAND"] else old["COMMAND"]
    lines = ["# ruff: noqa: E501  (generated: the commands and keys stay on one line each)",
             '"""Warp-instructions of the Triton kernels of one step, per GPU arch, geometry and point: the issue',
             "floor's input (replayssm/step_time.py step_instructions). Generated by the kernel report; do not edit.",
             "Refresh (each command adds its entries to the table; a table of another Triton is replaced):", "",
             *[f"    {c.strip()}" for c in command.split(";")], "",
             "Key: (arch, geometry, method, route, L, T, B_hist, state bytes) as step_time.issue_key names them.",
             "Value: (kernel, warps per program, resident warps per SM, programs per batch row, fixed programs,",
             "instructions per warp on the shortest storing path, on the longest path) per launch of the step",
             "(experiments/report/kernels/sass.py, occupancy.py).",
             '"""',
             "", f"TRITON = {triton.__version__!r}", f"COMMIT = {_git_commit()!r}",
             f"GENERATED = {datetime.date.today().isoformat()!r}", f"COMMAND = {command!r}",
             "STEPS: dict[tuple, tuple[tuple[str, int, int, int, int, int, int], ...]] = {"]
    for key in sorted(entries, key=repr):
        lines.append(f"    {key!r}: (")
        lines += [f"        {e!r}," for e in entries[key]]
        lines.append("    ),")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
