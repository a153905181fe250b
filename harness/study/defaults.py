"""The study `harness tune` runs when given no study file: one per kind of device.

On a CPU it is the quickstart study (studies/quickstart.toml holds the same): a
tiny GPT whose trials take seconds, so a study of a few minutes measures a few
dozen configurations. On CUDA devices it is a GPT-2-small study over the
devices present (data parallel with DDP or ZeRO when there are several).
"""

from __future__ import annotations

from typing import Any

from training_harness.study.study_file import Study

QUICKSTART: dict[str, Any] = {
    "name": "quickstart",
    "device": "cpu",
    "objective": "throughput",
    "global_batch_size": 16,
    "micro_batch_sizes": [4, 8, 16],
    "warmup_steps": 2,
    "steps": 6,
    "workload": {"name": "gpt", "layers": 2, "heads": 4, "hidden": 128, "seq_len": 128,
                 "vocab": 2048},
    "budget": {"time": "3m", "memory": 0.9, "trial_timeout": "90s", "ablation_share": 0.25,
               "ablation_repeats": 2},
    "strategies": {
        "fused": {"search": ["attention", "optimizer"],
                  "values": {"optimizer": ["foreach", "fused"]}},
        "amp": {"search": ["dtype"], "values": {"dtype": ["bf16"]}},
        "checkpoint": {"search": [], "fixed": {"every": 1}},
    },
}


def gpt2_small(device_count: int) -> dict[str, Any]:
    world = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= max(device_count, 1)]
    strategies: dict[str, Any] = {
        "amp": {},
        "fused": {"search": ["attention", "optimizer", "compile"],
                  "values": {"optimizer": ["foreach", "fused"]}},
        "checkpoint": {},
    }
    if len(world) > 1:
        strategies["ddp"] = {"search": ["bucket_cap_mb"]}
        strategies["zero"] = {"search": ["stage"]}
    return {
        "name": f"gpt2-small-{max(world)}gpu",
        "device": "cuda",
        "global_batch_size": 64,
        "micro_batch_sizes": {"min": 1, "max": 32},
        "warmup_steps": 5,
        "steps": 20,
        "workload": {"name": "gpt", "layers": 12, "heads": 12, "hidden": 768, "seq_len": 1024,
                     "vocab": 50304},
        "layout": {"world_sizes": world},
        "budget": {"time": "1h", "memory": 0.9, "trial_timeout": "10m"},
        "strategies": strategies,
    }


def default_study(device_type: str, device_count: int = 1) -> Study:
    table = QUICKSTART if device_type == "cpu" else gpt2_small(device_count)
    return Study.from_dict(table, where="the default study")
