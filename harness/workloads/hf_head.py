"""The fused linear cross-entropy of an `hf:` causal LM (fused linear_cross_entropy).

The strategy gives the model a loss module under the attribute CRITERION
(kernels.linear_cross_entropy.LinearCrossEntropy: hidden, weight, targets, bias -> the
mean loss). The workload's loss then runs the model's own forward, so every wrapper
around it (DDP, FSDP) and everything it adds (a mixture of experts' router loss) is
kept, with a forward pre-hook on its output embeddings (the LM head): the hook computes
the fused loss from the head's input and weight, there, inside the model's forward (so
FSDP's gathered weight is the one used), and hands the head an input of no positions,
so the logits the model returns are empty: (batch, 0, vocab).

That is the model's loss only where its logits are the head's output as it is. Which
models: read from the causal LM class's forward (`fused_head_reasons`): its logits are
assigned once, as `self.<head>(...)` (optionally `.float()` / `.contiguous()`), where
<head> is the module `get_output_embeddings()` returns, an nn.Linear. Models that
scale or soft-cap the logits after the head (Gemma 2/3's final_logit_softcapping,
Cohere's logit_scale, Granite's logits_scaling) are refused with the line that does it;
whatever the forward does to the head's input (MiniCPM's scaling) is kept, since the
hook sees that input. Encoder-decoders and masked LMs are refused: their heads are
not a causal LM's single linear layer (BERT's is a transform and a decoder).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import torch
from torch import nn

from training_harness.workloads.meta import on_meta

CRITERION = "linear_cross_entropy"  # the attribute the fused strategy sets on the model
# What a forward may apply to the head's output before it is the logits: a copy, or
# the same values.
SAME_VALUES = (".float()", ".contiguous()")
LOGITS = ("logits", "lm_logits")  # the names forwards give them


def criterion_of(model: nn.Module) -> Any:
    """The fused loss module the strategy gave the model (under DDP's wrapper), or None."""
    inner = getattr(model, "module", model) if isinstance(
        model, nn.parallel.DistributedDataParallel) else model
    return getattr(inner, CRITERION, None)


def fused_head_loss(model: nn.Module, criterion: Any, ids: torch.Tensor,
                    labels: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The model's output (logits of no positions) and the mean loss of `labels`, the
    loss fused with the head (see the module docstring)."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    head = inner.get_output_embeddings()
    losses: list[torch.Tensor] = []

    def fused(module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        losses.append(criterion(hidden.reshape(-1, hidden.size(-1)), module.weight,
                                labels.reshape(-1), module.bias))
        return (hidden.narrow(-2, 0, 0), *args[1:])  # no positions: empty logits

    handle = head.register_forward_pre_hook(fused)
    try:
        out = model(input_ids=ids)
    finally:
        handle.remove()
    if len(losses) != 1:
        raise RuntimeError(f"fused linear_cross_entropy: the model's forward called its "
                           f"output embeddings {len(losses)} times, not once")
    # + 0 from the (empty) logits: the loss's backward then passes through the model's
    # output, where FSDP's root hooks its backward (without, FSDP2's root never starts
    # its backward, and the step crashes).
    return out, losses[0] + out.logits.sum()


def fused_head_reasons(workload: Any) -> list[str]:
    """Why the fused linear cross-entropy cannot be this hf: workload's loss (one line
    each; none when it can)."""
    what = "fused linear_cross_entropy"
    if not workload.causal:
        kind = "an encoder-decoder" if workload.seq2seq else "a masked LM"
        return [f"{what} fuses a causal LM's linear head with its loss; '{workload.name}' is "
                f"{kind}, whose head and loss are not that; set linear_cross_entropy = false"]
    problem = _head_problem(workload)
    return [f"{what}: {problem}; set linear_cross_entropy = false"] if problem else []


def _problem_of(cls: type, head_names: tuple[str, ...]) -> str | None:
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward)))
    except (OSError, TypeError):
        return f"{cls.__name__}.forward's source cannot be read to see how it makes its logits"
    made = [(t, v) for t, v in _assignments(ast.parse(source)) if t in LOGITS]
    if len(made) != 1:
        lines = "; ".join(f"{t} = {v}" for t, v in made[1:] or made) or "no `logits = `"
        return (f"{cls.__name__} changes its head's output before the loss ({lines}), which "
                "the fused loss would skip")
    value = made[0][1]
    for tail in SAME_VALUES:
        value = value.removesuffix(tail)
    call = ast.parse(value, mode="eval").body
    head = call.func.attr if isinstance(call, ast.Call) and isinstance(
        call.func, ast.Attribute) and ast.unparse(call.func.value) == "self" else None
    if head not in head_names:
        return (f"{cls.__name__}'s logits are `{made[0][1]}`, not its output embeddings' "
                "output as it is")
    return None


def _assignments(tree: ast.AST) -> list[tuple[str, str]]:
    """(name, value) of every assignment to a plain name; an augmented one's value is
    '<op>=' (in place)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            out += [(t.id, ast.unparse(node.value)) for t in node.targets
                    if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and isinstance(node.target,
                                                                            ast.Name):
            value = ast.unparse(node.value) if node.value is not None else ""
            out.append((node.target.id, f"{node.target.id} (in place) {value}"))
    return out


def _head_problem(workload: Any) -> str | None:
    """The model's head: an nn.Linear output embedding that its forward's logits come
    from unchanged (None), else what is not so. Read once per config class, from a meta
    build (the model's class and its head's attribute do not depend on the values)."""
    key = type(workload.config)
    if key not in _PROBLEMS:
        with on_meta():
            model = workload.build_model()
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") \
            else None
        if not isinstance(head, nn.Linear):
            _PROBLEMS[key] = (f"{type(model).__name__}'s output embeddings are "
                              f"{type(head).__name__ if head is not None else 'none'}, not "
                              "one linear layer")
        else:
            names = tuple(n for n, m in model.named_children() if m is head)
            _PROBLEMS[key] = _problem_of(type(model), names)
    return _PROBLEMS[key]


_PROBLEMS: dict[type, str | None] = {}  # config class -> why not (None: it fuses)
