"""How long this process has been running, for the phases a command or a rank reports."""

from __future__ import annotations

import contextlib
import os
import time


def process_age_s() -> float | None:
    """Seconds since this process started (a fork: since the fork), to about 10 ms;
    None where it cannot be read.

    On Linux from /proc/self/stat (its start in clock ticks since boot) and the clock
    since boot: psutil's create_time() adds the boot time, which /proc/stat gives in
    whole seconds, and would be up to a second off."""
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start)
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # a platform psutil cannot read either: the phase is left out
        return None
