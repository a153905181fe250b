"""The repo's import graph, read with `ast` (nothing imported): modules, edges, cycles.

Used by tests/test_architecture.py, which holds the rules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("harness", "strategies", "kernels", "reports")  # the folders
PKG = "training_harness"  # their one import name: harness/ its root, the others inside it


@dataclass(frozen=True)
class Edge:
    src: str  # module importing
    dst: str  # module imported
    line: int
    lazy: bool  # inside a function
    typing: bool = False  # under `if TYPE_CHECKING:` (counts for cycles only)

    def where(self) -> str:
        kind = " (type only)" if self.typing else " (in a function)" if self.lazy else ""
        return f"{_path(self.src)}:{self.line}{kind}"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the top-level packages."""
    found = {}
    for top in TOP:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            parts[0:1] = [PKG] if top == "harness" else [PKG, top]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def package_of(module: str) -> str:
    """training_harness.tune.session -> "tune"; training_harness (its __init__) -> "harness";
    training_harness.__main__ -> "cli"; training_harness.strategies.zero -> "strategies"."""
    parts = module.split(".")
    if module == f"{PKG}.__main__":  # `python -m training_harness`: the command line
        return "cli"
    if len(parts) > 1 and parts[1] in TOP:
        return parts[1]
    if len(parts) > 1 and f"{PKG}.{parts[1]}" in MODULES and _is_package(parts[:2]):
        return parts[1]
    return "harness"


def _is_package(parts: list[str]) -> bool:
    """A folder: an __init__.py, or one of the namespace folders beside harness/."""
    name = ".".join(parts)
    return name not in MODULES or MODULES[name].name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, lazy: bool = False,
             with_typing: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every Import / ImportFrom under `tree`, and whether it sits inside a function;
    those under `if TYPE_CHECKING:` only `with_typing` (then only them)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            if with_typing:
                for child in node.body:
                    for n, _ in _imports(ast.Module(body=[child], type_ignores=[]), lazy):
                        yield n, lazy
                continue
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), lazy)
            continue
        if with_typing:
            yield from _imports(node, lazy, with_typing)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _imports(node, inner)


def _resolve(module: str, node: ast.stmt) -> Iterator[str]:
    """The repo modules an import statement in `module` names (external ones left out)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == PKG:
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
    if target.split(".")[0] != PKG:
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


@cache  # parsed when a test asks (3 s), not when pytest collects this module in each worker
def import_graph() -> tuple[list[Edge], dict[str, list[tuple[str, int]]]]:
    """The edges between the repo's modules, and per module the outside packages it
    imports at module level (top-level name, line)."""
    edges = []
    outside: dict[str, list[tuple[str, int]]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in _imports(tree, with_typing=True):
            for dst in _resolve(module, node):
                if dst and dst != module:
                    edges.append(Edge(module, dst, node.lineno, lazy, typing=True))
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
                if name.split(".")[0] != PKG:
                    outside.setdefault(module, []).append((name.split(".")[0], node.lineno))
    return edges, outside


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

    for v in sorted({e.src for e in edges} | {e.dst for e in edges}):
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
