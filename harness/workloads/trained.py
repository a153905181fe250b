"""Trained weights kept in a folder (`harness bench ... --save FOLDER`) and read back:
a distillation teacher, or the starting weights of a fine-tuning.

The folder holds `harness-saved.toml` (the workload's name and arguments) and the
weights: for an `hf:` model what `save_pretrained` writes (config.json and
model.safetensors), so the folder is itself an `hf:/FOLDER` workload; for the others
`model.safetensors`. The weights are the model's own parameter names, whatever
wrapped it while training (checkpoint wrappers, torch.compile); LoRA adapters are
merged into the weights they adapt.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training_harness.core.errors import HarnessError

SAVED = "harness-saved.toml"
WEIGHTS = "model.safetensors"
# Names that wrappers put into a parameter's path (torch's checkpoint wrapper, compile).
WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
# hf: arguments that are not config fields (a saved folder's config.json holds those).
HF_ARGS = ("seq_len", "attn_implementation", "task", "data")


def _plain_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under their own names: LoRA merged, wrappers' names removed."""
    for m in model.modules():
        if hasattr(m, "lora_A") and callable(getattr(m, "merge", None)) and \
                not getattr(m, "merged", False):
            m.merge()  # peft's LoRA layer: its delta added into base_layer's weight
    state = {}
    for name, value in model.state_dict().items():
        if "lora_" in name:
            continue
        for part in WRAPPER_PARTS:
            name = name.replace(part, "")
        name = name.replace(".base_layer.", ".")
        full = getattr(value, "full_tensor", None)
        state[name] = (full() if callable(full) else value).detach().cpu()
    return state


def save_trained(model: nn.Module, name: str, args: dict[str, Any], folder: str | Path) -> str:
    """Write `model`'s trained weights and its workload to `folder`; return its path."""
    import tomli_w
    from safetensors.torch import save_model

    from training_harness.workloads import load_workload

    out = Path(folder).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    workload = load_workload(name, args)
    with torch.device("cpu"):
        fresh = workload.build_model()
    missing, unexpected = fresh.load_state_dict(_plain_state(model), strict=False)
    if missing or unexpected:
        raise HarnessError(f"save: the trained weights do not fit a fresh '{name}' model "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if name.startswith("hf:"):
        fresh.save_pretrained(str(out))
    else:
        save_model(fresh, str(out / WEIGHTS))
    (out / SAVED).write_text(tomli_w.dumps({"workload": {"name": name, **args}}))
    return str(out)


def saved_workload(folder: str | Path) -> tuple[str, dict[str, Any]]:
    """The workload name and arguments that rebuild the saved model (an hf: model's
    become `hf:FOLDER`, its config read from the folder)."""
    path = Path(folder).expanduser().resolve()
    if not (path / SAVED).is_file():
        raise HarnessError(f"{path}: no {SAVED}; make the folder with "
                           "`harness bench ... --save FOLDER`")
    table = tomllib.loads((path / SAVED).read_text())["workload"]
    name = table.pop("name")
    if name.startswith("hf:"):
        return f"hf:{path}", {k: v for k, v in table.items() if k in HF_ARGS}
    return name, table


def load_trained(folder: str | Path) -> tuple[Any, nn.Module]:
    """(the workload, its model with the saved weights, on the CPU)."""
    from safetensors.torch import load_model

    from training_harness.workloads import load_workload

    name, args = saved_workload(folder)
    workload = load_workload(name, args)
    with torch.device("cpu"):
        model = workload.build_model()  # an hf: folder loads its own weights
    if not name.startswith("hf:"):
        load_model(model, str(Path(folder).expanduser().resolve() / WEIGHTS))
    return workload, model
