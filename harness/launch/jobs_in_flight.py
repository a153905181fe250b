"""Several trials in flight at once, for trials that run elsewhere: one thread each.

A trial on Slurm is a job the tuner only waits on (training_harness.launch.slurm), so the
search keeps up to its launcher's `max_jobs` out at once, each waited on by its own
thread, while the main thread asks Optuna for the next (TPE's constant liar keeps
it from proposing what is still running). With a limit of 1 (every local study:
its trials share this machine's cores and devices) each trial runs in the caller's
thread, exactly as it always has.

Ctrl-C or SIGTERM in the main thread stops them all: each running trial's
`should_stop` (wrapped by `guard`) raises KeyboardInterrupt at its launcher's next
poll, so the launcher cancels its job on the way out, as it does for Ctrl-C; the
main thread waits for them, then goes on stopping. None of them is recorded:
--resume settles them as a stopped tuner's trials. An error in one trial's thread
(the run folder, the storage) stops the others the same way and is raised here.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from training_harness.launch import procs
from training_harness.launch.launcher import Launcher

STOP_PATIENCE_S = 120.0  # for the running trials to cancel their jobs (scancel, then gone)


def max_jobs(launcher: Launcher) -> int:
    """Trials the launcher may have in flight at once: its `max_jobs` (the Slurm
    launcher's [cluster] max_jobs; 1 for the local one), at least 1."""
    return max(1, int(launcher.max_jobs or 1))


class InFlight:
    def __init__(self, limit: int):
        self.limit = limit
        self.stopping = threading.Event()
        self._threads: dict[int, threading.Thread] = {}
        self._ended: queue.SimpleQueue = queue.SimpleQueue()  # (serial, value, exception)
        self._inline: list[Any] = []  # limit 1: values of the trials run in this thread
        self._serial = 0

    @property
    def threaded(self) -> bool:
        return self.limit > 1

    @property
    def running(self) -> int:
        return len(self._threads)

    def __enter__(self) -> InFlight:
        self._stack = contextlib.ExitStack()
        if self.threaded:
            self._stack.enter_context(procs.sigterm_as_interrupt())
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self._threads:  # an interruption or an error: the others stop too
                self.stop()
        finally:
            self._stack.close()

    def start(self, fn: Callable[[], Any]) -> None:
        """Run `fn` (one trial): in a thread of its own, or here when the limit is 1.
        Call `room` first: the limit is the caller's to keep."""
        if not self.threaded:
            self._inline.append(fn())
            return
        self._serial += 1
        thread = threading.Thread(target=self._run, args=(self._serial, fn), daemon=True,
                                  name=f"trial-{self._serial}")
        self._threads[self._serial] = thread
        thread.start()

    def _run(self, serial: int, fn: Callable[[], Any]) -> None:
        try:
            if self.stopping.is_set():
                raise KeyboardInterrupt("the tuner is stopping")
            self._ended.put((serial, fn(), None))
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            self._ended.put((serial, None, e))

    def ended(self, wait: bool = False) -> list[Any]:
        """The values of the trials that ended since the last call; with `wait`, at least
        one (when any runs). Raises the first error a trial's thread raised."""
        values, self._inline = self._inline, []
        while self._threads:
            block = wait and not values
            try:  # a timeout, so that Ctrl-C reaches this thread while it waits
                serial, value, error = (self._ended.get(timeout=1.0) if block
                                        else self._ended.get_nowait())
            except queue.Empty:
                if block:
                    continue
                break
            self._threads.pop(serial).join()
            if error is not None:
                raise error
            values.append(value)
        return values

    def room(self) -> list[Any]:
        """Wait until another trial may start; returns the values of those that ended."""
        values = self.ended()
        while self.running >= self.limit:
            values += self.ended(wait=True)
        return values

    def drain(self) -> list[Any]:
        """Wait for every trial in flight; returns their values."""
        values = self.ended()
        while self.running:
            values += self.ended(wait=True)
        return values

    def guard(self, should_stop: Callable[[], str | None] | None
              ) -> Callable[[], str | None] | None:
        """`should_stop` for a trial's launcher that also raises KeyboardInterrupt once
        the tuner is stopping (the launcher cancels its job on the way out)."""
        if not self.threaded:
            return should_stop

        def stop() -> str | None:
            if self.stopping.is_set():
                raise KeyboardInterrupt("the tuner is stopping")
            return should_stop() if should_stop is not None else None
        return stop

    def stop(self, patience_s: float = STOP_PATIENCE_S) -> None:
        """Stop every trial in flight and wait (at most `patience_s`) for their threads."""
        self.stopping.set()
        give_up = time.monotonic() + patience_s
        for thread in list(self._threads.values()):
            thread.join(max(0.0, give_up - time.monotonic()))
        self._threads.clear()
