"""The lines of a trials.jsonl: each one's record, or what makes it unreadable (a line
cut short by a killed writer or a full disk, or damaged), as RunStore and the report
read them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The copy of an unreadable line of trials.jsonl: <file>.torn-<byte>-line<N>
TORN = re.compile(r"\.torn-(\d+)-line(\d+)(?:-\d+)?$")


@dataclass(frozen=True)
class Unreadable:
    """A line of trials.jsonl that is not a record: cut short, or damaged."""

    path: Path  # the file it was in
    line: int  # its number, from 1
    offset: int  # its first byte
    data: bytes  # its bytes, without the newline
    torn: bool | None  # the file's last line, with no newline after it (None: unknown)
    kept: Path | None = None  # the copy of its bytes, beside the file
    salvaged: str | None = None  # the trial id of a whole record found at its end
    glued_at: int | None = None  # where that record begins in `data`

    def trial(self) -> tuple[str | None, int | None]:
        """The trial id and Optuna number its bytes name (None: cut before them)."""
        text = self.data[:self.glued_at].decode(errors="replace")
        m = re.search(r'"trial_id": ("(?:[^"\\]|\\.)*"|-?\d+)[,}]', text)
        n = re.search(r'"optuna_number": (\d+)[,}]', text)
        tid = str(json.loads(m.group(1))) if m else None
        return tid, int(n.group(1)) if n else None

    def where(self) -> str:
        """Where it was and where its bytes are, for a record's reason."""
        kept = self.kept.name if self.kept is not None else "nowhere"
        return f"{self.path.name} line {self.line}, byte {self.offset}; its bytes kept in {kept}"

    def describe(self) -> str:
        tid, _ = self.trial()
        what = {True: "cut short", False: "not a record", None: "unreadable"}[self.torn]
        whose = f" (trial {tid}'s record)" if tid is not None else ""
        head = self.data[:self.glued_at][:48].decode(errors="replace")
        size = len(self.data) if self.glued_at is None else self.glued_at
        text = (f"{self.path} line {self.line} (byte {self.offset}) was {what}: "
                f"{size} bytes{whose}, beginning {head!r}")
        if self.salvaged is not None:
            text += (f", then the whole record of trial {self.salvaged} (written onto them), "
                     "which stays on a line of its own")
        if self.kept is not None:
            text += (f"; the line's {len(self.data)} bytes are kept in {self.kept}, and the "
                     "line was cut out")
        return text

    @classmethod
    def from_copy(cls, path: Path) -> Unreadable | None:
        m = TORN.search(path.name)
        if m is None:
            return None
        try:
            data = path.read_bytes()
        except OSError:
            return None
        at, salvaged = _glued(data)
        return cls(path.with_name(path.name[:m.start()]), int(m.group(2)), int(m.group(1)),
                   data, None, kept=path,
                   salvaged=None if salvaged is None else str(salvaged.get("trial_id")),
                   glued_at=at)


def parse_lines(path: Path, data: bytes, first_line: int = 1, first_offset: int = 0
                ) -> tuple[list[dict[str, Any]], list[Unreadable]]:
    """The records in `data` (a trials.jsonl, or its part from line `first_line` at byte
    `first_offset`), and its lines that are not records (a whole record found glued
    after unreadable bytes is kept, and its line named)."""
    lines = list(numbered_lines(path, data, first_line, first_offset))
    return [r for _, r, _ in lines if r is not None], [u for _, _, u in lines if u is not None]


def numbered_lines(path: Path, data: bytes, first_line: int = 1, first_offset: int = 0
                   ) -> Iterator[tuple[int, dict[str, Any] | None, Unreadable | None]]:
    """(line number, its record or None, the line as Unreadable or None) for each line
    of `data` that is not blank; a line may have both (a record glued after torn
    bytes). `data` may be the part of a file from line `first_line` at byte
    `first_offset`."""
    offset = first_offset
    chunks = data.split(b"\n")
    for i, chunk in enumerate(chunks):
        if chunk.strip():
            record = _record(chunk)
            line = first_line + i
            if record is not None:
                yield line, record, None
            else:
                at, salvaged = _glued(chunk)
                yield line, salvaged, Unreadable(
                    path, line, offset, chunk, torn=i == len(chunks) - 1,
                    salvaged=None if salvaged is None else str(salvaged.get("trial_id")),
                    glued_at=at)
        offset += len(chunk) + 1


def _record(chunk: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(chunk)  # bytes: UTF-8, strictly (a cut character fails)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _glued(chunk: bytes) -> tuple[int | None, dict[str, Any] | None]:
    """A whole record that ends an unreadable line (appended after a torn one by an
    older harness), and where it begins."""
    at = chunk.find(b'{"', 1)
    while at > 0:
        record = _record(chunk[at:])
        if record is not None and "trial_id" in record and "status" in record:
            return at, record
        at = chunk.find(b'{"', at + 1)
    return None, None


@dataclass(frozen=True)
class TrialsFile:
    """What a trials.jsonl holds, as every reader of a run folder sees it: the records
    (with their line numbers), the lines that are not records, and the copies of such
    lines that a tuner cut out (RunStore.repair). A caller shows `notes()`: a damaged
    line is named, never silently skipped."""

    path: Path
    records: list[tuple[int, dict[str, Any]]]  # (line number, record)
    unreadable: list[Unreadable]  # lines there now that are not records
    cut: list[Unreadable]  # lines cut out by a tuner, their bytes kept beside the file

    def dicts(self) -> list[dict[str, Any]]:
        return [record for _, record in self.records]

    def notes(self) -> list[str]:
        """One line per damaged line, saying what became of it."""
        out = [f"{u.describe()}: skipped (a trial still being written, or a record cut "
               "short: `harness tune --resume` cuts it out and settles its trial)"
               for u in self.unreadable]
        for u in self.cut:
            tid, _ = u.trial()
            whose = f" (trial {tid}'s record)" if tid is not None else ""
            out.append(f"{u.path.name} line {u.line} (byte {u.offset}) was unreadable: its "
                       f"{len(u.data)} bytes{whose} are kept in {u.kept}, cut out of "
                       f"{u.path.name} by a tuner that settled its trial once (recorded "
                       "again from its result.json, or failed: 'record torn')")
        return out


def read_trials(path: Path) -> TrialsFile:
    """The one reader of a trials.jsonl for the reports and the selftest (RunStore reads
    with the same `parse_lines`). A missing file holds nothing; another OSError is raised."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    lines = list(numbered_lines(path, data))
    return TrialsFile(path, [(n, r) for n, r, _ in lines if r is not None],
                      [u for _, _, u in lines if u is not None], cut_copies(path))


def cut_copies(path: Path) -> list[Unreadable]:
    """The unreadable lines cut out of `path` so far (their copies beside it), oldest
    first."""
    found = [u for p in path.parent.glob(f"{path.name}.torn-*")
             if (u := Unreadable.from_copy(p)) is not None]
    return sorted(found, key=lambda u: (u.offset, u.line))
