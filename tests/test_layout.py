"""The import graph runs one way (issue 22): no circle between project modules, no import up the layers,
no `sys.path` edit outside tests/.

Layers, bottom to top (a module may import its own layer and those below):
    replayssm < baselines < experiments.harness < experiments.published < experiments (kernel/, hybrid/,
    vllm/, accuracy*, budget_estimate, the entry modules) < experiments.report < scripts, benchmarks
and nothing imports a module of scripts/ (the thin command-line programs), not even another script.

Every .py of the five trees is read with ast, imports at any depth included (a lazy import inside a function
runs as surely as one at the top). `from pkg import name` where pkg/name.py exists counts as importing
pkg.name; relative imports are resolved; a bare `import aggregate` / `from aggregate import x` whose name is a
file of scripts/ counts as importing that script (it only resolves through a sys.path splice). An edge goes to
the named module only, not to the packages above it (their __init__ runs too, but an edge to each would
report every package that re-exports its children as a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("replayssm", "baselines", "experiments", "scripts", "benchmarks")
# (module prefix, rank): the longest matching prefix gives a module its layer
LAYERS = (("replayssm", 0), ("baselines", 1), ("experiments.harness", 2), ("experiments.published", 3),
          ("experiments", 4), ("experiments.report", 5), ("scripts", 6), ("benchmarks", 6))

Edges = dict[str, dict[str, str]]          # module -> {imported module: "path:line" of the first such import}


# ----------------------------------------------------------------------------------------- the checker

def module_of(path: Path, root: Path) -> str:
    """experiments/harness/store.py -> experiments.harness.store; a package's __init__.py -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, trees=TREES) -> dict[str, Path]:
    """Every module of the trees under `root` by dotted name."""
    return {module_of(p, root): p for tree in trees for p in sorted((root / tree).rglob("*.py"))
            if (root / tree).is_dir()}


def _target(name: str, modules: dict[str, Path], scripts: dict[str, str]) -> str | None:
    """The project module an absolute dotted name imports: the longest prefix that is a module; a bare
    name of a scripts/ file is that script; None outside the project."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return scripts.get(parts[0])


def imports_of(path: Path, module: str, modules: dict[str, Path], scripts: dict[str, str]) -> dict[str, int]:
    """The project modules `path` (module `module`) imports, at any depth, with the first line of each."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                    # relative: from the package, level - 1 up
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if package else []
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import name`: the submodule pkg.name where it is one, else pkg itself
            names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
        for name in names:
            target = _target(name, modules, scripts)
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


def import_graph(root: Path = ROOT, trees=TREES) -> Edges:
    """module -> {imported project module: "path:line"} for every module of the trees under `root`."""
    modules = project_modules(root, trees)
    scripts = {m.rpartition(".")[2]: m for m in modules if m.startswith("scripts.")}
    return {m: {t: f"{p.relative_to(root)}:{line}" for t, line in imports_of(p, m, modules, scripts).items()}
            for m, p in modules.items()}


def find_cycle(graph: dict[str, dict | set]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph is acyclic (iterative DFS, three colours)."""
    state: dict[str, int] = {}                 # absent: unvisited; 1: on the current path; 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def _layer(module: str) -> int:
    """The rank of the longest LAYERS prefix of `module` (-1: outside every layer)."""
    best = ("", -1)
    for prefix, rank in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[0]):
            best = (prefix, rank)
    return best[1]


def upward(graph: Edges, tree: str) -> list[str]:
    """Imports by modules of `tree` into a higher layer, or into scripts/ at all."""
    bad = []
    for src, targets in sorted(graph.items()):
        if src.split(".")[0] != tree:
            continue
        for dst, where in sorted(targets.items()):
            if dst.startswith("scripts.") or dst == "scripts":
                bad.append(f"{where}: {src} imports {dst} (nothing imports scripts/)")
            elif _layer(dst) > _layer(src):
                bad.append(f"{where}: {src} (layer {_layer(src)}) imports {dst} (layer {_layer(dst)})")
    return bad


def sys_path_edits(path: Path) -> list[int]:
    """Lines of `path` that change sys.path: sys.path.<insert|append|extend|remove|pop|clear>(...), an
    assignment (plain, augmented, item or slice) to sys.path, or site.addsitedir."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear") \
                    and _is_sys_path(node.func.value):
                lines.append(node.lineno)
            elif node.func.attr == "addsitedir" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "site":
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if _is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)):
                lines.append(node.lineno)
    return sorted(lines)


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


# ------------------------------------------------------------------------------ the checker, checked

def test_find_cycle_reports_a_deliberate_circle_and_passes_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None


def test_the_graph_reader_sees_lazy_relative_submodule_and_script_imports(tmp_path):
    """A synthetic tree: a lazy relative import closes a circle, `from pkg import sub` is pkg.sub, a bare
    script name is the script; sys.path edits are found in every form."""
    (tmp_path / "replayssm" / "sub").mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "replayssm" / "__init__.py").write_text("")
    (tmp_path / "replayssm" / "sub" / "__init__.py").write_text("")
    (tmp_path / "replayssm" / "a.py").write_text("from replayssm.sub import b\n")
    (tmp_path / "replayssm" / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (tmp_path / "scripts" / "tool.py").write_text("import sys\nsys.path.insert(0, 'x')\nimport helper\n"
                                                  "sys.path[:0] = ['y']\nsys.path += ['z']\n")
    (tmp_path / "scripts" / "helper.py").write_text("from replayssm import a\n")
    graph = import_graph(tmp_path, ("replayssm", "scripts"))
    assert set(graph["replayssm.a"]) == {"replayssm.sub.b"}
    assert set(graph["replayssm.sub.b"]) == {"replayssm.a"}
    assert set(graph["scripts.tool"]) == {"scripts.helper"}
    assert find_cycle(graph) == ["replayssm.a", "replayssm.sub.b", "replayssm.a"]
    assert upward(graph, "scripts") == ["scripts/tool.py:3: scripts.tool imports scripts.helper "
                                        "(nothing imports scripts/)"]
    assert sys_path_edits(tmp_path / "scripts" / "tool.py") == [2, 4, 5]


def test_layers_rank_the_agreed_layout():
    assert _layer("replayssm.gdn.kernels") < _layer("baselines.gdn") < _layer("experiments.harness.store") \
        < _layer("experiments.published") < _layer("experiments.kernel.run") == _layer("experiments.accuracy") \
        < _layer("experiments.report.runs") < _layer("scripts.reproduce")


# ------------------------------------------------------------------------------------ the real tree

GRAPH = import_graph()


def test_no_import_circle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(
        f"{a} ({GRAPH[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


@pytest.mark.parametrize("tree", TREES)
def test_no_upward_import(tree):
    bad = upward(GRAPH, tree)
    assert not bad, f"{len(bad)} imports run up the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("tree", TREES)
def test_no_sys_path_edit_outside_tests(tree):
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / tree).rglob("*.py")) for line in sys_path_edits(p)]
    assert not bad, "sys.path edited outside tests/: " + ", ".join(bad)
