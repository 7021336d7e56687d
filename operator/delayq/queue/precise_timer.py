"""A timer for the event loop that fires within a tenth of a millisecond of its instant.

asyncio's timers wake whole milliseconds late: the selector waits with `epoll_wait`, whose
timeout is in ms, and Python rounds the remaining time up (Python 3.11, `selectors.
EpollSelector.select`), so a claim timed for a message's due instant started 0-1 ms after it,
0.79 ms at the median of a quiet machine's pull service (docs/benchmarks.md, "Timers to the
tenth of a millisecond"). A delay queue promises delivery on time to the millisecond; that
rounding was most of its lateness.

On Linux the timer is a `timerfd` (CLOCK_MONOTONIC) armed `delay_s` ahead and watched by the
loop as a reader: the kernel wakes `epoll_wait` when it expires, whatever timeout the loop asked
for. Relative, not at an absolute instant: a process whose clocks are shifted (libfaketime, as
the clock-skew tests run pods) would otherwise name an instant the kernel's clock is minutes
from. No thread, no polling, and any loop with `add_reader` works, the user's own included.
Elsewhere (no `timerfd_create` in the C library, a loop without readers) it is
`loop.call_later`, as before. The standard
library has `os.timerfd_create` from Python 3.13 only, hence ctypes here; no maintained
package wraps it for 3.11 that is worth a dependency for two calls.

Early never: the timer only decides when to ask; the Lua scripts decide what is due, on the
Redis server's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from collections.abc import Callable

CLOCK_MONOTONIC = 1
NS_PER_S = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018 - absent outside Linux: AttributeError
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) on Windows
        return None
    return libc


_LIBC = _libc()


class PreciseTimer:
    """Calls `callback` in the running loop once, `delay_s` after `arm`; `arm` again replaces
    the instant, `cancel` forgets it, `close` releases the timerfd (a later `arm` makes a new
    one, in whatever loop runs then)."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._fallback: asyncio.TimerHandle | None = None
        # the timerfd holds an instant not read yet: only then has a cancel anything to
        # disarm (a consumer cancels after every sleep, most of them ended by the timer)
        self._armed = False

    def arm(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self.close()
            self._loop = loop
            self._fd = self._open(loop)
        if self._fd is None or delay_s <= 0:
            self.cancel()
            self._fallback = loop.call_later(max(0.0, delay_s), self._callback)
            return
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        # one call replaces the previous instant and drops an expiry not read yet (as cancel)
        in_ns = max(1, int(delay_s * NS_PER_S))  # relative: a zero value would disarm
        self._set(_Timespec(in_ns // NS_PER_S, in_ns % NS_PER_S))
        self._armed = True

    def cancel(self) -> None:
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        if self._armed:
            # a zero instant disarms, and the kernel drops an expiry not read yet with it:
            # the reader, if already queued in the loop, then reads nothing and calls nothing
            self._set(_Timespec(0, 0))
            self._armed = False

    def close(self) -> None:
        self.cancel()
        if self._fd is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed first: nothing watches
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
        self._fd = None
        self._loop = None
        self._armed = False

    def _open(self, loop: asyncio.AbstractEventLoop) -> int | None:
        if _LIBC is None:
            return None
        fd = int(_LIBC.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            return None
        try:
            loop.add_reader(fd, self._expired)
        except (NotImplementedError, RuntimeError):  # a loop without readers: call_later
            os.close(fd)
            return None
        return fd

    def _set(self, at: _Timespec) -> None:
        spec = _Itimerspec(_Timespec(0, 0), at)
        assert _LIBC is not None  # a timerfd was made
        if _LIBC.timerfd_settime(self._fd, 0, ctypes.byref(spec), None):
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _expired(self) -> None:
        """The descriptor is readable: the timer expired, unless a cancel or an arm since
        (queued in the same turn of the loop) reset it, which leaves nothing to read."""
        if self._fd is None:
            return
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        self._armed = False
        self._callback()
