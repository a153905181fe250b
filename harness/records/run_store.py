"""The run folder of a study, the contract `harness report` reads:

    runs/<study>/study.toml          the study as run, every default filled in
    runs/<study>/study.json          name, objective, directions, budgets, device, times,
                                     storage (password redacted), best and baseline trial,
                                     n_trials, stopped_because
    runs/<study>/trials.jsonl        one TrialResult.to_dict() per line
    runs/<study>/trials/<trial_id>/  plan.toml, command.txt, logs/, result.json
    runs/<study>/best.toml           the best configuration, a plan `harness bench` runs
    runs/<study>/optuna.journal      the default Optuna storage

Several workers append to trials.jsonl: each line is written under an exclusive
lock (fcntl), so lines never interleave; a short write is continued, and a write
that fails (a full disk) takes its partial line back out before it raises. A line
that does not parse (a writer may be mid-line) is returned by `read` as Unreadable,
for the caller to name; the reports and the selftest read the file with
`jsonl_lines.read_trials`, which names it too.

A line cut short (power lost, a full disk, a network file system) is never written
after: `append` (and `repair`, which a tuner runs on --resume) first copies an
unreadable line's bytes beside the file, `trials.jsonl.torn-<byte>-line<N>`, then
cuts it out; a whole record glued after torn bytes (written by an older harness)
stays, on a line of its own. Each cut is said, with the file, line and copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.records.jsonl_lines import Unreadable, cut_copies, parse_lines
from training_harness.records.result import TrialResult


class RunFolderUnwritable(HarnessError):
    """The run folder stopped taking writes (disk full, permissions, removed)."""

    exit_code = 3

    def __init__(self, store: RunStore, error: OSError):
        where = error.filename or f"in {store.root}"
        super().__init__(
            f"cannot write {where} ({error.strerror or error}): the study stops. "
            f"Every finished trial is in {store.trials_jsonl} and the storage; free space "
            f"or fix permissions, then `harness tune --resume --out {store.root}`")

    @staticmethod
    def stops(store: RunStore, error: OSError) -> bool:
        """Whether `error` is the run folder's: a write of one of its files, or a full
        disk or quota where the failed call did not say which file (a write to an open
        file, such as the Optuna journal's)."""
        return store.holds(error.filename) or (
            error.filename is None and error.errno in (errno.ENOSPC, errno.EDQUOT))


class RunStore:
    def __init__(self, root: str | Path, say: Callable[[str], None] | None = None):
        self.root = Path(root)
        self.study_toml = self.root / "study.toml"
        self.study_json = self.root / "study.json"
        self.trials_jsonl = self.root / "trials.jsonl"
        self.trials_dir = self.root / "trials"
        self.best_toml = self.root / "best.toml"
        self._lock_file = self.root / ".lock"
        self.cut: list[Unreadable] = []  # lines this process cut out of trials.jsonl
        # trials.jsonl's whole lines parsed so far (their bytes, records, line count):
        # a study reads its records several times per trial, and the file only grows
        self._parsed: tuple[bytes, list[dict[str, Any]], int] = (b"", [], 0)
        # where a cut line of trials.jsonl is named (stderr unless told)
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))

    def exists(self) -> bool:
        return self.study_toml.exists()

    def create(self, study_toml: str) -> None:
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.study_toml, study_toml)
        self.trials_jsonl.touch()

    def holds(self, path: str | os.PathLike | None) -> bool:
        """Whether `path` is inside this run folder."""
        if path is None:
            return False
        try:
            return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(self.root))
        except (TypeError, ValueError):
            return False

    def trial_dir(self, trial_id: int | str) -> Path:
        return self.trials_dir / str(trial_id)

    @contextlib.contextmanager
    def locked(self, name: str = "") -> Iterator[None]:
        """An exclusive lock among processes on this folder; `name` picks one of several
        (one process must not take the same lock twice: flock would wait on itself)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._lock_file.with_name(f".{name}.lock") if name else self._lock_file
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # --- trials.jsonl ------------------------------------------------------------
    def append(self, record: TrialResult | dict[str, Any]) -> None:
        """Add one record as a line of trials.jsonl, whole and on disk (fsync), or raise
        OSError naming trials.jsonl with the file as it was. A line cut short before it
        (its writer died) is cut out first (`repair`), and said (`say`)."""
        data = record.to_dict() if isinstance(record, TrialResult) else record
        line = (json.dumps(data, allow_nan=False) + "\n").encode()
        with self.locked():
            try:
                fd, end = self._open_end()
                try:
                    _write_all(fd, line, end)
                finally:
                    os.close(fd)
            except OSError as e:
                raise _named(e, self.trials_jsonl) from e

    def _open_end(self) -> tuple[int, int]:
        """trials.jsonl opened to append (under the lock), and its size; a torn last
        line cut out first."""
        fd = os.open(self.trials_jsonl, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":  # a torn last line
            os.close(fd)
            for u in self._repair():  # may replace the file: opened again after
                self.say(u.describe())
            fd = os.open(self.trials_jsonl, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            end = os.fstat(fd).st_size
        return fd, end

    def records(self) -> list[dict[str, Any]]:
        """The records of trials.jsonl, in order; a line that is not one is skipped
        (`read` names it). The record dicts are shared between calls: read, don't change."""
        return self.read()[0]

    def read(self) -> tuple[list[dict[str, Any]], list[Unreadable]]:
        """The records, and the lines that are not records. Only what was appended since
        the last read is parsed, while the file still begins with what was read then."""
        try:
            data = self.trials_jsonl.read_bytes()
        except FileNotFoundError:
            return [], []
        prefix, known, lines = self._parsed
        if not data.startswith(prefix):  # rewritten (repaired): parsed anew
            prefix, known, lines = b"", [], 0
        whole = data.rfind(b"\n") + 1  # the part made of whole lines
        new, bad = parse_lines(self.trials_jsonl, data[len(prefix):whole],
                               first_line=lines + 1, first_offset=len(prefix))
        records = known + new
        lines += data.count(b"\n", len(prefix), whole)
        if not bad:
            self._parsed = (data[:whole], records, lines)
        tail, torn = parse_lines(self.trials_jsonl, data[whole:], first_line=lines + 1,
                                 first_offset=whole)
        return records + tail, bad + torn

    def repair(self) -> list[Unreadable]:
        """Cut every unreadable line out of trials.jsonl, each one's bytes kept beside
        it first; the file then parses whole. Returns the lines cut."""
        with self.locked():
            return self._repair()

    def _repair(self) -> list[Unreadable]:
        try:
            data = self.trials_jsonl.read_bytes()
        except FileNotFoundError:
            return []
        records, bad = parse_lines(self.trials_jsonl, data)
        if not bad and data and not data.endswith(b"\n"):  # a whole last line: end it
            with open(self.trials_jsonl, "ab") as f:
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
            return []
        if not bad:
            return []
        cut = [self._keep(u) for u in bad]
        if len(bad) == 1 and bad[0].torn and bad[0].salvaged is None:  # the usual case
            with open(self.trials_jsonl, "r+b") as f:  # a torn tail: truncated
                f.truncate(bad[0].offset)
                os.fsync(f.fileno())
        else:  # damage inside: the file written again without those lines (the other
            # lines' bytes as they were; a glued record on a line of its own)
            at = {u.offset: u for u in bad}
            kept, offset = [], 0
            for chunk in data.split(b"\n"):
                u = at.get(offset)
                if u is None and chunk.strip():
                    kept.append(chunk + b"\n")
                elif u is not None and u.glued_at is not None:
                    kept.append(chunk[u.glued_at:] + b"\n")
                offset += len(chunk) + 1
            write_atomic(self.trials_jsonl, b"".join(kept))
        self.cut.extend(cut)
        return cut

    def _keep(self, u: Unreadable) -> Unreadable:
        """A copy of the line's bytes beside trials.jsonl (fsync'd), before it is cut."""
        path = self.trials_jsonl.with_name(
            f"{self.trials_jsonl.name}.torn-{u.offset}-line{u.line}")
        n = 1
        while path.exists() and path.read_bytes() != u.data:  # torn twice at one byte
            n += 1
            path = path.with_name(f"{self.trials_jsonl.name}.torn-{u.offset}-line{u.line}-{n}")
        write_atomic(path, u.data)
        return dataclasses.replace(u, kept=path)

    def kept(self) -> list[Unreadable]:
        """The unreadable lines cut out of trials.jsonl so far (their copies), oldest
        first."""
        return cut_copies(self.trials_jsonl)

    # --- study.json and best.toml ----------------------------------------------------
    def read_info(self) -> dict[str, Any]:
        try:
            return json.loads(self.study_json.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def update_info(self, **changes: Any) -> dict[str, Any]:
        with self.locked():
            info = {**self.read_info(), **changes}
            write_atomic(self.study_json, json.dumps(info, indent=2, default=str) + "\n")
        return info

    def write_trial_files(self, trial_id: int | str, plan_toml: str, command: str) -> Path:
        folder = self.trial_dir(trial_id)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "plan.toml", plan_toml)
        write_atomic(folder / "command.txt", command + "\n")
        return folder


# mkstemp makes its file 0600; a run folder is read by a team and by other nodes' jobs,
# so a file is given the mode open() would give it (read once: os.umask only swaps it)
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace `path` whole (fsync'd), or raise OSError naming it and leave it as it
    was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise _named(e, path) from e
    try:
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)
            _write_all(fd, data, 0)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _named(e, path) from e
        raise


def _write_all(fd: int, data: bytes, start: int) -> None:
    """Write `data` at the end of `fd` (at byte `start`), to the last byte, then fsync.
    A short write is continued; on an error the file is cut back to `start`."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(errno.EIO, f"write() wrote nothing ({len(view)} bytes left)")
            view = view[n:]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def _named(error: OSError, path: Path) -> OSError:
    """`error` with the file it was writing (a write to an open file names none)."""
    if error.filename is not None:
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))
