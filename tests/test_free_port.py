"""free_port under concurrent launches (issue 23): two calls, in threads of one process or
in two processes of one machine, never hand out the same port, even where the OS offers
the same one twice."""

from __future__ import annotations

import threading

import pytest

from training_harness.core import ports


@pytest.fixture(autouse=True)
def own_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_PORTS_DIR", str(tmp_path / "ports"))
    monkeypatch.setattr(ports, "_handed", {})


def test_concurrent_calls_never_return_the_same_port(monkeypatch):
    """The OS offers 40000 to everyone first (a port closed and handed out again)."""
    offers = iter([40000, 40000, 40000, 40001, 40000, 40002] + list(range(40003, 40100)))
    offer_lock = threading.Lock()

    def os_port(host):
        with offer_lock:
            return next(offers)

    monkeypatch.setattr(ports, "_os_port", os_port)
    got: list[int] = []
    barrier = threading.Barrier(2)

    def call():
        barrier.wait()
        got.append(ports.free_port())

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] != got[1] and 40000 in got


def test_many_real_concurrent_calls_are_all_different():
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(ports.free_port())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 16


def test_another_process_reservation_is_respected(monkeypatch):
    offers = iter([40000, 40000, 40005])
    monkeypatch.setattr(ports, "_os_port", lambda host: next(offers))
    assert ports.free_port() == 40000
    monkeypatch.setattr(ports, "_handed", {})  # another process: only the files are shared
    assert ports.free_port() == 40005


def test_a_stale_reservation_is_taken_over(monkeypatch):
    monkeypatch.setattr(ports, "_os_port", lambda host: 40000)
    assert ports.free_port() == 40000
    monkeypatch.setattr(ports, "_handed", {})
    now = ports.time.time()
    monkeypatch.setattr(ports.time, "time", lambda: now + ports.RESERVE_S + 1)
    assert ports.free_port() == 40000
