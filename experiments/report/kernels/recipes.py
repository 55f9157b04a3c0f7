"""What the kernel report builds and how it reports it: one recipe per public method (build a cache and inputs
through the method's public API at a production geometry, call it once while experiments/report/kernels/aot.py
captures the launches), the build of every captured launch per target, the table and the command line
(scripts/kernels/kernel_report.py runs `main`)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib
import inspect
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.report.kernels import aot
from experiments.report.kernels.aot import (
    TARGETS,
    TORCH_TO_TRITON,
    Builder,
    KernelSpec,
    Launch,
    aot_environment,
    capture_launches,
    compile_options,
)
from replayssm.checks import interpreter_active
from replayssm.gdn import inputs as gdn_inputs
from replayssm.geometry import (
    GDN_MODELS,
    KDA_MODELS,
    MAMBA2_MODELS,
    GDNGeometry,
    KDAGeometry,
    Mamba2Geometry,
    get_geometry,
)
from replayssm.kda import inputs as kda_inputs
from replayssm.mamba2 import inputs as m2_inputs

BATCH = 2

# ---------------------------------------------------------------------------------------------------------
# 4. recipes: build a cache and inputs through the public API, call it once


class MissingModule(Exception):
    """The recipe's module or function does not exist (yet)."""


def public(module: str, name: str) -> Callable:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise MissingModule(f"no module {module}") from exc
        raise
    if not hasattr(mod, name):
        raise MissingModule(f"{module} has no {name}")
    return getattr(mod, name)


def call(fn: Callable, *args, **kwargs):
    """Call a public function, dropping keyword arguments its signature does not have (APIs in flux)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


ACT = torch.bfloat16       # production activation dtype (compiled only: nothing runs)


def _slots(device) -> torch.Tensor:
    return torch.arange(BATCH, dtype=torch.int32, device=device)


def _mamba2_inputs(geom: Mamba2Geometry, device, window: int | None = None) -> dict[str, Any]:
    p = m2_inputs.random_params(geom, device=device)
    step = m2_inputs.random_step(geom, BATCH, act_dtype=ACT, device=device, window=window)
    return dict(x=step["x"], dt=step["dt"], A=p.A, B=step["B"], C=step["C"], D=p.D, z=step["z"],
                dt_bias=p.dt_bias, dt_softplus=True, slots=_slots(device))


def _gdn_inputs(geom: GDNGeometry, device, window: int | None = None) -> dict[str, Any]:
    step = gdn_inputs.random_step(geom, BATCH, act_dtype=ACT, device=device, window=window)
    return dict(step, slots=_slots(device))


def _kda_inputs(geom: KDAGeometry, device, window: int | None = None) -> dict[str, Any]:
    step = kda_inputs.random_step(geom, BATCH, act_dtype=ACT, device=device, window=window)
    return dict(step, slots=_slots(device))


def family_of(geom) -> str:
    """"mamba2", "gdn" or "kda": which recipes a geometry runs."""
    return "mamba2" if isinstance(geom, Mamba2Geometry) else "kda" if isinstance(geom, KDAGeometry) else "gdn"


def _accepted(device) -> torch.Tensor:
    return torch.tensor([1, 3], dtype=torch.int32, device=device)[:BATCH]


AR_BUFFER, SPEC_HISTORY, SPEC_WINDOW = 16, 16, 4


def _step(family: str, fn: Callable, target, inputs: dict[str, Any], **extra):
    """Call a Mamba-2 (x, dt, A, B, C, D, z, dt_bias) or GDN / KDA (q, k, v, g, beta) step/verify function."""
    i = inputs
    if family == "mamba2":
        return call(fn, target, i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"],
                    dt_softplus=True, slots=i["slots"], backend="triton", **extra)
    return call(fn, target, i["q"], i["k"], i["v"], i["g"], i["beta"], scale=None, use_qk_l2norm=False,
                slots=i["slots"], backend="triton", **extra)


def _inputs(family: str, geom, device, window: int | None = None) -> dict[str, Any]:
    return {"mamba2": _mamba2_inputs, "gdn": _gdn_inputs, "kda": _kda_inputs}[family](geom, device, window)


def replay_ar_recipe(family: str, cache_module: str, route: str | None = None) -> Callable:
    """ReplayCache.allocate -> replay_step (one normal row, one flush row) -> materialize."""
    module = f"replayssm.{family}.decode"

    def run(geom, device, state_dtype):
        step, materialize = public(module, "replay_step"), public(module, "materialize")
        cache = public(cache_module, "ReplayCache").allocate(geom, BATCH, buffer_len=AR_BUFFER,
                                                            state_dtype=state_dtype, act_dtype=ACT, device=device)
        cache.write_pos[:] = torch.tensor([0, AR_BUFFER - 1], dtype=torch.int32)[:BATCH]
        inputs = _inputs(family, geom, device)
        _step(family, step, cache, inputs, **({} if route is None else {"route": route}))
        if route != "state_and_output":              # materialize is the same kernel for both routes
            call(materialize, cache, backend="triton", A=inputs.get("A"))
    return run


def baseline_ar_recipe(family: str, module: str, name: str) -> Callable:
    """A plain state pool [BATCH, <state shape>] -> one step."""
    def run(geom, device, state_dtype):
        fn = public(module, name)
        shape = ((geom.nheads, geom.headdim, geom.dstate) if family == "mamba2" else (geom.HV, geom.V, geom.K))
        state = torch.zeros(BATCH, *shape, dtype=state_dtype, device=device)
        _step(family, fn, state, _inputs(family, geom, device))
    return run


def _first_module_with(modules: tuple[str, ...], name: str) -> str:
    """The first of `modules` that defines `name` (an API may move between modules while it lands)."""
    for module in modules:
        try:
            public(module, name)
            return module
        except MissingModule:
            pass
    raise MissingModule(f"none of {', '.join(modules)} has {name}")


def spec_recipe(family: str, modules: str | tuple[str, ...], cache_class: str) -> Callable:
    """allocate -> spec_reset -> spec_verify of a T-token window -> spec_commit -> spec_materialize (the
    functions a method lacks are skipped). A ring gets one plain row and one flush row. The cache class
    lives in the first of `modules` that has it, the functions in the first that has spec_verify."""
    modules = (modules,) if isinstance(modules, str) else modules

    def run(geom, device, state_dtype):
        Cache = public(_first_module_with(modules, cache_class), cache_class)
        cache = call(Cache.allocate, geom, BATCH, history_len=SPEC_HISTORY, window=SPEC_WINDOW,
                     state_dtype=state_dtype, act_dtype=ACT, device=device)
        mod = importlib.import_module(_first_module_with(modules, "spec_verify"))
        verify, commit = mod.spec_verify, public(mod.__name__, "spec_commit")
        if hasattr(mod, "spec_reset"):
            call(mod.spec_reset, cache, backend="triton")
        if hasattr(cache, "is_flush"):
            cache.write_pos[:] = torch.tensor([3, 13], dtype=torch.int32)[:BATCH]
            cache.is_flush[:] = torch.tensor([0, 1], dtype=torch.int32)[:BATCH]
        inputs = _inputs(family, geom, device, window=SPEC_WINDOW)
        _step(family, verify, cache, inputs)
        call(commit, cache, _accepted(device), A=inputs.get("A"), slots=inputs["slots"], backend="triton")
        if hasattr(mod, "spec_materialize"):
            call(mod.spec_materialize, cache, backend="triton", A=inputs.get("A"))
    return run


@dataclass(frozen=True)
class Recipe:
    method: str
    family: str                  # "mamba2", "gdn" or "kda": which geometries it runs on
    run: Callable                # (geometry, device, state_dtype) -> None; calls the public API once
    ar: bool                     # AR kernels are also built with fp16 state


RECIPES = [
    Recipe("mamba2.replay[output_only]", "mamba2",
           replay_ar_recipe("mamba2", "replayssm.mamba2.cache", "output_only"), ar=True),
    Recipe("mamba2.replay[state_and_output]", "mamba2",
           replay_ar_recipe("mamba2", "replayssm.mamba2.cache", "state_and_output"), ar=True),
    Recipe("mamba2.replay_spec", "mamba2",
           spec_recipe("mamba2", ("replayssm.mamba2.spec", "replayssm.mamba2.cache"), "SpecRing"), ar=False),
    Recipe("mamba2.ssu", "mamba2",
           baseline_ar_recipe("mamba2", "baselines.mamba2_ssu", "selective_state_update"), ar=True),
    Recipe("mamba2.ssu_spec", "mamba2",
           spec_recipe("mamba2", "baselines.mamba2_ssu", "SpecStates"), ar=False),
    Recipe("mamba2.commit_replay", "mamba2",
           spec_recipe("mamba2", "baselines.mamba2_commit_replay", "CommitReplayCache"), ar=False),
    Recipe("gdn.replay", "gdn", replay_ar_recipe("gdn", "replayssm.gdn.cache"), ar=True),      # output-only
    Recipe("gdn.replay[state_and_output]", "gdn",
           replay_ar_recipe("gdn", "replayssm.gdn.cache", "state_and_output"), ar=True),
    Recipe("gdn.replay_spec", "gdn",
           spec_recipe("gdn", ("replayssm.gdn.spec", "replayssm.gdn.ring"), "SpecRing"), ar=False),
    Recipe("gdn.recurrent", "gdn",
           baseline_ar_recipe("gdn", "baselines.gdn_recurrent", "fused_recurrent_step"), ar=True),
    Recipe("gdn.recurrent_spec", "gdn",
           spec_recipe("gdn", ("baselines.gdn_recurrent_spec", "baselines.gdn_recurrent"), "SpecStates"), ar=False),
    Recipe("gdn.commit_replay", "gdn",
           spec_recipe("gdn", "baselines.gdn_commit_replay", "CommitReplayCache"), ar=False),
]


TREE_PARENTS = [-1] + [(s - 1) // 2 for s in range(1, 15)]   # full 2-ary tree of 15 nodes: the largest swept


def tree_recipe(family: str) -> Callable:
    """Tree speculation (replayssm.<family>.tree): a ring with window N = 15 (the full 2-ary tree; every swept
    tree has N <= 16, so the same BLOCK_T = 16 tiles), one plain row and one flush row -> tree_verify ->
    tree_commit of a depth-4 branch (the move and cursor kernels)."""
    module = f"replayssm.{family}.tree"

    def run(geom, device, state_dtype):
        verify, commit = public(module, "tree_verify"), public(module, "tree_commit")
        Ring = public(f"replayssm.{family}", "SpecRing")
        N = len(TREE_PARENTS)
        ring = Ring.allocate(geom, BATCH, history_len=SPEC_HISTORY, window=N, state_dtype=state_dtype,
                             act_dtype=ACT, device=device)
        ring.write_pos[:] = torch.tensor([3, 15], dtype=torch.int32)[:BATCH]
        ring.is_flush[:] = torch.tensor([0, 1], dtype=torch.int32)[:BATCH]
        parents = torch.tensor(TREE_PARENTS, dtype=torch.int32, device=device)
        _step(family, verify, ring, _inputs(family, geom, device, window=N), parents=parents)
        path = torch.tensor([[0, 1, 3, 7]] * BATCH, dtype=torch.int32, device=device)
        call(commit, ring, path, _accepted(device), slots=_slots(device), backend="triton")
    return run


RECIPES += [
    Recipe("mamba2.replay_tree", "mamba2", tree_recipe("mamba2"), ar=False),
    Recipe("gdn.replay_tree", "gdn", tree_recipe("gdn"), ar=False),
    # KDA (replayssm.kda): GDN's kernels with PER_CHANNEL set, built at Kimi-Linear's geometry
    Recipe("kda.replay", "kda", replay_ar_recipe("kda", "replayssm.kda.cache"), ar=True),      # output-only
    Recipe("kda.replay[state_and_output]", "kda",
           replay_ar_recipe("kda", "replayssm.kda.cache", "state_and_output"), ar=True),
    Recipe("kda.replay_spec", "kda", spec_recipe("kda", ("replayssm.kda.spec", "replayssm.kda.cache"), "SpecRing"),
           ar=False),
    Recipe("kda.replay_tree", "kda", tree_recipe("kda"), ar=False),
    Recipe("kda.recurrent", "kda", baseline_ar_recipe("kda", "baselines.kda_recurrent", "fused_recurrent_step"),
           ar=True),
    Recipe("kda.recurrent_spec", "kda", spec_recipe("kda", "baselines.kda_recurrent_spec", "SpecStates"), ar=False),
    Recipe("kda.commit_replay", "kda", spec_recipe("kda", "baselines.kda_commit_replay", "CommitReplayCache"),
           ar=False),
]

# ---------------------------------------------------------------------------------------------------------
# 5. the report

COLUMNS = ["kernel", "method", "target", "geometry", "state", "variant", "grid", "num_warps", "registers", "spill",
           "stack", "shared", "widest_load", "state_load", "status"]
EXTRA_COLUMNS = ["num_stages", "local", "ldg"]


def _variants(launches: list[tuple[Launch, KernelSpec]]) -> list[str]:
    """For launches of the same kernel with different constexprs, the constexprs that tell them apart."""
    out = []
    for launch, spec in launches:
        same = [s for lch, s in launches if lch.fn is launch.fn]
        differing = sorted({k for s in same for k in s.constexprs if s.constexprs.get(k) != spec.constexprs.get(k)})
        out.append(",".join(f"{k}={spec.constexprs.get(k)}" for k in differing))
    return out


def _tile_candidates(recipe: Recipe, geom, spec_tiles: bool) -> list[tuple[str, contextlib.AbstractContextManager]]:
    """(label, context) per tile candidate to build: the default config only, or, with `spec_tiles`, every
    candidate of the Mamba-2 spec tile space (dropped ones included, labelled with their reason)."""
    if not (spec_tiles and recipe.method == "mamba2.replay_spec"):
        return [("", contextlib.nullcontext())]
    from replayssm import launch_table
    from replayssm.mamba2 import spec_kernels as sk

    out = []
    for cfg in sk.spec_tile_candidates(geom.headdim, SPEC_WINDOW, include_dropped=True):
        dropped = sk.dropped_reason(cfg)
        out.append((f"tiles={cfg.label}" + (" (dropped)" if dropped else ""),
                    launch_table.override("mamba2_replay_spec", cfg)))
    return out


TUNE_SPILL = "SPILL: a tuning candidate (reported, not a failure: drop it from experiments/tune.py's space)"


def _tune_candidates(recipe: Recipe, geom, target: int,
                     state_dtype) -> list[tuple[str, contextlib.AbstractContextManager]]:
    """(label, override) per candidate of every tuning space (experiments/tune.py) the recipe's launches
    resolve, found by capturing the recipe once under its defaults (nothing is built for that)."""
    from experiments import tune
    from replayssm import launch_table

    with aot_environment(target), capture_launches(), launch_table.use_defaults(), launch_table.record() as log:
        recipe.run(geom, torch.device("cpu"), state_dtype)
    out = []
    for launch in {(x.kernel, x.key): x for x in log}.values():
        key = dict(part.split("=", 1) for part in launch.key.split("|")[0].split(",") if part)
        key = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in key.items()}
        for cand in tune.candidates(launch.kernel, key, include_dropped=True):
            fields = launch_table.fields(cand)
            dropped = " (dropped)" if tune.dropped_reason(launch.kernel, key, cand) else ""
            out.append((f"tune={launch.kernel}:{launch_table.config_label(fields)}{dropped}",
                        launch_table.override(launch.kernel, cand)))
    return out


def run_report(geometries: dict[str, Mamba2Geometry | GDNGeometry | KDAGeometry], targets: list[int],
               methods: list[str] | None,
               fp32_state_only: bool, workdir: Path, log=print, bf16_state: bool = False,
               spec_tiles: bool = False, tune_space: bool = False) -> list[dict[str, Any]]:
    """bf16_state adds a bfloat16-state build of every recipe (AR and spec: each cache stores it). spec_tiles
    builds every candidate of the Mamba-2 spec tile space (replayssm/mamba2/spec_kernels.py); a candidate the
    space drops is expected to spill and does not fail the report (its status says why it was dropped).
    tune_space builds every candidate of every tuning space the recipe launches (experiments/tune.py), each
    launch only where it differs from one already built (the default's other kernels are not repeated); a
    spilling candidate is reported (TUNE_SPILL), not failed: the tuner would time it."""
    builder = Builder(workdir)
    rows: list[dict[str, Any]] = []
    device = torch.device("cpu")
    for target in targets:
        for geo_name, geom in geometries.items():
            family = family_of(geom)
            for recipe in RECIPES:
                if recipe.family != family or (methods and recipe.method not in methods):
                    continue
                dtypes = [torch.float32] if (fp32_state_only or not recipe.ar) else [torch.float32, torch.float16]
                if bf16_state:
                    dtypes.append(torch.bfloat16)
                seen_all: set = set()
                for state_dtype, (tiles, tile_ctx) in ((d, c) for d in dtypes
                                                       for c in _tile_candidates(recipe, geom, spec_tiles)
                                                       + (_tune_candidates(recipe, geom, target, d)
                                                          if tune_space else [])):
                    base = dict(method=recipe.method, target=f"sm_{target}", geometry=geo_name,
                                state=TORCH_TO_TRITON[state_dtype])
                    try:
                        with aot_environment(target), capture_launches() as launches, tile_ctx:
                            recipe.run(geom, device, state_dtype)
                    except MissingModule as exc:
                        rows.append({**base, "kernel": "-", "status": f"missing: {exc}"})
                        break
                    except Exception as exc:
                        rows.append({**base, "kernel": "-", "status": f"recipe error: {type(exc).__name__}: {exc}"})
                        continue
                    if not launches:
                        rows.append({**base, "kernel": "-", "status": "recipe error: no Triton launch captured"})
                        continue
                    built, seen = [], seen_all if tune_space else set()
                    for launch in launches:
                        spec, build = builder.build(launch, target)
                        ident = (state_dtype, launch.fn, spec.key(), tuple(sorted(compile_options(launch).items())))
                        if ident not in seen:             # the same kernel launched twice alike: one row
                            seen.add(ident)
                            built.append((launch, spec, build))
                    for (launch, _, build), variant in zip(built, _variants([(lch, s) for lch, s, _ in built])):
                        variant = ",".join(v for v in (tiles, variant) if v)
                        if "(dropped)" in tiles and build.status == "SPILL":
                            build = dataclasses.replace(build, status="SPILL: dropped from the tile space")
                        if tiles.startswith("tune=") and build.status == "SPILL":
                            build = dataclasses.replace(build, status="SPILL: dropped from the tile space"
                                                        if "(dropped)" in tiles else TUNE_SPILL)
                        row = {**base, "kernel": launch.name, "variant": variant,
                               "grid": "x".join(map(str, launch.grid)),
                               **{k: v for k, v in dataclasses.asdict(build).items() if k != "seconds"}}
                        rows.append(row)
                        log(f"  sm_{target} {geo_name} {recipe.method} {launch.name} {variant} "
                            f"regs={build.registers} spill={build.spill} {build.status} ({build.seconds:.1f}s)")
    return rows


def failures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that fail the report: a spill, a compile error or a recipe error (missing recipes do not)."""
    return [r for r in rows if r["status"] != "ok" and not r["status"].startswith("missing")
            and "dropped from the tile space" not in r["status"] and r["status"] != TUNE_SPILL]


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
    p.add_argument("--spec-tiles", action="store_true",
                   help="build every candidate of the Mamba-2 spec tile space (mamba2.replay_spec)")
    p.add_argument("--tune-space", action="store_true",
                   help="build every candidate of every tuning space (experiments/tune.py); spills are reported")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
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
                          spec_tiles=args.spec_tiles, tune_space=args.tune_space)
    print(format_table(rows))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS + EXTRA_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, "ldg": json.dumps(r.get("ldg", {}))} for r in rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1, default=str))
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


if __name__ == "__main__":
    sys.exit(main())
