"""What a compiled Triton kernel's binary says: registers, spills, global loads (scripts/kernels/kernel_report.py).

Inputs are the cubin (read with the cuobjdump that ships inside Triton) and the PTX of one kernel:
- registers / stack / shared / local from `cuobjdump --dump-resource-usage`;
- spill = bytes of local-memory stores (STL) in the SASS, what `ptxas -v` calls "bytes spill stores"
  (spilled registers land in the stack frame, so LOCAL stays 0 even when a kernel spills);
- global loads by width: LDG (global -> registers) and LDGSTS (global -> shared, cp.async: how Triton
  feeds tl.dot operands), e.g. LDG.E.128 = 16 bytes per thread;
- state_load: the widest load whose address derives from a pointer argument named like "state", found by
  tracing each PTX load's address back to the ld.param of the pointer it is computed from.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import triton

from experiments.report.kernels import sass as sass_mod

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

_RESOURCE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
# LDG: global -> registers; LDGSTS: global -> shared (cp.async), how Triton feeds tl.dot operands.
_LDG = re.compile(r"\b(LDG|LDGSTS)((?:\.[A-Z0-9_]+)*)(?=\s)")
_WIDTH_BYTES = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def parse_resource_usage(text: str) -> tuple[int, int, int, int]:
    """(REG, STACK, SHARED, LOCAL) of the (single) function in `cuobjdump --dump-resource-usage` output."""
    m = _RESOURCE.search(text)
    if not m:
        raise RuntimeError(f"no resource usage line in cuobjdump output:\n{text}")
    return tuple(int(x) for x in m.groups())


def _width(modifiers: str) -> int:
    return next((_WIDTH_BYTES[t] for t in modifiers.split(".")[1:] if t in _WIDTH_BYTES), 4)


def global_load_counts(sass: str) -> dict[tuple[str, int], int]:
    """{(opcode, bytes per thread): count} of the global loads (LDG, LDGSTS) in a SASS listing."""
    counts: dict[tuple[str, int], int] = {}
    for m in _LDG.finditer(sass):
        key = (m.group(1), _width(m.group(2)))
        counts[key] = counts.get(key, 0) + 1
    return counts


def count_global_loads(sass: str) -> dict[int, int]:
    """{bytes per thread: count} of the global loads, LDG and LDGSTS together (plain LDG.E = 4 bytes)."""
    counts: dict[int, int] = {}
    for (_, width), n in global_load_counts(sass).items():
        counts[width] = counts.get(width, 0) + n
    return counts


_STL = re.compile(r"\bSTL((?:\.[A-Z0-9_]+)*)(?=\s)")


def spill_store_bytes(sass: str) -> int:
    """Bytes of local-memory stores per thread (STL = 4 bytes, STL.64 = 8, STL.128 = 16): in Triton kernels
    these are register spills, and the sum equals the "bytes spill stores" that `ptxas -v` prints."""
    return sum(_width(m.group(1)) for m in _STL.finditer(sass))


def describe_widths(counts: dict[int, int]) -> str:
    """The widest load of {bytes per thread: count} and how many there are, e.g. "128-bit x4"."""
    if not counts:
        return "none"
    widest = max(counts)
    return f"{widest * 8}-bit x{counts[widest]}"


_PTX_PARAM = re.compile(r"ld\.param\.\w+\s+(%\w+),\s*\[\w+_param_(\d+)\]")
_PTX_POINTER_PARAM = re.compile(r"\.param\s+\.u64\s+\.ptr\b.*_param_(\d+)")
_PTX_REG = re.compile(r"%\w+")
_PTX_LD_GLOBAL = re.compile(r"ld\.global(?:\.[\w:]+)*?\.(?:v(\d+)\.)?[bfsu](\d+)\s+(.*?),\s*\[(.*?)\]")
_PTX_CP_ASYNC = re.compile(r"cp\.async\.\w+\.shared\.global(?:\.[\w:]+)*\s+\[.*?\],\s*\[(.*?)\],\s*"
                           r"(0x[0-9a-fA-F]+|\d+)")


def ptx_load_widths_by_param(ptx: str) -> dict[int, dict[int, int]]:
    """{pointer param index: {bytes per load: count}} for every ld.global and cp.async, found by tracing
    each load's address register back through the PTX to the ld.param of the pointer it is computed from.
    The trace stops at loaded values (an offset read from a slots tensor does not make it a slots load)."""
    pointers = {int(i) for i in _PTX_POINTER_PARAM.findall(ptx)}
    defs: dict[str, set[str]] = {}
    param_of: dict[str, int] = {}
    loads: list[tuple[int, set[str]]] = []
    for raw in ptx.splitlines():
        line = raw.split("//")[0].strip().rstrip(";")
        if line.startswith("@"):
            line = line.split(None, 1)[1] if " " in line else ""
        if not line or line.startswith(".") or line.endswith(":") or line.startswith("{") or line == "}":
            continue
        if m := _PTX_PARAM.match(line):
            param_of[m.group(1)] = int(m.group(2))
            continue
        if m := _PTX_LD_GLOBAL.match(line):
            vec, bits = int(m.group(1) or 1), int(m.group(2))
            loads.append((vec * bits // 8, set(_PTX_REG.findall(m.group(4)))))
            continue                              # loaded registers have no traceable definition
        if m := _PTX_CP_ASYNC.match(line):        # global -> shared copy (operands of tl.dot)
            loads.append((int(m.group(2), 0), set(_PTX_REG.findall(m.group(1)))))
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or parts[0].startswith(("ld.", "st.", "bra", "ret", "bar", "atom", "red")):
            continue
        regs = _PTX_REG.findall(parts[1])
        if regs:
            defs.setdefault(regs[0], set()).update(regs[1:])
    result: dict[int, dict[int, int]] = {}
    for width, regs in loads:
        seen, todo, params = set(), list(regs), set()
        while todo:
            r = todo.pop()
            if r in seen:
                continue
            seen.add(r)
            if param_of.get(r) in pointers:
                params.add(param_of[r])
            todo.extend(defs.get(r, ()))
        for p in params:
            result.setdefault(p, {})
            result[p][width] = result[p].get(width, 0) + 1
    return result


def state_load(ptx: str, signature: dict[str, str]) -> str:
    """The widest load from a pointer argument whose name contains "state", e.g. "128-bit x8".

    signature: {argument name: triton type} of the kernel's parameters in order (kernel_report.KernelSpec's);
    parameter i is the PTX's `_param_<i>`."""
    state_params = [i for i, (n, kind) in enumerate(signature.items()) if "state" in n.lower() and kind.startswith("*")]
    if not state_params:
        return "-"
    by_param = ptx_load_widths_by_param(ptx)
    counts: dict[int, int] = {}
    for p in state_params:
        for w, c in by_param.get(p, {}).items():
            counts[w] = counts.get(w, 0) + c
    return describe_widths(counts) if counts else "none"


def run_cuobjdump(flag: str, cubin: Path) -> str:
    """stdout of the cuobjdump that ships inside Triton (no CUDA toolkit needed) on one cubin."""
    proc = subprocess.run([str(CUOBJDUMP), flag, str(cubin)], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise RuntimeError(f"cuobjdump {flag} failed: {proc.stderr.strip()}")
    return proc.stdout


def sass_statistics(sass: str, ttgir: str | None = None) -> dict[str, Any]:
    """The SASS mix and the executed-path counts (experiments/report/kernels/sass.py) by kernel_report.Build's
    field names: sass (static total), shfl, bar, lds, sts, mma, mufu, path_min, path_max, loops ("8,?")."""
    instrs = sass_mod.parse_sass(sass)
    mix = sass_mod.instruction_mix(instrs)
    trips = sass_mod.ttgir_loop_trips(ttgir) if ttgir else None
    p = sass_mod.paths(instrs, trips)
    loops = ",".join("?" if t is None else str(t) for t in p.trips)
    return dict(sass=mix["total"], **{k: mix[k] for k in ("shfl", "bar", "lds", "sts", "mma", "mufu")},
                path_min=p.path_min, path_max=p.path_max, loops=loops)


def inspect_cubin(cubin: Path, ptx: str, signature: dict[str, str], ttgir: str | None = None) -> dict[str, Any]:
    """Every statistic of one compiled kernel, by the field names of kernel_report.Build: registers, stack,
    shared, local, spill (bytes), ldg ({"LDG.128": count, ...}), widest_load, state_load, and the SASS mix and
    path counts of sass_statistics (loop trip counts from `ttgir`, the kernel's TTGIR, where given)."""
    registers, stack, shared, local = parse_resource_usage(run_cuobjdump("--dump-resource-usage", cubin))
    sass = run_cuobjdump("--dump-sass", cubin)
    return dict(registers=registers, stack=stack, shared=shared, local=local, spill=spill_store_bytes(sass),
                ldg={f"{op}.{w * 8}": c for (op, w), c in sorted(global_load_counts(sass).items())},
                widest_load=describe_widths(count_global_loads(sass)), state_load=state_load(ptx, signature),
                **sass_statistics(sass, ttgir))
