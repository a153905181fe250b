"""Every key of a study file, read from the dataclasses that parse it.

A key's type and default are its field's; its meaning is the docstring under the field
(PEP 257's attribute docstring, as torchtitan's job config writes them), so each key is
documented in one place. `harness tune --keys` prints them; docs/tuning.md's key table
is generated from them (training_harness.study.keys_doc).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import shutil
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from training_harness.core.errors import HarnessError
from training_harness.study.study_file import Study

NOT_KEYS = {"workload_args"}  # filled from the [workload] table, not written by a user


@dataclass(frozen=True)
class Key:
    section: str  # "" for the top level, "budget", "strategies.<name>"
    name: str
    type: str
    default: str
    doc: str

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), whitespace folded; {} when
    the class's source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def section_doc(cls: type) -> str:
    """The class docstring's first paragraph ("" for the signature dataclass makes up)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split("\n\n")[0].split())


def sections(cls: type = Study) -> list[tuple[str, type]]:
    """("", Study) and each table a study file may hold, in the order of its fields."""
    out: list[tuple[str, type]] = [("", cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if (table := _table_of(hints[f.name])) is not None:
            out.append((f.name, table))
        elif get_origin(hints[f.name]) is dict and dataclasses.is_dataclass(
                value := get_args(hints[f.name])[-1]):
            out.append((f"{f.name}.<name>", value))
    return out


def study_keys() -> list[Key]:
    """Every key a study file may hold, section by section."""
    keys, tables = [], sections()
    skip = NOT_KEYS | {name.split(".")[0] for name, _ in tables[1:]}  # tables are no keys
    for section, cls in tables:
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in dataclasses.fields(cls):
            if section or f.name not in skip:
                bounds = f.metadata.get("range")
                kind = _type_name(hints[f.name]) + (
                    f" in [{_num(bounds[0])}, {_num(bounds[1])}]" if bounds else "")
                keys.append(Key(section, f.name, kind, _default_text(f), docs.get(f.name, "")))
    return keys


def keys_text(section: str | None = None) -> str:
    """The keys for a terminal, section by section (or one section: "top", "budget",
    "strategies", ...): `section.key: type = default`, and its meaning under it."""
    width = min(100, max(60, shutil.get_terminal_size().columns))
    heads = {name: section_doc(cls) for name, cls in sections()}
    if section is not None:
        wanted = {"top": ""}.get(section, section)
        heads = {k: v for k, v in heads.items() if wanted in (k, k.split(".")[0])}
        if not heads:
            names = ["top"] + [name.split(".")[0] for name, _ in sections()[1:]]
            raise HarnessError(f"--keys {section}: no such section; give one of "
                               f"{', '.join(names)}, or none for every key")
    lines, seen = ["Study file keys (docs/tuning.md has the same table)."], set()
    for key in study_keys():
        if key.section not in heads:
            continue
        if key.section not in seen:  # its section's first key
            seen.add(key.section)
            head = f"[{key.section}]" if key.section else "Top level"
            lines += ["", *textwrap.wrap(f"{head}: {heads[key.section]}", width)]
        lines.append(f"  {key.path}: {key.type} = {key.default}")
        lines += textwrap.wrap(key.doc, width, initial_indent=" " * 6,
                               subsequent_indent=" " * 6, break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def _table_of(tp: Any) -> type | None:
    """The dataclass a field's type holds as a table of its own (`X` or `X | None`)."""
    args = [a for a in get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    return args[0] if len(args) == 1 and dataclasses.is_dataclass(args[0]) else None


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is tuple:
        return f"[{', '.join(_type_name(a) for a in args)}]"
    if origin is dict or tp is dict:
        return "table"
    if dataclasses.is_dataclass(tp):
        return "{" + ", ".join(f.name for f in dataclasses.fields(tp)) + "}"
    return "any" if tp is Any else tp.__name__


def _default_text(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return "(required)"
    else:
        value = f.default
    return "(unset)" if value is None else json.dumps(value)


def _num(x: float) -> str:
    """A bound as a reader takes it in: 4096, 1e6, 2^30, 2^32-1."""
    if x != int(x) or abs(x) < 10_000:
        return f"{x:g}"
    n = int(x)
    for k in range(14, 64):
        if n in (2**k, 2**k - 1):
            return f"2^{k}" + ("-1" if n < 2**k else "")
    text = f"{n:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if float(text) == n else str(n)
