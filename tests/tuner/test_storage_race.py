"""Workers started at the same moment on one new database race to make Optuna's tables
(PostgreSQL: "duplicate key value violates unique constraint pg_type_typname_nsp_index");
the loser opens the storage again instead of stopping with exit 2. Seen with two
`harness tune` processes on a fresh PostgreSQL (tests/slurm/test_two_tuners_postgres.py);
here the lost race is staged on SQLite, so the test needs no server and fails for sure
without the retry."""

from __future__ import annotations

import pytest
import sqlalchemy.exc as sa

from training_harness.core.errors import HarnessError
from training_harness.tune import storage


def lost_races(monkeypatch, n: int) -> list[int]:
    real, calls = storage.RDBStorage, []

    def rdb(*args, **kwargs):
        calls.append(1)
        if len(calls) <= n:  # another worker made the tables first
            raise sa.IntegrityError("CREATE TABLE studies", {}, Exception(
                'duplicate key value violates unique constraint "pg_type_typname_nsp_index"'))
        return real(*args, **kwargs)

    monkeypatch.setattr(storage, "RDBStorage", rdb)
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    return calls


def test_a_worker_that_lost_the_race_to_make_the_tables_opens_them(tmp_path, monkeypatch):
    calls = lost_races(monkeypatch, 1)
    opened = storage.make_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    assert isinstance(opened, storage.PatientStorage) and len(calls) == 2
    opened.backend.engine.dispose()


def test_a_database_that_keeps_refusing_is_still_one_line(tmp_path, monkeypatch):
    calls = lost_races(monkeypatch, 10)
    with pytest.raises(HarnessError, match="cannot open .IntegrityError"):
        storage.make_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path)
    assert len(calls) == 3
