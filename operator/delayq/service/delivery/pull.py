"""Pull delivery: claim from the owned slots only when a consumer asks for a lease.

No push loop and no buffer: a lease request claims at most `max_count` messages, spread over the
owned slots round-robin (an equal share per slot per round, one pipelined round trip per broker
per round), so one hot slot cannot starve the others and nothing is leased that nobody asked
for. An empty
request may wait (long poll) until the earliest due time the claims reported, cut short by the
slots' wake lists when a producer schedules something earlier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis.asyncio

from delayq.queue.codes import StaleEpochError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import ClaimBatch, Message, SlotClaim
from delayq.service.brokers import Brokers

MAX_LEASE_BATCH = 1000
MIN_WAIT_S = 0.001
# Long polls blocked on Redis at once; each holds a pooled connection, so beyond this the
# waiters re-check every FALLBACK_WAIT_S instead of starving producers of connections.
MAX_BLOCKING_WAITS = 32
FALLBACK_WAIT_S = 0.05


@dataclass
class _Round:
    messages: list[Message] = field(default_factory=list)
    full: list[int] = field(default_factory=list)  # slots that filled their share: maybe more
    next_in_ms: int | None = None  # server ms until the earliest next due time or deadline


class PullLeaser:
    """Leases messages of the slots this process owns, on request."""

    def __init__(self, brokers: Brokers) -> None:
        self.brokers = brokers
        self._epochs: dict[int, int] = {}
        self._cursor = 0
        self._stopping = False
        self._rounds: set[asyncio.Future[None]] = set()  # claims in flight
        self._blocking = asyncio.Semaphore(MAX_BLOCKING_WAITS)
        self._owned_more = asyncio.Event()  # wakes long polls: new slots may have a backlog
        # the Redis server clock as of the latest claim (server ms, monotonic s): lateness is
        # measured on it, never on this pod's clock
        self._clock = (time.time() * 1000, time.monotonic())

    @property
    def owned_slots(self) -> list[int]:
        return sorted(self._epochs)

    async def own(self, slots: Iterable[int]) -> None:
        for slot in slots:
            if slot not in self._epochs:
                self._epochs[slot] = await self.brokers.queue_for(slot).take_over(slot)
        self._owned_more.set()
        self._owned_more = asyncio.Event()

    async def release(self, slots: Iterable[int]) -> None:
        """Stop claiming the slots; returns once no claim that may include them is in flight,
        which is what Ownership's handoff order requires before another process takes them."""
        for slot in slots:
            self._epochs.pop(slot, None)
        in_flight = list(self._rounds)
        if in_flight:
            await asyncio.wait(in_flight)

    def stop(self) -> None:
        self._stopping = True
        self._owned_more.set()

    def server_now_ms(self) -> float:
        server_ms, local_s = self._clock
        return server_ms + (time.monotonic() - local_s) * 1000

    async def lease(self, max_count: int, lease_ms: int, wait_ms: int = 0) -> list[Message]:
        """Up to `max_count` due messages leased for `lease_ms`, waiting up to `wait_ms`."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            messages, next_in_ms = await self._claim(max_count, lease_ms)
            remaining_s = deadline - time.monotonic()
            if messages or remaining_s <= 0 or self._stopping:
                return messages
            wait_s = remaining_s if next_in_ms is None else min(remaining_s, next_in_ms / 1000)
            await self._wait_for_wake(max(MIN_WAIT_S, wait_s))

    async def _claim(self, max_count: int, lease_ms: int) -> tuple[list[Message], int | None]:
        """Claim exactly up to `max_count`: shares per round never add up to more."""
        pending = self._rotation()
        messages: list[Message] = []
        next_in_ms: int | None = None
        while pending and len(messages) < max_count:
            wanted = max_count - len(messages)
            batch, rest = pending[:wanted], pending[wanted:]
            result = await self._round(batch, _shares(wanted, len(batch)), lease_ms)
            messages.extend(result.messages)
            next_in_ms = _earliest(next_in_ms, result.next_in_ms)
            pending = rest + result.full
        return messages, next_in_ms

    def _rotation(self) -> list[int]:
        """Owned slots starting after where the previous request started."""
        owned = self.owned_slots
        if not owned:
            return []
        self._cursor = (self._cursor + 1) % len(owned)
        return owned[self._cursor :] + owned[: self._cursor]

    async def _round(self, slots: list[int], shares: list[int], lease_ms: int) -> _Round:
        claimed = {
            slot: (self._epochs[slot], share)
            for slot, share in zip(slots, shares, strict=True)
            if slot in self._epochs
        }
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rounds.add(done)
        try:
            per_broker = self.brokers.split(claimed)
            replies = await asyncio.gather(
                *(self._claim_on(broker, s, claimed, lease_ms) for broker, s in per_broker.items())
            )
        finally:
            self._rounds.discard(done)
            done.set_result(None)
        result = _Round()
        for slot, outcome in (pair for reply in replies for pair in reply):
            epoch, share = claimed[slot]
            if isinstance(outcome, StaleEpochError):
                if self._epochs.get(slot) == epoch:
                    del self._epochs[slot]  # a newer owner fenced us out of this slot
                continue
            result.messages.extend(outcome.messages)
            self._clock = (outcome.now_us / 1000, time.monotonic())
            if len(outcome.messages) >= share:
                result.full.append(slot)
            upcoming = [t for t in (outcome.next_due_ms, outcome.next_deadline_ms) if t is not None]
            if upcoming:
                next_in = max(0, min(upcoming) - outcome.now_ms)
                result.next_in_ms = _earliest(result.next_in_ms, next_in)
        return result

    async def _claim_on(
        self, broker: int, slots: list[int], claimed: dict[int, tuple[int, int]], lease_ms: int
    ) -> list[tuple[int, ClaimBatch | StaleEpochError]]:
        """One pipelined round trip to one broker for all its slots in this round."""
        claims = [SlotClaim(slot, *claimed[slot]) for slot in slots]
        outcomes = await self.brokers.queues[broker].claim_slots(claims, lease_ms)
        return list(zip(slots, outcomes, strict=True))

    async def _wait_for_wake(self, timeout_s: float) -> None:
        """Block until a producer marks an owned slot's head earlier, this process takes over
        more slots (which may hold a due backlog), or `timeout_s` passes."""
        per_broker = self.brokers.split(self.owned_slots)
        owned_more = asyncio.create_task(self._owned_more.wait())
        if not per_broker or self._blocking.locked():
            sleep_s = timeout_s if not per_broker else min(timeout_s, FALLBACK_WAIT_S)
            await asyncio.wait([owned_more], timeout=sleep_s)
            owned_more.cancel()
            return
        async with self._blocking:
            waits = [owned_more] + [
                asyncio.create_task(self._blpop(broker, slots, timeout_s))
                for broker, slots in per_broker.items()
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()

    async def _blpop(self, broker: int, slots: list[int], timeout_s: float) -> None:
        topic = self.brokers.topic
        keys = [slot_keys(topic, slot).key(Part.WAKE) for slot in slots]
        try:
            await self.brokers.queues[broker].redis.blpop(keys, timeout=timeout_s)
        except redis.RedisError:
            await asyncio.sleep(min(timeout_s, FALLBACK_WAIT_S))


def _shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as possible (the first ones get the remainder)."""
    quotient, remainder = divmod(total, parts)
    return [quotient + (1 if index < remainder else 0) for index in range(parts)]


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)

