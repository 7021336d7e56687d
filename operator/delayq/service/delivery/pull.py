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

While a doubling switches slots (`Routing.doubled_slots`), the owner of a switched old slot s
leases its halves s and s + N at the next key generation at once: they are slots of a second
generation of this one leaser (`add_generation`, the service's halves engine), in the same
rotation, rate limit, long polls and broker clocks (s + N is on the broker of s), so a request
leases from both and the route tells each lease's generation (`lease` answers per generation).
A round then costs one claim call per broker and generation, sent together.

A broker that fails (a claim failed; or a pause read could not reach it) is left out of the
rotation for `BROKER_RETRY_S`, then claimed again: a request leases from, and long-polls, the
brokers that work, and is refused (the error raised, HTTP 503) only when every broker it owns
slots on failed. A broker that did not answer (connection error, timeout) is up again once it
answers a pause read; one that refused a claim (an error reply: READONLY after a failover
demoted it) once a claim succeeds. Which brokers failed is `unreachable` (the metric
`delayq_pull_broker_unreachable`), logged when one fails and when it works again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
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
BROKER_RETRY_S = 1.0  # a broker whose claim failed is claimed again after this long
#: The errors of a broker that did not answer (down, partitioned, loading its data), as
#: opposed to an error reply.
UNANSWERED = (redis.ConnectionError, redis.TimeoutError, OSError)

#: Leased messages by the key generation of their slots: the topic's, and while a doubling
#: switches slots, its halves' (the next one).
Pulled = dict[int, list[Message]]


@dataclass(eq=False)
class PullSlot(OwnedSlot):
    """An owned slot and when it next has something to claim."""

    # server ms from which a claim may find something (a due message or an expired lease);
    # None: nothing until a wake-up; 0: now (just owned, or it filled its share); a woken
    # slot: the due time its wake-up held, if earlier
    due_ms: float | None = 0.0
    claiming: bool = False  # a claim is in flight: its reply sets due_ms
    generation: int = 0  # the key generation it is a slot of


class _Generation:
    """The owned slots of one key generation, one `OwnedSlots` per broker: the topic's, or a
    doubling's halves (twice the slots, s + N on the broker of s)."""

    def __init__(
        self,
        brokers: Brokers,
        wake: Callable[[PullSlot, float], None],
        on_lost: Callable[[int], None] | None,
    ) -> None:
        self.brokers = brokers
        generation = brokers.topic.slot_generation

        def new_slot(slot: int, epoch: int) -> PullSlot:
            return PullSlot(slot, epoch, generation=generation)

        self.owned = [OwnedSlots(queue, new_slot, wake) for queue in brokers.queues]
        self.top_ups = [TopUps(queue) for queue in brokers.queues]
        self.on_lost = on_lost  # told of a slot a newer owner fenced this process out of

    def owned_of(self, state: PullSlot) -> OwnedSlots[PullSlot]:
        return self.owned[self.brokers.routing[state.slot]]


@dataclass
class _Round:
    messages: Pulled = field(default_factory=dict)
    count: int = 0
    full: list[PullSlot] = field(default_factory=list)  # filled their share: maybe more
    # a broker's claims failed (its slots keep their due time); the others' stand
    failed: redis.RedisError | OSError | None = None


class PullLeaser:
    """Leases messages of the slots this process owns, on request."""

    def __init__(
        self, brokers: Brokers, pacer: Pacer | None = None, backoff: Backoff | None = None
    ) -> None:
        self.brokers = brokers
        self.generation = brokers.topic.slot_generation
        self.pacer = pacer  # the topic's rate limit: leases draw from it first
        # the topic's retry policy: a lease that ran out is claimable again after it, as a nack
        # without delayMs is (None: at once)
        self.backoff = backoff
        self._paced_ms = 0.0  # the latest claim was refused by the pacer: wait this long
        self._generations = {self.generation: _Generation(brokers, self._wake, None)}
        self._started = False
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
        # the brokers whose latest claim failed, or that a pause read could not reach:
        # monotonic time, error
        self._down: dict[int, tuple[float, redis.RedisError | OSError]] = {}

    @property
    def owned_slots(self) -> list[int]:
        return self.owned_in(self.generation)

    def owned_in(self, generation: int) -> list[int]:
        """The owned slots of key generation `generation`, sorted."""
        owned = self._generations[generation].owned
        return sorted(slot for broker_owned in owned for slot in broker_owned.slots)

    def add_generation(
        self, brokers: Brokers, on_lost: Callable[[int], None] | None = None
    ) -> int:
        """Lease from the slots of `brokers` too, at their key generation (returned): a
        doubling's halves, owned by `own(..., generation)`; `on_lost` is told of a slot a newer
        owner fenced this process out of."""
        generation = brokers.topic.slot_generation
        added = _Generation(brokers, self._wake, on_lost)
        self._generations[generation] = added
        if self._started:
            for owned in added.owned:
                owned.start()
        return generation

    def start(self) -> None:
        """Start the brokers' wake-up waits (`close` ends them)."""
        self._started = True
        for generation in self._generations.values():
            for owned in generation.owned:
                owned.start()

    async def close(self) -> None:
        generations = list(self._generations.values())
        await asyncio.gather(*(t.close() for g in generations for t in g.top_ups))
        await asyncio.gather(*(owned.close() for g in generations for owned in g.owned))
        self._polls.close()

    async def own(
        self, slots: Iterable[int], generation: int | None = None
    ) -> dict[int, redis.RedisError | OSError]:
        """Take the slots (of `generation`, by default the topic's) over; returns those that
        could not be taken now (OwnedSlots.own)."""
        owner = self._generations[self.generation if generation is None else generation]
        failed: dict[int, redis.RedisError | OSError] = {}
        for broker, broker_slots in owner.brokers.split(slots).items():
            failed.update(await owner.owned[broker].own(broker_slots))
        return failed

    async def release(self, slots: Iterable[int], generation: int | None = None) -> None:
        """Stop claiming the slots; returns once no claim that may include them is in flight,
        which is what Ownership's handoff order requires before another process takes them."""
        owner = self._generations[self.generation if generation is None else generation]
        for broker, broker_slots in owner.brokers.split(slots).items():
            # no watchdog here: a wake-up its wait took for them goes back (OwnedSlots.release)
            await owner.owned[broker].release(broker_slots, hand_back=True)
        in_flight = list(self._rounds)
        if in_flight:
            await asyncio.wait(in_flight)

    def stop(self) -> None:
        self._stopping = True
        self._polls.wake_all()

    def _wake(self, state: PullSlot, due_ms: float) -> None:
        """A slot was owned (due now) or woken by a producer with its new earliest message's
        due time: it may have something due then (a claim in flight on it sees `wakes` move
        and leaves it due). A waiting poll times its wait again."""
        if state.due_ms is None or due_ms < state.due_ms:
            state.due_ms = due_ms
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
        its last reading and is down (`_broker_failed`): the other brokers' slots are leased
        meanwhile rather than every lease failing with it; one that answers is up again."""
        queues = self.brokers.queues
        read = await asyncio.gather(*(q.is_paused() for q in queues), return_exceptions=True)
        for broker, paused in enumerate(read):
            if isinstance(paused, bool):
                self._paused[broker] = paused
                self._broker_works(broker, claimed=False)
            elif isinstance(paused, UNANSWERED):
                self._broker_failed(broker, paused)
            elif isinstance(paused, redis.RedisError):  # an error reply: it answers
                self._broker_works(broker, claimed=False)
            else:
                raise paused
        self._paused_read_s = time.monotonic()

    @property
    def unreachable(self) -> list[bool]:
        """Per broker: its latest claim failed, or a pause read could not reach it."""
        return [broker in self._down for broker in range(len(self.brokers.queues))]

    def _broker_failed(self, broker: int, error: redis.RedisError | OSError) -> None:
        if broker not in self._down:
            log.warning(
                "broker %d failed (%r): leasing from the others, claiming it again every %.0f s",
                broker,
                error,
                BROKER_RETRY_S,
            )
        self._down[broker] = (time.monotonic(), error)

    def _broker_works(self, broker: int, claimed: bool) -> None:
        """The broker answered a claim (`claimed`) or a pause read: up again, unless it
        answers reads but refused its latest claim (only a claim tells it works again)."""
        down = self._down.get(broker)
        if down is not None and (claimed or isinstance(down[1], UNANSWERED)):
            del self._down[broker]
            log.warning("broker %d works again", broker)

    def _all_down(
        self, kinds: type[BaseException] | tuple[type[BaseException], ...] = BaseException
    ) -> redis.RedisError | OSError | None:
        """The latest error when every broker this process leases from (owns slots on; any,
        while it owns none) failed with an error of `kinds`; None while one has not."""
        owning = {
            broker
            for generation in self._generations.values()
            for broker, owned in enumerate(generation.owned)
            if owned.slots
        } or set(range(len(self.brokers.queues)))
        failed = [self._down.get(broker) for broker in owning]
        if any(down is None or not isinstance(down[1], kinds) for down in failed):
            return None
        return max((down for down in failed if down is not None), key=lambda d: d[0])[1]

    def server_now_ms(self, slot: int, generation: int | None = None) -> float:
        """The clock of the Redis server storing `slot` (of `generation`, by default the
        topic's), as estimated from its claims."""
        owner = self._generations[self.generation if generation is None else generation]
        return self._clocks[owner.brokers.routing[slot]].now_ms()

    async def give_back(self, leased: Pulled) -> None:
        """Give leased messages back undelivered (prepare -> store, no attempt counted)."""
        for generation, messages in leased.items():
            await self._generations[generation].brokers.each(
                messages, _slot, lambda queue, chunk: queue.giveback_many(chunk)
            )

    async def lease(self, max_count: int, ack_timeout_ms: int, wait_ms: int = 0) -> Pulled:
        """Up to `max_count` due messages leased for `ack_timeout_ms`, waiting up to `wait_ms`."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            # no broker answers: read them now, before refusing (one may be back); one that
            # answers but refuses claims is claimed again when something is due on it
            down = bool(self._down) and self._all_down(UNANSWERED) is not None
            if down or time.monotonic() - self._paused_read_s >= PAUSE_CHECK_S:
                await self.refresh_paused()
                if (error := self._all_down(UNANSWERED)) is not None:
                    raise error
            leased = await self._paced_claim(max_count, ack_timeout_ms)
            due_now = self._arm() and not self._paced_ms
            if leased:
                if due_now:
                    self._polls.wake_one()  # more is due: the next waiting poll claims it
                return leased
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or self._stopping:
                return {}
            if self._paced_ms:  # over the rate: nothing claimed, the messages stay in store
                await asyncio.sleep(min(remaining_s, self._paced_ms / 1000))
            elif not due_now:
                recheck = self.paused or self._down  # a resume, a broker back: seen in a second
                wait_s = min(remaining_s, PAUSE_CHECK_S) if recheck else remaining_s
                await self._polls.wait(wait_s)

    def _idle(self) -> list[tuple[PullSlot, float]]:
        """The owned slots of unpaused brokers that no claim is in flight on, each with its
        broker's clock as a claim sent now would find it (`ServerClock.arrival_ms`); a broker
        down is left out until BROKER_RETRY_S after it failed."""
        now_ms = [clock.arrival_ms() for clock in self._clocks]
        now_s = time.monotonic()
        resting = {b for b, (at_s, _) in self._down.items() if now_s - at_s < BROKER_RETRY_S}
        return [
            (state, now_ms[broker])
            for generation in self._generations.values()
            for broker, owned in enumerate(generation.owned)
            if not self._paused[broker] and broker not in resting
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

    async def _paced_claim(self, max_count: int, ack_timeout_ms: int) -> Pulled:
        """`_claim` of as many messages as the topic's rate limit grants now (all when it has
        none); tokens the claim did not use are given back."""
        self._paced_ms = 0.0
        if self.pacer is None or not self._rotation_due():
            return (await self._claim(max_count, ack_timeout_ms)).messages
        granted, wait_ms = await self.pacer.take(max_count)
        if not granted:
            self._paced_ms = max(1.0, wait_ms)
            return {}
        claimed = await self._claim(granted, ack_timeout_ms)
        self.pacer.unused(granted - claimed.count)
        return claimed.messages

    def _rotation_due(self) -> bool:
        """Some idle slot has something due now (a claim would not come back empty at once)."""
        return any(s.due_ms is not None and s.due_ms <= now for s, now in self._idle())

    async def _claim(self, max_count: int, ack_timeout_ms: int) -> _Round:
        """Claim exactly up to `max_count`: shares per round never add up to more."""
        pending = self._rotation()
        claimed = _Round()
        while pending and claimed.count < max_count:
            wanted = max_count - claimed.count
            batch, rest = pending[:wanted], pending[wanted:]
            result = await self._round(batch, _shares(wanted, len(batch)), ack_timeout_ms)
            for generation, messages in result.messages.items():
                claimed.messages.setdefault(generation, []).extend(messages)
            claimed.count += result.count
            if result.failed is not None:
                # what is leased already goes to the caller: raised, it would wait out its
                # lease unseen and then count an attempt that never was; with nothing leased,
                # the brokers that work are waited on, unless none does
                if not claimed.count and self._all_down() is not None:
                    raise result.failed
                break
            pending = rest + result.full
        return claimed

    def _rotation(self) -> list[PullSlot]:
        """The idle slots due by now, starting after where the previous request started."""
        due = sorted(
            (
                state
                for state, now_ms in self._idle()
                if state.due_ms is not None and state.due_ms <= now_ms
            ),
            key=_order,
        )
        if not due:
            return []
        self._cursor = (self._cursor + 1) % len(due)
        return due[self._cursor :] + due[: self._cursor]

    async def _round(
        self, states: list[PullSlot], shares: list[int], ack_timeout_ms: int
    ) -> _Round:
        claimed = {
            state: (share, state.wakes)
            for state, share in zip(states, shares, strict=True)
            if not state.claiming
            and self._generations[state.generation].owned_of(state).get(state.slot) is state
        }
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rounds.add(done)
        for state in claimed:
            state.claiming = True
        groups: dict[tuple[int, int], list[PullSlot]] = {}  # (generation, broker) -> slots
        for state in claimed:
            broker = self._generations[state.generation].brokers.routing[state.slot]
            groups.setdefault((state.generation, broker), []).append(state)
        try:
            replies = await self._claims_on(groups, claimed, ack_timeout_ms)
        finally:
            for state in claimed:
                state.claiming = False
            self._rounds.discard(done)
            done.set_result(None)
        result = _Round()
        for (_, broker), reply in zip(groups, replies, strict=True):
            if isinstance(reply, redis.RedisError | OSError):
                result.failed = reply
                self._broker_failed(broker, reply)
            elif isinstance(reply, BaseException):
                raise reply
            else:
                self._broker_works(broker, claimed=True)
        for (generation, broker), reply in zip(groups, replies, strict=True):
            if isinstance(reply, BaseException):
                continue
            owner = self._generations[generation]
            for state, outcome in reply:
                share, wakes = claimed[state]
                if isinstance(outcome, StaleEpochError):  # fenced out by a newer owner
                    if owner.owned[broker].lose(state) and owner.on_lost is not None:
                        owner.on_lost(state.slot)
                    continue
                top_ups = owner.top_ups[broker]
                top_ups.retry_failed()
                top_ups.note(outcome)
                if outcome.messages:
                    result.messages.setdefault(generation, []).extend(outcome.messages)
                    result.count += len(outcome.messages)
                self._clocks[broker].note(outcome.now_us, outcome.received_s, outcome.sent_s)
                upcoming = [
                    t for t in (outcome.next_due_ms, outcome.next_deadline_ms) if t is not None
                ]
                state.due_ms = min(upcoming) if upcoming else None
                if len(outcome.messages) >= share:
                    result.full.append(state)
                    state.due_ms = 0.0  # maybe more due now
                elif state.wakes != wakes:
                    state.due_ms = 0.0  # woken while the claim was in flight: it may have missed it
        return result

    async def _claims_on(
        self,
        groups: dict[tuple[int, int], list[PullSlot]],
        claimed: dict[PullSlot, tuple[int, int]],
        ack_timeout_ms: int,
    ) -> list[list[tuple[PullSlot, ClaimBatch | StaleEpochError]] | BaseException]:
        """`_claim_on` of every (generation, broker) group at once, in the groups' order, a
        broker's error in its place: one broker's failure leaves the others' leases. A round
        on one broker (a pod's usual case) awaits its claim itself: `gather` would wrap it in a
        task, a turn of the event loop before the claim is sent and two after its reply."""
        calls = [
            self._claim_on(generation, broker, group, claimed, ack_timeout_ms)
            for (generation, broker), group in groups.items()
        ]
        if len(calls) != 1:
            return await asyncio.gather(*calls, return_exceptions=True)
        try:
            return [await calls[0]]
        except (redis.RedisError, OSError) as error:
            return [error]

    async def _claim_on(
        self,
        generation: int,
        broker: int,
        states: list[PullSlot],
        claimed: dict[PullSlot, tuple[int, int]],
        ack_timeout_ms: int,
    ) -> list[tuple[PullSlot, ClaimBatch | StaleEpochError]]:
        """One pipelined round trip to one broker for all its slots of one generation in this
        round."""
        claims = [SlotClaim(state.slot, state.epoch, claimed[state][0]) for state in states]
        queue = self._generations[generation].brokers.queues[broker]
        outcomes = await queue.claim_slots(claims, ack_timeout_ms, self.backoff)
        return list(zip(states, outcomes, strict=True))


def _order(state: PullSlot) -> tuple[int, int]:
    return state.generation, state.slot


def _slot(message: Message) -> int:
    return message.slot


def _shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as possible (the first ones get the remainder)."""
    quotient, remainder = divmod(total, parts)
    return [quotient + (1 if index < remainder else 0) for index in range(parts)]
