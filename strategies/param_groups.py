"""Splitting an optimizer's parameters in two by a rule, keeping the groups it was given.

An optimizer factory (strategies.setup.OptimizerFactory) gets a list of parameters,
or of group dicts (tensor parallel's DTensor and plain groups, ZeRO-1's shard).
LARS leaves biases and norm gains out of its trust ratio; Muon takes the hidden
matrices and AdamW the rest: both split each group by a rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def groups_of(params: Iterable[Any]) -> list[dict[str, Any]]:
    """The parameters as group dicts (one group when given plain tensors)."""
    items = list(params)
    if items and isinstance(items[0], dict):
        return [dict(g, params=list(g["params"])) for g in items]
    return [{"params": items}]


def split(params: Iterable[Any], rule: Callable[[torch.Tensor], bool]
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(groups of the parameters the rule picks, groups of the others); each group keeps
    its own keys, and empty groups are left out."""
    chosen, rest = [], []
    for group in groups_of(params):
        picked = [p for p in group["params"] if rule(p)]
        others = [p for p in group["params"] if not rule(p)]
        if picked:
            chosen.append(dict(group, params=picked))
        if others:
            rest.append(dict(group, params=others))
    return chosen, rest


def is_matrix(p: torch.Tensor) -> bool:
    """A weight matrix (or a convolution's filters): 2 or more dimensions. Biases and
    norm gains (one dimension) are not."""
    return p.ndim >= 2
