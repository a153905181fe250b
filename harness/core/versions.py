"""The installed dependencies against the ranges the harness declares and was tested with.

The ranges are read from the installed distribution's own metadata (pyproject.toml's
`dependencies` and extras), so they are never written twice. A dependency outside its
range, or a core one missing, is said in one line that names the fix
(docs/dependencies.md). Torch-free: the command line checks the core ones at its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from training_harness.core.errors import HarnessError

DIST = "training-harness"


@dataclass(frozen=True)
class Declared:
    """One dependency as declared: its range, and the extra that brings it (None: core)."""

    name: str
    spec: str  # e.g. ">=4.56,<6"; "" for any version
    extra: str | None

    def installed(self) -> str | None:
        try:
            return metadata.version(self.name)
        except metadata.PackageNotFoundError:
            return None

    def admits(self, version: str) -> bool:
        try:
            return Requirement(f"{self.name}{self.spec}").specifier.contains(
                Version(version), prereleases=True)
        except InvalidVersion:
            return True  # a version pip could not order either: nothing to say

    def fix(self) -> str:
        return f"pip install '{self.name}{self.spec}'"


@cache
def declared() -> tuple[Declared, ...]:
    """Every dependency the installed harness declares; none when it is not installed
    (a source tree on PYTHONPATH has no metadata to read)."""
    try:
        lines = metadata.requires(DIST) or []
        extras = metadata.metadata(DIST).get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        return ()
    found = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == DIST:  # an extra that brings another extra
            continue
        if req.marker is None:
            found.append(Declared(req.name, str(req.specifier), None))
            continue
        for extra in extras:
            if req.marker.evaluate({"extra": extra}):
                found.append(Declared(req.name, str(req.specifier), extra))
                break
    return tuple(found)


def _by_name(name: str) -> Declared | None:
    wanted = name.lower().replace("_", "-")
    return next((d for d in declared() if d.name.lower().replace("_", "-") == wanted), None)


def drift(names: list[str] | None = None) -> list[str]:
    """One line per installed dependency outside its declared range (all of them, or
    those named), each naming the fix."""
    lines, said = [], set()
    for d in declared():
        if (names is not None and d.name not in names) or d.name in said:
            continue
        got = d.installed()
        if got is not None and not d.admits(got):
            said.add(d.name)  # declared twice (transformers: [hf] and [export]): one line
            where = f" (the [{d.extra}] extra)" if d.extra else ""
            lines.append(f"{d.name} {got} is installed; the harness is tested with "
                         f"{d.name}{d.spec}{where}: {d.fix()}")
    return lines


def check_core() -> None:
    """A HarnessError when a core dependency is missing or outside its range."""
    for d in declared():
        if d.extra is None and d.installed() is None:
            raise HarnessError(f"{d.name} is not installed, and the harness needs it: "
                               f"{d.fix()}")
    core = [d.name for d in declared() if d.extra is None]
    if lines := drift(core):
        raise HarnessError("; ".join(lines))


def check(name: str) -> None:
    """A HarnessError when `name` is installed outside its declared range."""
    d = _by_name(name)
    if d is not None and (lines := drift([d.name])):
        raise HarnessError(lines[0])


def explain(error: ImportError) -> str | None:
    """For an import that failed: the line saying which installed dependency is outside
    its range, where one is; None when every one is in range (a bug, not drift)."""
    lines = drift()
    if not lines:
        return None
    return f"{type(error).__name__}: {error}; {'; '.join(lines)}"


def table() -> list[tuple[str, str | None, str, str | None]]:
    """(name, installed or None, declared range, extra) of every declared dependency."""
    return [(d.name, d.installed(), d.spec or "any", d.extra) for d in declared()]
