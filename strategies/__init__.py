"""Acceleration techniques: the registry, and the one function that composes them.

Importing this package registers every built-in strategy.
"""

from strategies import (  # noqa: F401  (registers)
    accumulation,
    amp,
    averaging,
    checkpoint,
    curriculum,
    ddp,
    distill,
    float8,
    fused,
    lamb,
    lars,
    lora,
    muon,
    pipeline,
    tensor,
    tf32,
    zero,
)
from strategies.base import Choice, FloatRange, IntRange, Phase, Strategy
from strategies.compose import compose, reasons_against, resolved, validate
from strategies.registry import all_strategies, get, register
from strategies.setup import Setup

__all__ = [
    "Choice",
    "FloatRange",
    "IntRange",
    "Phase",
    "Setup",
    "Strategy",
    "all_strategies",
    "compose",
    "get",
    "reasons_against",
    "register",
    "resolved",
    "validate",
]
