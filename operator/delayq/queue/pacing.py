"""The topic's pace: how fast its consumers may claim, shared by every pod of every broker.

Two things slow a topic down, both kept in one hash on the topic's first broker (`pace_key`):

- its rate limit (`rate_limit_per_second`, `rate_limit_burst`): a token bucket on the Redis
  server's clock that every claim draws from first (pace-1), so a herd of due messages drains at
  the limit however many pods and brokers claim it. A message not granted a token is not
  claimed: it stays in store, in due order, costing no attempt and no pod memory. The limit is
  the topic's settings record's (`topic_record.py`), which pace-1 reads at every draw: a change
  published by the operator's health pass applies to every pod's next draw without a restart
  (the process's own values are the fallback while no record holds one), and each draw tells
  the process the limit it obeyed;
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
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

from delayq.queue.client import AsyncQueue
from delayq.queue.model import Draw

T = TypeVar("T")

#: The longest hold a receiver's Retry-After gets: a receiver cannot park the topic for ever.
MAX_HOLD_MS = 5 * 60 * 1000
#: How long past its due a message may be held back by receivers' holds (each given back, no
#: attempt spent) by default: a message overdue by more counts its next hold as a failed attempt,
#: so the retry policy (maxRetries, retry.for) ends it even on a topic without an expiry, and a
#: receiver that answers 429 for ever cannot park it for ever (`delayq serve
#: --webhook-max-held-ms`, docs/service.md "Delivery by topicType").
MAX_HELD_MS = 12 * MAX_HOLD_MS
#: A claim waits for this much of a second's tokens at least: a round trip is worth a slice of
#: the rate, not one message (500/s: 25 tokens, 20 draws a second shared by every pod).
SLICE_S = 0.05
#: Without a rate limit, the hold (and a limit set since) is read from Redis at most this often
#: per process.
UNPACED_CHECK_S = 0.25
#: A draw granted nothing this recently: the topic is being held back (`held_back`).
HELD_BACK_S = 1.0


class Pacer:
    """One process's door to the topic's pace: `take` before a claim, `unused` for tokens a
    claim did not need, `hold` when a receiver asks for time, `held` before handing over a
    message claimed earlier."""

    def __init__(self, queue: AsyncQueue, per_second: float = 0.0, burst: int = 0) -> None:
        self.queue = queue  # the topic's first broker
        # the limit: the process's own until a draw tells the topic's (its settings record's)
        self.per_second = per_second
        self.burst = burst  # 0: a tenth of a second's tokens (pace-1 says how many after a draw)
        self._given = (per_second, burst)  # the fallback pace-1 obeys while no record has one
        self.holds = 0  # holds asked for by receivers (for metrics)
        self.waits = 0  # draws that were granted nothing (for metrics)
        self._unused = 0  # tokens drawn and not used: given back with the next draw
        self._unused_since_s = 0.0  # monotonic: the draw the oldest of them came from
        self._drawn_s = 0.0  # monotonic: the latest draw was asked for
        self._closed_until_s = 0.0  # monotonic: nothing is granted before (a hold or no tokens)
        self._checked_s = -UNPACED_CHECK_S  # monotonic time of the last draw from Redis
        self._refused_s = -HELD_BACK_S  # monotonic time a draw last granted nothing
        self._held_until_s = 0.0  # monotonic: a receiver's hold lasts until (as last known)
        self._hold_checked_s = -UNPACED_CHECK_S  # monotonic time `held` last asked Redis

    @property
    def limited(self) -> bool:
        return self.per_second > 0

    @property
    def hold_left_ms(self) -> float:
        """How much longer a receiver's hold lasts, as this process knows (0: none)."""
        return max(0.0, (self._held_until_s - time.monotonic()) * 1000)

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
        least = min(want, max(1, math.ceil(self.per_second * SLICE_S)))
        returned = self._returnable(now_s)
        self._drawn_s = now_s
        try:
            draw = await self.queue.pace(*self._given, want, least, returned)
        except redis.RedisError:
            if self.limited:
                raise  # a limit that is not enforced is not a limit: the claim waits
            # only a receiver's hold was asked about: the first broker being down must not
            # stop the other brokers' delivery (a hold is the receiver's wish, not a limit)
            self._checked_s = now_s
            return want, 0.0
        self._checked_s = now_s
        self._note(draw)
        if not draw.granted:
            self.waits += 1
            self._refused_s = now_s
            self._closed_until_s = time.monotonic() + draw.wait_ms / 1000
        return draw.granted, float(draw.wait_ms)

    async def held(self) -> bool:
        """A receiver's hold lasts: what this process knows, asked of Redis at most every
        `UNPACED_CHECK_S`. Asked before a message claimed earlier is handed over, so that a
        hold stops the deliveries a pod has claimed already, not only its next claims (a pod
        holding a round's messages went on POSTing them for the whole hold). Never raises:
        with the first broker unreachable, no hold is known (a hold is the receiver's wish)."""
        now_s = time.monotonic()
        if self._held_until_s > now_s:
            return True
        if now_s - self._hold_checked_s < UNPACED_CHECK_S:
            return False
        self._hold_checked_s = now_s
        try:
            self._note(await _once_more_on_reconnect(lambda: self.queue.pace(*self._given, 0, 0)))
        except redis.RedisError:
            return False
        return self._held_until_s > now_s

    def _note(self, draw: Draw) -> None:
        """What a draw told: the topic's limit, and a hold with its end."""
        self.per_second, self.burst = draw.per_second, draw.burst
        if draw.held:
            self._held_until_s = time.monotonic() + draw.wait_ms / 1000

    def unused(self, count: int) -> None:
        """Tokens drawn that a claim did not use (it found fewer due messages)."""
        if self.limited and count > 0:
            if not self._unused:
                self._unused_since_s = self._drawn_s
            self._unused += count

    def _returnable(self, now_s: float) -> int:
        """The unused tokens the next draw gives back: those the bucket's refill since their
        draw cannot have replaced. Given back late, a token drawn from a full bucket would be a
        second one: meanwhile the refill filled the bucket again and another pod drew it (pods
        woken before a herd was due each drew the whole bucket and claimed nothing; each one's
        return at the herd was a burst of its own). The refill replaces at most `per_second`
        tokens a second, so what is left after that is what the bucket would still hold had
        they never been drawn: the burst bound holds, and a claim's prompt return keeps most.
        (The draw is the process's latest before the claim found fewer; with two brokers'
        consumers drawing at once, one claim's round trip later than theirs at most.)"""
        unused, self._unused = self._unused, 0
        replaced = self.per_second * max(0.0, now_s - self._unused_since_s)
        return max(0, math.floor(unused - replaced))

    async def hold(self, hold_ms: int) -> None:
        """Stop every pod's claims for `hold_ms` (at most `MAX_HOLD_MS`); this process at once."""
        hold_ms = max(0, min(hold_ms, MAX_HOLD_MS))
        self.holds += 1
        until_s = time.monotonic() + hold_ms / 1000
        self._closed_until_s = max(self._closed_until_s, until_s)
        self._held_until_s = max(self._held_until_s, until_s)
        await _once_more_on_reconnect(lambda: self.queue.hold(hold_ms, MAX_HOLD_MS))


async def _once_more_on_reconnect(call: Callable[[], Awaitable[T]]) -> T:
    """A hold, or a draw of nothing that only asks for one, again on a connection error: a
    pooled connection a restart of the broker closed fails its first use, and a hold that
    fails so holds only this process (the others POST into the receiver's Retry-After). Both
    are safe to repeat: the longer hold stays, a draw of nothing changes nothing. A draw of
    tokens is not repeated (its tokens given back would count twice): its claim is retried."""
    try:
        return await call()
    except redis.ConnectionError:
        return await call()
