"""How the suite shares its two workers (tests/workers.py): groups, order, the `alone` lock."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from tests import workers


class FakeItem:
    def __init__(self, nodeid: str, *fixtures: str) -> None:
        self.nodeid, self.fixturenames, self.marks = nodeid, list(fixtures), []

    def add_marker(self, mark) -> None:
        self.marks.append(mark)

    def group(self) -> str:
        return next(m.args[0] for m in self.marks if m.name == "xdist_group")


def test_modules_sharing_a_launch_are_one_group_and_the_long_groups_go_first():
    items = [FakeItem("tests/test_a.py::one"), FakeItem("tests/test_a.py::two"),
             FakeItem("tests/test_b.py::uses", "parallel_records"),
             FakeItem("tests/test_b.py::plain"),
             FakeItem("tests/slurm/test_s.py::job"),
             FakeItem("tests/test_c.py::study", "quickstart_study", "tmp_path"),
             FakeItem("tests/test_d.py::also", "parallel_records"),
             FakeItem("tests/test_cli.py::long")]  # a long module of its own, in FIRST
    workers.group_items(items)
    assert [i.nodeid for i in items] == [
        "tests/slurm/test_s.py::job", "tests/test_c.py::study", "tests/test_b.py::uses",
        "tests/test_b.py::plain", "tests/test_d.py::also", "tests/test_cli.py::long",
        "tests/test_a.py::one", "tests/test_a.py::two"]
    groups = {i.nodeid: i.group() for i in items}
    # the whole module follows its test that uses the shared launch
    assert groups["tests/test_b.py::plain"] == groups["tests/test_d.py::also"] == "parallel-launch"
    assert groups["tests/test_a.py::one"] == groups["tests/test_a.py::two"] == "tests/test_a.py"
    assert groups["tests/slurm/test_s.py::job"] == "slurm"
    # the study's users are not `alone`: the fixture runs the study alone_now
    assert not [i for i in items if any(m.name == "alone" for m in i.marks)]


def test_the_modules_that_wait_are_spread_through_the_rest():
    rest = [FakeItem(f"tests/test_{m}.py::{n}") for m in "abcd" for n in ("x", "y")]
    items = [FakeItem("tests/tuner/test_confirm.py::w"), *rest,
             FakeItem("tests/tuner/test_postgres.py::w"), FakeItem("tests/test_cli.py::c")]
    workers.group_items(items)
    # FIRST's, then the longest waiting one at once, the next after half of the rest
    assert [i.nodeid.split("::")[0].split("/")[-1] for i in items] == [
        "test_cli.py", "test_postgres.py", "test_a.py", "test_a.py", "test_b.py", "test_b.py",
        "test_confirm.py", "test_c.py", "test_c.py", "test_d.py", "test_d.py"]


def _around(exclusive) -> list[str]:
    """What happens when `exclusive(events)` starts while another test runs and a third
    starts once it waits: the events, in order."""
    events: list[str] = []
    first_in = threading.Event()

    def shared(name: str, hold: float) -> None:
        with workers.turn(alone=False):
            events.append(f"{name} in")
            first_in.set()
            time.sleep(hold)
            events.append(f"{name} out")

    running = threading.Thread(target=shared, args=("first", 0.5))
    running.start()
    assert first_in.wait(10)
    waiting = threading.Thread(target=exclusive, args=(events,))
    waiting.start()
    blocked_on(workers._lock_folder() / "running")  # it holds the turnstile now ...
    later = threading.Thread(target=shared, args=("next", 0.0))
    later.start()  # ... so this one waits behind it
    for t in (running, waiting, later):
        t.join(20)
    return events


def test_an_alone_test_waits_for_the_running_one_and_holds_the_next_back(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")

    def alone(events: list[str]) -> None:
        with workers.turn(alone=True):
            events.append("alone in")
            time.sleep(0.3)
            events.append("alone out")

    assert _around(alone) == ["first in", "first out", "alone in", "alone out", "next in",
                              "next out"]


def test_a_block_alone_now_waits_for_the_other_test_and_holds_the_next_back(monkeypatch):
    """A session fixture's costly part (the quickstart study) runs alone_now within a
    test's shared turn: the other worker's running test ends first, its next one waits
    until the block is over (not until the whole test is), then runs beside the rest."""
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")

    def fixture_user(events: list[str]) -> None:
        with workers.turn(alone=False):
            with workers.alone_now():
                events.append("alone in")
                time.sleep(0.3)
                events.append("alone out")
            time.sleep(0.5)  # the test goes on, beside the next one
            events.append("reader out")

    assert _around(fixture_user) == ["first in", "first out", "alone in", "alone out",
                                     "next in", "next out", "reader out"]


def blocked_on(path, timeout: float = 20.0) -> None:
    """Wait until some lock request on `path` is blocked (Linux's /proc/locks marks it
    "->")."""
    inode = f":{path.stat().st_ino} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            if any("->" in line and inode in line for line in locks):
                return
        time.sleep(0.01)
    raise AssertionError(f"no lock request on {path} was blocked")


@pytest.mark.parametrize("alone", [False, True])
def test_the_lock_is_let_go_when_a_test_fails(monkeypatch, alone):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    with pytest.raises(RuntimeError), workers.turn(alone=alone):
        raise RuntimeError("the test failed")
    with workers.turn(alone=True):  # would block forever if the lock were kept
        pass


@pytest.mark.parametrize("users", [None, "4"])
def test_processes_get_one_thread_except_beside_an_alone_test(monkeypatch, users):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    monkeypatch.setattr(workers, "_set_here", {})
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # so that monkeypatch restores what was there
    if users is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", users)
    workers.one_thread_for_processes()
    ours = users or "1"
    assert os.environ["OMP_NUM_THREADS"] == ours
    with workers.turn(alone=False):
        assert os.environ["OMP_NUM_THREADS"] == ours
    with workers.turn(alone=True):  # the user's value stays; ours is lifted
        assert os.environ.get("OMP_NUM_THREADS") == users
    assert os.environ["OMP_NUM_THREADS"] == ours
