"""The fake launcher (fake_launch.py) as a launcher of trials that run elsewhere: it says
`max_jobs = 2`, as the Slurm launcher does with [cluster] max_jobs = 2, so the tuner
keeps two of its trials in flight at once, each in its own thread.

The first two trials meet at a barrier before they run: they finish only if both were
in flight at once. With HOLD set, each trial instead calls HOLD(trial_id) once started
(a test stops the tuner there). ENDED keeps how each launch ended.
"""

from __future__ import annotations

import threading

from tests.tuner import fake_launch

MEET = threading.Barrier(2, timeout=30)
HOLD = None
ENDED: list[tuple[object, str]] = []  # (trial id, "ok" or the exception's type)
_met: list[object] = []


def launch(prep, out_dir, command, *, trial_id=None, **kwargs):
    try:
        if HOLD is not None:
            HOLD(trial_id)
        elif len(_met) < 2:
            _met.append(trial_id)
            MEET.wait()  # BrokenBarrierError when the other is not in flight meanwhile
        result = fake_launch.launch(prep, out_dir, command, trial_id=trial_id, **kwargs)
    except BaseException as e:
        ENDED.append((trial_id, type(e).__name__))
        raise
    ENDED.append((trial_id, "ok"))
    return result


launch.max_jobs = 2  # type: ignore[attr-defined]


def reset() -> None:
    global HOLD
    HOLD = None
    MEET.reset()
    ENDED.clear()
    _met.clear()
