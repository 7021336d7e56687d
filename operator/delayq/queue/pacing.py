"""The topic's pace: how fast its consumers may claim, shared by every pod of every broker.

Two things slow a topic down, both kept in one hash on the topic's first broker (`pace_key`):

- its rate limit (`rate_limit_per_second`, `rate_limit_burst`): a token bucket on the Redis
  server's clock that every claim draws from first (pace-1), so a herd of due messages drains at
  the limit however many pods and brokers claim it. A message not granted a token is not
  claimed: it stays in store, in due order, costing no attempt and no pod memory;
- a receiver's hold (hold-1): a webhook receiver that answered 429 or 503 with `Retry-After`
  stops every pod's claims for the time it asked (bounded by `MAX_HOLD_MS`).

Why one bucket on the first broker rather than `limit / brokers` on each: a herd is rarely
spread evenly over the brokers (one customer's messages hash to a few slots), and a split bucket
would drain a herd on one broker at a fraction of the limit. The cost is one call to the first
broker per claim round (a round claims up to a batch), and while that broker is unreachable a
rate-limited topic claims nothing: a limit that is not enforced is not a limit.
"""

from __future__ import annotations

import math
import time

import redis

from delayq.queue.client import AsyncQueue

#: The longest hold a receiver's Retry-After gets: a receiver cannot park the topic for ever.
MAX_HOLD_MS = 5 * 60 * 1000
#: A claim waits for this much of a second's tokens at least: a round trip is worth a slice of
#: the rate, not one message (500/s: 25 tokens, 20 draws a second shared by every pod).
SLICE_S = 0.05
#: Without a rate limit, the hold is read from Redis at most this often per process.
UNPACED_CHECK_S = 0.25
#: A draw granted nothing this recently: the topic is being held back (`held_back`).
HELD_BACK_S = 1.0


def burst_of(per_second: float, burst: int) -> int:
    """The bucket's size: `burst`, or when 0 a tenth of a second's tokens (at least 1)."""
    return burst if burst > 0 else max(1, math.ceil(per_second / 10))


class Pacer:
    """One process's door to the topic's pace: `take` before a claim, `unused` for tokens a
    claim did not need, `hold` when a receiver asks for time."""

    def __init__(self, queue: AsyncQueue, per_second: float = 0.0, burst: int = 0) -> None:
        self.queue = queue  # the topic's first broker
        self.per_second = per_second
        self.burst = burst_of(per_second, burst)
        self.holds = 0  # holds asked for by receivers (for metrics)
        self.waits = 0  # draws that were granted nothing (for metrics)
        self._unused = 0  # tokens drawn and not used: given back with the next draw
        self._closed_until_s = 0.0  # monotonic: nothing is granted before (a hold or no tokens)
        self._checked_s = -UNPACED_CHECK_S  # monotonic time of the last draw from Redis
        self._refused_s = -HELD_BACK_S  # monotonic time a draw last granted nothing

    @property
    def limited(self) -> bool:
        return self.per_second > 0

    @property
    def held_back(self) -> bool:
        """A draw was refused within the last second: due messages wait on purpose (the
        consumers' stall watchdog must not take them for a lost wake-up)."""
        return time.monotonic() - self._refused_s < HELD_BACK_S

    async def take(self, want: int) -> tuple[int, float]:
        """Up to `want` tokens: (granted, 0), or (0, ms to wait before asking again). Raises
        the broker's error (the caller retries its claim round later)."""
        now_s = time.monotonic()
        if want <= 0:
            return 0, 0.0
        if self._closed_until_s > now_s:
            self._refused_s = now_s
            return 0, (self._closed_until_s - now_s) * 1000
        if not self.limited and now_s - self._checked_s < UNPACED_CHECK_S:
            return want, 0.0
        # never more than the bucket can hold: a burst below a slice would wait for ever
        least = min(want, self.burst, max(1, math.ceil(self.per_second * SLICE_S)))
        returned, self._unused = self._unused, 0
        try:
            granted, wait_ms = await self.queue.pace(
                self.per_second, self.burst, want, least, returned
            )
        except redis.RedisError:
            if self.limited:
                raise  # a limit that is not enforced is not a limit: the claim waits
            # only a receiver's hold was asked about: the first broker being down must not
            # stop the other brokers' delivery (a hold is the receiver's wish, not a limit)
            self._checked_s = now_s
            return want, 0.0
        self._checked_s = now_s
        if not granted:
            self.waits += 1
            self._refused_s = now_s
            self._closed_until_s = time.monotonic() + wait_ms / 1000
        return granted, float(wait_ms)

    def unused(self, count: int) -> None:
        """Tokens drawn that a claim did not use (it found fewer due messages)."""
        if self.limited and count > 0:
            self._unused += count

    async def hold(self, hold_ms: int) -> None:
        """Stop every pod's claims for `hold_ms` (at most `MAX_HOLD_MS`); this process at once."""
        hold_ms = max(0, min(hold_ms, MAX_HOLD_MS))
        self.holds += 1
        self._closed_until_s = max(self._closed_until_s, time.monotonic() + hold_ms / 1000)
        await self.queue.hold(hold_ms, MAX_HOLD_MS)
