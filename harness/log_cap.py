"""Keeping a trial's log files bounded on disk while it runs.

A trial's output goes to files under out/logs/ (see harness.launch): the
launcher's own redirects (rank0/stdout.log and stderr.log for one process,
agent.log for torchrun) and, with torchrun, each rank's stdout.log and
stderr.log. Over a day-long study a chatty trial would fill the disk, so while a
trial runs the launcher stats those files every CHECK_S, and once more when it
has ended, and cuts any that takes more than the cap: LOG_CAP_BYTES (64 MiB), or
the environment variable HARNESS_LOG_CAP_BYTES (bytes, or a size such as 8MiB).

A cut keeps the file's first lines (up to HEAD_BYTES: the worker's header there
names the rank), then one marker line, then the file's last KEEP_BYTES from a
line start (the latest output, which a failure's reason quotes):

    [harness: log cut at 67112960 bytes (cut 1; cap 67108864 bytes, HARNESS_LOG_CAP_BYTES);
     about 66846720 bytes of output dropped so far; the latest output follows]

(one line in the file). The cut is in place: os.ftruncate to the kept head, then
the marker and the kept tail appended, so a writer whose descriptor appends
(O_APPEND) carries on at the new end. The launcher opens its redirects so, and
each rank makes its stdout and stderr so (`append_output`, from
harness.worker), since torchrun opens the ranks' files without it. A writer
that does not append carries on at its old offset and leaves a hole: the file's
apparent size keeps growing, the disk it takes does not, and that is what the cap
counts (st_blocks); rank_logs.tail skips the hole's NUL bytes.

Limits: a cut races the writer for a moment. The tail is read to the end of the
file (and again until nothing more came), then the truncation and the write of
the marker and the kept tail follow back to back: only what the writer adds in
the instant between the last read and the truncation is lost, and what it adds
between the truncation and the write lands just before the marker. And a file may
pass the cap by what the trial writes in CHECK_S before the next look (a flood of
300 MB in a second is cut only after it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from pathlib import Path

from harness.units import parse_bytes

LOG_CAP_BYTES = 64 * 2**20
CAP_ENV = "HARNESS_LOG_CAP_BYTES"
MIN_CAP_BYTES = 64 * 2**10
HEAD_BYTES = 4096
KEEP_BYTES = 256 * 2**10
CHECK_S = 0.5
NAMES = ("stdout.log", "stderr.log", "agent.log")


def cap_bytes() -> int:
    """The cap from HARNESS_LOG_CAP_BYTES, else LOG_CAP_BYTES; HarnessError when unreadable."""
    text = os.environ.get(CAP_ENV, "").strip()
    return max(MIN_CAP_BYTES, parse_bytes(text, CAP_ENV)) if text else LOG_CAP_BYTES


def disk_bytes(st: os.stat_result) -> int:
    """What a file takes on disk: its size, less its holes."""
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else min(st.st_size, blocks * 512)


def append_output(fds: tuple[int, ...] = (1, 2)) -> None:
    """In a trial's process: make its stdout and stderr, where they are files, append
    (O_APPEND), so that after a cut they carry on at the file's new end."""
    for fd in fds:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)


class LogCap:
    """The log files under `root` (named as NAMES), kept under `cap` bytes on disk."""

    def __init__(self, root: Path, cap: int | None = None, every_s: float = CHECK_S) -> None:
        self.root = Path(root)
        self.cap = max(MIN_CAP_BYTES, cap) if cap is not None else cap_bytes()
        self.every_s = every_s
        self.cuts: dict[Path, int] = {}  # how many times each file was cut
        self.dropped: dict[Path, int] = {}  # about how many bytes each lost
        self._heads: dict[Path, int] = {}  # the length of each file's kept head
        self._next = 0.0

    def files(self) -> list[Path]:
        try:
            return [p for p in self.root.rglob("*.log") if p.name in NAMES]
        except OSError:
            return []

    def check(self, force: bool = False) -> None:
        """Cut the files over the cap; at most every `every_s` unless `force`."""
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every_s
        for path in self.files():
            try:
                if disk_bytes(path.stat()) > self.cap:
                    self.cut(path)
            except OSError:
                continue

    def cut(self, path: Path) -> None:
        """Keep the head, a marker line and the latest output of `path` (see the doc)."""
        head_room, keep_room = min(HEAD_BYTES, self.cap // 8), min(KEEP_BYTES, self.cap // 4)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)  # appends: the marker lands at the end
        try:
            if path not in self._heads:  # whole lines only; the marker goes after them
                self._heads[path] = os.pread(fd, head_room, 0).rfind(b"\n") + 1
            head = self._heads[path]
            st = os.fstat(fd)
            start = max(head, st.st_size - keep_room)
            kept, at = b"", start
            for _ in range(64):  # to the end, and what the writer adds meanwhile (bounded)
                more = os.pread(fd, 1 << 20, at)
                if not more:
                    break
                kept, at = (kept + more)[-2 * keep_room:], at + len(more)
            cut_off = len(kept) > keep_room
            kept = kept[-keep_room:].replace(b"\0", b"")  # a hole: see the doc
            if (start > head or cut_off) and b"\n" in kept:
                kept = kept.split(b"\n", 1)[1]
            n = self.cuts[path] = self.cuts.get(path, 0) + 1
            dropped = self.dropped[path] = (
                self.dropped.get(path, 0) + max(0, disk_bytes(st) - head - len(kept)))
            marker = (f"[harness: log cut at {at} bytes (cut {n}; cap {self.cap} bytes, "
                      f"{CAP_ENV}); about {dropped} bytes of output dropped so far; the latest "
                      "output follows]\n").encode()
            # Back to back, so a line the writer adds in between is all but impossible.
            os.ftruncate(fd, head)
            os.write(fd, marker + kept)
        finally:
            os.close(fd)

    def summary(self) -> dict[str, str]:
        """Each cut file (relative to the root): how often it was cut and what it lost."""
        return {str(p.relative_to(self.root)): f"cut {n} time(s), about {self.dropped[p]} "
                f"bytes dropped" for p, n in sorted(self.cuts.items())}
