"""Ahead-of-time build of every Triton kernel for sm_90 and sm_100, on a CPU box: registers, spills, loads.

How: with REPLAYSSM_AOT_CAPTURE=1 the Triton backend of every public
function accepts CPU tensors, and REPLAYSSM_TARGET_ARCH makes the launchers pick the launch config they
would pick on that GPU. `JITFunction.run` is replaced by a recorder, so calling each method's public API
once records every launch (kernel, bound arguments, grid, num_warps/num_stages) without running it. Each
launch is then specialised the way the JIT specialises it (16-byte aligned pointers and ints divisible by
16 get `tt.divisibility 16`, ints equal to 1 and None become constexprs), compiled with `triton.compile`
for the target, and its cubin inspected with the cuobjdump that ships inside Triton
(experiments/report/kernels/cubin.py).

Columns: registers / stack / shared from `cuobjdump --dump-resource-usage`; spill = bytes of local-memory
stores (STL) in the SASS, which is what `ptxas -v` calls "bytes spill stores" (spilled registers land in the
stack frame, so cuobjdump's LOCAL stays 0 even when a kernel spills: STACK > 0 is the hint, STL the proof);
widest_load = the widest global load in the SASS (LDG.E.128 = 16 bytes) and how many there are;
state_load = the widest load whose address derives from a pointer argument named like "state", traced
through the PTX. Exit code 1 if a kernel spills or fails to compile; a recipe whose module is not there
(yet) is listed as "missing" and does not fail.

What to build (one recipe per public method) and the report's table live in
experiments/report/kernels/recipes.py; the command line is scripts/kernels/kernel_report.py.

Usage: python scripts/kernels/kernel_report.py [--geometry NAME]... [--tp N] [--target 90|100]...
           [--method NAME]... [--fp32-state-only] [--bf16-state] [--spec-tiles] [--csv PATH] [--json PATH]
--spec-tiles builds every candidate of the Mamba-2 spec tile space (variant "tiles=m32-n16-w4-s2-tmin"); a
candidate the space drops (replayssm/mamba2/spec_kernels.py, SPEC_TILE_DROPPED, with the reason) is
expected to spill and does not fail the report.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from experiments.report.kernels.cubin import inspect_cubin

TARGETS = (90, 100)
DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3          # triton's defaults when a launch names neither

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
    phase: str = ""              # what the recipe was doing: "step" inside the step it times, "" elsewhere

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


_PHASE = [""]


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Tag the launches captured inside with `name` (a recipe wraps the calls of one step in phase("step"))."""
    saved, _PHASE[0] = _PHASE[0], name
    try:
        yield
    finally:
        _PHASE[0] = saved


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
        launches.append(Launch(self, arguments, tuple(int(g) for g in resolved), options, _PHASE[0]))
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
    torch.float8_e4m3fn: "fp8e4nv",
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
    shared: int = -1             # cuobjdump's SHARED: static, with the 1 KB the runtime reserves per block
    dyn_shared: int = -1         # Triton's dynamic shared memory (compiled.metadata.shared), ncu's "Dynamic Shared"
    sass: int = -1               # static SASS instructions (padding excluded) and their mix (sass.instruction_mix)
    shfl: int = -1
    bar: int = -1
    lds: int = -1
    sts: int = -1
    mma: int = -1
    mufu: int = -1
    path_min: int = -1           # instructions per warp on the shortest storing path, loops x trips (sass.paths)
    path_max: int = -1           # ... on the longest path
    loops: str = ""              # trip count per SASS loop, "?" where unknown (counted once)
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
            out.dyn_shared = int(compiled.metadata.shared)
            cubin = self.workdir / f"{serial:03d}_{launch.name}_sm{target}.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            for name, value in inspect_cubin(cubin, compiled.asm["ptx"], spec.signature,
                                             compiled.asm.get("ttgir")).items():
                setattr(out, name, value)
            out.status = "SPILL" if out.spill > 0 or out.local > 0 else "ok"
        except Exception as exc:  # a kernel that does not build is a finding, not a crash of the report
            out.status = f"compile error: {error_summary(exc)}"
        out.seconds = time.perf_counter() - start
        return out


