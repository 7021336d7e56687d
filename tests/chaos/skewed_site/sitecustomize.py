"""Loaded (via PYTHONPATH) only by serve processes running under libfaketime.

libfaketime 0.9.10 (Debian) with FAKETIME_DONT_FAKE_MONOTONIC=1 rewrites Python's
`time.sleep` (clock_nanosleep on CLOCK_MONOTONIC with TIMER_ABSTIME) into an invalid call:
every `time.sleep` raises OSError EINVAL, which kills kazoo's connection thread on its first
reconnect. Faking the monotonic clock instead hangs every timed lock wait. So the skewed
processes keep a real monotonic clock and sleep on a timed lock acquire (sem_clockwait, which
libfaketime leaves alone): the wall clock is skewed, nothing else changes.
"""

import threading
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex) -> None:
    length = float(seconds)  # type: ignore[arg-type,unused-ignore]  # int or float
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    lock = threading.Lock()
    lock.acquire()
    lock.acquire(timeout=length)


time.sleep = _sleep
