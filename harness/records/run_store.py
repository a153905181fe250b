"""The run folder of a study, the contract `harness report` reads:

    runs/<study>/study.toml          the study as run, every default filled in
    runs/<study>/study.json          name, objective, directions, budgets, device, times,
                                     storage (password redacted), best and baseline trial,
                                     n_trials, stopped_because
    runs/<study>/trials.jsonl        one TrialResult.to_dict() per line
    runs/<study>/trials/<trial_id>/  plan.toml, command.txt, logs/, result.json
    runs/<study>/best.toml           the best configuration, a plan `harness bench` runs
    runs/<study>/optuna.journal      the default Optuna storage

Several workers append to trials.jsonl: each line is written with one write()
under an exclusive lock (fcntl), so lines never interleave, and a reader skips a
last line cut short by a killed writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.core.errors import HarnessError
from harness.records.result import TrialResult


class RunFolderUnwritable(HarnessError):
    """The run folder stopped taking writes (disk full, permissions, removed)."""

    exit_code = 3

    def __init__(self, store: RunStore, error: OSError):
        super().__init__(
            f"cannot write {error.filename} ({error.strerror or error}): the study stops. "
            f"Every finished trial is in {store.trials_jsonl} and the storage; free space "
            f"or fix permissions, then `harness tune --resume --out {store.root}`")


class RunStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.study_toml = self.root / "study.toml"
        self.study_json = self.root / "study.json"
        self.trials_jsonl = self.root / "trials.jsonl"
        self.trials_dir = self.root / "trials"
        self.best_toml = self.root / "best.toml"
        self.journal = self.root / "optuna.journal"
        self._lock_file = self.root / ".lock"

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
        data = record.to_dict() if isinstance(record, TrialResult) else record
        line = (json.dumps(data, allow_nan=False) + "\n").encode()
        with self.locked():
            fd = os.open(self.trials_jsonl, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)

    def records(self) -> list[dict[str, Any]]:
        try:
            text = self.trials_jsonl.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut short by a killed writer
        return out

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


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
