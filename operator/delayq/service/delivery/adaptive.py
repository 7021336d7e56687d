"""How many webhook POSTs may be in flight now: an adaptive limit (AIMD) under maxInFlight.

A receiver that times out or answers 5xx is overloaded: more concurrent POSTs only make it
slower. So each such failure halves the limit (at most once per `SHRINK_EVERY_S`, since the
POSTs in flight when a receiver falls over fail together and are one signal), and each success
adds 1/limit (one POST slot per limit's worth of successes), back up to the configured
`webhook.maxInFlight`. Never below 1: a single POST at a time still finds out when the receiver
has recovered.
"""

from __future__ import annotations

import asyncio
import collections
import time
from types import TracebackType

SHRINK_EVERY_S = 1.0


class AdaptiveLimit:
    """A semaphore whose size moves between 1 and `most` (`shrink`, `grow`)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.limit = float(most)
        self.shrinks = 0  # times the limit was halved (for metrics)
        self._in_use = 0
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._shrunk_s = -SHRINK_EVERY_S

    @property
    def size(self) -> int:
        """POSTs allowed in flight now."""
        return max(1, int(self.limit))

    def try_acquire(self) -> bool:
        """A POST slot now if one is free and nobody waits for one (True), else nothing."""
        if self._in_use < self.size and not self._waiters:
            self._in_use += 1
            return True
        return False

    async def acquire(self, abandoned: asyncio.Future[None] | None = None) -> bool:
        """First come, first served: a POST slot freed goes to the longest waiter, handed over
        by `_wake`, never to a newcomer that would find it free before the waiter runs (which
        then queued again at the back: the messages a consumer took first, a backlog's most
        urgent ones, could wait behind hundreds taken after them). True once the slot is held;
        False, holding nothing, when `abandoned` is done first (its caller gave up the wait)."""
        if self.try_acquire():
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if abandoned is not None:
            abandoned.add_done_callback(lambda _: _give_up(waiter))
        try:
            granted = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # a slot handed over as it was cancelled: the next waiter's
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if not granted and waiter in self._waiters:
            self._waiters.remove(waiter)  # else a free slot would look waited for
        return granted

    def release(self) -> None:
        self._in_use -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand each free slot to the next waiter, counted as in use from now on."""
        while self._in_use < self.size and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # done: abandoned
                waiter.set_result(True)
                self._in_use += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()

    def grow(self) -> None:
        """A POST succeeded: one more slot per limit's worth of successes."""
        if self.limit < self.most:
            grown = min(float(self.most), self.limit + 1 / self.limit)
            self.limit = grown
            self._wake()

    def shrink(self) -> None:
        """A POST timed out or was answered 5xx: half the slots (once per SHRINK_EVERY_S)."""
        now_s = time.monotonic()
        if now_s - self._shrunk_s < SHRINK_EVERY_S or self.limit <= 1:
            return
        self._shrunk_s = now_s
        self.limit = max(1.0, self.limit / 2)
        self.shrinks += 1


def _give_up(waiter: asyncio.Future[bool]) -> None:
    """End a wait that was not handed a slot yet: its `acquire` answers False."""
    if not waiter.done():
        waiter.set_result(False)
