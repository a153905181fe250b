"""The shape of the code: no import cycles, imports only down the package table, small files.

Every module under harness/, strategies/, kernels/ and reports/ is read with `ast`
(nothing is imported): every import counts, at the top or inside a function; those
under `if TYPE_CHECKING:` count for cycles only (a type-only circle is still a circle).
`from training_harness.x import y` is an import of the module training_harness.x.y
where that is a module, else of training_harness.x.

Packages are harness's subpackages (cli, tune, launch, measure, core, study,
estimator, workloads, records) and the top-level strategies, kernels, reports;
`harness` itself is its __init__.py (harness/__main__.py counts as cli). A package
may import its own modules and the packages ALLOWED lists for it, nothing else.
docs/architecture.md draws the same table.

The tuner's process never imports torch: the modules it loads (TORCH_FREE_*, and what
they import at module level, parents included) import neither torch nor triton at
module level. What needs torch runs in the torch-side helper
(training_harness.measure.torch_helper_server)
or in a trial's own processes, and is imported there inside a function.
"""

from __future__ import annotations

import ast

import pytest

from tests.import_graph import (
    MODULES,
    ROOT,
    TOP,
    Edge,
    _cycles,
    _describe,
    _imports,
    _path,
    _resolve,
    import_graph,
    package_of,
)

MAX_LINES = 500  # the hard cap; 400 is the guide (docs/architecture.md)

# package -> the packages it may import (besides itself). Downward only:
# cli -> tune -> launch -> measure -> core; study, estimator, workloads and records sit
# beside the chain; reports read stored records only.
ALLOWED: dict[str, set[str]] = {
    "harness": {"core"},  # harness/__init__.py: __version__, HarnessError
    "cli": {
        "tune", "launch", "measure", "core", "study", "estimator", "workloads", "records",
        "strategies", "kernels", "reports", "harness", "selftest", "export",
    },
    # `harness export` (plans in other stacks' files) and `harness verify` (the HF Trainer's
    # run, in its own processes): beside the chain, below cli
    "export": {"core", "records", "strategies", "workloads", "harness"},
    # `harness selftest --gpu`: subprocesses and the files they leave; never CUDA here
    "selftest": {"core", "records"},  # records: the run folder's one reader
    # the tuner's process: no package that is torch through and through
    "tune": {"launch", "core", "study", "records", "harness"},  # never measure/
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
TORCH_FREE_MODULES = ("training_harness", "training_harness.__main__", "training_harness.cli.main",
                      "training_harness.cli.tune",
                      "training_harness.cli.selftest")
TORCH_FREE_PACKAGES = ("training_harness.tune", "training_harness.launch",
                       "training_harness.records", "training_harness.reports",
                       "training_harness.selftest")
HEAVY = ("torch", "triton")


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
    """`from training_harness.x import y`: the module .x.y if there is one, else .x."""
    node = ast.parse("from training_harness.measure import peaks, Thing").body[0]
    assert list(_resolve("training_harness.cli.main", node)) == ["training_harness.measure.peaks",
                                                                 "training_harness.measure"]
    node = ast.parse("from . import base").body[0]
    assert list(_resolve("training_harness.workloads", node)) == ["training_harness.workloads.base"]
    node = ast.parse("from .base import Workload").body[0]
    assert list(_resolve("training_harness.workloads.gpt",
                         node)) == ["training_harness.workloads.base"]
    node = ast.parse("import torch, training_harness.strategies.zero").body[0]
    assert list(_resolve("training_harness.cli.main",
                         node)) == ["training_harness.strategies.zero"]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import training_harness.tune\n"
        "else:\n    import training_harness.core\n"
        "def f():\n    import training_harness.records\n"
    )
    found = [(getattr(n, "module", None) or n.names[0].name, lazy) for n, lazy in _imports(tree)]
    assert found == [("typing", False), ("training_harness.core", False),
                     ("training_harness.records", True)]
    typed = [n.names[0].name for n, _ in _imports(tree, with_typing=True)]
    assert typed == ["training_harness.tune"]
    assert package_of("training_harness.tune.session") == "tune"
    assert package_of("training_harness") == "harness"
    assert package_of("training_harness.__main__") == "cli"
    assert package_of("training_harness.strategies.zero") == "strategies"


def test_the_cycle_finder_finds_one():
    a, b, c = ("training_harness.core.plan", "training_harness.core.units",
               "training_harness.core.errors")
    edges = [Edge(a, b, 1, False), Edge(b, c, 2, True), Edge(c, a, 3, False), Edge(a, c, 4, False)]
    (cycle,) = _cycles(edges)
    assert [e.src for e in cycle] == [c, a] and cycle[-1].dst == c  # the shortest: c -> a -> c
    assert _describe(cycle).startswith(f"{c} -> {a} -> {c}")


def test_a_cycle_through_a_function_or_a_type_only_import_counts():
    a, b = "training_harness.tune.session", "training_harness.tune.recorder"
    for lazy, typing in ((True, False), (False, True)):
        (cycle,) = _cycles([Edge(a, b, 1, False), Edge(b, a, 2, lazy, typing)])
        assert {e.src for e in cycle} == {a, b}


def test_no_import_cycles():
    cycles = _cycles(import_graph()[0])
    if cycles:
        text = "\n".join(f"  {i}. {_describe(c)}" for i, c in enumerate(cycles, 1))
        pytest.fail(f"{len(cycles)} import cycle(s), each shown once:\n{text}", pytrace=False)


def test_imports_follow_the_package_table():
    bad: dict[tuple[str, str], list[Edge]] = {}
    for e in import_graph()[0]:
        src, dst = package_of(e.src), package_of(e.dst)
        if not e.typing and src != dst and dst not in ALLOWED.get(src, set()):
            bad.setdefault((src, dst), []).append(e)
    if bad:
        lines = []
        for (src, dst), edges in sorted(bad.items()):
            lines.append(f"  {src} -> {dst} (not in ALLOWED[{src!r}]):")
            lines += [f"      {e.src} imports {e.dst}  [{e.where()}]" for e in edges]
        pytest.fail("imports against the package table:\n" + "\n".join(lines), pytrace=False)


# Inside tune/, by layer (docs/architecture.md#inside-tune-one-subpackage-per-stage-of-a-study):
# a module imports only from lower layers, or within its own stage's subpackage (the base
# modules among themselves). One crossing is allowed: the final phases measure a busy
# trial again as the search does.
TUNE = "training_harness.tune"
TUNE_LAYERS = {"session": 4, "search": 3, "final": 3, "recovery": 3, "model": 1}
TUNE_BASE = 2  # recorder, trial_job, study_trials, budget, storage, workers, ...
TUNE_CROSSINGS = {("final", "search.busy_machine")}


def _tune_unit(module: str) -> tuple[str, str]:
    """(its stage or "base", the module below tune/): tune.search.loop -> ("search",
    "search.loop")."""
    rest = module[len(TUNE) + 1:]
    head = rest.split(".")[0]
    return (head if head in TUNE_LAYERS else "base"), rest


def test_tunes_stages_import_only_downward():
    bad = []
    for e in import_graph()[0]:
        if e.typing or not (e.src.startswith(TUNE + ".") and e.dst.startswith(TUNE + ".")):
            continue
        (src, src_mod), (dst, dst_mod) = _tune_unit(e.src), _tune_unit(e.dst)
        level = {**TUNE_LAYERS, "base": TUNE_BASE}
        if src == dst or level[dst] < level[src] or (src, dst_mod) in TUNE_CROSSINGS:
            continue
        bad.append(f"  {src_mod} ({src}) imports {dst_mod} ({dst})  [{e.where()}]")
    assert not bad, "imports against tune/'s order:\n" + "\n".join(bad)


def test_the_tune_order_check_can_fail():
    level = {**TUNE_LAYERS, "base": TUNE_BASE}
    for src, dst in (("tune.trial_job", "tune.search.loop"),
                     ("tune.search.loop", "tune.final.ablation")):
        (s, _), (d, m) = (_tune_unit(f"training_harness.{src}"),
                          _tune_unit(f"training_harness.{dst}"))
        assert s != d and level[d] >= level[s] and (s, m) not in TUNE_CROSSINGS


def test_no_module_is_over_500_lines():
    long = []
    for top in (*TOP, "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                long.append(f"  {path.relative_to(ROOT)}: {n} lines")
    assert not long, (f"modules over {MAX_LINES} lines (split them by subject, not by "
                      "length):\n" + "\n".join(long))


def loaded_with(roots: list[str]) -> dict[str, list[str]]:
    """Every module that importing `roots` loads (module-level imports and parent
    packages followed), with the chain of modules that brings it in."""
    eager: dict[str, list[str]] = {}
    for e in import_graph()[0]:
        if not e.lazy and not e.typing:
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
        lines = [f"{n}:{line}" for n, line in import_graph()[1].get(m, []) if n in HEAVY]
        if lines:
            found.append(f"  {' -> '.join(path)} imports {', '.join(lines)}  [{_path(m)}]")
    return found


def test_the_tuner_side_does_not_import_torch():
    roots = [m for m in MODULES if m in TORCH_FREE_MODULES
             or any(m == p or m.startswith(p + ".") for p in TORCH_FREE_PACKAGES)]
    assert heavy_imports(["training_harness.measure.trial_loop"]), "the check itself finds torch"
    if bad := heavy_imports(roots):
        pytest.fail("torch on the tuner's side, at import time (import it inside the function "
                    "the torch-side helper or a trial runs):\n" + "\n".join(bad), pytrace=False)


def _no_context_objects(path_text: dict[str, str]) -> list[str]:
    """Where a function takes a `ctx` parameter, or (in tune/ and launch/) a callback is
    set on an object after it was made (`x.on_... = ...`, `x.say = ...`, outside `self`)."""
    found = []
    for where, text in sorted(path_text.items()):
        after_made = where.startswith(("harness/tune/", "harness/launch/"))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                if "ctx" in [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]:
                    found.append(f"  {where}:{node.lineno}: a parameter named ctx")
            elif after_made and isinstance(node, ast.Assign):
                for t in node.targets:
                    if (isinstance(t, ast.Attribute) and (t.attr.startswith("on_")
                                                          or t.attr == "say")
                            and not (isinstance(t.value, ast.Name) and t.value.id == "self")):
                        found.append(f"  {where}:{node.lineno}: {t.attr} set after construction")
    return found


def test_functions_take_what_they_use_and_callbacks_come_at_construction():
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "harness").rglob("*.py")}
    bad = _no_context_objects(texts)
    assert not bad, ("give each function the parts it uses, and each callback to the "
                     "constructor (docs/architecture.md):\n" + "\n".join(bad))
    # the check finds both
    assert len(_no_context_objects({"harness/tune/x.py": "def f(ctx):\n    s.on_x = f\n"})) == 2
