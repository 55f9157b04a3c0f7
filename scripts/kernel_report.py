"""Ahead-of-time build of every Triton kernel for sm_90 and sm_100, on a CPU box: registers, spills, loads.

How: with REPLAYSSM_AOT_CAPTURE=1 the Triton backend of every public
function accepts CPU tensors, and REPLAYSSM_TARGET_ARCH makes the launchers pick the launch config they
would pick on that GPU. `JITFunction.run` is replaced by a recorder, so calling each method's public API
once records every launch (kernel, bound arguments, grid, num_warps/num_stages) without running it. Each
launch is then specialised the way the JIT specialises it (16-byte aligned pointers and ints divisible by
16 get `tt.divisibility 16`, ints equal to 1 and None become constexprs), compiled with `triton.compile`
for the target, and its cubin inspected with the cuobjdump that ships inside Triton (scripts/cubin_stats.py).

Columns: registers / stack / shared from `cuobjdump --dump-resource-usage`; spill = bytes of local-memory
stores (STL) in the SASS, which is what `ptxas -v` calls "bytes spill stores" (spilled registers land in the
stack frame, so cuobjdump's LOCAL stays 0 even when a kernel spills: STACK > 0 is the hint, STL the proof);
widest_load = the widest global load in the SASS (LDG.E.128 = 16 bytes) and how many there are;
state_load = the widest load whose address derives from a pointer argument named like "state", traced
through the PTX. Exit code 1 if a kernel spills or fails to compile; a recipe whose module is not there
(yet) is listed as "missing" and does not fail.

Usage: python scripts/kernel_report.py [--geometry NAME]... [--tp N] [--target 90|100]... [--method NAME]...
                                       [--fp32-state-only] [--bf16-state] [--spec-tiles] [--csv PATH] [--json PATH]
--spec-tiles builds every candidate of the Mamba-2 spec tile space (variant "tiles=m32-n16-w4-s2-tmin"); a
candidate the space drops (replayssm/mamba2/spec_kernels.py, SPEC_TILE_DROPPED, with the reason) is
expected to spill and does not fail the report.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import triton
from cubin_stats import inspect_cubin  # scripts/cubin_stats.py: scripts/ is on sys.path when run as a script
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replayssm.checks import interpreter_active  # noqa: E402
from replayssm.geometry import GDN_MODELS, MAMBA2_MODELS, GDNGeometry, Mamba2Geometry, get_geometry  # noqa: E402

TARGETS = (90, 100)
DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3          # triton's defaults when a launch names neither
BATCH = 2

# ---------------------------------------------------------------------------------------------------------
# 1. capture launches


@dataclass
class Launch:
    """One `kernel[grid](...)` call: the JIT function, every argument by name (defaults applied), the grid
    and the launch options (num_warps, num_stages, ...)."""

    fn: JITFunction
    args: dict[str, Any]
    grid: tuple[int, ...]
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Replace JITFunction.run (what `kernel[grid](...)` calls) by a recorder that launches nothing."""
    launches: list[Launch] = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        signature = inspect.signature(self.fn)
        params = {k: v for k, v in kwargs.items() if k in signature.parameters}
        options = {k: v for k, v in kwargs.items() if k not in signature.parameters}
        bound = signature.bind(*args, **params)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        resolved = grid(arguments) if callable(grid) else grid
        launches.append(Launch(self, arguments, tuple(int(g) for g in resolved), options))
        return None

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def aot_environment(target: int) -> Iterator[None]:
    """Let the Triton backend take CPU tensors, and make launchers choose the config for `target`."""
    saved = {k: os.environ.get(k) for k in ("REPLAYSSM_AOT_CAPTURE", "REPLAYSSM_TARGET_ARCH")}
    os.environ["REPLAYSSM_AOT_CAPTURE"] = "1"
    os.environ["REPLAYSSM_TARGET_ARCH"] = str(target)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------------------
# 2. specialise like the JIT (triton/runtime/jit.py create_function_from_signature + backend specialisation)

TORCH_TO_TRITON = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "u1",
}
DIVISIBILITY_16 = [["tt.divisibility", 16]]


@dataclass(frozen=True)
class KernelSpec:
    """What `triton.compiler.ASTSource` needs: signature {name: type}, constexprs {name: value},
    attrs {(arg index,): [["tt.divisibility", 16]]}."""

    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[tuple[int, ...], list]

    def key(self) -> tuple:
        return (tuple(self.signature.items()), tuple((k, repr(v)) for k, v in self.constexprs.items()),
                tuple(sorted(self.attrs)))


def _int_type(value: int) -> str:
    if -(2**31) <= value < 2**31:
        return "i32"
    if -(2**63) <= value < 2**63:
        return "i64"
    if value < 2**64:
        return "u64"
    raise ValueError(f"integer argument {value} does not fit 64 bits")


def specialize(fn: JITFunction, args: dict[str, Any]) -> KernelSpec:
    """The signature, constexprs and divisibility attributes the JIT would compile this call with.

    Rules (triton 3.6-3.9): constexpr parameters and None are constexprs; bools are u1 and floats fp32
    (never specialised); an int equal to 1 becomes constexpr 1 and an int divisible by 16 gets
    divisibility 16, unless the parameter is in do_not_specialize (nor either); a tensor is a pointer
    "*<dtype>" ("*k" if annotated const) with divisibility 16 when its data pointer is 16-byte aligned,
    unless listed in do_not_specialize / do_not_specialize_on_alignment. An explicit type annotation wins.
    """
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list] = {}
    for i, kp in enumerate(fn.params):
        value = args[kp.name]
        specialise = not kp.do_not_specialize
        align = specialise and not kp.do_not_specialize_on_alignment
        divisible = False
        if kp.is_constexpr or value is None or isinstance(value, JITFunction):
            signature[kp.name] = "constexpr"
            constexprs[kp.name] = value
            continue
        if isinstance(value, bool):
            kind, specialise = "u1", False
        elif isinstance(value, int):
            if value == 1 and specialise and not kp.annotation_type:
                signature[kp.name] = "constexpr"
                constexprs[kp.name] = 1
                continue
            kind = _int_type(value)
            divisible = value % 16 == 0
        elif isinstance(value, float):
            kind, specialise = "fp32", False
        elif isinstance(value, torch.Tensor):
            if value.dtype not in TORCH_TO_TRITON:
                raise ValueError(f"{fn.fn.__name__}: argument {kp.name} has unsupported dtype {value.dtype}")
            kind = ("*k" if kp.is_const else "*") + TORCH_TO_TRITON[value.dtype]
            divisible = value.data_ptr() % 16 == 0
        else:
            raise ValueError(f"{fn.fn.__name__}: cannot specialise argument {kp.name} of type "
                             f"{type(value).__name__} (tuples and descriptors are not handled)")
        if kp.annotation_type:
            kind = kp.annotation_type
            if kind == "u1" or kind[:2] in ("fp", "bf"):
                specialise = False
        signature[kp.name] = kind
        if divisible and specialise and align:
            attrs[(i,)] = DIVISIBILITY_16
    return KernelSpec(signature, constexprs, attrs)


# ---------------------------------------------------------------------------------------------------------
# 3. compile and inspect


@dataclass
class Build:
    """One compiled kernel and what its binary says."""

    num_warps: int = 0
    num_stages: int = 0
    registers: int = -1
    spill: int = -1              # bytes of spill stores (STL in the SASS) = ptxas's "bytes spill stores"
    local: int = -1              # LOCAL from cuobjdump (spills land in the stack frame, so this stays 0)
    stack: int = -1
    shared: int = -1
    widest_load: str = ""
    state_load: str = ""
    ldg: dict[str, int] = field(default_factory=dict)
    status: str = "ok"
    seconds: float = 0.0


def compile_options(launch: Launch) -> dict[str, Any]:
    """num_warps / num_stages (and any other backend option the launch passed), with triton's defaults."""
    options = {k: v for k, v in launch.options.items() if k not in ("debug", "instrumentation_mode")}
    options.setdefault("num_warps", DEFAULT_NUM_WARPS)
    options.setdefault("num_stages", DEFAULT_NUM_STAGES)
    return options


def error_summary(exc: BaseException) -> str:
    """The innermost cause of a compile error, on one line (a CompilationError's own text is source code)."""
    where = ""
    while True:
        text = getattr(exc, "error_message", None) or str(exc).strip().splitlines()[-1:] or [""]
        text = text if isinstance(text, str) else text[0]
        m = re.match(r"at (\d+:\d+):", str(exc))
        if m and not where:
            where = f" (kernel line {m.group(1)})"
        nxt = exc.__cause__ or exc.__context__
        if nxt is None:
            return f"{type(exc).__name__}: {text}"[:300] + where
        exc = nxt


class Builder:
    """Compiles launches for a target, once per (kernel, specialisation, options, target)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.cache: dict[tuple, Build] = {}

    def build(self, launch: Launch, target: int) -> tuple[KernelSpec, Build]:
        spec = specialize(launch.fn, launch.args)
        options = compile_options(launch)
        key = (f"{launch.fn.module}.{launch.fn.fn.__qualname__}", spec.key(), tuple(sorted(options.items())), target)
        if key not in self.cache:
            self.cache[key] = self._compile(launch, spec, options, target, len(self.cache))
        return spec, self.cache[key]

    def _compile(self, launch: Launch, spec: KernelSpec, options: dict, target: int, serial: int) -> Build:
        start = time.perf_counter()
        out = Build(num_warps=options["num_warps"], num_stages=options["num_stages"])
        try:
            src = triton.compiler.ASTSource(fn=launch.fn, signature=spec.signature, constexprs=spec.constexprs,
                                            attrs=spec.attrs)
            compiled = triton.compile(src, target=GPUTarget("cuda", target, 32), options=options)
            out.num_warps = compiled.metadata.num_warps
            cubin = self.workdir / f"{serial:03d}_{launch.name}_sm{target}.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            for name, value in inspect_cubin(cubin, compiled.asm["ptx"], spec.signature).items():
                setattr(out, name, value)
            out.status = "SPILL" if out.spill > 0 or out.local > 0 else "ok"
        except Exception as exc:  # a kernel that does not build is a finding, not a crash of the report
            out.status = f"compile error: {error_summary(exc)}"
        out.seconds = time.perf_counter() - start
        return out


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
    from replayssm.mamba2.inputs import random_params, random_step

    p = random_params(geom, device=device)
    step = random_step(geom, BATCH, act_dtype=ACT, device=device, window=window)
    return dict(x=step["x"], dt=step["dt"], A=p.A, B=step["B"], C=step["C"], D=p.D, z=step["z"],
                dt_bias=p.dt_bias, dt_softplus=True, slots=_slots(device))


def _gdn_inputs(geom: GDNGeometry, device, window: int | None = None) -> dict[str, Any]:
    from replayssm.gdn.inputs import random_step

    step = random_step(geom, BATCH, act_dtype=ACT, device=device, window=window)
    return dict(step, slots=_slots(device))


def _accepted(device) -> torch.Tensor:
    return torch.tensor([1, 3], dtype=torch.int32, device=device)[:BATCH]


AR_BUFFER, SPEC_HISTORY, SPEC_WINDOW = 16, 16, 4


def _step(family: str, fn: Callable, target, inputs: dict[str, Any], **extra):
    """Call a Mamba-2 (x, dt, A, B, C, D, z, dt_bias) or GDN (q, k, v, g, beta) step/verify function."""
    i = inputs
    if family == "mamba2":
        return call(fn, target, i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], i["z"], i["dt_bias"],
                    dt_softplus=True, slots=i["slots"], backend="triton", **extra)
    return call(fn, target, i["q"], i["k"], i["v"], i["g"], i["beta"], scale=None, use_qk_l2norm=False,
                slots=i["slots"], backend="triton", **extra)


def _inputs(family: str, geom, device, window: int | None = None) -> dict[str, Any]:
    return (_mamba2_inputs if family == "mamba2" else _gdn_inputs)(geom, device, window)


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
    family: str                  # "mamba2" or "gdn": which geometries it runs on
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
    Recipe("gdn.replay", "gdn", replay_ar_recipe("gdn", "replayssm.gdn.cache"), ar=True),
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
    from replayssm.mamba2 import spec_kernels as sk

    out = []
    for cfg in sk.spec_tile_candidates(geom.headdim, SPEC_WINDOW, include_dropped=True):
        dropped = sk.dropped_reason(cfg)
        out.append((f"tiles={cfg.label}" + (" (dropped)" if dropped else ""), sk.use_spec_tiles(cfg)))
    return out


def run_report(geometries: dict[str, Mamba2Geometry | GDNGeometry], targets: list[int], methods: list[str] | None,
               fp32_state_only: bool, workdir: Path, log=print, bf16_state: bool = False,
               spec_tiles: bool = False) -> list[dict[str, Any]]:
    """bf16_state adds a bfloat16-state build of every recipe (AR and spec: each cache stores it). spec_tiles
    builds every candidate of the Mamba-2 spec tile space (replayssm/mamba2/spec_kernels.py); a candidate the
    space drops is expected to spill and does not fail the report (its status says why it was dropped)."""
    builder = Builder(workdir)
    rows: list[dict[str, Any]] = []
    device = torch.device("cpu")
    for target in targets:
        for geo_name, geom in geometries.items():
            family = "mamba2" if isinstance(geom, Mamba2Geometry) else "gdn"
            for recipe in RECIPES:
                if recipe.family != family or (methods and recipe.method not in methods):
                    continue
                dtypes = [torch.float32] if (fp32_state_only or not recipe.ar) else [torch.float32, torch.float16]
                if bf16_state:
                    dtypes.append(torch.bfloat16)
                for state_dtype, (tiles, tile_ctx) in ((d, c) for d in dtypes
                                                       for c in _tile_candidates(recipe, geom, spec_tiles)):
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
                    built, seen = [], set()
                    for launch in launches:
                        spec, build = builder.build(launch, target)
                        ident = (launch.fn, spec.key(), tuple(sorted(compile_options(launch).items())))
                        if ident not in seen:             # the same kernel launched twice alike: one row
                            seen.add(ident)
                            built.append((launch, spec, build))
                    for (launch, _, build), variant in zip(built, _variants([(lch, s) for lch, s, _ in built])):
                        variant = ",".join(v for v in (tiles, variant) if v)
                        if "(dropped)" in tiles and build.status == "SPILL":
                            build = dataclasses.replace(build, status="SPILL: dropped from the tile space")
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
            and "dropped from the tile space" not in r["status"]]


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
    all_models = sorted({**MAMBA2_MODELS, **GDN_MODELS})
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", action="append", choices=all_models, help="model (repeatable; default all five)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel split of every geometry (default 1)")
    p.add_argument("--target", action="append", type=int, choices=TARGETS, help="sm arch (repeatable; default both)")
    p.add_argument("--method", action="append", choices=[r.method for r in RECIPES], help="recipe (repeatable)")
    p.add_argument("--fp32-state-only", action="store_true", help="skip the fp16-state builds of the AR kernels")
    p.add_argument("--bf16-state", action="store_true", help="also build a bfloat16-state variant of every recipe")
    p.add_argument("--spec-tiles", action="store_true",
                   help="build every candidate of the Mamba-2 spec tile space (mamba2.replay_spec)")
    p.add_argument("--csv", type=Path, help="also write the rows as CSV")
    p.add_argument("--json", type=Path, help="also write the rows as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if interpreter_active():
        print("kernel_report: unset TRITON_INTERPRET: under the interpreter @triton.jit makes interpreted "
              "functions, which run on the CPU instead of being captured", file=sys.stderr)
        return 2
    names = args.geometry or sorted({**MAMBA2_MODELS, **GDN_MODELS})
    geometries = {(n if args.tp == 1 else f"{n}@tp{args.tp}"): get_geometry(n, args.tp) for n in names}
    targets = args.target or list(TARGETS)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel_report_") as tmp:
        rows = run_report(geometries, targets, args.method, args.fp32_state_only, Path(tmp),
                          log=lambda s: print(s, file=sys.stderr, flush=True), bf16_state=args.bf16_state,
                          spec_tiles=args.spec_tiles)
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
