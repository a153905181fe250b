"""Finding a model's repeated layers ("blocks"): what checkpointing, per-block compile
and FSDP's per-block sharding act on.

A model that keeps them in an `nn.ModuleList` named `blocks` is taken at its word.
Otherwise the finder looks at every `nn.ModuleList` / `nn.Sequential` whose children
are all of one type, groups them by that type, and takes the type whose containers
hold the most parameters: Hugging Face's `model.layers` (Llama), `transformer.h`
(GPT-2), `encoder.layer` (BERT); torchvision's stages (ResNet's layer1..layer4 of
Bottlenecks, as one run of blocks in order), a ViT's `encoder.layers`.

A timm model says where its blocks are itself: its `group_matcher(coarse=False)` (what
timm's layer-wise learning-rate decay uses) gives patterns for the block names
(`layer1.0` in a ResNet, `blocks.3` in a ViT, `stages.2.blocks.1` in a ConvNeXt or a
Swin, `blocks.4.2` in an EfficientNet); the outermost modules with parameters whose
names match are the blocks, whatever their classes. When it names none, the search
above applies.

Wrappers that strategies put around a block (torch's checkpoint wrapper, a compiled
module, FSDP2's dynamic subclass) are seen through, so the finder gives the same
blocks before and after them.
"""

from __future__ import annotations

import contextlib
import re
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
    named = _timm_blocks(model)
    if named is not None:
        return named
    groups: dict[type, list[tuple[str, nn.Module]]] = {}
    for path, container, cls in _containers(model):
        groups.setdefault(cls, []).append((path, container))
    if not groups:
        return None

    def size(item: tuple[type, list[tuple[str, nn.Module]]]) -> tuple[int, int]:
        params = {id(p): p.numel() for _, c in item[1] for p in c.parameters()}
        return sum(params.values()), sum(len(c) for _, c in item[1])

    both = _encoder_decoder(model, groups, size)
    if both is not None:
        return both
    cls, found = max(groups.items(), key=size)
    # A container inside another one of the same group is part of its blocks already.
    outer = [(p, c) for p, c in found
             if not any(q != p and (not q or p.startswith(q + ".")) for q, _ in found)]
    return _blocks(outer, cls)


def _encoder_decoder(model: nn.Module, groups: dict[type, list[tuple[str, nn.Module]]],
                     size) -> Blocks | None:
    """An encoder-decoder whose two stacks have layers of two classes (BART's encoder and
    decoder layers; T5's are one class, found as one group): both stacks' layers, the
    encoder's first, so checkpointing and per-block sharding act on both."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None

    def best(stack: str) -> tuple[type, list[tuple[str, nn.Module]]] | None:
        mine = [(cls, [(p, c) for p, c in found if stack in p.split(".")])
                for cls, found in groups.items()]
        mine = [(cls, found) for cls, found in mine if found]
        return max(mine, key=size) if mine else None

    enc, dec = best("encoder"), best("decoder")
    if enc is None or dec is None or enc[0] is dec[0]:
        return None
    blocks = _blocks(enc[1] + dec[1], enc[0])
    blocks.name = f"{enc[0].__name__} + {dec[0].__name__}"
    return blocks


def _blocks(containers: list[tuple[str, nn.Module]], cls: type) -> Blocks:
    named = [(p, c, name) for p, c in containers for name, _ in c.named_children()]
    return Blocks(paths=tuple(p for p, _ in containers), slots=[(c, n) for _, c, n in named],
                  name=cls.__name__, slot_paths=[p for p, _, _ in named])


# The path segments wrappers add: torch.compile's, the checkpoint wrapper's, DDP's.
_WRAPPERS = {"_orig_mod", "_checkpoint_wrapped_module", "module"}


def _timm_patterns(model: nn.Module) -> list[re.Pattern[str]]:
    """The block-name patterns of a timm model's `group_matcher(coarse=False)`: the
    "blocks" entries that number blocks (a pattern alone, or with None as its ordinal);
    the others (a final norm, a downsample) are placed after or before them."""
    inner = getattr(model, "_orig_mod", model)
    inner = getattr(inner, "module", inner)
    if not type(inner).__module__.startswith("timm."):
        return []
    matcher = getattr(inner, "group_matcher", None)
    try:
        groups = matcher(coarse=False) if callable(matcher) else None
    except Exception:  # a model whose matcher cannot run (timm's own bug): the search decides
        return []
    spec = groups.get("blocks") if isinstance(groups, dict) else None
    if isinstance(spec, str):
        spec = [(spec, None)]
    if not isinstance(spec, list | tuple):
        return []
    patterns = []
    for entry in spec:
        if isinstance(entry, tuple | list) and len(entry) == 2 and entry[1] is None:
            entry = entry[0]
        if isinstance(entry, str):
            with contextlib.suppress(re.error):
                patterns.append(re.compile(entry))
    return patterns


def _timm_blocks(model: nn.Module) -> Blocks | None:
    """The blocks a timm model's group matcher names (module docstring), in forward
    order (module order), or None when it is not a timm model or names none."""
    patterns = _timm_patterns(model)
    if not patterns:
        return None
    seen: set[str] = set()
    found: list[tuple[str, nn.Module]] = []  # (qualified name, module), outermost first
    for path, module in model.named_modules(remove_duplicate=True):
        bare = ".".join(s for s in path.split(".") if s not in _WRAPPERS)
        if not bare or bare in seen:
            continue
        if any(p.fullmatch(bare) for p in patterns):
            seen.add(bare)  # a wrapper's inner module has the same bare name: the slot is outer
            if any(path.startswith(q + ".") for q, _ in found):
                continue  # inside a block already
            if any(True for _ in module.parameters()):
                found.append((path, module))
    if not found:
        return None
    # A ModuleDict with a forward of its own (timm's DenseBlock) feeds each child the
    # list of all earlier outputs and appends to it after each one: a checkpointed child
    # would recompute from the grown list. The dict is the block there.
    paths = list(dict.fromkeys(_dict_or_self(model, path) for path, _ in found))
    found = [(path, model.get_submodule(path)) for path in paths]
    slots, slot_paths = [], []
    for path, _ in found:
        parent, _, child = path.rpartition(".")
        slots.append((model.get_submodule(parent), child))
        slot_paths.append(parent)
    names = dict.fromkeys(kind(m).__name__ for _, m in found)
    return Blocks(paths=tuple(dict.fromkeys(slot_paths)), slots=slots, name="/".join(names),
                  slot_paths=slot_paths)


def _dict_or_self(model: nn.Module, path: str) -> str:
    """`path`, or its parent's (a wrapper around the parent included) when the parent is
    a ModuleDict with a forward of its own."""
    parent = path.rpartition(".")[0]
    module = model.get_submodule(parent)
    own_forward = type(module).forward is not nn.ModuleDict.forward
    if not (isinstance(module, nn.ModuleDict) and own_forward):
        return path
    while parent.rpartition(".")[2] in _WRAPPERS:
        parent = parent.rpartition(".")[0]
    return parent


def block_of(blocks: Blocks | None, parameter_name: str) -> int | None:
    """The index of the block a qualified parameter name belongs to, else None."""
    if blocks is None:
        return None
    for i, prefix in enumerate(blocks.prefixes()):
        if parameter_name.startswith(prefix):
            return i
    return None
