"""Reading values out of stored records: the one number coercion and the one dotted
lookup that the reports and the selftest page share, so that both read a record alike."""

from __future__ import annotations

import math
from typing import Any


def get(record: Any, dotted: str, default: Any = None) -> Any:
    """record["a"]["b"] for "a.b"; `default` where a step is missing or the value is null."""
    for key in dotted.split("."):
        if not isinstance(record, dict) or key not in record:
            return default
        record = record[key]
    return default if record is None else record


def number(x: Any, finite: bool = False) -> float | None:
    """A record value as a float, or None where it is not a number.

    Numbers and numeric strings count ("1.5", "inf": a record that kept a non-finite
    float as text); NaN, pandas' NA, None, booleans and other text do not. Infinity is
    kept (an unbounded prediction is a figure) unless `finite` asks for finite only."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):  # text, pandas' NA, a dict
        return None
    if math.isnan(v) or (finite and math.isinf(v)):
        return None
    return v
