"""The AOT audit of the launch-tuning spaces (experiments/tune.py): every candidate built for sm_90 and sm_100 at a
production geometry, its registers and spill bytes, kept in experiments/tune_audit.json per Triton version.

    python -m experiments.report.kernels.tune_audit --geometry kimi_linear_48b_a3b [--family kda] [--write]

Why a record: a candidate that spills runs with local-memory traffic the byte model does not count, so the tuner
must never time it (tune.TUNE_DROPPED leaves it out, with the reason). Building every candidate costs 1-10 s per
build on a CPU (~200 builds for the KDA spaces at Kimi-Linear), too slow for the suite; the record keeps the
result, tests/report/test_tune_audit.py holds TUNE_DROPPED to it (no listed candidate spills in any recorded
version, every spilling one is dropped) and rebuilds a few entries to keep the record true to the compiler.

How: the kernel report's recipes (experiments/report/kernels/recipes.py) capture each method's launches once per
candidate under launch_table.override; every launch of the step is built (aot.Builder; identical builds are
compiled once) and the candidate's row takes the most registers and the most spill bytes over them. The default
configs of the step's other kernels build without spills (make kernel-report), so a spill is the candidate's.
Record (experiments.tune.TUNE_AUDIT, read by tune.audited_spills into TUNE_DROPPED): {triton version: {geometry:
{kernel: {config label: {"sm_90": [registers, spill], "sm_100": [...]}}}}}. A kernel whose launch config is keyed
by a route (kda_replay_ar: replayssm.checks.FAMILY_ROUTES, one recipe each) is recorded per route, as "kernel[route]":
the two routes are different programs and spill differently. Several versions are kept side by side (the GPU
stack's Triton and the CPU environment's): run the module under each interpreter with --write, each replaces
only its own version's entry for the geometry.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

from experiments.harness.store import locked
from experiments.report.kernels.aot import TARGETS, Builder, aot_environment, capture_launches
from experiments.tune import TUNE_AUDIT as RECORD
from experiments.tune import audited_spills
from replayssm.geometry import get_geometry


def triton_version() -> str:
    import triton

    return triton.__version__


def load_record(path: Path = RECORD) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def audit(geo_name: str, targets: list[int], family: str | None = None, only: set[tuple[str, str]] | None = None,
          workdir: Path | None = None, log=print) -> dict[str, dict[str, dict[str, list[int]]]]:
    """{kernel: {config label: {"sm_<t>": [registers, spill]}}} of every tuning candidate the recipes of
    `geo_name`'s family launch (or only the (kernel, label) pairs in `only`), fp32 state; a route-keyed kernel is
    named "kernel[route]" (record_name). A candidate that two recipes build at the same name keeps the most
    registers and spill bytes of the two."""
    from experiments.report.kernels.recipes import RECIPES, _tune_candidates, family_of
    from replayssm import launch_table

    geom = get_geometry(geo_name)
    out: dict[str, dict[str, dict[str, list[int]]]] = {}
    with tempfile.TemporaryDirectory(prefix="tune_audit_") as tmp:
        builder = Builder(workdir or Path(tmp))
        for target in targets:
            for recipe in RECIPES:
                if recipe.family != family_of(geom) or (family and recipe.family != family):
                    continue
                for label, ctx in _tune_candidates(recipe, geom, target, torch.float32):
                    kernel, config = label.removeprefix("tune=").removesuffix(" (dropped)").split(":", 1)
                    if only is not None and not any(c == config and k.split("[")[0] == kernel for k, c in only):
                        continue
                    with aot_environment(target), capture_launches() as launches, launch_table.record() as seen, \
                            ctx:
                        recipe.run(geom, torch.device("cpu"), torch.float32)
                    name = record_name(kernel, {route_of(x.key) for x in seen if x.kernel == kernel})
                    if only is not None and (name, config) not in only and (kernel, config) not in only:
                        continue
                    builds = [builder.build(launch, target)[1] for launch in launches]
                    regs = max(b.registers or 0 for b in builds)
                    spill = max(b.spill or 0 for b in builds)
                    targets = out.setdefault(name, {}).setdefault(config, {})
                    old = targets.get(f"sm_{target}", [0, 0])
                    targets[f"sm_{target}"] = [max(regs, old[0]), max(spill, old[1])]
                    log(f"  sm_{target} {geo_name} {name} {config}: {regs} registers, {spill} B spilled")
    return out


def route_of(entry_key: str) -> str | None:
    """The route of a launch's entry key ("K=128,L=16,V=128,route=output_only|float32"), or None."""
    fields = dict(part.split("=", 1) for part in entry_key.split("|")[0].split(",") if "=" in part)
    return fields.get("route")


def record_name(kernel: str, routes: set[str | None]) -> str:
    """The record's name of `kernel` launched at `routes` (one route, or None: not route-keyed)."""
    if len(routes) > 1:
        raise ValueError(f"{kernel}: one recipe launched it at several routes {sorted(routes, key=str)}")
    route = next(iter(routes), None)
    return f"{kernel}[{route}]" if route else kernel


def dumps(record: dict) -> str:
    """The record as JSON, one candidate a line: {"sm_100": [registers, spill], "sm_90": [...]}."""
    text = json.dumps(record, indent=1, sort_keys=True)
    text = re.sub(r"\[\s+(\d+),\s+(\d+)\s+\]", r"[\1, \2]", text)
    return re.sub(r"\{\s+(\"sm_\d+\": \[\d+, \d+\]),\s+(\"sm_\d+\": \[\d+, \d+\])\s+\}", r"{\1, \2}", text) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", required=True, help="production model (e.g. kimi_linear_48b_a3b)")
    p.add_argument("--family", help="only this family's recipes (mamba2, gdn, kda)")
    p.add_argument("--target", action="append", type=int, choices=TARGETS, help="sm arch (default both)")
    p.add_argument("--write", action="store_true", help=f"merge the result into {RECORD.name}")
    args = p.parse_args(argv)
    result = audit(args.geometry, args.target or list(TARGETS), args.family,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    spills = audited_spills({triton_version(): {args.geometry: result}})
    for (kernel, route, fields), reason in sorted(spills.items(), key=str):
        print(f"{record_name(kernel, {route})} {','.join(f'{k}={v}' for k, v in fields)}: {reason}")
    if args.write:        # under a lock: the audits of two Triton versions may run side by side
        with locked(Path(tempfile.gettempdir()) / "replayssm_tune_audit.lock"):
            record = load_record()
            record.setdefault(triton_version(), {})[args.geometry] = result
            RECORD.write_text(dumps(record))
        print(f"written: {RECORD} (triton {triton_version()}, {args.geometry})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
