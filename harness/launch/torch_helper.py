"""The tuner's client of its torch-side helper (training_harness.measure.torch_helper_server).

    probe = shared()                     # one helper per tuner, started lazily
    facts = probe.study_facts(study)     # the study checked here (HarnessError if not)
    prepared = probe.prepare(plan)       # the plan checked, estimated, FLOPs counted

The tuner process never imports torch: what needs it is asked of this helper.
The helper is a fork of the rank server (training_harness.launch.rank_server.serve), whose
imports (torch, the strategies, the estimator) the trials share, or, where ranks
are not forked, a process of its own (training_harness.measure.torch_helper_server). It ends
with the tuner (its connection, or its stdin, closes).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.prepared import PreparedPlan
from training_harness.launch import rank_server
from training_harness.launch.local import import_path
from training_harness.study.machine_facts import MachineFacts


class ProbeCrashed(RuntimeError):
    """The helper failed in a way that is not the user's mistake (a bug, or it died)."""


class TorchHelper:
    def __init__(self) -> None:
        self._proc: Any = None  # the helper: a fork of the rank server, or a Popen
        self._conn: Any = None  # the fork's connection (None for a process: its pipes)
        self._stderr: Any = None  # the helper's stderr, read back to explain a crash
        self._log: str | None = None  # its file's name, until the helper has it open
        self._lock = threading.Lock()  # one question at a time

    def devices(self) -> dict[str, Any]:
        """{"cuda": how many CUDA devices are visible here}."""
        return self._ask({"op": "devices"})

    def study_facts(self, study: Any) -> MachineFacts:
        """`study` (training_harness.study.study_file.Study) checked against the registry and
        this machine; its [known_good] comes back normalised."""
        facts = MachineFacts.from_json(self._ask({"op": "study", "study": study.to_dict()}))
        study.known_good = facts.known_good
        return facts

    def prepare(self, plan: Plan, peaks: dict[str, Any] | None = None,
                phases: dict[str, float] | None = None) -> PreparedPlan:
        """The plan checked, resolved and estimated; HarnessError when refused here.
        `peaks`: the study's fixed peaks (MachineFacts.peaks), used where they hold the
        plan's dtype. `phases`, when given, gets where the helper's time went
        (training_harness.measure.prepare's phases)."""
        request = {"op": "prepare", "plan": plan.to_dict(), "peaks": peaks or {}}
        return PreparedPlan.from_dict(self._ask(request, phases))

    def _ask(self, request: dict[str, Any], phases: dict[str, float] | None = None) -> Any:
        line = json.dumps({**request, "cwd": os.getcwd(), "path": import_path()}, default=str)
        with self._lock:
            self._start()
            try:
                if self._conn is not None:
                    self._conn.send_bytes(line.encode())
                    line = self._conn.recv_bytes().decode()
                else:
                    self._proc.stdin.write(line + "\n")
                    self._proc.stdin.flush()
                    line = self._proc.stdout.readline()
            except (BrokenPipeError, EOFError, OSError):
                line = ""
            if not line:
                code = self._ended()
                raise ProbeCrashed(f"the torch-side helper stopped (exit {code}): "
                                   f"{self._stderr_tail()}")
            self._unlink_log()  # the helper answered: it holds its log open
        answer = json.loads(line)
        if phases is not None:
            phases.update(answer.get("phases_s") or {})
        return _ok(answer)

    def _start(self) -> None:
        """The helper, started if it is not running. Where one-node trials are forked from
        the rank server, it is a fork of that server too (rank_server.serve): torch is
        imported once for the tuner's trials and its questions, not a second time."""
        if self._alive():
            return
        if self._proc is not None:  # it died since the last question: forgotten, replaced
            self._ended()
        # Its warnings must not reach the display; kept to explain a crash. The file's
        # name goes once the helper holds it open (a tuner killed later leaves none).
        self._unlink_log()  # a helper that died before answering: its file too
        fd, self._log = tempfile.mkstemp(prefix="harness-helper-")
        self._stderr = os.fdopen(fd, "w+b")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            import_path(os.environ.get("PYTHONPATH")))}
        if rank_server.enabled():
            self._proc, self._conn = rank_server.serve(env, self._log)
        else:
            self._conn = None
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "training_harness.measure.torch_helper_server"], env=env,
                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
            self._unlink_log()  # it has the file already

    def _alive(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            return False
        # A fork's exit status comes through the rank server, a moment after its death;
        # its end of the connection closes as it dies: readable before a question = gone.
        return self._conn is None or not self._conn.poll()

    def _ended(self) -> int | None:
        """The stopped helper's exit status; it is forgotten (the next question starts one)."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if conn is not None:
            conn.close()
        return proc.wait()

    def _unlink_log(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace").strip()

    def close(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        stderr, self._stderr = self._stderr, None
        try:
            self._stop(proc, conn)
        finally:
            self._unlink_log()
            if stderr is not None:
                stderr.close()

    @staticmethod
    def _stop(proc: Any, conn: Any) -> None:
        if conn is not None:  # the helper ends when its connection, or its stdin, closes
            conn.close()
        if proc is None or proc.poll() is not None:
            return
        if conn is None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ok(answer: dict[str, Any]) -> Any:
    """The helper's answer: what it found, or the user's mistake raised as HarnessError."""
    if "error" in answer:
        error = HarnessError(answer["error"])
        error.exit_code = answer.get("exit_code", 2)
        raise error
    if "crash" in answer:
        raise ProbeCrashed(f"the torch-side helper failed:\n{answer['crash']}")
    return answer["ok"]


_SHARED: TorchHelper | None = None


def shared() -> TorchHelper:
    """This process's helper: one for all the studies it checks or runs."""
    global _SHARED
    if _SHARED is None:
        _SHARED = TorchHelper()
        atexit.register(_SHARED.close)
    return _SHARED
