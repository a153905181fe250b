"""Import `training_harness` from the tree this file is in, whatever is installed.

A benchmark that compares two trees (a worktree of another revision beside this
checkout) must measure each tree's own code; the installed distribution (an editable
install of another checkout) would otherwise answer every `import training_harness`.
Call `use_this_tree()` before anything imports it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def use_this_tree() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # tests.benchmarks.* of this tree
    loaded = sys.modules.get("training_harness")
    if loaded is not None:
        if Path(loaded.__file__).resolve().parent != ROOT / "harness":
            raise RuntimeError(f"training_harness was imported from {loaded.__file__} before "
                               f"this tree's ({ROOT}) could be")
        return
    # The package's root is harness/; its __init__ adds the tree's sibling folders to
    # its __path__ (strategies/, kernels/, reports/), as in any checkout.
    spec = importlib.util.spec_from_file_location(
        "training_harness", ROOT / "harness" / "__init__.py",
        submodule_search_locations=[str(ROOT / "harness")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["training_harness"] = module
    spec.loader.exec_module(module)
