"""Reading what a trial's ranks left behind: which rank failed, why, and where each hung.

Each rank keeps its stdout and stderr in its own folder (torchrun's --log-dir with
--redirects 3: `<log-dir>/<run id>_<random>/attempt_0/<local rank>/`; ranks
forked from the rank server, and a single process, use `<log-dir>/rank<i>/`). Each
rank has an error file there (TORCHELASTIC_ERROR_FILE, error.json) that
training_harness.measure.rank_main's @record fills with the exception and its traceback.
Only the tails of the logs are read (and error files up to ERROR_FILE_LIMIT),
however much a trial writes.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_harness.measure.rank_process import LOG_HEADER as HEADER
from training_harness.measure.rank_process import stack_file

TAIL_BYTES = 8192
ERROR_FILE_LIMIT = 4 * 2**20  # larger error files are not read

_RANK = re.compile(re.escape(HEADER) + r" rank (\d+) of (\d+)")
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory", re.IGNORECASE)
# Errors a rank sees because another rank went away: never the root cause.
_SYMPTOM = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|"
    r"DistBackendError|communicator was aborted|Socket Timeout|SignalException",
    re.IGNORECASE,
)


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a text file, from a line start; '' when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    # A hole a writer left after a cut (training_harness.launch.log_cap) reads as NULs.
    text = data.replace(b"\0", b"").decode(errors="replace")
    if size > limit and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


def head(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


@dataclass
class RankLog:
    folder: Path
    rank: int | None  # from the worker's first line; None if it never got there
    stderr: str  # the tail
    error: str | None  # the exception line from the error file
    traceback: str | None
    timestamp: int | None
    stacks: str = ""  # the stack it wrote when the launcher asked (training_harness.launch.procs)

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"the process in {self.folder}"

    @property
    def is_oom(self) -> bool:
        return bool(_OOM.search(self.error or "") or _OOM.search(self.stderr))

    @property
    def is_symptom(self) -> bool:
        return bool(self.error and _SYMPTOM.search(self.error))

    def last_lines(self, n: int = 8) -> str:
        """The last n lines of its stderr, ending at its error where it printed one:
        what follows the traceback (an abort on the way out, a faulthandler dump) is
        summed up in one line so it cannot push the traceback out of the quote."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        end = self._error_line(lines)
        if end is None or end == len(lines) - 1:
            return "\n".join(lines[-n:])
        after = lines[end + 1:]
        return "\n".join(lines[max(0, end + 1 - n):end + 1] + [
            f"[then {len(after)} more line{'s' if len(after) > 1 else ''}, "
            f"the first: {after[0].strip()[:200]}]"])

    def _error_line(self, lines: list[str]) -> int | None:
        """Index of the last line that carries the rank's error, if any does."""
        message = (self.error or "").strip().splitlines()
        if not message or len(message[0]) < 8:
            return None  # too short to find honestly
        needle = message[0][:200]
        return next((i for i in range(len(lines) - 1, -1, -1) if needle in lines[i]), None)

    def where(self) -> str | None:
        """Where the main thread was when the rank was stopped: from the stack it wrote
        when asked, else from the one it printed on SIGTERM (faulthandler's dumps)."""
        for text in (self.stacks, self.stderr):
            found = _where(text)
            if found:
                return found
        return None


def _where(dump: str) -> str | None:
    """The innermost frame of the last faulthandler dump that reached the worker."""
    blocks = dump.split("(most recent call first):")
    for block in reversed(blocks[1:]):
        frames = _FRAME.findall(block.split("\n\n", 1)[0])
        if frames and any("rank_main.py" in f or "runpy" in f for f, _, _ in frames):
            file, line, fn = frames[0]
            return f"in {fn} at {Path(file).name}:{line}"
    return None


def _read_error(path: Path) -> tuple[str | None, str | None, int | None]:
    try:
        size = path.stat().st_size
        if size > ERROR_FILE_LIMIT:  # an exception carrying a flood: not read whole
            return f"an error too large to read ({path.name}: {size} bytes)", None, None
        message = json.loads(path.read_text())["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, None, None
    if isinstance(message, str):
        return message.strip().splitlines()[0][:500] if message.strip() else None, None, None
    text = str(message.get("message", "")).strip()
    extra = message.get("extraInfo") or {}
    stamp = extra.get("timestamp")
    return (
        text.splitlines()[0][:500] if text else None,
        extra.get("py_callstack"),
        int(stamp) if str(stamp or "").isdigit() else None,
    )


def read_rank_logs(log_dir: Path) -> list[RankLog]:
    """Every rank folder under `log_dir`, by rank."""
    found = []
    for stderr in sorted(Path(log_dir).rglob("stderr.log")):
        folder = stderr.parent
        m = _RANK.search(head(stderr))
        rank = int(m.group(1)) if m else None
        error, tb, stamp = _read_error(folder / "error.json")
        stacks = tail(Path(stack_file(log_dir, rank))) if rank is not None else ""
        found.append(RankLog(folder, rank, tail(stderr), error, tb, stamp, stacks))
    return sorted(found, key=lambda r: (r.rank is None, r.rank or 0))


def root_cause(logs: list[RankLog]) -> RankLog | None:
    """The rank that failed first: an error that is not a symptom of another rank's
    failure before one that is, then the earliest, then the lowest rank."""
    failed = [r for r in logs if r.error]
    if not failed:
        return None
    return min(failed, key=lambda r: (r.is_symptom, r.timestamp or 0, r.rank or 0))


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = ", as the kernel's out-of-memory killer does" if -code == 9 else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"


_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)",
    re.DOTALL,
)


def agent_root_cause(agent_log: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun's closing summary names."""
    m = _ROOT_CAUSE.search(agent_log)
    return (int(m.group(1)), int(m.group(2))) if m else None


def log_paths(logs: list[RankLog]) -> dict[str, Any]:
    return {str(r.rank if r.rank is not None else r.folder.name): str(r.folder) for r in logs}
