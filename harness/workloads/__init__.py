"""Workloads by name: the built-in ones, or a user's `package.module:function`.

A workload builds the model, its batches and its loss (`base.Workload`); the built-in
ones are a GPT (`gpt`, with `attention`), a ResNet and a ViT (`vision`) and an MLP
(`mlp`). Beside them: `hf:<model_type>` and `hf:/path/to/folder` (Hugging Face
transformers, `hf`), `torchvision:<name>` (`torchvision_models`), `timm:<name>`
(`timm_models`), and a user's own,
as a Workload or from plain functions (`Workload.from_callables`, `@workload`).
`blocks` finds a model's repeated layers. It imports training_harness.core only; the trial
loop, the estimator, the study checks and strategies import it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from training_harness.core.config import did_you_mean
from training_harness.core.errors import HarnessError
from training_harness.workloads.base import TransformerShape, Workload, workload

BUILTIN = {
    "gpt": "training_harness.workloads.gpt:build_gpt",
    "vit": "training_harness.workloads.vision:build_vit",
    "resnet": "training_harness.workloads.vision:build_resnet",
    "mlp": "training_harness.workloads.mlp:build_mlp",
}

# name prefixes of the model libraries: "hf:llama", "torchvision:resnet50"
LIBRARIES = {
    "hf": "training_harness.workloads.hf:build_hf",
    "torchvision": "training_harness.workloads.torchvision_models:build_torchvision",
    "timm": "training_harness.workloads.timm_models:build_timm",
}
EXAMPLES = {"hf": "hf:llama", "torchvision": "torchvision:resnet50", "timm": "timm:resnet18"}

__all__ = ["BUILTIN", "LIBRARIES", "TransformerShape", "Workload", "load_workload", "workload"]


def _resolve(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise HarnessError(
            f"workload '{spec}': use a built-in name ({', '.join(BUILTIN)}) "
            "or 'package.module:function'"
        )
    if os.getcwd() not in sys.path:  # as `python -m` would: the user's own package
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise HarnessError(
            f"workload '{spec}': cannot import module '{module_name}' ({e}); "
            "check the name and that it is on PYTHONPATH"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise HarnessError(f"workload '{spec}': '{module_name}' has no function '{attr}'")
    return fn


def load_workload(name: str, args: dict[str, Any] | None = None) -> Workload:
    """Build workload `name` with its arguments; a user's mistake is a HarnessError."""
    args = dict(args or {})
    library, _, spec = name.partition(":")
    if library in LIBRARIES:
        if not spec:
            raise HarnessError(f"workload '{name}': name the model after '{library}:', e.g. "
                               f"{EXAMPLES[library]}")
        workload = _resolve(LIBRARIES[library])(spec, args)
    else:
        workload = _call(name, args)
    if not isinstance(workload, Workload):
        raise HarnessError(
            f"workload '{name}' returned {type(workload).__name__}, not a "
            "training_harness.workloads.base.Workload"
        )
    return workload


def _call(name: str, args: dict[str, Any]) -> Any:
    """A built-in or a user's `package.module:function`, called with the arguments."""
    if ":" in name:
        fn = _resolve(name)
    elif name in BUILTIN:
        fn = _resolve(BUILTIN[name])
    else:
        raise HarnessError(
            f"unknown workload '{name}'{did_you_mean(name, BUILTIN)}; built-in: "
            f"{', '.join(BUILTIN)}, or give 'package.module:function'"
        )
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        raise HarnessError(f"workload '{name}': {e}; fix the [workload] arguments") from None
    return fn(**args)
