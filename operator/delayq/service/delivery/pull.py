"""Pull delivery: claim from the owned slots only when a consumer asks for a lease.

No push loop and no buffer: a lease request claims at most `max_count` messages, spread over the
owned slots round-robin (an equal share per slot per round, one pipelined round trip per broker
per round), so one hot slot cannot starve the others and nothing is leased that nobody asked
for. An empty request may wait (long poll) until the earliest due time the claims reported, cut
short when a producer schedules something earlier or this process takes over more slots.

Ownership and wake-ups are the engine's `OwnedSlots`, one per broker (the core the push
`Consumer` uses too): its one blocking wait per broker wakes every long poll at once, so a long
poll holds no Redis connection and costs nothing while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from delayq.queue.codes import StaleEpochError
from delayq.queue.model import ClaimBatch, Message, SlotClaim
from delayq.queue.slots import OwnedSlot, OwnedSlots
from delayq.queue.topups import TopUps
from delayq.service.brokers import Brokers

MAX_LEASE_BATCH = 1000
MIN_WAIT_S = 0.001
PAUSE_CHECK_S = 1.0  # the brokers' pause flags are read again when older than this


@dataclass
class _Round:
    messages: list[Message] = field(default_factory=list)
    full: list[int] = field(default_factory=list)  # slots that filled their share: maybe more
    next_in_ms: int | None = None  # server ms until the earliest next due time or deadline


class PullLeaser:
    """Leases messages of the slots this process owns, on request."""

    def __init__(self, brokers: Brokers) -> None:
        self.brokers = brokers
        self._owned = [OwnedSlots(queue, OwnedSlot, self._wake) for queue in brokers.queues]
        self._top_ups = [TopUps(queue) for queue in brokers.queues]
        self._cursor = 0
        self._stopping = False
        self._rounds: set[asyncio.Future[None]] = set()  # claims in flight
        # set (and replaced) when an owned slot may have something due now: wakes long polls
        self._woken = asyncio.Event()
        # the Redis server clock as of the latest claim (server ms, monotonic s): lateness is
        # measured on it, never on this pod's clock
        self._clock = (time.time() * 1000, time.monotonic())
        self._paused = [False] * len(brokers.queues)  # per broker, as last read
        self._paused_read_s = -PAUSE_CHECK_S  # monotonic time of that read

    @property
    def owned_slots(self) -> list[int]:
        return sorted(slot for owned in self._owned for slot in owned.slots)

    def start(self) -> None:
        """Start the brokers' wake-up waits (`close` ends them)."""
        for owned in self._owned:
            owned.start()

    async def close(self) -> None:
        await asyncio.gather(*(top_ups.close() for top_ups in self._top_ups))
        await asyncio.gather(*(owned.close() for owned in self._owned))

    async def own(self, slots: Iterable[int]) -> None:
        for broker, broker_slots in self.brokers.split(slots).items():
            await self._owned[broker].own(broker_slots)

    async def release(self, slots: Iterable[int]) -> None:
        """Stop claiming the slots; returns once no claim that may include them is in flight,
        which is what Ownership's handoff order requires before another process takes them."""
        for broker, broker_slots in self.brokers.split(slots).items():
            await self._owned[broker].release(broker_slots)
        in_flight = list(self._rounds)
        if in_flight:
            await asyncio.wait(in_flight)

    def stop(self) -> None:
        self._stopping = True
        self._wake(None)

    def _wake(self, _state: OwnedSlot | None) -> None:
        """A slot was owned or woken (or the leaser stops): every long poll claims again."""
        self._woken.set()
        self._woken = asyncio.Event()

    @property
    def paused(self) -> bool:
        """Delivery is paused on some broker of the topic (as last read)."""
        return any(self._paused)

    async def refresh_paused(self) -> None:
        """Read every broker's pause flag now (leases do it when the last read is a second
        old): the slots of a paused broker are not claimed."""
        queues = self.brokers.queues
        self._paused = list(await asyncio.gather(*(queue.is_paused() for queue in queues)))
        self._paused_read_s = time.monotonic()

    def _state(self, slot: int) -> OwnedSlot | None:
        return self._owned[self.brokers.routing[slot]].get(slot)

    def server_now_ms(self) -> float:
        server_ms, local_s = self._clock
        return server_ms + (time.monotonic() - local_s) * 1000

    async def lease(self, max_count: int, lease_ms: int, wait_ms: int = 0) -> list[Message]:
        """Up to `max_count` due messages leased for `lease_ms`, waiting up to `wait_ms`."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if time.monotonic() - self._paused_read_s >= PAUSE_CHECK_S:
                await self.refresh_paused()
            woken = self._woken  # taken before the claim: a wake-up during it ends the wait
            messages, next_in_ms = await self._claim(max_count, lease_ms)
            remaining_s = deadline - time.monotonic()
            if messages or remaining_s <= 0 or self._stopping:
                return messages
            wait_s = remaining_s if next_in_ms is None else min(remaining_s, next_in_ms / 1000)
            if self.paused:
                wait_s = min(wait_s, PAUSE_CHECK_S)  # a resume is seen within a second
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), max(MIN_WAIT_S, wait_s))

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
        owned = [s for s in self.owned_slots if not self._paused[self.brokers.routing[s]]]
        if not owned:
            return []
        self._cursor = (self._cursor + 1) % len(owned)
        return owned[self._cursor :] + owned[: self._cursor]

    async def _round(self, slots: list[int], shares: list[int], lease_ms: int) -> _Round:
        claimed = {
            slot: (state, share)
            for slot, share in zip(slots, shares, strict=True)
            if (state := self._state(slot)) is not None
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
            state, share = claimed[slot]
            if isinstance(outcome, StaleEpochError):
                self._owned[self.brokers.routing[slot]].lose(state)  # fenced out by a newer owner
                continue
            top_ups = self._top_ups[self.brokers.routing[slot]]
            top_ups.retry_failed()
            top_ups.note(outcome)
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
        self,
        broker: int,
        slots: list[int],
        claimed: dict[int, tuple[OwnedSlot, int]],
        lease_ms: int,
    ) -> list[tuple[int, ClaimBatch | StaleEpochError]]:
        """One pipelined round trip to one broker for all its slots in this round."""
        claims = [SlotClaim(slot, claimed[slot][0].epoch, claimed[slot][1]) for slot in slots]
        outcomes = await self.brokers.queues[broker].claim_slots(claims, lease_ms)
        return list(zip(slots, outcomes, strict=True))


def _shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as possible (the first ones get the remainder)."""
    quotient, remainder = divmod(total, parts)
    return [quotient + (1 if index < remainder else 0) for index in range(parts)]


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
