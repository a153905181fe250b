"""Keeping a trial's log files bounded on disk while it runs.

A trial's output goes to files under out/logs/ (see training_harness.launch.local): the
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

(one line in the file). The cut is in place, and a writer whose descriptor
appends (O_APPEND) carries on at the file's new end. The launcher opens its
redirects so, and each rank makes its stdout and stderr so (`append_output`, from
training_harness.measure.rank_main), since torchrun opens the ranks' files without it. A writer
that does not append carries on at its old offset and leaves a hole: the file's
apparent size keeps growing, the disk it takes does not, and that is what the cap
counts (st_blocks); rank_logs.tail skips the hole's NUL bytes.

How the middle goes: where the file system can (ext4, XFS), the kernel takes it
out of the file (fallocate's COLLAPSE_RANGE, in whole blocks) and makes room for
the marker after the head (INSERT_RANGE). The writer's appends are never touched,
so nothing it writes during a cut is lost or moved: the head keeps whole blocks
(the marker line starts with a newline for the line cut there), and the kept tail
starts at a block boundary, mid-line. Elsewhere (tmpfs, overlayfs...) the file is
truncated to its head and the marker and the tail it read are written back, back
to back; that races the writer for a moment: what it adds between the last read
and the truncation is lost, and what it adds between the truncation and the write
lands before the marker (CI saw a print's text land there and its newline after).

Limit: a file may pass the cap by what the trial writes in CHECK_S before the
next look (a flood of 300 MB in a second is cut only after it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import os
import time
from pathlib import Path

from training_harness.core.units import parse_bytes

LOG_CAP_BYTES = 64 * 2**20
CAP_ENV = "HARNESS_LOG_CAP_BYTES"
MIN_CAP_BYTES = 64 * 2**10
HEAD_BYTES = 4096
KEEP_BYTES = 256 * 2**10
CHECK_S = 0.5
NAMES = ("stdout.log", "stderr.log", "agent.log")
COLLAPSE_RANGE, INSERT_RANGE = 0x08, 0x20  # fallocate modes (linux/falloc.h)


def cap_bytes() -> int:
    """The cap from HARNESS_LOG_CAP_BYTES, else LOG_CAP_BYTES; HarnessError when unreadable."""
    text = os.environ.get(CAP_ENV, "").strip()
    return max(MIN_CAP_BYTES, parse_bytes(text, CAP_ENV)) if text else LOG_CAP_BYTES


def disk_bytes(st: os.stat_result) -> int:
    """What a file takes on disk: its size, less its holes."""
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else min(st.st_size, blocks * 512)


class LogCap:
    """The log files under `root` (named as NAMES), kept under `cap` bytes on disk."""

    def __init__(self, root: Path, cap: int | None = None, every_s: float = CHECK_S) -> None:
        self.root = Path(root)
        self.cap = max(MIN_CAP_BYTES, cap) if cap is not None else cap_bytes()
        self.every_s = every_s
        self.cuts: dict[Path, int] = {}  # how many times each file was cut
        self.dropped: dict[Path, int] = {}  # about how many bytes each lost
        self._heads: dict[Path, int] = {}  # the length of each file's kept head
        self._markers: dict[Path, int] = {}  # where each collapsed file's marker block is
        self._rewritten: set[Path] = set()  # files cut by rewriting: never collapsed after
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
            with contextlib.suppress(OSError):
                if disk_bytes(path.stat()) > self.cap:
                    self.cut(path)

    def cut(self, path: Path) -> None:
        """Keep the head, a marker line and the latest output of `path` (see the doc)."""
        head_room = min(HEAD_BYTES, self.cap // 8)
        if path not in self._heads:  # whole lines only; the marker goes after them
            with open(path, "rb") as f:
                self._heads[path] = f.read(head_room).rfind(b"\n") + 1
        if path not in self._rewritten and self._collapse(path):
            return
        self._rewrite(path)

    def _marker(self, path: Path, at: int, dropped: int) -> bytes:
        n = self.cuts[path] = self.cuts.get(path, 0) + 1
        self.dropped[path] = self.dropped.get(path, 0) + dropped
        return (f"[harness: log cut at {at} bytes (cut {n}; cap {self.cap} bytes, "
                f"{CAP_ENV}); about {self.dropped[path]} bytes of output dropped so far; "
                "the latest output follows]").encode()

    def _collapse(self, path: Path) -> bool:
        """Cut by taking the middle out of the file in the kernel; False where the file
        system cannot (nothing was changed then)."""
        keep_room = min(KEEP_BYTES, self.cap // 4)
        fd = os.open(path, os.O_RDWR)  # not O_APPEND: the marker is written in place
        try:
            block = os.fstatvfs(fd).f_bsize
            at = os.fstat(fd).st_size
            marker_at = self._markers.get(path, -(-self._heads[path] // block) * block)
            start = marker_at + block  # the marker's block, then what is dropped
            end = (at - keep_room) // block * block
            if path not in self._markers:  # make room for the marker first
                if end <= marker_at or not _fallocate(fd, INSERT_RANGE, marker_at, block):
                    return False
                self._markers[path] = marker_at
                end += block
            elif end <= start:
                return True  # nothing whole to take out yet
            if not _fallocate(fd, COLLAPSE_RANGE, start, end - start):
                return False  # (the marker's block is dropped by the rewrite)
            line = self._marker(path, at, end - start)[: block - 2]
            os.pwrite(fd, b"\n" + line.ljust(block - 2) + b"\n", marker_at)
            return True
        finally:
            os.close(fd)

    def _rewrite(self, path: Path) -> None:
        """Cut by truncating to the head and writing the marker and the tail back."""
        self._rewritten.add(path)
        self._markers.pop(path, None)
        keep_room = min(KEEP_BYTES, self.cap // 4)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)  # appends: the marker lands at the end
        try:
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
            marker = self._marker(path, at, max(0, disk_bytes(st) - head - len(kept))) + b"\n"
            # Back to back, so a line the writer adds in between is all but impossible.
            os.ftruncate(fd, head)
            os.write(fd, marker + kept)
        finally:
            os.close(fd)

    def summary(self) -> dict[str, str]:
        """Each cut file (relative to the root): how often it was cut and what it lost."""
        return {str(p.relative_to(self.root)): f"cut {n} time(s), about {self.dropped[p]} "
                f"bytes dropped" for p, n in sorted(self.cuts.items())}


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "fallocate"):
        return None
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc


def _fallocate(fd: int, mode: int, offset: int, length: int) -> bool:
    """fallocate(2) with `mode`: True when done, False where the file system (or the
    platform) does not offer it; other errors raise."""
    libc = _libc()
    if libc is None:
        return False
    if libc.fallocate(fd, mode, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err))
