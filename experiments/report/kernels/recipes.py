"""What the kernel report builds and how it reports it: one recipe per public method (build a cache and inputs
through the method's public API at a production geometry, call it once while experiments/report/kernels/aot.py
captures the launches), the build of every captured launch per target and its rows; the command line and the
tables are report_cli.py's (scripts/kernels/kernel_report.py runs its `main`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.report.kernels import aot, predict
from experiments.report.kernels.aot import (
    TORCH_TO_TRITON,
    Builder,
    KernelSpec,
    Launch,
    aot_environment,
    capture_launches,
    compile_options,
)
from replayssm import state_format
from replayssm.gdn import inputs as gdn_inputs
from replayssm.geometry import (
    GDNGeometry,
    KDAGeometry,
    Mamba2Geometry,
)
from replayssm.kda import inputs as kda_inputs
from replayssm.mamba2 import inputs as m2_inputs

BATCH = 2


@dataclass
class RecipePoint:
    """What the recipes build: `batch` rows (the launch grid's batch axis), q / k L2-normalised in the GDN / KDA
    kernels or not (the benchmark follows conf/model's use_qk_l2norm: true for every GDN and KDA model), the AR
    buffer length, the spec history and window. point() sets it for the recipes called inside."""

    batch: int = BATCH
    l2norm: bool = False
    buffer_len: int = 16
    history: int = 16
    window: int = 4


POINT = RecipePoint()


@contextlib.contextmanager
def point(**fields):
    """Run the recipes inside at another RecipePoint (fields not named keep their current value)."""
    global POINT
    saved, POINT = POINT, dataclasses.replace(POINT, **fields)
    try:
        yield POINT
    finally:
        POINT = saved


def _rows(values: list[int], device=None) -> torch.Tensor:
    """`values` repeated over the batch's rows (one normal and one flush row, and so on), int32."""
    return torch.tensor([values[i % len(values)] for i in range(POINT.batch)], dtype=torch.int32, device=device)

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
    return torch.arange(POINT.batch, dtype=torch.int32, device=device)


def _mamba2_inputs(geom: Mamba2Geometry, device, window: int | None = None) -> dict[str, Any]:
    p = m2_inputs.random_params(geom, device=device)
    step = m2_inputs.random_step(geom, POINT.batch, act_dtype=ACT, device=device, window=window)
    return dict(x=step["x"], dt=step["dt"], A=p.A, B=step["B"], C=step["C"], D=p.D, z=step["z"],
                dt_bias=p.dt_bias, dt_softplus=True, slots=_slots(device))


def _gdn_inputs(geom: GDNGeometry, device, window: int | None = None) -> dict[str, Any]:
    step = gdn_inputs.random_step(geom, POINT.batch, act_dtype=ACT, device=device, window=window)
    return dict(step, slots=_slots(device))


def _kda_inputs(geom: KDAGeometry, device, window: int | None = None) -> dict[str, Any]:
    step = kda_inputs.random_step(geom, POINT.batch, act_dtype=ACT, device=device, window=window)
    return dict(step, slots=_slots(device))


def family_of(geom) -> str:
    """"mamba2", "gdn" or "kda": which recipes a geometry runs."""
    return "mamba2" if isinstance(geom, Mamba2Geometry) else "kda" if isinstance(geom, KDAGeometry) else "gdn"


def _accepted(device) -> torch.Tensor:
    return _rows([1, min(3, POINT.window)], device)


def _step(family: str, fn: Callable, target, inputs: dict[str, Any], **extra):
    """Call a Mamba-2 (x, dt, A, B, C, D, z, dt_bias) or GDN / KDA (q, k, v, g, beta) step/verify function."""
    i = inputs
    if family == "mamba2":
        return call(fn, target, i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"],
                    dt_softplus=True, slots=i["slots"], backend="triton", **extra)
    return call(fn, target, i["q"], i["k"], i["v"], i["g"], i["beta"], scale=None, use_qk_l2norm=POINT.l2norm,
                slots=i["slots"], backend="triton", **extra)


def _inputs(family: str, geom, device, window: int | None = None) -> dict[str, Any]:
    return {"mamba2": _mamba2_inputs, "gdn": _gdn_inputs, "kda": _kda_inputs}[family](geom, device, window)


def replay_ar_recipe(family: str, cache_module: str, route: str | None = None) -> Callable:
    """ReplayCache.allocate -> replay_step (one normal row, one flush row) -> materialize."""
    module = f"replayssm.{family}.decode"

    def run(geom, device, state_dtype):
        step, materialize = public(module, "replay_step"), public(module, "materialize")
        L = POINT.buffer_len
        cache = public(cache_module, "ReplayCache").allocate(geom, POINT.batch, buffer_len=L,
                                                            state_dtype=state_dtype, act_dtype=ACT, device=device)
        cache.write_pos[:] = _rows([0, L - 1])
        inputs = _inputs(family, geom, device)
        with aot.phase("step"):
            _step(family, step, cache, inputs, **({} if route is None else {"route": route}))
        if route != "state_and_output":              # materialize is the same kernel for both routes
            call(materialize, cache, backend="triton", A=inputs.get("A"))
    return run


def baseline_ar_recipe(family: str, module: str, name: str) -> Callable:
    """A plain state pool [BATCH, <state shape>] -> one step."""
    def run(geom, device, state_dtype):
        fn = public(module, name)
        shape = ((geom.nheads, geom.headdim, geom.dstate) if family == "mamba2" else (geom.HV, geom.V, geom.K))
        if isinstance(state_dtype, str):             # a state format (state_formats=True): its FormattedState
            state = state_format.FormattedState.allocate((POINT.batch, *shape), state_dtype, device=device)
        else:
            state = torch.zeros(POINT.batch, *shape, dtype=state_dtype, device=device)
        inputs = _inputs(family, geom, device)
        with aot.phase("step"):
            _step(family, fn, state, inputs)
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


def spec_recipe(family: str, modules: str | tuple[str, ...], cache_class: str, route: str | None = None) -> Callable:
    """allocate -> spec_reset -> spec_verify of a T-token window -> spec_commit -> spec_materialize (the
    functions a method lacks are skipped). A ring gets one plain row and one flush row. The cache class
    lives in the first of `modules` that has it, the functions in the first that has spec_verify."""
    modules = (modules,) if isinstance(modules, str) else modules

    def run(geom, device, state_dtype):
        Cache = public(_first_module_with(modules, cache_class), cache_class)
        cache = call(Cache.allocate, geom, POINT.batch, history_len=POINT.history, window=POINT.window,
                     state_dtype=state_dtype, act_dtype=ACT, device=device)
        mod = importlib.import_module(_first_module_with(modules, "spec_verify"))
        verify, commit = mod.spec_verify, public(mod.__name__, "spec_commit")
        if hasattr(mod, "spec_reset"):
            call(mod.spec_reset, cache, backend="triton")
        if hasattr(cache, "is_flush"):
            cache.write_pos[:] = _rows([3, POINT.history - 3])
            cache.is_flush[:] = _rows([0, 1])
        inputs = _inputs(family, geom, device, window=POINT.window)
        with aot.phase("step"):
            _step(family, verify, cache, inputs, **({} if route is None else {"route": route}))
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
    # the prep / verify / fold spec route (replayssm/mamba2/spec_verify_fold.py): issue 35 item 1
    Recipe("mamba2.replay_spec[verify_fold]", "mamba2",
           spec_recipe("mamba2", ("replayssm.mamba2.spec", "replayssm.mamba2.cache"), "SpecRing", "verify_fold"),
           ar=False),
    Recipe("mamba2.ssu", "mamba2",
           baseline_ar_recipe("mamba2", "baselines.mamba2_ssu", "selective_state_update"), ar=True),
    Recipe("mamba2.ssu_spec", "mamba2",
           spec_recipe("mamba2", "baselines.mamba2_ssu", "SpecStates"), ar=False),
    Recipe("mamba2.commit_replay", "mamba2",
           spec_recipe("mamba2", "baselines.mamba2_commit_replay", "CommitReplayCache"), ar=False),
    Recipe("gdn.replay", "gdn", replay_ar_recipe("gdn", "replayssm.gdn.cache"), ar=True),      # output-only
    Recipe("gdn.replay[state_and_output]", "gdn",
           replay_ar_recipe("gdn", "replayssm.gdn.cache", "state_and_output"), ar=True),
    # the prep / step / fold route (replayssm/delta_rule/): issue 34 item 1
    Recipe("gdn.replay[output_only_fold]", "gdn",
           replay_ar_recipe("gdn", "replayssm.gdn.cache", "output_only_fold"), ar=True),
    Recipe("gdn.replay_spec", "gdn",
           spec_recipe("gdn", ("replayssm.gdn.spec", "replayssm.gdn.ring"), "SpecRing"), ar=False),
    # the ring verify's prep / verify / fold route (replayssm/delta_rule/spec_*.py): issue 35 item 1
    Recipe("gdn.replay_spec[verify_fold]", "gdn",
           spec_recipe("gdn", ("replayssm.gdn.spec", "replayssm.gdn.ring"), "SpecRing", "verify_fold"), ar=False),
    Recipe("gdn.recurrent", "gdn",
           baseline_ar_recipe("gdn", "baselines.gdn_recurrent", "fused_recurrent_step"), ar=True),
    Recipe("gdn.recurrent_spec", "gdn",
           spec_recipe("gdn", ("baselines.gdn_recurrent_spec", "baselines.gdn_recurrent"), "SpecStates"), ar=False),
    Recipe("gdn.commit_replay", "gdn",
           spec_recipe("gdn", "baselines.gdn_commit_replay", "CommitReplayCache"), ar=False),
]


TREE_PARENTS = [-1] + [(s - 1) // 2 for s in range(1, 15)]   # full 2-ary tree of 15 nodes: the largest swept


def _first_branch(parents: list[int]) -> list[int]:
    """Node 0, then each node's first child down to a leaf (the recipe's accepted branch)."""
    path = [0]
    while (kids := [s for s in range(len(parents)) if parents[s] == path[-1]]):
        path.append(kids[0])
    return path


def tree_recipe(family: str, route: str | None = None, parents: list[int] | str | None = None) -> Callable:
    """Tree speculation (replayssm.<family>.tree): a ring with window N = 15 (the full 2-ary tree; every swept
    tree has N <= 16, so the same BLOCK_T = 16 tiles), one plain row and one flush row -> tree_verify ->
    tree_commit of a depth-4 branch (the move and cursor kernels). `route` is tree_verify's (None: its default);
    `parents` another tree (default TREE_PARENTS; its first branch is committed), or "window": the full 2-ary
    tree of the point's window (--spec-T) nodes, for a route whose tiles follow N."""

    def run(geom, device, state_dtype):
        module = f"replayssm.{family}.tree"
        tree = (TREE_PARENTS if parents is None else
                [-1] + [(s - 1) // 2 for s in range(1, POINT.window)] if parents == "window" else parents)
        branch = _first_branch(tree)
        verify, commit = public(module, "tree_verify"), public(module, "tree_commit")
        Ring = public(f"replayssm.{family}", "SpecRing")
        N = len(tree)
        ring = Ring.allocate(geom, POINT.batch, history_len=POINT.history, window=N, state_dtype=state_dtype,
                             act_dtype=ACT, device=device)
        ring.write_pos[:] = _rows([3, POINT.history - 1])
        ring.is_flush[:] = _rows([0, 1])
        parents_t = torch.tensor(tree, dtype=torch.int32, device=device)
        inputs = _inputs(family, geom, device, window=N)
        path = torch.tensor([branch] * POINT.batch, dtype=torch.int32, device=device)
        with aot.phase("step"):
            _step(family, verify, ring, inputs, parents=parents_t, **({} if route is None else {"route": route}))
            call(commit, ring, path, _accepted(device), slots=_slots(device), backend="triton")
    return run


RECIPES += [
    Recipe("mamba2.replay_tree", "mamba2", tree_recipe("mamba2"), ar=False),
    # the tree on the prep / verify / fold route (replayssm/mamba2/spec_verify_fold.py, IS_TREE): issue 35 item 2
    Recipe("mamba2.replay_tree[verify_fold]", "mamba2", tree_recipe("mamba2", "verify_fold"), ar=False),
    Recipe("gdn.replay_tree", "gdn", tree_recipe("gdn"), ar=False),
    # the tree on the ring verify's prep / verify / fold route (replayssm/delta_rule/, the prep with IS_TREE): issue
    # 35 item 2; its prep's tiles follow N (2N window rows), so built at the point's window, N = T
    Recipe("gdn.replay_tree[verify_fold]", "gdn", tree_recipe("gdn", "verify_fold", parents="window"), ar=False),
    # KDA (replayssm.kda): GDN's kernels with PER_CHANNEL set, built at Kimi-Linear's geometry
    Recipe("kda.replay", "kda", replay_ar_recipe("kda", "replayssm.kda.cache"), ar=True),      # output-only
    Recipe("kda.replay[state_and_output]", "kda",
           replay_ar_recipe("kda", "replayssm.kda.cache", "state_and_output"), ar=True),
    Recipe("kda.replay[output_only_fold]", "kda",
           replay_ar_recipe("kda", "replayssm.kda.cache", "output_only_fold"), ar=True),
    Recipe("kda.replay_spec", "kda", spec_recipe("kda", ("replayssm.kda.spec", "replayssm.kda.cache"), "SpecRing"),
           ar=False),
    Recipe("kda.replay_spec[verify_fold]", "kda",
           spec_recipe("kda", ("replayssm.kda.spec", "replayssm.kda.cache"), "SpecRing", "verify_fold"), ar=False),
    Recipe("kda.replay_tree", "kda", tree_recipe("kda"), ar=False),
    # KDA's tree on the same route (its prep with IS_TREE: stacked at N <= 4, token-major above), built at N = T
    Recipe("kda.replay_tree[verify_fold]", "kda", tree_recipe("kda", "verify_fold", parents="window"), ar=False),
    Recipe("kda.recurrent", "kda", baseline_ar_recipe("kda", "baselines.kda_recurrent", "fused_recurrent_step"),
           ar=True),
    Recipe("kda.recurrent_spec", "kda", spec_recipe("kda", "baselines.kda_recurrent_spec", "SpecStates"), ar=False),
    Recipe("kda.commit_replay", "kda", spec_recipe("kda", "baselines.kda_commit_replay", "CommitReplayCache"),
           ar=False),
]

# ---------------------------------------------------------------------------------------------------------
# 5. the report

COLUMNS = ["kernel", "method", "target", "geometry", "state", "variant", "grid", "num_warps", "registers", "spill",
           "dyn_shared", "occupancy", "sass", "path_min", "issue_us", "byte_us", "widest_load", "status"]
EXTRA_COLUMNS = (["stack", "shared", "state_load", "num_stages", "local", "ldg", "L", "T", "history", "l2norm"]
                 + [c for c in predict.ROW_COLUMNS if c not in COLUMNS] + ["programs_per_row", "programs_fixed"])
STEP_COLUMNS = ["target", "geometry", "method", "state", "variant", "point", "kernels", "issue_us", "issue_us_cycle",
                "byte_us", "bound"]


def _variants(launches: list[tuple[Launch, KernelSpec]]) -> list[str]:
    """For launches of the same kernel with different constexprs, the constexprs that tell them apart."""
    out = []
    for launch, spec in launches:
        same = [s for lch, s in launches if lch.fn is launch.fn]
        differing = sorted({k for s in same for k in s.constexprs if s.constexprs.get(k) != spec.constexprs.get(k)})
        out.append(",".join(f"{k}={spec.constexprs.get(k)}" for k in differing))
    return out


class Reusable(contextlib.AbstractContextManager):
    """A context manager entered afresh each time (a generator-based one runs once; the report enters each
    candidate's override twice, to capture the launches at two batches)."""

    def __init__(self, factory: Callable[[], contextlib.AbstractContextManager]):
        self.factory, self.active = factory, []

    def __enter__(self):
        cm = self.factory()
        self.active.append(cm)
        return cm.__enter__()

    def __exit__(self, *exc):
        return self.active.pop().__exit__(*exc)


def _tile_candidates(recipe: Recipe, geom, spec_tiles: bool) -> list[tuple[str, contextlib.AbstractContextManager]]:
    """(label, context) per tile candidate to build: the default config only, or, with `spec_tiles`, every
    candidate of the Mamba-2 spec tile space (dropped ones included, labelled with their reason)."""
    if not (spec_tiles and recipe.method == "mamba2.replay_spec"):
        return [("", contextlib.nullcontext())]
    from replayssm import launch_table
    from replayssm.mamba2 import spec_kernels as sk

    out = []
    for cfg in sk.spec_tile_candidates(geom.headdim, POINT.window, include_dropped=True):
        dropped = sk.dropped_reason(cfg)
        out.append((f"tiles={cfg.label}" + (" (dropped)" if dropped else ""),
                    Reusable(functools.partial(launch_table.override, "mamba2_replay_spec", cfg))))
    return out


TUNE_SPILL = ("SPILL: a tuning candidate (reported, not a failure: drop it in its declaration, "
              "replayssm/launch_registry.py)")


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
                        Reusable(functools.partial(launch_table.override, launch.kernel, cand))))
    return out


def _point_combos(buffer_lens: list[int], windows: list[int]) -> list[tuple[int, int]]:
    """(L, T) pairs to build: every L with the first T (AR recipes), every other T with the first L (spec)."""
    return [(L, windows[0]) for L in buffer_lens] + [(buffer_lens[0], T) for T in windows[1:]]


def _wanted(recipe: Recipe, L: int, T: int, buffer_lens: list[int], windows: list[int]) -> bool:
    """An AR recipe at every L and the first T; a spec / tree recipe at every T and the first L."""
    return T == windows[0] if recipe.ar else L == buffer_lens[0]


def run_report(geometries: dict[str, Mamba2Geometry | GDNGeometry | KDAGeometry], targets: list[int],
               methods: list[str] | None,
               fp32_state_only: bool, workdir: Path, log=print, bf16_state: bool = False,
               spec_tiles: bool = False, tune_space: bool = False, batch: int = 256,
               buffer_lens: tuple[int, ...] = (16,), windows: tuple[int, ...] = (4,), history: int = 16,
               l2norm: bool | None = None, state_formats: bool = False) -> list[dict[str, Any]]:
    """bf16_state adds a bfloat16-state build of every recipe (AR and spec: each cache stores it). state_formats
    adds a build per state format a recipe's Triton kernels store besides the plain ones (formats_of: the
    stochastic-rounding and the scaled 8-bit ones, replayssm/state_format.py), its row's `state` the format
    name. spec_tiles builds every candidate of the Mamba-2 spec tile space (replayssm/mamba2/spec_kernels.py); a
    candidate the space drops is expected to spill and does not fail the report (its status says why it was
    dropped).
    tune_space builds every candidate of every tuning space the recipe launches (experiments/tune.py), each
    launch only where it differs from one already built (the default's other kernels are not repeated); a
    spilling candidate is reported (TUNE_SPILL), not failed: the tuner would time it.
    batch, buffer_lens, windows, history: the benchmark point of the issue floor and byte time (predict.py; AR
    recipes at every buffer length, spec recipes at every window); l2norm: q / k normalised in the GDN / KDA
    kernels (None: the model's conf/model use_qk_l2norm, as the benchmark runs them)."""
    builder = Builder(workdir)
    rows: list[dict[str, Any]] = []
    for target in targets:
        for geo_name, geom in geometries.items():
            norm = _model_l2norm(geo_name) if l2norm is None else l2norm
            for L, T in _point_combos(list(buffer_lens), list(windows)):
                with point(l2norm=norm, buffer_len=L, window=T, history=history):
                    for recipe in RECIPES:
                        if (recipe.family != family_of(geom) or (methods and recipe.method not in methods)
                                or not _wanted(recipe, L, T, list(buffer_lens), list(windows))):
                            continue
                        rows += _recipe_rows(recipe, builder, target, geo_name, geom, fp32_state_only, bf16_state,
                                             spec_tiles, tune_space, batch, log, state_formats)
    return rows


def _model_l2norm(geo_name: str) -> bool:
    from experiments.harness.points import load_model_config

    try:
        return bool(load_model_config(geo_name.split("@")[0]).get("use_qk_l2norm"))
    except ValueError:
        return False


def _capture(recipe: Recipe, geom, target: int, state_dtype, tile_ctx) -> list[Launch]:
    with aot_environment(target), capture_launches() as launches, tile_ctx:
        recipe.run(geom, torch.device("cpu"), state_dtype)
    return launches


def formats_of(method: str) -> list[str]:
    """The non-plain state formats the recipe `method`'s Triton kernels store (state_format's writer lists)."""
    return ([*state_format.SR_FORMATS] if method in state_format.TRITON_SR_WRITERS else []) + \
        ([n for n, f in state_format.FORMATS.items() if f.scaled] if method in state_format.TRITON_SCALED_WRITERS
         else [])


def _state_label(state) -> str:
    return state if isinstance(state, str) else TORCH_TO_TRITON[state]


def _state_bytes(state) -> int:
    return state_format.state_format(state).storage.itemsize


def _recipe_rows(recipe: Recipe, builder: Builder, target: int, geo_name: str, geom, fp32_state_only: bool,
                 bf16_state: bool, spec_tiles: bool, tune_space: bool, batch: int, log,
                 state_formats: bool = False) -> list[dict[str, Any]]:
    """The rows of one recipe at the current POINT: one per distinct kernel build, state dtype and candidate."""
    rows: list[dict[str, Any]] = []
    dtypes = [torch.float32] if (fp32_state_only or not recipe.ar) else [torch.float32, torch.float16]
    if bf16_state:
        dtypes.append(torch.bfloat16)
    if state_formats:
        dtypes += formats_of(recipe.method)
    seen_all: set = set()
    method = predict.step_method(recipe.method)
    for state_dtype, (tiles, tile_ctx) in ((d, c) for d in dtypes
                                           for c in _tile_candidates(recipe, geom, spec_tiles)
                                           + (_tune_candidates(recipe, geom, target, d) if tune_space else [])):
        base = dict(method=recipe.method, target=f"sm_{target}", geometry=geo_name, state=_state_label(state_dtype),
                    L=POINT.buffer_len, T=POINT.window, history=POINT.history, l2norm=POINT.l2norm,
                    point=predict.point_label(method, batch, POINT.buffer_len, POINT.window, POINT.history))
        try:
            launches = _capture(recipe, geom, target, state_dtype, tile_ctx)
            with point(batch=POINT.batch + 1):        # the grid's batch axis: the same launches one row larger
                more = _capture(recipe, geom, target, state_dtype, tile_ctx)
        except MissingModule as exc:
            return rows + [{**base, "kernel": "-", "status": f"missing: {exc}"}]
        except Exception as exc:
            rows.append({**base, "kernel": "-", "status": f"recipe error: {type(exc).__name__}: {exc}"})
            continue
        if not launches or len(more) != len(launches):
            why = (f"{len(launches)} launches at batch {POINT.batch}, {len(more)} at one more" if launches
                   else "no Triton launch captured")
            rows.append({**base, "kernel": "-", "status": f"recipe error: {why}"})
            continue
        byte_s = predict.byte_seconds(geom, method, batch, target, POINT.buffer_len, POINT.window, POINT.history,
                                      _state_bytes(state_dtype))
        built, seen, index = [], seen_all if tune_space else set(), {}
        for launch, bigger in zip(launches, more):
            spec, build = builder.build(launch, target)
            ident = (state_dtype, launch.fn, spec.key(), tuple(sorted(compile_options(launch).items())))
            if ident not in index:
                grids = (predict.programs(launch.grid), predict.programs(bigger.grid))
                index[ident] = [launch, spec, build, 0, predict.affine(*grids, POINT.batch)]
            index[ident][3] += launch.phase == "step"
            if ident not in seen:                     # the same kernel launched twice alike: one row
                seen.add(ident)
                built.append(index[ident])
        for (launch, _, build, in_step, (per_row, fixed)), variant in zip(
                built, _variants([(b[0], b[1]) for b in built])):
            variant = ",".join(v for v in (tiles, variant) if v)
            if "(dropped)" in tiles and build.status == "SPILL":
                build = dataclasses.replace(build, status="SPILL: dropped from the tile space")
            if tiles.startswith("tune=") and build.status == "SPILL":
                build = dataclasses.replace(build, status="SPILL: dropped from the tile space"
                                            if "(dropped)" in tiles else TUNE_SPILL)
            row = {**base, "kernel": launch.name, "variant": variant, "grid": "x".join(map(str, launch.grid)),
                   "step_launches": in_step, **{k: v for k, v in dataclasses.asdict(build).items() if k != "seconds"}}
            rows.append(predict.annotate(row, per_row, fixed, batch, target, method, byte_s))
            log(f"  sm_{target} {geo_name} {recipe.method} {launch.name} {variant} regs={build.registers} "
                f"spill={build.spill} smem={build.dyn_shared} path={build.path_min}/{build.path_max} {build.status} "
                f"({build.seconds:.1f}s)")
    return rows


def failures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that fail the report: a spill, a compile error or a recipe error (missing recipes do not)."""
    return [r for r in rows if r["status"] != "ok" and not r["status"].startswith("missing")
            and "dropped from the tile space" not in r["status"] and r["status"] != TUNE_SPILL]
