"""A fork of the rank server keeps multiprocessing's resource tracker to itself.

Forks share the command's tracker through the forkserver unless told otherwise: a
semaphore a rank leaves behind by os._exit (torch's compile workers' on the H200) was
reported when the command ended, on the user's terminal ("There appear to be 5 leaked
semaphore objects" after each `harness tune`). The fork's own tracker cleans it and
says so in the fork's log.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, os, sys
    sys.path.insert(0, sys.argv[2])

    def child(log):
        from training_harness.launch.fork_child import redirect
        redirect(log, log)
        kept = mp.get_context("spawn").Semaphore()  # registered with the tracker
        os._exit(0)  # and left behind, as a rank leaves

    if __name__ == "__main__":
        p = mp.get_context("forkserver").Process(target=child, args=(sys.argv[1],))
        p.start()
        p.join()
        print("child exit", p.exitcode, flush=True)
""")


@pytest.mark.timeout(60)
def test_a_semaphore_a_fork_leaves_is_reported_in_its_log_not_the_commands(tmp_path):
    script, log = tmp_path / "leak.py", tmp_path / "fork.log"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(log), str(ROOT)],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and "child exit 0" in done.stdout, done.stderr
    assert "leaked semaphore" not in done.stderr
    deadline = time.monotonic() + 20  # the fork's tracker reports once its pipe closes
    while "leaked semaphore" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.1)
