"""No Triton kernel of ours loops with `range()` to a bound that is a runtime argument.

Triton 3.6.0 (the GPU box's: torch 2.11.0+cu130 pins it) has an interpreter that takes int() of such a bound,
a 1-element array, which numpy >= 2.4 refuses (TypeError). `make test-gpu-stack` pins numpy 2.3, where the
interpreter still runs such a loop, so this static check is what keeps the kernels runnable by both Triton
versions under any numpy: a bound must be a literal or a `tl.constexpr` parameter (else write a while loop, as
replayssm/tree_ring.py's move kernel does). Kernels are the functions decorated with a `jit`, and those with
a `tl.constexpr` parameter (tree_ring and ring_cursors jit theirs at first use)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def runtime_bound_loops(source: str, filename: str = "<src>") -> list[str]:
    """`file:line: kernel: range(...)` for each loop of a kernel whose range() names a non-constexpr value."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        constexpr = {a.arg for a in fn.args.args
                     if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}
        if not (constexpr or any("jit" in ast.unparse(d) for d in fn.decorator_list)):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)):
                continue
            call = ast.unparse(node.iter.func)
            if call not in ("range", "tl.range"):          # tl.static_range needs constexprs: Triton says so
                continue
            names = {n.id for a in node.iter.args for n in ast.walk(a) if isinstance(n, ast.Name)}
            if names - constexpr:
                found.append(f"{filename}:{node.lineno}: {fn.name}: {ast.unparse(node.iter)}")
    return found


def test_the_scan_finds_a_runtime_bound_and_passes_constexpr_ones():
    src = ("import triton\nimport triton.language as tl\n\n@triton.jit\n"
           "def k(p, depth, N: tl.constexpr):\n    for i in range(1, depth):\n        pass\n"
           "    for j in range(0, N, 2):\n        pass\n    for s in tl.range(depth):\n        pass\n")
    assert runtime_bound_loops(src) == ["<src>:6: k: range(1, depth)", "<src>:10: k: tl.range(depth)"]


def test_no_kernel_loops_to_a_runtime_bound():
    offenders = []
    for package in ("replayssm", "baselines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            offenders += runtime_bound_loops(path.read_text(), str(path.relative_to(ROOT)))
    assert not offenders, "loops Triton 3.6.0's interpreter cannot run under numpy >= 2.4:\n" + "\n".join(offenders)
