"""Human-readable numbers for summaries, and parsing of sizes users type."""

from __future__ import annotations

import math
import re

from training_harness.core.errors import HarnessError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def parse_bytes(text: str, what: str = "size") -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise HarnessError(f"{what} {text!r}: write a size such as 70GiB, 512MiB or 8GB")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(size):
        raise HarnessError(f"{what} {_short(text)}: too large; write a size such as 70GiB or 8GB")
    return int(size)


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{s / 60:.1f} min"


def format_rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    for prefix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_S = 3650 * 86400  # ten years: timers and clocks stay finite


def parse_duration(text: str | float | int, what: str = "duration") -> float:
    """Seconds from `90s`, `30m`, `6h`, `1d`, `1h30m` or a plain number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        parts = re.findall(r"([0-9]*\.?[0-9]+)\s*([smhd])", str(text).strip().lower())
        joined = "".join(f"{n}{u}" for n, u in parts)
        if not parts or joined != re.sub(r"\s+", "", str(text).strip().lower()):
            raise HarnessError(
                f"{what} {text!r}: write a positive duration such as 90s, 30m, 6h or 1d"
            )
        seconds = sum(float(n) * _DURATION[u] for n, u in parts)
    if not seconds > 0:
        raise HarnessError(
            f"{what} {text!r}: must be above 0; write a duration such as 90s, 30m, 6h or 1d"
        )
    if not seconds <= MAX_DURATION_S:  # also refuses nan and inf
        raise HarnessError(f"{what} {_short(text)}: must be at most {MAX_DURATION_S // 86400}d; "
                           "write a duration such as 90s, 30m, 6h or 1d")
    return seconds


def _short(text: str | float) -> str:
    """`text` as a message shows it: quoted, and cut short when it is long."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."
