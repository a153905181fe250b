"""Finding a model's repeated layers ("blocks"): what checkpointing, per-block compile
and FSDP's per-block sharding act on.

A model that keeps them in an `nn.ModuleList` named `blocks` is taken at its word.
Otherwise the finder looks at every `nn.ModuleList` / `nn.Sequential` whose children
are all of one type, groups them by that type, and takes the type whose containers
hold the most parameters: Hugging Face's `model.layers` (Llama), `transformer.h`
(GPT-2), `encoder.layer` (BERT); torchvision's stages (ResNet's layer1..layer4 of
Bottlenecks, as one run of blocks in order), a ViT's `encoder.layers`.

Wrappers that strategies put around a block (torch's checkpoint wrapper, a compiled
module, FSDP2's dynamic subclass) are seen through, so the finder gives the same
blocks before and after them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import nn
from torch.distributed.fsdp import FSDPModule


def kind(module: nn.Module) -> type:
    """The block's own class, under a checkpoint wrapper, torch.compile or fully_shard."""
    inner = getattr(module, "_checkpoint_wrapped_module", module)
    inner = getattr(inner, "_orig_mod", inner)
    return next(c for c in type(inner).__mro__ if not issubclass(c, FSDPModule))


@dataclass
class Blocks:
    """The repeated layers, in forward order, as slots in their containers."""

    paths: tuple[str, ...]  # the containers' qualified names ("" is the model itself)
    slots: list[tuple[nn.Module, str]]  # (container, child name), one per block
    name: str  # the blocks' class name
    slot_paths: list[str]  # each slot's container name

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, i: int) -> nn.Module:
        container, child = self.slots[i]
        return getattr(container, child)

    def __setitem__(self, i: int, module: nn.Module) -> None:
        container, child = self.slots[i]
        setattr(container, child, module)

    def __iter__(self) -> Iterator[nn.Module]:
        return (self[i] for i in range(len(self)))

    def prefixes(self) -> list[str]:
        """Each block's qualified-name prefix ("model.layers.3."), in block order."""
        return [f"{path}.{child}." if path else f"{child}."
                for path, (_, child) in zip(self.slot_paths, self.slots, strict=True)]

    def describe(self) -> str:
        where = ", ".join(p or "(the model)" for p in self.paths)
        return f"{len(self)} x {self.name} in {where}"


def _containers(model: nn.Module) -> Iterator[tuple[str, nn.Module, type]]:
    """(qualified name, container, block class) of every ModuleList / Sequential whose
    children are all of one class (wrappers seen through) and hold parameters."""
    for path, module in model.named_modules(remove_duplicate=True):
        if not isinstance(module, nn.ModuleList | nn.Sequential) or len(module) == 0:
            continue
        kinds = {kind(child) for child in module.children()}
        if len(kinds) == 1 and any(True for _ in module.parameters()):
            yield path, module, kinds.pop()


def find_blocks(model: nn.Module) -> Blocks | None:
    """The model's repeated layers, or None when it has no container of same-typed ones."""
    own = getattr(model, "blocks", None)
    if isinstance(own, nn.ModuleList) and len(own) > 0:
        return _blocks([("blocks", own)], kind(own[0]))
    groups: dict[type, list[tuple[str, nn.Module]]] = {}
    for path, container, cls in _containers(model):
        groups.setdefault(cls, []).append((path, container))
    if not groups:
        return None

    def size(item: tuple[type, list[tuple[str, nn.Module]]]) -> tuple[int, int]:
        params = {id(p): p.numel() for _, c in item[1] for p in c.parameters()}
        return sum(params.values()), sum(len(c) for _, c in item[1])

    cls, found = max(groups.items(), key=size)
    # A container inside another one of the same group is part of its blocks already.
    outer = [(p, c) for p, c in found
             if not any(q != p and (not q or p.startswith(q + ".")) for q, _ in found)]
    return _blocks(outer, cls)


def _blocks(containers: list[tuple[str, nn.Module]], cls: type) -> Blocks:
    named = [(p, c, name) for p, c in containers for name, _ in c.named_children()]
    return Blocks(paths=tuple(p for p, _ in containers), slots=[(c, n) for _, c, n in named],
                  name=cls.__name__, slot_paths=[p for p, _, _ in named])


def block_of(blocks: Blocks | None, parameter_name: str) -> int | None:
    """The index of the block a qualified parameter name belongs to, else None."""
    if blocks is None:
        return None
    for i, prefix in enumerate(blocks.prefixes()):
        if parameter_name.startswith(prefix):
            return i
    return None
