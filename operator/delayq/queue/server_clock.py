"""The Redis server clock, estimated on this process's monotonic clock from claim replies.

Due times are on the server clock, so consumers time their wake-ups on an estimate of it: each
claim reply carries the server's µs clock (`now_us`) and the monotonic time it was received
(`received_s`). Taking the latest reply as the truth put the estimate behind by however long
that reply waited before Python stamped it — the pipeline of a claim of many slots, an event
loop busy with other requests: 1-2 ms on a loaded 2-core machine, so every timer aimed at a due
time fired that much late (a pull process measured its claims 1.4-2.2 ms after the due time
with the timer itself only 0.4-0.9 ms late).

Every reply's offset (server ms minus local ms at receipt) is at most the true offset, since
the server ran the script before the reply was received. So the estimate keeps the largest
offset seen, which the least delayed reply gave, and lets it age by `DECAY_MS_PER_S`, far above
any clock drift (NTP slews at most 0.5 ms/s), so it never runs ahead of the server for long. A
reply more than `REBASE_MS` below the estimate is either stalled (the event loop was busy: the
server's clock did not move, and taking it would make the next timer as late as the stall) or
the server's clock was set back (a timer aimed early would claim nothing, again and again,
until it caught up). The next reply received after it tells which: if it is low too, the
better of the two is taken; if not, the estimate stays. Replies received together (one
pipelined claim of several slots) are one stall, not a confirmation. A clock set back costs one
claim aimed early, which finds nothing not due: the scripts decide on the server's own clock.
"""

from __future__ import annotations

import time

DECAY_MS_PER_S = 1.0
REBASE_MS = 5.0


class ServerClock:
    """The server's clock in ms: `now_ms()`, fed with each claim reply by `note`."""

    def __init__(self) -> None:
        # server ms minus monotonic ms; until the first reply, this host's wall clock
        self._offset_ms = (time.time() - time.monotonic()) * 1000
        self._noted_s: float | None = None  # received_s of the latest reply noted
        # (offset, received_s) of the best reply since one fell REBASE_MS below: a stall or a
        # clock set back, until a reply received later tells which
        self._low: tuple[float, float] | None = None

    def note(self, now_us: int, received_s: float) -> None:
        """A reply: the server's clock `now_us` when its script ran, received at `received_s`
        (time.monotonic())."""
        sample_ms = now_us / 1000 - received_s * 1000
        if self._noted_s is None:
            self._offset_ms, self._noted_s = sample_ms, received_s
            return
        aged_ms = self._offset_ms - max(0.0, received_s - self._noted_s) * DECAY_MS_PER_S
        self._noted_s = max(self._noted_s, received_s)
        if sample_ms >= aged_ms - REBASE_MS:
            self._offset_ms, self._low = max(sample_ms, aged_ms), None
        elif self._low is not None and received_s > self._low[1]:  # set back: the better low
            low_ms, low_s = self._low
            self._offset_ms = max(sample_ms, low_ms - (received_s - low_s) * DECAY_MS_PER_S)
            self._low = None
        else:
            self._offset_ms = aged_ms
            low_ms = sample_ms if self._low is None else max(sample_ms, self._low[0])
            self._low = (low_ms, received_s if self._low is None else self._low[1])

    def now_ms(self) -> float:
        return time.monotonic() * 1000 + self._offset_ms
