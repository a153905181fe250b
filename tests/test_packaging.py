"""One import name the project owns: the built wheel, the folders, and the commands run
from outside the checkout with HuggingFace's `kernels` importable
(docs/architecture.md#one-import-name).

The wheel is built from a copy of the sources (nothing is written into the checkout) and
put on PYTHONPATH, where it comes before the editable install: its commands run from its
own files. Where HuggingFace's `kernels` is not installed, a stand-in package of that name
takes its place, so that the collision is always tried.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "training_harness"
FOLDERS = {"harness": PKG, "strategies": f"{PKG}.strategies", "kernels": f"{PKG}.kernels",
           "reports": f"{PKG}.reports"}
# A Llama of a few thousand parameters: transformers is imported, and with it `kernels`.
HF_BENCH = ["bench", "--workload", "hf:llama", "--arg", "num_hidden_layers=1",
            "--arg", "hidden_size=32", "--arg", "intermediate_size=64",
            "--arg", "num_attention_heads=2", "--arg", "num_key_value_heads=2",
            "--arg", "vocab_size=64", "--arg", "seq_len=16", "--micro-batch-size", "2",
            "--global-batch-size", "2", "--steps", "2", "--warmup-steps", "1",
            "--device", "cpu"]


def _folders_packages() -> set[str]:
    found = set()
    for folder, name in FOLDERS.items():
        for py in (ROOT / folder).rglob("*.py"):
            rel = py.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    return found


def test_pyproject_lists_every_package_of_the_folders():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    assert listed == _folders_packages(), "pyproject.toml's [tool.setuptools] packages"
    assert meta["tool"]["setuptools"]["package-dir"] == {v: k for k, v in FOLDERS.items()}
    assert meta["project"]["scripts"] == {"harness": f"{PKG}.cli.main:main"}


def test_the_folders_beside_harness_shadow_no_package_of_their_name():
    """No __init__.py: from a checkout on sys.path they are at most namespace portions."""
    for folder in ("strategies", "kernels", "reports"):
        assert not (ROOT / folder / "__init__.py").exists(), folder


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of its sources, without build isolation."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-index", "-q", "-w", str(tmp / "dist"),
                           str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = (tmp / "dist").glob("training_harness-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name_and_every_module(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        record = z.read(f"{info}/RECORD").decode().splitlines()
        top_level = z.read(f"{info}/top_level.txt").decode().split()
    tops = {line.split(",")[0].split("/")[0] for line in record} - {info}
    assert tops == {PKG}, f"top-level names not the project's own: {sorted(tops - {PKG})}"
    assert top_level == [PKG]
    expected = {f"{name.replace('.', '/')}/{py.relative_to(ROOT / folder).as_posix()}"
                for folder, name in FOLDERS.items() for py in (ROOT / folder).rglob("*.py")}
    assert expected <= set(names), sorted(expected - set(names))[:5]


def _hf_kernels_path(tmp: Path) -> tuple[list[str], str]:
    """PYTHONPATH entries that make a `kernels` importable, and the file it imports from:
    HuggingFace's where installed, else a stand-in of that name."""
    spec = importlib.util.find_spec("kernels")
    if spec is not None and spec.origin and not Path(spec.origin).is_relative_to(ROOT / "kernels"):
        return [], spec.origin
    stub = tmp / "stub" / "kernels"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("OWNER = 'not the harness'\n")
    return [str(tmp / "stub")], str(stub / "__init__.py")


def _run(argv: list[str], cwd: Path, pythonpath: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _commands_work_outside(tmp: Path, harness: list[str], pythonpath: list[str],
                           expect_from: Path) -> None:
    away = tmp / "elsewhere"
    away.mkdir()
    extra, kernels_file = _hf_kernels_path(tmp)
    path = [*pythonpath, *extra]
    where = _run([sys.executable, "-c", f"import {PKG}, kernels; "
                  f"print({PKG}.__file__); print(kernels.__file__)"], away, path)
    assert where.returncode == 0, where.stderr
    ours, theirs = where.stdout.split()
    assert Path(ours).is_relative_to(expect_from) and theirs == kernels_file

    listed = _run([*harness, "strategies", "--json"], away, path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert {"amp", "fused", "zero"} <= {s["name"] for s in json.loads(listed.stdout)}

    bench = _run([*harness, *HF_BENCH, "--out", str(away / "bench")], away, path)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-3000:]
    record = json.loads((away / "bench" / "result.json").read_text())
    assert record["status"] == "ok", record["reason"]


@pytest.mark.slow
def test_the_console_script_runs_from_outside_the_checkout(tmp_path):
    """The installed `harness` (editable here), started in an empty folder elsewhere."""
    script = Path(sys.executable).parent / "harness"
    if not script.exists():
        pytest.skip("no `harness` console script beside this interpreter")
    _commands_work_outside(tmp_path, [str(script)], [], ROOT / "harness")


@pytest.mark.slow
def test_the_built_wheel_runs_from_outside_the_checkout(tmp_path, wheel):
    """The wheel's own files, as `pip install .` would lay them out: `python -m
    training_harness` and its trial processes run from them, not from the checkout."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    _commands_work_outside(tmp_path, [sys.executable, "-m", PKG], [str(site)], site / PKG)
    # `harness selftest` from the wheel (a GPU machine's way, docs/gpu.md) finds the
    # repository it is started in: its tests and studies
    where = _run([sys.executable, "-c", f"from {PKG}.selftest import proof; print(proof.ROOT)"],
                 ROOT, [str(site)])
    assert where.returncode == 0 and where.stdout.strip() == str(ROOT), where.stderr


def test_a_checkout_on_sys_path_leaves_kernels_to_its_owner(tmp_path):
    """`python` started in the checkout (as `python -m pytest` is) imports the installed
    `kernels`, not the checkout's folder; `import harness` there names the right import."""
    extra, kernels_file = _hf_kernels_path(tmp_path)
    done = _run([sys.executable, "-c", "import kernels; print(kernels.__file__)"], ROOT, extra)
    assert done.returncode == 0 and done.stdout.strip() == kernels_file, done.stderr
    wrong = _run([sys.executable, "-c", "import harness"], ROOT, [])
    assert wrong.returncode == 1 and "import training_harness" in wrong.stderr
