"""Reading typed dataclasses from TOML tables, with errors that name the key.

One function serves plans, strategy settings and (later) study files, so every
user-written table is checked the same way: unknown keys, wrong types and values
outside a `Literal` are refused with the dotted path of the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self, TypeVar, get_args, get_origin

from training_harness.core.errors import HarnessError

T = TypeVar("T")


def bounded(default: Any, lo: float, hi: float) -> Any:
    """A dataclass field whose value from_table keeps within [lo, hi].

    Upper bounds keep absurd values (layers = 10**12) from hanging model building:
    they are far above any model that trains today."""
    return dataclasses.field(default=default, metadata={"range": (lo, hi)})


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning every way it can fail into a HarnessError."""
    p = Path(path)
    if not p.is_file():
        raise HarnessError(f"{p}: no such file; give the path of a TOML file")
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise HarnessError(f"{p}: not valid TOML ({e}); fix the syntax at that place") from None
    except (UnicodeDecodeError, OSError) as e:
        raise HarnessError(f"{p}: cannot be read as a TOML text file ({e})") from None
    except RecursionError:
        data = None
    if data is None or _depth(data) > MAX_DEPTH:
        raise HarnessError(f"{p}: lists or tables nested more than {MAX_DEPTH} deep; "
                           "no key of a plan or study needs that")
    return data


MAX_DEPTH = 16  # of nested lists and tables; a study needs 5 (strategies.amp.values.dtype)


def _depth(value: Any) -> int:
    """How deeply lists and tables nest in `value` (without recursion)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d + 1)
            if d + 1 <= MAX_DEPTH:
                todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def did_you_mean(word: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def split_workload(data: dict[str, Any], where: str) -> dict[str, Any] | None:
    """A [workload] table in `data` becomes data["workload"] = its name; returns its other
    keys (the workload's arguments), or None when there was no table."""
    wl = data.pop("workload", None)
    if not isinstance(wl, dict):
        if wl is not None:
            data["workload"] = wl
        return None
    args = dict(wl)
    name = args.pop("name", None)
    if not isinstance(name, str):
        raise HarnessError(f"{where}.workload: needs name = \"gpt\" (or \"vit\", \"resnet\", "
                           "\"mlp\", or \"package.module:function\")")
    data["workload"] = name
    return args


def from_table(cls: type[T], table: Mapping[str, Any], where: str) -> T:
    """Build dataclass `cls` from `table`, checking keys and types.

    `where` names the table in messages, e.g. "plan.toml [strategies.amp]".
    """
    if not isinstance(table, Mapping):
        raise HarnessError(f"{where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise HarnessError(
                f"{where}: unknown key '{key}'{did_you_mean(key, fields)}; known keys: {known}"
            )
        values[key] = coerce(raw, hints[key], f"{where}.{key}")
    missing = [
        n for n, f in fields.items()
        if n not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise HarnessError(f"{where}: missing key '{missing[0]}'")
    for key, value in values.items():
        bounds = fields[key].metadata.get("range")
        if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = bounds
            if not lo <= value <= hi:
                raise HarnessError(
                    f"{where}.{key}: must be between {_num(lo)} and {_num(hi)}, got {_num(value)}"
                )
    obj = cls(**values)
    check = getattr(obj, "validate", None)
    if callable(check):
        check(where)
    return obj


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a table"
    if tp is type(None):
        return "nothing"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _same_kind(raw: Any, tp: Any) -> bool:
    """Whether `raw` is of the kind `tp` wants (a table for a dataclass or dict, a list
    for a list, a number for a number), so the error of coercing it says more."""
    origin = get_origin(tp)
    if isinstance(raw, Mapping):
        return dataclasses.is_dataclass(tp) or origin is dict or tp is dict
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return tp in (int, float)
    return isinstance(raw, (list, tuple)) and origin in (list, tuple)


def coerce(raw: Any, tp: Any, key: str) -> Any:
    """Check `raw` against annotation `tp`; return it (ints widen to floats)."""
    origin = get_origin(tp)
    if tp is Any:
        return raw
    if origin is Literal:
        if raw in get_args(tp) and type(raw) in {type(a) for a in get_args(tp)}:
            return raw
        raise HarnessError(f"{key}: {raw!r} is not one of {type_name(tp)}")
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            try:
                return coerce(raw, arg, key)
            except HarnessError as e:
                errors.append((arg, e))
        for arg, e in errors:  # a table or list of the right kind: its own mistake
            if _same_kind(raw, arg):
                raise e from None
        raise HarnessError(f"{key}: expected {type_name(tp)}, got {_show(raw)}")
    if tp is type(None):
        if raw is None:
            return None
        raise HarnessError(f"{key}: expected nothing, got {_show(raw)}")
    if tp is bool:
        if isinstance(raw, bool):
            return raw
    elif tp is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
    elif tp is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            if raw != raw:
                raise HarnessError(f"{key}: nan is not a value it can take; give a number")
            return float(raw)
    elif tp is str:
        if isinstance(raw, str):
            return raw
    elif origin in (list, tuple):
        if isinstance(raw, (list, tuple)):
            args = get_args(tp)
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(raw) != len(args):
                    raise HarnessError(f"{key}: expected {len(args)} values, got {len(raw)}")
                pairs = enumerate(zip(raw, args, strict=True))
                return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in pairs)
            item = args[0] if args else Any
            out = [coerce(v, item, f"{key}[{i}]") for i, v in enumerate(raw)]
            return tuple(out) if origin is tuple else out
    elif origin is dict or tp is dict:
        if isinstance(raw, Mapping):
            return dict(raw)
    elif dataclasses.is_dataclass(tp):
        return from_table(tp, raw, key)
    else:
        raise TypeError(f"config type {tp!r} for {key} is not supported")
    raise HarnessError(f"{key}: expected {type_name(tp)}, got {_show(raw)}")


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e18:
        return str(int(x))
    return f"{x:g}"


def _show(raw: Any) -> str:
    text = repr(raw)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} ({type(raw).__name__})"


def to_table(obj: Any) -> Any:
    """The inverse of from_table: a dataclass as plain TOML-able values (None dropped)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_table(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if getattr(obj, f.name) is not None
        }
    if isinstance(obj, Mapping):
        return {k: to_table(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [to_table(v) for v in obj]
    return obj


class TomlFile:
    """For dataclasses users write as TOML with a [workload] table (plans, studies):
    the workload's name and arguments share one table, the betas are a list."""

    @classmethod
    def from_toml(cls, path: str | Path) -> Self:
        return cls.from_dict(read_toml(path), where=str(path))

    def to_dict(self) -> dict[str, Any]:
        table = to_table(self)
        table.pop("workload_args", None)
        table["workload"] = {"name": self.workload, **to_table(self.workload_args)}
        table["optimizer"]["betas"] = list(self.optimizer.betas)
        return table

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def replace(self, **changes: Any):
        import copy

        return dataclasses.replace(copy.deepcopy(self), **changes)
