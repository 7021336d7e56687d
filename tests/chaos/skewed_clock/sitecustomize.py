"""Loaded (via PYTHONPATH) by the chaos suite's serve processes whose wall clock is skewed.

It shifts `time.time` and `time.time_ns` by `DELAYQ_CHAOS_CLOCK_SKEW_S` seconds, as a host whose
NTP is off would: every wall-clock read of delayq, kazoo, aiohttp and logging goes through them
(delayq reads `datetime.now` only to check a cron expression's syntax). The monotonic clock,
sleeps and timed waits stay real.

Why not libfaketime (which `tests/service/test_clock_skew.py` still uses for one short-lived
process): under it, the chaos suite's skewed processes stopped running for 1-7 s at a time with
no fault injected (claimed messages held before their POSTs; the unplanned `serve_stall` windows:
4-13 per seed in c1 and c2, while the same seeds with the same faults and no skew showed none
outside their injected faults), which made the messages they owned late and broke `stalled`.
"""

import os
import time

_SKEW_S = float(os.environ.get("DELAYQ_CHAOS_CLOCK_SKEW_S", "0"))
_SKEW_NS = round(_SKEW_S * 1_000_000_000)
_real_time = time.time
_real_time_ns = time.time_ns


def _time() -> float:
    return _real_time() + _SKEW_S


def _time_ns() -> int:
    return _real_time_ns() + _SKEW_NS


if _SKEW_S:
    time.time = _time
    time.time_ns = _time_ns
