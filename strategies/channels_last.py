"""Channels-last: convolutions on NHWC tensors (torch's channels_last memory format).

cuDNN's and oneDNN's fastest convolution kernels read NHWC, and on tensor cores with
mixed precision NHWC is what torchvision's and timm's training scripts ask for
(`--channels-last`). The model's parameters are converted once, at the module-swap
phase (`model.to(memory_format=torch.channels_last)`); a convolution whose weight is
channels-last returns a channels-last output, so the activations follow from the first
convolution on. What is trained does not change: the same values in another layout (the
tests hold the loss to the baseline's). A model with no 2-D convolution is refused: the
strategy would change nothing there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from training_harness.strategies.base import Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class ChannelsLastSettings:
    """No settings: on (channels-last) or off (torch's contiguous NCHW)."""


@lru_cache(maxsize=64)
def _convolutions(workload: str, args_json: str) -> int:
    """How many 2-D convolutions the workload's model has (built on the meta device)."""
    from training_harness.workloads import load_workload

    with torch.device("meta"):
        model = load_workload(workload, json.loads(args_json)).build_model()
    return sum(isinstance(m, nn.Conv2d) for m in model.modules())


class ChannelsLast(Strategy):
    name = "channels_last"
    summary = "the model's convolutions on NHWC (channels-last) tensors: the memory format"
    phases = (Phase.MODULE_SWAP,)
    Settings = ChannelsLastSettings
    requires = "a model with 2-D convolutions (resnet, vit's patch embedding, torchvision:, timm:)"

    def check(self, settings, plan, env):
        args = json.dumps(plan.workload_args, sort_keys=True, default=str)
        if _convolutions(plan.workload, args) == 0:
            return [f"channels_last lays out 2-D convolutions' tensors, and '{plan.workload}' "
                    "has none: drop [strategies.channels_last]"]
        return []

    def apply(self, phase, setup, settings):
        setup.model = setup.model.to(memory_format=torch.channels_last)
        n = sum(isinstance(m, nn.Conv2d) for m in setup.model.modules())
        setup.notes.append(f"channels_last: {n} convolutions' weights in NHWC; their outputs "
                           "follow")


register(ChannelsLast())
