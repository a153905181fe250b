"""The shape of the code: no import cycles, imports only down the package table, small files.

Every module under harness/, strategies/, kernels/ and reports/ is read with `ast`
(nothing is imported): every import counts, at the top or inside a function, except
those under `if TYPE_CHECKING:`. `from harness.x import y` is an import of the
module harness.x.y where that is a module, else of harness.x.

Packages are harness's subpackages (cli, tune, launch, measure, core, study,
estimator, workloads, records) and the top-level strategies, kernels, reports;
`harness` itself is its __init__.py (harness/__main__.py counts as cli). A package
may import its own modules and the packages ALLOWED lists for it, nothing else.
docs/architecture.md draws the same table.

The tuner's process never imports torch: the modules it loads (TORCH_FREE_*, and what
they import at module level, parents included) import neither torch nor triton at
module level. What needs torch runs in the torch-side helper (harness.measure.probe_server)
or in a trial's own processes, and is imported there inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("harness", "strategies", "kernels", "reports")
MAX_LINES = 400

# package -> the packages it may import (besides itself). Downward only:
# cli -> tune -> launch -> measure -> core; study, estimator, workloads and records sit
# beside the chain; reports read stored records only.
ALLOWED: dict[str, set[str]] = {
    "harness": {"core"},  # harness/__init__.py: __version__, HarnessError
    "cli": {
        "tune", "launch", "measure", "core", "study", "estimator", "workloads", "records",
        "strategies", "kernels", "reports", "harness", "selftest",
    },
    # `harness selftest --gpu`: subprocesses and the files they leave; never CUDA here
    "selftest": {"core"},
    # the tuner's process: no package that is torch through and through
    "tune": {"launch", "measure", "core", "study", "records", "harness"},
    "launch": {"measure", "core", "study", "records", "harness"},
    # inside a trial's ranks, and the torch-side helper (measure.probe_server)
    "measure": {"core", "study", "estimator", "workloads", "records", "strategies", "harness"},
    "core": set(),
    # strategies and workloads: only inside the checks the torch-side helper runs
    "study": {"core", "strategies", "workloads"},
    "estimator": {"core", "workloads", "strategies"},
    "workloads": {"core"},
    "records": {"core"},
    "strategies": {"core", "workloads", "kernels"},  # workloads and kernels: for now
    "kernels": set(),
    "reports": {"records", "core"},
}


# The tuner's process (`harness tune`, its workers and followers) and `harness report`
# load these; torch must not come with them. Modules, or whole packages.
# (core and study are checked as far as these load them: core.device and study.checks
# are the torch side's.)
TORCH_FREE_MODULES = ("harness", "harness.__main__", "harness.cli.main", "harness.cli.tune",
                      "harness.cli.selftest")
TORCH_FREE_PACKAGES = ("harness.tune", "harness.launch", "harness.records", "reports",
                       "harness.selftest")
HEAVY = ("torch", "triton")


@dataclass(frozen=True)
class Edge:
    src: str  # module importing
    dst: str  # module imported
    line: int
    lazy: bool  # inside a function

    def where(self) -> str:
        return f"{_path(self.src)}:{self.line}{' (in a function)' if self.lazy else ''}"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the top-level packages."""
    found = {}
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def package_of(module: str) -> str:
    """harness.tune.session -> "tune"; harness (its __init__) -> "harness";
    harness.__main__ -> "cli"; strategies.zero -> "strategies"."""
    parts = module.split(".")
    if module == "harness.__main__":  # `python -m harness`: the command line
        return "cli"
    if parts[0] == "harness":
        if len(parts) > 1 and f"harness.{parts[1]}" in MODULES and _is_package(parts[:2]):
            return parts[1]
        return "harness"
    return parts[0]


def _is_package(parts: list[str]) -> bool:
    return MODULES[".".join(parts)].name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every Import / ImportFrom under `tree`, and whether it sits inside a function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), lazy)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _imports(node, inner)


def _resolve(module: str, node: ast.stmt) -> Iterator[str]:
    """The repo modules an import statement in `module` names (external ones left out)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in TOP:
                yield _nearest(alias.name)
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:  # relative: from the module's package
        base = module.split(".")
        if not _is_package(base):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] not in TOP:
        return
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        yield sub if sub in MODULES else _nearest(target)


def _nearest(name: str) -> str:
    """The module itself, or the closest package above it that exists."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def import_graph() -> tuple[list[Edge], dict[str, list[tuple[str, int]]]]:
    """The edges between the repo's modules, and per module the outside packages it
    imports at module level (top-level name, line)."""
    edges = []
    outside: dict[str, list[tuple[str, int]]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in _imports(tree):
            for dst in _resolve(module, node):
                if dst and dst != module:
                    edges.append(Edge(module, dst, node.lineno, lazy))
            if lazy:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                names = [] if node.level else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in TOP:
                    outside.setdefault(module, []).append((name.split(".")[0], node.lineno))
    return edges, outside


EDGES, OUTSIDE = import_graph()


def _cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (its edges, in order) per strongly connected component of the graph."""
    out: dict[str, list[Edge]] = {}
    for e in edges:
        out.setdefault(e.src, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in out.get(v, []):
            if e.dst not in index:
                strongconnect(e.dst)
                low[v] = min(low[v], low[e.dst])
            elif e.dst in on_stack:
                low[v] = min(low[v], index[e.dst])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(MODULES):
        if v not in index:
            strongconnect(v)
    return [_a_cycle(sorted(comp), out) for comp in components]


def _a_cycle(comp: list[str], out: dict[str, list[Edge]]) -> list[Edge]:
    """The shortest cycle through the component's first module (breadth-first)."""
    members = set(comp)
    start = comp[0]
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in out.get(v, []):
                if e.dst not in members:
                    continue
                if e.dst == start:
                    path = [e]
                    while path[0].src != start:
                        path.insert(0, came[path[0].src])
                    return path
                if e.dst not in came:
                    came[e.dst] = e
                    nxt.append(e.dst)
        frontier = nxt
    raise AssertionError(f"no cycle in {comp}")  # a component of 2+ always has one


def _describe(cycle: list[Edge]) -> str:
    names = " -> ".join([cycle[0].src] + [e.dst for e in cycle])
    where = "; ".join(e.where() for e in cycle)
    return f"{names}\n      ({where})"


def test_the_table_itself_flows_one_way():
    for pkg, allowed in ALLOWED.items():
        assert pkg not in allowed, pkg
        assert allowed <= set(ALLOWED), (pkg, allowed - set(ALLOWED))

    def visit(pkg: str, path: list[str]) -> None:
        assert pkg not in path, f"the table has a cycle: {' -> '.join([*path, pkg])}"
        for dep in sorted(ALLOWED[pkg]):
            visit(dep, [*path, pkg])

    for pkg in ALLOWED:
        visit(pkg, [])


def test_every_module_belongs_to_a_package_in_the_table():
    unknown = sorted({package_of(m) for m in MODULES} - set(ALLOWED))
    assert not unknown, f"packages missing from ALLOWED in {__file__}: {unknown}"


def test_resolving_imports():
    """`from harness.x import y`: the module harness.x.y if there is one, else harness.x."""
    node = ast.parse("from harness.measure import peaks, Thing").body[0]
    assert list(_resolve("harness.cli.main", node)) == ["harness.measure.peaks", "harness.measure"]
    node = ast.parse("from . import base").body[0]
    assert list(_resolve("harness.workloads", node)) == ["harness.workloads.base"]
    node = ast.parse("from .base import Workload").body[0]
    assert list(_resolve("harness.workloads.gpt", node)) == ["harness.workloads.base"]
    node = ast.parse("import torch, strategies.zero").body[0]
    assert list(_resolve("harness.cli.main", node)) == ["strategies.zero"]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import harness.tune\nelse:\n    import harness.core\n"
        "def f():\n    import harness.records\n"
    )
    found = [(getattr(n, "module", None) or n.names[0].name, lazy) for n, lazy in _imports(tree)]
    assert found == [("typing", False), ("harness.core", False), ("harness.records", True)]
    assert package_of("harness.tune.session") == "tune"
    assert package_of("harness") == "harness" and package_of("harness.__main__") == "cli"
    assert package_of("strategies.zero") == "strategies"


def test_the_cycle_finder_finds_one():
    a, b, c = "harness.core.plan", "harness.core.units", "harness.core.errors"
    edges = [Edge(a, b, 1, False), Edge(b, c, 2, True), Edge(c, a, 3, False), Edge(a, c, 4, False)]
    (cycle,) = _cycles(edges)
    assert [e.src for e in cycle] == [c, a] and cycle[-1].dst == c  # the shortest: c -> a -> c
    assert _describe(cycle).startswith(f"{c} -> {a} -> {c}")


def test_no_import_cycles():
    cycles = _cycles(EDGES)
    if cycles:
        text = "\n".join(f"  {i}. {_describe(c)}" for i, c in enumerate(cycles, 1))
        pytest.fail(f"{len(cycles)} import cycle(s), each shown once:\n{text}", pytrace=False)


def test_imports_follow_the_package_table():
    bad: dict[tuple[str, str], list[Edge]] = {}
    for e in EDGES:
        src, dst = package_of(e.src), package_of(e.dst)
        if src != dst and dst not in ALLOWED.get(src, set()):
            bad.setdefault((src, dst), []).append(e)
    if bad:
        lines = []
        for (src, dst), edges in sorted(bad.items()):
            lines.append(f"  {src} -> {dst} (not in ALLOWED[{src!r}]):")
            lines += [f"      {e.src} imports {e.dst}  [{e.where()}]" for e in edges]
        pytest.fail("imports against the package table:\n" + "\n".join(lines), pytrace=False)


def test_no_module_is_over_400_lines():
    long = []
    for top in (*TOP, "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                long.append(f"  {path.relative_to(ROOT)}: {n} lines")
    assert not long, f"modules over {MAX_LINES} lines (split them by subject):\n" + "\n".join(long)


def loaded_with(roots: list[str]) -> dict[str, list[str]]:
    """Every module that importing `roots` loads (module-level imports and parent
    packages followed), with the chain of modules that brings it in."""
    eager: dict[str, list[str]] = {}
    for e in EDGES:
        if not e.lazy:
            eager.setdefault(e.src, []).append(e.dst)
    chain: dict[str, list[str]] = {}
    todo = [[r] for r in roots]
    while todo:  # breadth-first: the shortest chain to each
        path = todo.pop(0)
        m = path[-1]
        if m in chain:
            continue
        chain[m] = path
        parents = [m.rsplit(".", 1)[0]] if "." in m else []
        todo += [[*path, d] for d in (*eager.get(m, []), *parents)]
    return chain


def heavy_imports(roots: list[str]) -> list[str]:
    """Where importing `roots` imports torch or triton, each as its chain of modules."""
    found = []
    for m, path in sorted(loaded_with(roots).items()):
        lines = [f"{n}:{line}" for n, line in OUTSIDE.get(m, []) if n in HEAVY]
        if lines:
            found.append(f"  {' -> '.join(path)} imports {', '.join(lines)}  [{_path(m)}]")
    return found


def test_the_tuner_side_does_not_import_torch():
    roots = [m for m in MODULES if m in TORCH_FREE_MODULES
             or any(m == p or m.startswith(p + ".") for p in TORCH_FREE_PACKAGES)]
    assert heavy_imports(["harness.measure.trial_loop"]), "the check itself finds torch"
    if bad := heavy_imports(roots):
        pytest.fail("torch on the tuner's side, at import time (import it inside the function "
                    "the torch-side helper or a trial runs):\n" + "\n".join(bad), pytrace=False)
