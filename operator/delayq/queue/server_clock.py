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

A claim sent at a due time runs on the server later still: the estimate above is behind the
server by a reply's way back, and the request has its own way there. On an idle 2-vCPU VM a
pull process's claims, sent 0.6 ms after the due time by the estimate, ran 1.6 ms after it
(p50; docs/benchmarks.md, "Claims sent ahead of the due time"). So the clock also learns the
claims' lead: how far the server's clock, when a claim ran, was past the estimate when it was
sent (`sent_s`), the least of recent claims; `arrival_ms()` is the estimate plus that lead, and
the timers aim at it, so a claim reaches the server about when its messages come due. Early
never: a claim that arrives before a due time finds that message not due (the scripts decide)
and its own lead, lower, is the new one at once, so the next claim is aimed later, never spun;
the lead climbs back by `LEAD_RISE_MS_PER_S` when all claims take longer (a busier machine),
and never passes `MAX_LEAD_MS`.
"""

from __future__ import annotations

import time

DECAY_MS_PER_S = 1.0
REBASE_MS = 5.0
LEAD_RISE_MS_PER_S = 0.1
MAX_LEAD_MS = 2.0


class ServerClock:
    """The server's clock in ms: `now_ms()`, and `arrival_ms()` for aiming claims, fed with
    each claim reply by `note`."""

    def __init__(self) -> None:
        # server ms minus monotonic ms; until the first reply, this host's wall clock
        self._offset_ms = (time.time() - time.monotonic()) * 1000
        self._noted_s: float | None = None  # received_s of the latest reply noted
        # (offset, received_s) of the best reply since one fell REBASE_MS below: a stall or a
        # clock set back, until a reply received later tells which
        self._low: tuple[float, float] | None = None
        self._lead_ms = 0.0  # none until a claim's send time is known
        self._lead_s: float | None = None  # sent_s of the claim that set the lead last

    def note(self, now_us: int, received_s: float, sent_s: float | None = None) -> None:
        """A reply: the server's clock `now_us` when its script ran, received at `received_s`
        (time.monotonic()); `sent_s` when the claim was sent, if known."""
        self._note_offset(now_us / 1000 - received_s * 1000, received_s)
        if sent_s is not None:
            self._note_lead(now_us / 1000 - (sent_s * 1000 + self._offset_ms), sent_s)

    def now_ms(self) -> float:
        return time.monotonic() * 1000 + self._offset_ms

    def arrival_ms(self) -> float:
        """The server's clock when a claim sent now would run there, as the quickest recent
        claims ran: what a timer aims at a due time."""
        return self.now_ms() + self._lead_ms

    def _note_lead(self, sample_ms: float, sent_s: float) -> None:
        sample_ms = min(max(sample_ms, 0.0), MAX_LEAD_MS)
        if self._lead_s is None:
            self._lead_ms, self._lead_s = sample_ms, sent_s
            return
        risen_ms = self._lead_ms + max(0.0, sent_s - self._lead_s) * LEAD_RISE_MS_PER_S
        self._lead_ms = min(sample_ms, risen_ms, MAX_LEAD_MS)
        self._lead_s = max(self._lead_s, sent_s)

    def _note_offset(self, sample_ms: float, received_s: float) -> None:
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
