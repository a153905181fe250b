"""Where a study's Optuna trials live, shared by every worker that tunes it.

    (no --storage)        runs/<study>/optuna.journal: workers on one machine
    journal:PATH          a journal file on a filesystem the machines share (no server)
    redis://HOST/...      Optuna's Redis journal
    postgresql://...      an RDB (any SQLAlchemy URL): what a cluster should use

An RDB storage is wrapped in PatientStorage, which gets three things beyond
Optuna's defaults, set in the study's [storage] table (training_harness.study.storage_spec):

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

PatientStorage also tells the tuner (StorageHooks, given by training_harness.tune.session)
which trial it holds from the moment the trial is RUNNING, so that a worker that
gives up on the database leaves a record for it: a trial Optuna's ask() creates is born tagged
with its worker (`stamp`), and a queued trial ask() claims is reported
(`on_claim`) before ask() returns.
"""

from __future__ import annotations

import abc
import contextlib
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from training_harness.core.errors import HarnessError
from training_harness.study.storage_spec import StorageSpec

STORAGE_ENV = "HARNESS_STORAGE"  # --storage, for processes started without it in argv


class StorageUnreachable(HarnessError):
    """The storage stayed unreachable for longer than storage.patience."""

    exit_code = 3


# --- opening a storage ------------------------------------------------------------
def make_storage(url: str | None, run_dir: Path, spec: StorageSpec | None = None,
                 say: Callable[[str], None] | None = None,
                 hooks: StorageHooks | None = None) -> BaseStorage:
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
    # tuner drives them itself (Heartbeat below, and training_harness.tune.recovery.resume.settle).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed",
                            category=UserWarning)
    try:
        rdb = _open_rdb(url, spec, hooks.on_stale if hooks else None)
        return PatientStorage(rdb, redact(url), spec.seconds("patience"), say or say_stderr, hooks)
    except Exception as e:  # a driver missing, a server not there: the user's to fix
        raise HarnessError(f"--storage {redact(url)}: cannot open ({type(e).__name__}: "
                           f"{scrub(_first_line(e), url)})") from None


def _open_rdb(url: str, spec: StorageSpec, on_stale: Callable | None = None,
              tries: int = 3) -> RDBStorage:
    """Optuna's RDBStorage, which makes its tables on a new database. Workers started
    at the same moment on one new database race to make them (PostgreSQL: a unique
    violation in pg_type); the loser tries again and finds them made. `on_stale`: what
    Optuna's fail_stale_trials calls for each trial it fails (fail_stale_trials below)."""
    import sqlalchemy.exc as sa

    for attempt in range(tries):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(url, engine_kwargs={"pool_pre_ping": True},
                                  heartbeat_interval=spec.seconds("heartbeat"),
                                  grace_period=spec.seconds("grace"),
                                  heartbeat_stale_trial_callback=on_stale)
        except (sa.IntegrityError, sa.ProgrammingError):
            if attempt + 1 == tries:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise ValueError(f"tries must be 1 or more, not {tries}")


def say_stderr(text: str) -> None:
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
def _forward(name: str) -> Callable:
    def call(self: PatientStorage, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(getattr(self.backend, name), *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _forwarding(cls: type) -> type:
    """Every method of Optuna's storage interface that `cls` does not write out forwards
    to its backend, patiently (BaseStorage's concrete ones too: RDBStorage has faster ones)."""
    names = (BaseStorage.__abstractmethods__
             | {n for n, v in vars(BaseStorage).items() if not n.startswith("_") and callable(v)})
    for name in sorted(names - set(vars(cls))):
        setattr(cls, name, _forward(name))
    return abc.update_abstractmethods(cls)


# A trial's beats from its creation until the tuner's Heartbeat takes over: longer than
# any ask(), short enough that a trial an exception left behind still goes stale.
BRIDGE_S = 120.0


@dataclass
class StorageHooks:
    """What an RDB storage tells the tuner, given when it is made (tune.session)."""

    stamp: dict[str, Any] = field(default_factory=dict)  # a trial ask() creates is born with
    on_claim: Callable[[FrozenTrial], None] | None = None  # a queued trial ask() took
    on_give_up: Callable[[], None] | None = None  # just before StorageUnreachable
    on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None  # silent trial failed


@_forwarding
class PatientStorage(BaseStorage):
    """An RDBStorage behind Optuna's storage interface: every call is forwarded to it,
    and one that cannot reach the database is retried for `patience_s`, then raises
    StorageUnreachable (and every later call at once). The methods not written out
    below are forwarded as they are (_forwarding). It is not one of Optuna's heartbeat
    storages (that interface is private to Optuna): the tuner beats (Heartbeat) and
    fails the silent trials (fail_stale_trials) itself, through the database's own."""

    def __init__(self, backend: RDBStorage, shown: str, patience_s: float,
                 say: Callable[[str], None], hooks: StorageHooks | None = None):
        self.backend, self.shown, self.patience_s, self.say = backend, shown, patience_s, say
        self.gave_up: str | None = None
        self.hooks = hooks or StorageHooks()
        self._bridges: dict[int, Heartbeat] = {}  # trial id -> beats until the tuner's own

    def patiently(self, method: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.gave_up:
            raise StorageUnreachable(self.gave_up)
        first, delay = None, 0.5
        while True:
            try:
                result = method(*args, **kwargs)
            except Exception as e:
                if not _is_connection_error(e):
                    raise
                now = time.monotonic()
                if first is None:
                    first = now
                    self.say(f"storage {self.shown} unreachable ({_first_line(e)}); retrying "
                             f"for up to {self.patience_s:.0f} s")
                if now - first >= self.patience_s:
                    self._give_up(f"storage {self.shown} unreachable for {now - first:.0f} s "
                                  f"({_first_line(e)}); this worker stops. Every finished trial "
                                  "is in trials.jsonl: once the database is back, continue with "
                                  "`harness tune --resume --out RUN_FOLDER --storage URL`")
                with contextlib.suppress(Exception):  # a fresh session for the next try
                    self.backend.remove_session()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if first is not None:
                self.say(f"storage {self.shown} reachable again after "
                         f"{time.monotonic() - first:.0f} s")
            return result

    def _give_up(self, message: str) -> None:
        self.gave_up = message
        if self.hooks.on_give_up is not None:  # the held trial's record, before the worker stops
            try:
                self.hooks.on_give_up()
            except OSError as e:  # the run folder too: the message below still stands
                self.say(f"could not record the trial this worker held: {e}")
        raise StorageUnreachable(message) from None

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        stamp = self.hooks.stamp
        if template_trial is None and stamp:
            # ask()'s new trial carries its owner from the first moment it is RUNNING:
            # whenever its worker stops, resume.py can tell whose it was.
            template_trial = optuna.trial.create_trial(state=TrialState.RUNNING,
                                                       user_attrs=stamp)
        trial_id = self.patiently(self.backend.create_new_trial, study_id, template_trial)
        if stamp and (template_trial is None or template_trial.state == TrialState.RUNNING):
            self._first_beat(trial_id)
        return trial_id

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        if state.is_finished():
            self.end_bridge(trial_id)
        if state != TrialState.RUNNING or self.hooks.on_claim is None:
            return self.patiently(self.backend.set_trial_state_values, trial_id, state, values)
        # ask() claims a queued trial: read which one first, so that the tuner knows the
        # trial it holds even if the database goes away before ask() returns.
        queued = self.get_trial(trial_id)
        claimed = self.patiently(self.backend.set_trial_state_values, trial_id, state, values)
        if claimed:
            self._first_beat(trial_id)
            self.hooks.on_claim(queued)
        return claimed

    def _first_beat(self, trial_id: int) -> None:
        """A trial this worker starts beats at once: if the worker dies before its
        Heartbeat thread runs, the trial still goes stale and is failed and retried (a
        trial that never beat never goes stale). It goes on beating while the sampler
        chooses its configuration (inside ask(), which may take seconds on a loaded
        machine), until the tuner's own Heartbeat takes over or the trial finishes."""
        if self.backend.get_heartbeat_interval():
            with contextlib.suppress(Exception):
                self.backend.record_heartbeat(trial_id)
            self._bridges[trial_id] = Heartbeat(self, trial_id, BRIDGE_S).__enter__()

    def end_bridge(self, trial_id: int) -> None:
        """Stop the beats `_first_beat` started for the trial (its Heartbeat took over)."""
        bridge = self._bridges.pop(trial_id, None)
        if bridge is not None:
            bridge.__exit__(None, None, None)

    def record_heartbeat(self, trial_id: int) -> None:
        self.backend.record_heartbeat(trial_id)  # one try: a beat never stalls its trial

    def get_heartbeat_interval(self) -> int | None:
        return self.backend.get_heartbeat_interval()


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


def fail_stale_trials(study: optuna.Study, storage: BaseStorage) -> None:
    """Fail the trials whose worker stopped beating (RDB storages): Optuna's own
    fail_stale_trials over the study on the database itself, patiently; the database's
    stale-trial callback, the hooks' on_stale, records and retries each
    (training_harness.tune.recovery.resume.StaleTrials)."""
    if isinstance(storage, PatientStorage) and storage.get_heartbeat_interval():
        storage.patiently(_fail_stale, study.study_name, storage.backend)


def _fail_stale(study_name: str, rdb: RDBStorage) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(optuna.load_study(
            study_name=study_name, storage=rdb, sampler=optuna.samplers.RandomSampler()))


# --- heartbeats ----------------------------------------------------------------------
class Heartbeat:
    """While a trial runs, record its heartbeat every interval. A beat that fails (the
    database restarting) is skipped, never waited for: a trial must not stall on its
    heartbeat, and the grace period covers a short outage."""

    def __init__(self, storage: PatientStorage, trial_id: int, for_at_most_s: float = 0.0):
        self.storage, self.trial_id = storage, trial_id
        self.for_at_most_s = for_at_most_s  # 0: until the block ends
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if not self.for_at_most_s:  # the tuner's own: the bridge from ask() ends here
            self.storage.end_bridge(self.trial_id)
        if self.storage.get_heartbeat_interval():
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
        end = time.monotonic() + (self.for_at_most_s or float("inf"))
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                self.storage.record_heartbeat(self.trial_id)
            if self._stop.wait(interval):
                return
