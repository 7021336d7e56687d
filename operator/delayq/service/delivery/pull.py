"""Pull delivery: claim from the owned slots only when a consumer asks for a lease.

No push loop and no buffer: a lease request claims at most `max_count` messages, spread over the
owned slots round-robin (an equal share per slot per round, one pipelined round trip per broker
per round), so one hot slot cannot starve the others and nothing is leased that nobody asked
for. Each claim reply tells when its slot next has something to claim (its earliest due message
or lease deadline), so a request claims only the slots due by then, woken since, or just owned:
not every owned slot, which with many slots and a small `max` took several sequential rounds.
An empty request may wait (long poll) until the earliest of those times, cut short when a
producer schedules something earlier or this process takes over more slots.

Ownership and wake-ups are the engine's `OwnedSlots`, one per broker (the core the push
`Consumer` uses too): its one blocking wait per broker, and the timer at the next due time,
hand the claim to one waiting long poll at a time (`LongPolls`), so a long poll holds no Redis
connection and costs nothing while it waits, and a due message costs a claim, not one per
waiting poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from delayq.queue.backoff import Backoff
from delayq.queue.codes import StaleEpochError
from delayq.queue.model import ClaimBatch, Message, SlotClaim
from delayq.queue.pacing import Pacer
from delayq.queue.server_clock import ServerClock
from delayq.queue.slots import OwnedSlot, OwnedSlots
from delayq.queue.topups import TopUps
from delayq.service.brokers import Brokers
from delayq.service.delivery.long_polls import LongPolls

log = logging.getLogger(__name__)

MAX_LEASE_BATCH = 1000
PAUSE_CHECK_S = 1.0  # the brokers' pause flags are read again when older than this


@dataclass(eq=False)
class PullSlot(OwnedSlot):
    """An owned slot and when it next has something to claim."""

    # server ms from which a claim may find something (a due message or an expired lease);
    # None: nothing until a wake-up; 0: now (just owned, woken, or it filled its share)
    due_ms: float | None = 0.0
    claiming: bool = False  # a claim is in flight: its reply sets due_ms


@dataclass
class _Round:
    messages: list[Message] = field(default_factory=list)
    full: list[int] = field(default_factory=list)  # slots that filled their share: maybe more
    # a broker's claims failed (its slots keep their due time); the others' stand
    failed: redis.RedisError | OSError | None = None


class PullLeaser:
    """Leases messages of the slots this process owns, on request."""

    def __init__(
        self, brokers: Brokers, pacer: Pacer | None = None, backoff: Backoff | None = None
    ) -> None:
        self.brokers = brokers
        self.pacer = pacer  # the topic's rate limit: leases draw from it first
        # the topic's retry policy: a lease that ran out is claimable again after it, as a nack
        # without delayMs is (None: at once)
        self.backoff = backoff
        self._paced_ms = 0.0  # the latest claim was refused by the pacer: wait this long
        self._owned = [OwnedSlots(queue, PullSlot, self._wake) for queue in brokers.queues]
        self._top_ups = [TopUps(queue) for queue in brokers.queues]
        self._cursor = 0
        self._stopping = False
        self._rounds: set[asyncio.Future[None]] = set()  # claims in flight
        self._polls = LongPolls()
        # each broker's Redis clock, from its claims' replies: its slots' due times and
        # lateness are measured on it, never on this pod's clock nor another broker's (one
        # estimate for all would keep the clock furthest ahead, and a slower broker's timers
        # would fire early and claim again and again until due)
        self._clocks = [ServerClock() for _ in brokers.queues]
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
        self._polls.close()

    async def own(self, slots: Iterable[int]) -> dict[int, redis.RedisError | OSError]:
        """Take the slots over; returns those that could not be taken now (OwnedSlots.own)."""
        failed: dict[int, redis.RedisError | OSError] = {}
        for broker, broker_slots in self.brokers.split(slots).items():
            failed.update(await self._owned[broker].own(broker_slots))
        return failed

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
        self._polls.wake_all()

    def _wake(self, state: PullSlot) -> None:
        """A slot was owned or woken: it may have something due now (a claim in flight on it
        sees `wakes` move and leaves it due)."""
        state.due_ms = 0.0
        self._polls.wake_one()

    @property
    def waiting(self) -> int:
        """Long polls waiting now for something to be due."""
        return len(self._polls)

    @property
    def paused(self) -> bool:
        """Delivery is paused on some broker of the topic (as last read)."""
        return any(self._paused)

    async def refresh_paused(self) -> None:
        """Read every broker's pause flag now (leases do it when the last read is a second
        old): the slots of a paused broker are not claimed. A broker that does not answer keeps
        its last reading: its own claims fail (`_round`), and the other brokers' slots are
        leased meanwhile rather than every lease failing with it."""
        queues = self.brokers.queues
        read = await asyncio.gather(*(q.is_paused() for q in queues), return_exceptions=True)
        for broker, paused in enumerate(read):
            if isinstance(paused, bool):
                self._paused[broker] = paused
            elif not isinstance(paused, redis.RedisError | OSError):
                raise paused
        self._paused_read_s = time.monotonic()

    def _state(self, slot: int) -> PullSlot | None:
        return self._owned[self.brokers.routing[slot]].get(slot)

    def server_now_ms(self, slot: int) -> float:
        """The clock of the Redis server storing `slot`, as estimated from its claims."""
        return self._clocks[self.brokers.routing[slot]].now_ms()

    async def lease(self, max_count: int, ack_timeout_ms: int, wait_ms: int = 0) -> list[Message]:
        """Up to `max_count` due messages leased for `ack_timeout_ms`, waiting up to `wait_ms`."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if time.monotonic() - self._paused_read_s >= PAUSE_CHECK_S:
                await self.refresh_paused()
            messages = await self._paced_claim(max_count, ack_timeout_ms)
            due_now = self._arm() and not self._paced_ms
            if messages:
                if due_now:
                    self._polls.wake_one()  # more is due: the next waiting poll claims it
                return messages
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or self._stopping:
                return []
            if self._paced_ms:  # over the rate: nothing claimed, the messages stay in store
                await asyncio.sleep(min(remaining_s, self._paced_ms / 1000))
            elif not due_now:
                wait_s = min(remaining_s, PAUSE_CHECK_S) if self.paused else remaining_s
                await self._polls.wait(wait_s)  # a resume is seen within a second

    def _idle(self) -> list[tuple[PullSlot, float]]:
        """The owned slots of unpaused brokers that no claim is in flight on, each with its
        broker's clock now."""
        return [
            (state, now_ms)
            for owned, paused, now_ms in zip(
                self._owned, self._paused, (c.now_ms() for c in self._clocks), strict=True
            )
            if not paused
            for state in owned
            if not state.claiming
        ]

    def _arm(self) -> bool:
        """Set the timer at the earliest time an idle slot has something to claim; True when
        that is now. (A slot with a claim in flight is its claimer's to look at afterwards.)"""
        times = [s.due_ms - now_ms for s, now_ms in self._idle() if s.due_ms is not None]
        in_ms = min(times) if times else None
        if in_ms is not None and in_ms <= 0:
            return True
        self._polls.arm(None if in_ms is None else in_ms / 1000)
        return False

    async def _paced_claim(self, max_count: int, ack_timeout_ms: int) -> list[Message]:
        """`_claim` of as many messages as the topic's rate limit grants now (all when it has
        none); tokens the claim did not use are given back."""
        self._paced_ms = 0.0
        if self.pacer is None or not self._rotation_due():
            return await self._claim(max_count, ack_timeout_ms)
        granted, wait_ms = await self.pacer.take(max_count)
        if not granted:
            self._paced_ms = max(1.0, wait_ms)
            return []
        messages = await self._claim(granted, ack_timeout_ms)
        self.pacer.unused(granted - len(messages))
        return messages

    def _rotation_due(self) -> bool:
        """Some idle slot has something due now (a claim would not come back empty at once)."""
        return any(s.due_ms is not None and s.due_ms <= now for s, now in self._idle())

    async def _claim(self, max_count: int, ack_timeout_ms: int) -> list[Message]:
        """Claim exactly up to `max_count`: shares per round never add up to more."""
        pending = self._rotation()
        messages: list[Message] = []
        while pending and len(messages) < max_count:
            wanted = max_count - len(messages)
            batch, rest = pending[:wanted], pending[wanted:]
            result = await self._round(batch, _shares(wanted, len(batch)), ack_timeout_ms)
            messages.extend(result.messages)
            if result.failed is not None:
                # what is leased already goes to the caller: raised, it would wait out its
                # lease unseen and then count an attempt that never was
                if not messages:
                    raise result.failed
                log.warning("claim failed on a broker (%r); leasing the others'", result.failed)
                break
            pending = rest + result.full
        return messages

    def _rotation(self) -> list[int]:
        """The idle slots due by now, starting after where the previous request started."""
        due = sorted(
            state.slot
            for state, now_ms in self._idle()
            if state.due_ms is not None and state.due_ms <= now_ms
        )
        if not due:
            return []
        self._cursor = (self._cursor + 1) % len(due)
        return due[self._cursor :] + due[: self._cursor]

    async def _round(self, slots: list[int], shares: list[int], ack_timeout_ms: int) -> _Round:
        claimed = {
            slot: (state, share, state.wakes)
            for slot, share in zip(slots, shares, strict=True)
            if (state := self._state(slot)) is not None and not state.claiming
        }
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rounds.add(done)
        for state, _, _ in claimed.values():
            state.claiming = True
        try:
            per_broker = self.brokers.split(claimed)
            replies = await asyncio.gather(
                *(
                    self._claim_on(broker, s, claimed, ack_timeout_ms)
                    for broker, s in per_broker.items()
                ),
                return_exceptions=True,  # one broker's failure leaves the others' leases
            )
        finally:
            for state, _, _ in claimed.values():
                state.claiming = False
            self._rounds.discard(done)
            done.set_result(None)
        result = _Round()
        for reply in replies:
            if isinstance(reply, redis.RedisError | OSError):
                result.failed = reply
            elif isinstance(reply, BaseException):
                raise reply
        for broker, slot, outcome in (
            (broker, slot, outcome)
            for broker, reply in zip(per_broker, replies, strict=True)
            if not isinstance(reply, BaseException)
            for slot, outcome in reply
        ):
            state, share, wakes = claimed[slot]
            if isinstance(outcome, StaleEpochError):
                self._owned[self.brokers.routing[slot]].lose(state)  # fenced out by a newer owner
                continue
            top_ups = self._top_ups[self.brokers.routing[slot]]
            top_ups.retry_failed()
            top_ups.note(outcome)
            result.messages.extend(outcome.messages)
            self._clocks[broker].note(outcome.now_us, outcome.received_s)
            upcoming = [t for t in (outcome.next_due_ms, outcome.next_deadline_ms) if t is not None]
            state.due_ms = min(upcoming) if upcoming else None
            if len(outcome.messages) >= share:
                result.full.append(slot)
                state.due_ms = 0.0  # maybe more due now
            elif state.wakes != wakes:
                state.due_ms = 0.0  # woken while the claim was in flight: it may have missed it
        return result

    async def _claim_on(
        self,
        broker: int,
        slots: list[int],
        claimed: dict[int, tuple[PullSlot, int, int]],
        ack_timeout_ms: int,
    ) -> list[tuple[int, ClaimBatch | StaleEpochError]]:
        """One pipelined round trip to one broker for all its slots in this round."""
        claims = [SlotClaim(slot, claimed[slot][0].epoch, claimed[slot][1]) for slot in slots]
        outcomes = await self.brokers.queues[broker].claim_slots(
            claims, ack_timeout_ms, self.backoff
        )
        return list(zip(slots, outcomes, strict=True))


def _shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as possible (the first ones get the remainder)."""
    quotient, remainder = divmod(total, parts)
    return [quotient + (1 if index < remainder else 0) for index in range(parts)]
