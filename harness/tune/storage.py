"""Where a study's Optuna trials live, shared by every worker that tunes it.

    (no --storage)        runs/<study>/optuna.journal: workers on one machine
    journal:PATH          a journal file on a filesystem the machines share (no server)
    redis://HOST/...      Optuna's Redis journal
    postgresql://...      an RDB (any SQLAlchemy URL): what a cluster should use

An RDB storage gets three things beyond Optuna's defaults, set in the study's
[storage] table (harness.tune.storage.StorageSpec):

    heartbeats   a running trial's worker records one every `heartbeat`; a trial
                 silent for `grace` is failed by whichever worker notices first,
                 recorded, and run again (`retries` times) by a live worker
    patience     a database that goes away (a restart, a failover) is waited for:
                 every storage call is retried for up to `patience`, then the
                 worker stops with one clear line (exit 3); pool_pre_ping
                 replaces the connections a restart broke
    redaction    the URL's password is shown as *** in every message, record and
                 file (put it in PGPASSWORD or ~/.pgpass to keep it off the
                 command line altogether)
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import optuna
from optuna.storages import BaseStorage, RDBStorage

from harness.core.config import bounded
from harness.core.errors import HarnessError
from harness.core.units import parse_duration


@dataclass
class StorageSpec:
    """The study's [storage] table: how workers sharing an RDB storage watch each other."""

    heartbeat: str | float = "60s"  # a running trial's worker says it is alive this often
    grace: str | float = "3m"  # silence after which another worker fails the trial
    retries: int = bounded(1, 0, 100)  # runs again of a trial whose worker died
    patience: str | float = "10m"  # how long a worker waits for an unreachable storage

    def validate(self, where: str) -> None:
        beat = parse_duration(self.heartbeat, f"{where}.heartbeat")
        grace = parse_duration(self.grace, f"{where}.grace")
        parse_duration(self.patience, f"{where}.patience")
        if beat < 1:
            raise HarnessError(f"{where}.heartbeat: at least 1s (Optuna counts whole seconds)")
        if grace <= beat:
            raise HarnessError(f"{where}.grace: must be longer than heartbeat ({self.heartbeat}), "
                               "or live trials would be failed")

    def seconds(self, key: str) -> int:
        return max(1, round(parse_duration(getattr(self, key), f"storage.{key}")))


STORAGE_ENV = "HARNESS_STORAGE"  # --storage, for processes started without it in argv


class StorageUnreachable(HarnessError):
    """The storage stayed unreachable for longer than storage.patience."""

    exit_code = 3


# --- opening a storage ------------------------------------------------------------
def make_storage(url: str | None, run_dir: Path, spec: StorageSpec | None = None,
                 say: Callable[[str], None] | None = None) -> BaseStorage:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if url is None or url.startswith("journal:") or url.endswith(".journal"):
        path = Path(url.removeprefix("journal:")) if url else run_dir / "optuna.journal"
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("redis://"):
        from optuna.storages.journal import JournalRedisBackend

        return JournalStorage(JournalRedisBackend(url))
    if "://" not in url:
        raise HarnessError(f"--storage {redact(url)!r}: give an RDB URL (postgresql://user@host/"
                           "db, sqlite:///file.db), redis://..., or journal:PATH")
    spec = spec or StorageSpec()
    # Optuna warns on every ask() that heartbeats are meant for Study.optimize; the
    # tuner drives them itself (Heartbeat, fail_stale_trials below).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed",
                            category=UserWarning)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return PatientRDBStorage(
                url, spec.seconds("patience"), say or _say,
                engine_kwargs={"pool_pre_ping": True},
                heartbeat_interval=spec.seconds("heartbeat"), grace_period=spec.seconds("grace"))
    except Exception as e:  # a driver missing, a server not there: the user's to fix
        raise HarnessError(f"--storage {redact(url)}: cannot open ({type(e).__name__}: "
                           f"{scrub(_first_line(e), url)})") from None


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
    cause = e.__cause__ or e
    lines = str(cause).strip().splitlines() or [type(cause).__name__]
    return lines[0][:200]


# --- keeping the password out of sight ----------------------------------------------
def describe_storage(url: str | None, run_dir: Path) -> str:
    return redact(url) if url else f"journal:{run_dir / 'optuna.journal'}"


def redact(url: str) -> str:
    """The URL with its password replaced by ***."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def password_of(url: str | None) -> str | None:
    try:
        return urlsplit(url or "").password or None
    except ValueError:
        return None


def scrub(text: str, url: str | None) -> str:
    """`text` with the URL's password (as written and decoded) replaced by ***."""
    secret = password_of(url)
    for form in {secret, secret and unquote(secret), secret and quote(secret, safe="")}:
        if form:
            text = text.replace(form, "***")
    return text


# --- an RDB storage that waits out a database restart --------------------------------
class PatientRDBStorage(RDBStorage):
    """RDBStorage whose calls are retried while the database cannot be reached."""

    def __init__(self, url: str, patience_s: float, say: Callable[[str], None], **kw: Any):
        super().__init__(url, **kw)
        self.shown = redact(url)
        self.patience_s = patience_s
        self.say = say
        self.gave_up: str | None = None
        self.on_stale: Callable[[optuna.Study, Any], None] | None = None

    def get_heartbeat_stale_trial_callback(self):
        return self.on_stale  # set by the tuner once it knows where to record


def _is_connection_error(e: BaseException) -> bool:
    """A lost or refused connection anywhere in the exception's chain (Optuna wraps
    SQLAlchemy's errors in StorageInternalError); a session left broken by one
    (PendingRollbackError) counts too."""
    import sqlalchemy.exc as sa

    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, (sa.OperationalError, sa.InterfaceError, sa.PendingRollbackError)):
            return True
        if isinstance(seen, sa.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _patient(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self: PatientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        if self.gave_up:
            raise StorageUnreachable(self.gave_up)
        first, delay = None, 0.5
        while True:
            try:
                result = method(self, *args, **kwargs)
            except Exception as e:
                if not _is_connection_error(e):
                    raise
                now = time.monotonic()
                if first is None:
                    first = now
                    self.say(f"storage {self.shown} unreachable ({_first_line(e)}); retrying "
                             f"for up to {self.patience_s:.0f} s")
                if now - first >= self.patience_s:
                    self.gave_up = (
                        f"storage {self.shown} unreachable for {now - first:.0f} s "
                        f"({_first_line(e)}); this worker stops. Every finished trial is in "
                        "trials.jsonl: once the database is back, continue with "
                        "`harness tune --resume --out RUN_FOLDER --storage URL`")
                    raise StorageUnreachable(self.gave_up) from None
                with contextlib.suppress(Exception):  # a fresh session for the next try
                    self.scoped_session.remove()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if first is not None:
                self.say(f"storage {self.shown} reachable again after "
                         f"{time.monotonic() - first:.0f} s")
            return result
    return call


# Every public call, and the private ones Optuna's cache (_CachedStorage) makes.
_PATIENT = [n for n in dir(BaseStorage) if not n.startswith("_")
            and callable(getattr(BaseStorage, n))] + [
    "record_heartbeat", "_get_stale_trial_ids", "_get_trials", "_create_new_trial",
    "_get_best_trial_id", "_set_trial_param"]
for _name in _PATIENT:
    setattr(PatientRDBStorage, _name, _patient(getattr(RDBStorage, _name)))


def backend(study: optuna.Study) -> BaseStorage:
    """The study's storage under Optuna's cache (it wraps every RDBStorage)."""
    return getattr(study._storage, "_backend", study._storage)


# --- heartbeats ----------------------------------------------------------------------
class Heartbeat:
    """While a trial runs, record its heartbeat every interval (RDB storages only). A
    beat that fails (the database restarting) is skipped, never waited for: a trial
    must not stall on its heartbeat."""

    def __init__(self, study: optuna.Study, trial_id: int):
        storage = backend(study)
        self.storage = storage if isinstance(storage, PatientRDBStorage) else None
        self.trial_id = trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.storage is not None and self.storage.get_heartbeat_interval():
            self._thread = threading.Thread(target=self._beat, daemon=True,
                                            name=f"heartbeat-{self.trial_id}")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _beat(self) -> None:
        interval = self.storage.get_heartbeat_interval()
        while True:
            # Not the patient method; a failed beat is retried next interval, and the
            # grace period covers a short outage.
            with contextlib.suppress(Exception):
                RDBStorage.record_heartbeat(self.storage, self.trial_id)
            if self._stop.wait(interval):
                return


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail the trials whose worker stopped beating; the storage's on_stale hook records
    and retries each (harness.tune.resume.StaleTrials)."""
    if isinstance(backend(study), PatientRDBStorage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
