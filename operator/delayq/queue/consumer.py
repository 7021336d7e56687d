"""Deliver due messages of owned slots to a handler, waking at each due time and no later.

Precise wake-up without polling: every claim returns the slot's next due time and lease
deadline on the Redis server clock, so the consumer sleeps exactly until the earliest of them
(measured as a duration, so client clock skew never matters). A producer that schedules a new
earliest message wakes the slot (`slots.OwnedSlots`, the ownership and wake-up core shared with
pull delivery), which cuts the sleep short. A message is therefore claimed within the event
loop's timer resolution of its due instant — never before it, since the claim script compares
against server time.

Flow control: at most `worker_concurrency` messages are leased at once; when handlers are slow the
consumer stops claiming rather than buffering (the seed's per-partition pause), and a burst of
millions due at one instant is drained `batch_size` at a time. Room is given back per message as
its handler finishes.

Honest leases: a lease covers the time a message really waits for and spends in its handler. A
heartbeat extends the leases of every claimed message not finished yet before they run out (so
queueing behind `batch_concurrency`, or a long handler, never lets a lease expire while Redis is
reachable), and before each handler call the consumer checks that the slot is still its own and
the lease still valid: a message that fails the check is not handed to the handler but given back
(prepare -> store, attempt not counted), so the slot's owner delivers it at once.

Never stuck: a slot this consumer owns is either being claimed or has a timer (every path that
takes a slot off the timer heap puts it back), and a watchdog checks that invariant against Redis
once a second: a slot whose head is overdue while the consumer believes otherwise (a lost wake-up)
is claimed again and counted (`counters.stalled_slots_recovered`).

Release never depends on Redis: it stops claiming at once, waits (bounded) for claims in flight to
come back and gives their messages back, lets running handlers finish and give back the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar, cast

import redis.asyncio

from delayq.queue import settings
from delayq.queue.backoff import Backoff
from delayq.queue.client import AsyncQueue
from delayq.queue.coalesce import Coalescer
from delayq.queue.codes import Code, DelayqError, ReplicationTimeoutError, StaleEpochError
from delayq.queue.model import ClaimBatch, Leased, Message, Outcome, Retry, SlotClaim
from delayq.queue.pacing import Pacer
from delayq.queue.precise_timer import PreciseTimer
from delayq.queue.renamed import renamed_kwargs
from delayq.queue.server_clock import ServerClock
from delayq.queue.slots import OwnedSlot, OwnedSlots
from delayq.queue.topups import TopUps

log = logging.getLogger(__name__)
T = TypeVar("T")

Handler = Callable[[Message], Awaitable[None]]
RETRY_MS = 200  # after a failed claim, the slot is tried again this much later
ACK_FLUSH_S = 0.05  # a handled message's ack waits for its group at most this long
WATCHDOG_S = 1.0  # how often owned slots are checked against Redis for a missed wake-up
STALL_BOUND_MS = 1000  # a head overdue this long that the consumer does not expect is a stall
PAUSED_RETRY_MS = 1000  # while the topic is paused, due slots look again this much later


class DeadLetterError(Exception):
    """Raised by a handler for a message that can never succeed: it goes to dead at once."""


class NoSlotsError(DelayqError, ValueError):
    """`Consumer.run()` was started with no slot to consume and nobody to grant one: it would
    idle for ever. Pass the slots (`run(slots=...)`), `own()` them first, or construct the
    consumer with `managed=True` when an ownership source grants them later."""


class GiveBackError(Exception):
    """Raised by a handler that did not deliver the message: it is given back rather than
    nacked (prepare -> store at its due time, no attempt counted)."""


class LeaseGoneError(GiveBackError):
    """Raised by a handler that found, before it started delivering, that the message's lease
    is no longer valid (`Consumer.holds` is false)."""


# messages leased at once at most: the DelayTopic's `worker.concurrency` default (1000; the
# delivery bench measured it at the CPU per message of 2000)
DEFAULT_WORKER_CONCURRENCY: int = settings.default("worker_concurrency")
# messages per claim at most: 200 cost 13% more Python and 20% more Redis CPU per delivered
# message than 500 (bench/bench_hot_paths.py, delivery, 16 slots)
DEFAULT_BATCH_SIZE = 500


# the old names until the next release
@renamed_kwargs(lease_ms="ack_timeout_ms", max_in_flight="worker_concurrency")
@dataclass
class ConsumerSettings:
    batch_size: int = DEFAULT_BATCH_SIZE
    worker_concurrency: int = DEFAULT_WORKER_CONCURRENCY  # leased at once at most
    ack_timeout_ms: int | None = None  # a claim's lease length; default: the topic's
    batch_concurrency: int = 64  # handlers running at once within one claimed batch
    ack_group_size: int = 256  # acks (and nacks) sent together once this many are ready
    release_drain_s: float = 10.0  # how long releasing a slot waits for its in-flight acks
    backoff: Backoff = field(default_factory=Backoff)


@dataclass
class ConsumerCounters:
    """What went wrong and was handled, for metrics (monotonic counts since start)."""

    stalled_slots_recovered: int = 0  # the watchdog found a slot overdue and claimed it again
    acks_lease_lost: int = 0  # acks or nacks refused: the lease had expired or moved on
    # claimed messages not delivered: slot or lease gone, or the receiver asked for time
    deliveries_skipped: int = 0
    given_back: int = 0  # claimed messages returned undelivered to store
    acks_unreplicated: int = 0  # acks or nacks done on the master, not confirmed by replicas
    schedules_topped_up: int = 0  # recurring schedules' next-but-one due precomputed


@dataclass(eq=False)
class _SlotState(OwnedSlot):
    next_ms: float | None = 0  # server ms when the slot next needs a claim (0 = now)
    wakes_at_claim: int = 0  # `wakes` when the slot's latest claim was sent
    claimed_seq: int = 0  # when the slot was last claimed, in claims: the least recent first
    claimed_ms: float = 0  # server ms of the slot's latest claim (`_watch_slots` skips it)


@dataclass
class _Batch:
    """A claimed batch while any of its messages is not finished: what the heartbeat extends
    and what `holds` checks before each handler call."""

    slot: int
    epoch: int
    deadline_ms: float  # server ms the leases of its unfinished messages run out
    pending: dict[str, Message]  # claimed, not acked or nacked yet (waiting, handled, unsent)
    lost: set[str] = field(default_factory=set)  # ids whose lease an extend found gone


class Consumer:
    """Owns a set of slots of one topic and runs the claim → handle → ack/nack loop.

    Which slots it consumes, two ways:

    * standalone (the default): `await consumer.run(slots=topic.slots)` takes the slots over
      (fencing out any previous owner) and consumes them until `stop()`; `own()` before `run()`
      does the same. `run()` with no slot owned and none given raises `NoSlotsError` at once
      instead of idling silently.
    * `managed=True`: an ownership source outside the consumer (the delay service's ZooKeeper
      assignment) calls `own()` and `release()` while `run()` is going, and `run()` may start
      with no slot at all, waiting for the first grant.

    A slot taken over by another consumer is dropped (logged, `on_slot_lost`) in both modes.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Handler,
        settings: ConsumerSettings | None = None,
        on_slot_lost: Callable[[int], None] | None = None,
        *,
        managed: bool = False,
        on_nacked: Callable[[list[Outcome]], None] | None = None,
        on_claimed: Callable[[list[Message]], None] | None = None,
        on_acked: Callable[[list[Outcome]], None] | None = None,
        pacer: Pacer | None = None,
        on_released: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        self.queue = queue
        # the topic's pace (rate limit, receiver's hold), drawn from before each claim round
        self.pacer = pacer
        self.handler = handler
        self.settings = settings or ConsumerSettings()
        self.on_slot_lost = on_slot_lost
        # told the engine's answer to every nack sent (retried, dead or dropped): only the
        # scripts know whether a failure ended the message (maxRetries, retry.for, expiry)
        self.on_nacked = on_nacked
        # told every claimed batch before its handlers run, and the engine's answer to every
        # ack sent (the delay service's traces; None, the default, costs one test per call)
        self.on_claimed = on_claimed
        self.on_acked = on_acked
        # told the slots `release` let go, before it waits for their handlers: a handler
        # waiting for its turn (the webhook sink's POST slots) stops and gives its message back
        self.on_released = on_released
        self.managed = managed
        self.counters = ConsumerCounters()
        self._ack_timeout_ms = queue.topic.lease_ms(self.settings.ack_timeout_ms)
        self._owned = OwnedSlots(queue, _SlotState, self._due_at)
        self.top_ups = TopUps(queue, self._count_topped_up)  # what claims owe schedules
        self._timers: list[tuple[float, int]] = []  # heap of (next_ms, slot); stale ones skipped
        self._changed = asyncio.Event()
        self._timer = PreciseTimer(self._changed.set)  # the next claim's, to 0.1 ms
        self._stopping = False
        self._paused = False  # the broker's pause flag as last read (Queue.pause)
        self._in_flight = 0
        self._room = asyncio.Event()  # set when a worthwhile claim fits in flight again
        self._tasks: dict[asyncio.Task[None], int] = {}  # delivery task -> its slot
        self._batches: dict[tuple[int, int], _Batch] = {}  # (slot, lease_id) -> batch
        self._claiming: set[int] = set()  # slots in a claim call right now
        self._claimed = asyncio.Event()  # set whenever a claim call returns
        # every batch's acks (and nacks) share one call in flight: see `coalesce`
        self._acks: Coalescer[Leased, Outcome] = Coalescer(
            lambda leases: self._twice_on_reconnect(self.queue.ack_many, leases)
        )
        self._nacks: Coalescer[Retry, Outcome] = Coalescer(
            lambda retries: self._twice_on_reconnect(self.queue.nack_many, retries)
        )
        # server clock estimate, in fractional ms (claims report µs): a floored estimate would
        # wake up to 1 ms late
        self._clock = ServerClock()
        # the smallest claim worth a round trip: a quarter batch (never more than fits in flight)
        batch_limit = min(self.settings.batch_size, self.settings.worker_concurrency)
        self._min_batch = max(1, batch_limit // 4)
        # the smallest share of a round that reaches every due slot (`_split`)
        self._min_share = max(1, batch_limit // 16)
        self._claims_sent = 0  # slot claims sent so far (`_SlotState.claimed_seq`)

    # ownership --------------------------------------------------------------------------------

    @property
    def owned_slots(self) -> list[int]:
        return self._owned.slots

    async def own(self, slots: Iterable[int]) -> dict[int, redis.RedisError | OSError]:
        """Take over slots (bumping their fencing epochs) and start consuming them; returns
        those that could not be taken now, with why (OwnedSlots.own), for the caller to retry."""
        return await self._owned.own(slots)

    async def release(self, slots: Iterable[int]) -> None:
        """Stop claiming from slots, give back what was claimed and not started, and wait (at
        most `release_drain_s`) for running handlers to be acked: the next owner's fence would
        reject those acks and redeliver. Never raises, whatever the state of Redis: the caller
        (the ownership handoff) must be able to give the slots up in any case."""
        # a wake-up its wait took since the slot's latest claim goes back to the slot's list:
        # a process thawed after its session expired reads the new owner's wake-up (its wait
        # is served first) before it drops its slots, and the new owner would learn of that
        # message from its watchdog, 1-2 s late (chaos seed 23: 1.8 s)
        released = self._owned.drop(slots, _woken_since_claim)
        if not released:
            return
        if self.on_released is not None:
            self.on_released(frozenset(released))
        await self._owned.interrupt()
        deadline = time.monotonic() + self.settings.release_drain_s
        while self._claiming & released and (left := deadline - time.monotonic()) > 0:
            self._claimed.clear()  # the claim gives its messages back before it returns
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._claimed.wait(), left)
        draining = [task for task, slot in self._tasks.items() if slot in released]
        if draining:
            await asyncio.wait(draining, timeout=max(0.0, deadline - time.monotonic()))

    def holds(self, message: Message) -> bool:
        """True while this consumer may still deliver the message: its slot is owned under the
        epoch it was claimed with and its lease is neither lost nor past its deadline."""
        return self.lease_deadline_ms(message) is not None

    def lease_deadline_ms(self, message: Message) -> float | None:
        """When the message's lease runs out (server ms, as far as this consumer knows: the
        heartbeat may still move it later), or None when `holds` is false."""
        batch = self._batches.get((message.slot, message.lease_id))
        return None if batch is None else self._deadline_in(batch, message)

    def _deadline_in(self, batch: _Batch, message: Message) -> float | None:
        """`lease_deadline_ms` of a message of `batch`: what a batch's worker checks before
        each handler call, without looking its batch up."""
        state = self._owned.get(batch.slot)
        if (
            state is None
            or state.epoch != batch.epoch
            or batch.deadline_ms <= self.server_now_ms()
            or message.id in batch.lost
        ):
            return None
        return batch.deadline_ms

    # the loop ---------------------------------------------------------------------------------

    async def run(self, slots: Iterable[int] | None = None) -> None:
        """Own `slots` (if given), then run until `stop()`; then wait for in-flight deliveries
        to finish. Raises NoSlotsError, before doing anything, when the consumer is not
        `managed` and would own no slot (see the class docstring), and the error of a slot of
        `slots` that could not be taken over."""
        if slots is not None:
            failed = await self.own(slots)
            if failed:  # nobody would retry them: a standalone consumer fails at once
                raise next(iter(failed.values()))
        if not len(self._owned) and not self.managed:
            raise NoSlotsError(
                "Consumer.run() has no slot to consume: pass run(slots=...), own() slots "
                "first, or construct the consumer with managed=True when an ownership source "
                "grants slots later"
            )
        self._owned.start()
        with contextlib.suppress(redis.RedisError):  # a paused topic stays paused across restarts
            await self.refresh_paused()
        upkeep = asyncio.create_task(self._keep_up())
        try:
            while not self._stopping:
                await self._drain(self._pop_due_slots())
                await self._sleep_until_next()
        finally:
            self._stopping = True
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upkeep
            await self.top_ups.close()
            await self._owned.close()
            self._timer.close()

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()
        self._room.set()  # a claim waiting for room in flight: stopping never waits on handlers

    @property
    def paused(self) -> bool:
        """The topic's delivery is paused on this broker (as last read): nothing is claimed."""
        return self._paused

    async def refresh_paused(self) -> None:
        """Read the broker's pause flag now (the upkeep does it every second); on resume every
        owned slot is claimed at once."""
        paused = await self.queue.is_paused()
        if paused == self._paused:
            return
        self._paused = paused
        log.warning("delivery %s", "paused: claiming stopped" if paused else "resumed")
        if not paused:
            for state in self._owned:
                self._due_at(state, 0)

    def _count_topped_up(self, count: int) -> None:
        self.counters.schedules_topped_up += count

    def server_now_ms(self) -> float:
        """The Redis server clock as estimated from the claims' replies (µs precise,
        skew-free; `ServerClock`): what lateness and every other user-facing time is measured
        on."""
        return self._clock.now_ms()

    def _due_at(self, state: _SlotState, due_ms: float) -> None:
        """The slot may have something due at `due_ms` (0: now): it was just owned or resumed,
        or a producer woke it with its new earliest message's due time. Its timer goes no later
        than that, and the loop times its sleep again (it may be asleep with no timer at all).
        A message scheduled ahead is claimed when it is due, with the other slots due then,
        not at once: a producer's first batch over 1,024 slots was 1,024 claims of nothing,
        each its own call, while the producer was still writing."""
        if state.next_ms is not None and state.next_ms < due_ms:
            return  # its timer comes first: that claim's reply tells the slot's next due
        self._set_next(state.slot, due_ms)
        self._changed.set()

    def _set_next(self, slot: int, next_ms: float | None) -> None:
        state = self._owned.get(slot)
        if state is None:
            return
        state.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self._timers, (next_ms, slot))

    def _is_current(self, entry: tuple[float, int]) -> bool:
        state = self._owned.get(entry[1])
        return state is not None and state.next_ms == entry[0]

    def _next_timer(self) -> float | None:
        while self._timers and not self._is_current(self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _pop_due_slots(self) -> list[int]:
        """The slots whose timer is due, each once: a slot woken many times to the same
        instant (a producer storing a herd wakes it once per batch) has as many entries on the
        heap, all current, and a duplicate would be claimed again in the same round, its
        herd taking the room that round owes the other due slots. Due by the time a claim
        sent now reaches the server (`ServerClock.arrival_ms`)."""
        now = self._clock.arrival_ms()
        due: dict[int, None] = {}
        while (next_ms := self._next_timer()) is not None and next_ms <= now:
            due[heapq.heappop(self._timers)[1]] = None
        return list(due)

    async def _drain(self, slots: list[int]) -> None:
        """Claim the due messages of these slots, all slots in one pipelined round trip per
        round, while there is room in flight; a slot whose claim came back full goes again.

        Every slot taken off the timer heap gets a timer back on every way out (the finally):
        a slot that is neither claimed nor timed would never be claimed again."""
        pending = slots
        backlogged: set[int] = set()  # slots whose latest claim came back full (`_split`)
        retry_in_ms = 0
        try:
            while pending and not self._stopping:
                room = await self._wait_for_capacity()
                # after the wait: a pause read while it waited for room holds this claim too
                if self._paused:
                    retry_in_ms = PAUSED_RETRY_MS  # resuming claims them at once anyway
                    return
                owned = [(slot, state) for slot in pending if (state := self._owned.get(slot))]
                if self._stopping or not owned:
                    return
                # the slots claimed least recently first: when room takes only some of the due
                # slots, each gets its turn (a herd in one slot cannot keep another's waiting,
                # as due-then-slot-number order did whenever a drain began again)
                owned.sort(key=lambda item: item[1].claimed_seq)
                fresh = any(slot not in backlogged for slot, _ in owned)
                count, share = self._split(room, len(owned), fresh)
                pending = [slot for slot, _ in owned]
                owned = owned[:count]
                try:
                    if self.pacer is not None:
                        granted, wait_ms = await self.pacer.take(count * share)
                        if not granted:  # rate limit or receiver's hold: the messages stay
                            retry_in_ms = max(1, math.ceil(wait_ms))
                            return
                        count, share = self._split(granted, count, fresh)
                        owned = owned[:count]
                        self.pacer.unused(granted - count * share)
                    results = await self._claim(owned, share)
                except redis.RedisError as error:
                    # Redis unreachable or failing over: keep the slots and try again shortly
                    log.warning("claim failed (%s); retrying in %d ms", error, RETRY_MS)
                    retry_in_ms = RETRY_MS
                    return
                pending = pending[count:]
                for (slot, state), result in zip(owned, results, strict=True):
                    if self.pacer is not None:
                        used = len(result.messages) if isinstance(result, ClaimBatch) else 0
                        self.pacer.unused(share - used)
                    if self._take_result(slot, state, result, share):
                        pending.append(slot)
                        backlogged.add(slot)
                    else:
                        backlogged.discard(slot)
                pending += self._due_besides(pending)
        finally:
            now = self.server_now_ms()
            for slot in pending:
                self._set_next(slot, now + retry_in_ms)

    def _split(self, room: int, due: int, fresh: bool) -> tuple[int, int]:
        """How many of `due` slots a round claims, and how many messages each (the shares add
        up to at most `room`, the room in flight or the pacer's grant). A round with a slot
        that is not a known backlog (`fresh`: a herd's first round, a slot come due since,
        also one claimed earlier in the same drain: only a claim that came back full says a
        slot has more) and room for a sixteenth batch in every due slot claims them all,
        sharing the room. (A drain goes on as long as something is due at the end of its
        round; in a burst over 1,024 slots that is the whole burst, and counting every slot
        it had claimed once as a backlog left its rounds at quarter batches of slots holding
        one or two messages each.) When more are due than a sixteenth batch each fits, such a
        round claims as many as it fits, the least recently claimed first, the others next
        round: quarter batches reached 8 slots a round trip at the defaults, and a burst over
        1,024 slots, a hundred of them due after a pause of a few ms, took a dozen round trips
        of 8 messages to catch up. A slot left out of a round waits for rounds of the others'
        claims, every message in it with it, whatever its group or priority: a herd in 16
        slots, its first round at a quarter batch a slot, reached 8 of them at the defaults
        and left the other 8 waiting a second of the receiver's time. Otherwise (only slots
        whose claims came back full) quarter batches, the least recently claimed slots first
        (slots left out go first next round), not slivers: each claim costs its own Lua call,
        ack call and workers (sharing every round with room cost the delivery bench 7 % more
        Redis CPU a message at 16 slots, twice the claim calls)."""
        least = self._min_share if fresh else self._min_batch
        count = max(1, min(due, room // least))
        return count, min(self.settings.batch_size, room // count)

    def _due_besides(self, pending: list[int]) -> list[int]:
        """The slots come due (or woken) during a drain, but those it claims anyway: they join
        it, each round, rather than wait for its end, which a herd in other slots (their
        claims coming back full) puts off until it is drained."""
        due = self._pop_due_slots()
        if not due:
            return due
        draining = set(pending)
        return [slot for slot in due if slot not in draining]

    async def _claim(
        self, owned: list[tuple[int, _SlotState]], share: int
    ) -> list[ClaimBatch | StaleEpochError]:
        """One pipelined claim; a batch whose slot was released meanwhile is given back before
        the claim counts as returned (release waits for that)."""
        for slot, state in owned:
            state.wakes_at_claim = state.wakes
            self._claims_sent += 1
            state.claimed_seq = self._claims_sent
            self._claiming.add(slot)
        try:
            results = await self.queue.claim_slots(
                [SlotClaim(slot, state.epoch, share) for slot, state in owned],
                self._ack_timeout_ms,
                self.settings.backoff,  # a lease that ran out is retried as a nack would be
            )
            orphans = [
                message
                for (slot, state), result in zip(owned, results, strict=True)
                if self._owned.get(slot) is not state and isinstance(result, ClaimBatch)
                for message in result.messages
            ]
            if orphans:
                await self._give_back(orphans)
        finally:
            self._claiming.difference_update(slot for slot, _ in owned)
            self._claimed.set()
        return results

    def _take_result(
        self, slot: int, state: _SlotState, result: ClaimBatch | StaleEpochError, share: int
    ) -> bool:
        """Start delivering a claim's messages and time the slot's next claim; True when the
        slot should be claimed again in this drain (its batch came back full)."""
        if self._owned.get(slot) is not state:
            return False  # released while the claim was in flight (its messages given back)
        if isinstance(result, StaleEpochError):
            self._lose(state)
            return False
        self._clock.note(result.now_us, result.received_s, result.sent_s)
        state.claimed_ms = result.now_ms
        self.top_ups.note(result)
        if result.messages:
            self._deliver(result)
        if state.wakes != state.wakes_at_claim:
            # woken while the claim was in flight: the reply's next due time predates the
            # message that caused the wake-up, so claim again rather than trust it
            self._set_next(slot, 0)
        elif len(result.messages) < share:
            self._set_next(slot, _next_ms(result))
        else:
            return True
        return False

    async def _sleep_until_next(self) -> None:
        """Until the next timer or a change (`_changed`). The timer sets `_changed` itself:
        `asyncio.wait_for` would wrap each sleep in a task and, at the due instant, take three
        more turns of the event loop to come back (Python 3.11), each turn running whatever
        else was ready first."""
        self._changed.clear()
        if self._stopping:
            return  # stop() came during the claim: its signal was just cleared with the others
        next_ms = self._next_timer()
        timeout = None if next_ms is None else (next_ms - self._clock.arrival_ms()) / 1000
        if timeout is not None and timeout <= 0:
            return
        if timeout is not None:
            self._timer.arm(timeout)
        try:
            await self._changed.wait()
        finally:
            self._timer.cancel()

    async def _wait_for_capacity(self) -> int:
        """Wait until a worthwhile claim fits in flight: at least a quarter batch of room, so a
        backlog is not drained in slivers (each sliver would cost its own claim and ack calls)."""
        limit = self.settings.worker_concurrency
        while not self._stopping and limit - self._in_flight < self._min_batch:
            self._room.clear()
            await self._room.wait()
        return limit - self._in_flight

    def _give_room(self, count: int) -> None:
        self._in_flight -= count
        if self.settings.worker_concurrency - self._in_flight >= self._min_batch:
            self._room.set()

    def _lose(self, state: _SlotState) -> None:
        if not self._owned.lose(state):
            return
        log.warning("slot %d has a newer owner: stopped consuming it", state.slot)
        if self.on_slot_lost is not None:
            self.on_slot_lost(state.slot)

    # delivery ---------------------------------------------------------------------------------

    def _deliver(self, claimed: ClaimBatch) -> None:
        messages = claimed.messages
        if self.on_claimed is not None:
            self.on_claimed(messages)
        batch = _Batch(
            claimed.slot,
            messages[0].epoch,
            claimed.now_ms + self._ack_timeout_ms,  # as the script computed it (whole ms)
            {message.id: message for message in messages},
        )
        key = (claimed.slot, messages[0].lease_id)  # one claim draws one lease number
        self._batches[key] = batch
        self._in_flight += len(messages)
        task = asyncio.create_task(self._handle_batch(messages, batch))
        self._tasks[task] = claimed.slot
        task.add_done_callback(lambda done: self._tasks.pop(done, None))
        task.add_done_callback(lambda _: self._batches.pop(key, None))

    async def _handle_batch(self, messages: list[Message], batch: _Batch) -> None:
        """Run the batch's handlers (`_BatchRun`), then give back what was not delivered."""
        run = _BatchRun(self, batch, messages)
        try:
            await run.run()
        finally:
            self._give_room(len(messages) - run.handled)  # only if cancelled: else all counted
            batch.pending.clear()
        if run.skipped:
            self.counters.deliveries_skipped += len(run.skipped)
            await self._give_back(run.skipped, retry=True)

    def _retry(self, message: Message, error: BaseException) -> Retry:
        reason = f"{type(error).__name__}: {error}"[:1000]
        if isinstance(error, DeadLetterError):
            return Retry(message.lease, 0, reason, dead=True)
        return Retry(message.lease, self.settings.backoff.delay_ms(message.attempt), reason)

    async def _twice_on_reconnect(
        self, send: Callable[[list[T]], Awaitable[list[Outcome]]], items: list[T]
    ) -> list[Outcome]:
        """Send acks or nacks; on a connection error, once more. A pooled connection the
        server closed (a Redis restart while the handlers ran) fails its first use, and
        without a second try the delivered messages would come again once their leases ran
        out. Sending twice is safe: each carries its lease, so one that already ran answers
        that the lease is spent, changing nothing."""
        try:
            return await self._settled(send(items))
        except redis.ConnectionError:
            return await self._settled(send(items))

    async def _settled(self, call: Awaitable[list[Outcome]]) -> list[Outcome]:
        """The outcomes of an ack or nack call, also when the topic's replicas did not confirm
        it in time: it still happened on the master, and sending it again would change nothing
        (the lease is spent), so it is counted and logged rather than retried."""
        try:
            return await call
        except ReplicationTimeoutError as error:
            outcomes = cast(list[Outcome], error.result) if isinstance(error.result, list) else []
            self.counters.acks_unreplicated += len(outcomes)
            log.warning("%s (%d acks or nacks)", error, len(outcomes))
            return outcomes

    def _count_lost(self, outcomes: list[Outcome]) -> None:
        lost = sum(1 for outcome in outcomes if outcome.code.is_error)
        if lost:
            self.counters.acks_lease_lost += lost
            log.warning("%d acks or nacks found their lease gone (expired or moved on)", lost)

    async def _give_back(self, messages: list[Message], retry: bool = False) -> None:
        """Return claimed messages undelivered, so the slot's owner (this process or the next)
        delivers them at once; if Redis refuses, their leases expire and they come back anyway,
        an attempt counted. With `retry` (messages a handler gave back: a receiver's hold
        spends no attempt) it is sent again every RETRY_MS while Redis refuses (a restart),
        until the leases may have run out: each carries its lease, so a repeat of one that
        ran changes nothing."""
        give_up_s = time.monotonic() + self._ack_timeout_ms / 1000
        while True:
            try:
                outcomes = await self.queue.giveback_many(messages)
                break
            except redis.RedisError as error:
                if not retry or self._stopping or time.monotonic() >= give_up_s:
                    log.warning(
                        "giving back %d messages failed (%s); their leases will expire",
                        len(messages),
                        error,
                    )
                    return
            await asyncio.sleep(RETRY_MS / 1000)
        self.counters.given_back += sum(1 for o in outcomes if o.code is Code.GIVEN_BACK)

    # upkeep: lease heartbeat and stall watchdog -------------------------------------------------

    async def _keep_up(self) -> None:
        """Extend the leases of unfinished messages before they run out (every third of a
        lease), and once a second check every owned slot against Redis for a stall."""
        period_s = min(WATCHDOG_S, self._ack_timeout_ms / 3000)
        watched_s = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(period_s)
            try:
                await self._extend_leases()
                if time.monotonic() - watched_s >= WATCHDOG_S:
                    watched_s = time.monotonic()
                    await self.refresh_paused()
                    self.top_ups.retry_failed()
                    held_back = self.pacer is not None and self.pacer.held_back
                    if not self._paused and not held_back:  # overdue on purpose
                        await self._watch_slots()
            except redis.RedisError as error:
                log.warning("lease heartbeat or slot watchdog failed: %s", error)

    async def _extend_leases(self) -> None:
        now = self.server_now_ms()
        half = self._ack_timeout_ms / 2
        batches = [b for b in self._batches.values() if b.pending and b.deadline_ms - now < half]
        messages = [m for b in batches for m in b.pending.values() if m.id not in b.lost]
        if not messages:
            return
        outcomes = await self.queue.extend_many(messages, self._ack_timeout_ms)
        for message, outcome in zip(messages, outcomes, strict=True):
            batch = self._batches.get((message.slot, message.lease_id))
            if batch is None:
                continue
            if outcome.code is Code.EXTENDED and outcome.at_ms is not None:
                batch.deadline_ms = max(batch.deadline_ms, outcome.at_ms)
            else:
                batch.lost.add(message.id)

    async def _watch_slots(self) -> None:
        """Re-arm a slot whose oldest message is overdue while the consumer neither claims it
        nor expects it (a lost wake-up, a timer dropped by a bug): the invariant, checked.

        A slot claimed within the last STALL_BOUND_MS is not read: its claim took what was due
        then (or came back full, or bounded by bytes, and the consumer expects its head), so
        no head of it is a bound overdue yet; one put back since with an older due (a
        give-back whose wake-up was lost) is found once the claim is a bound old. In a burst
        over 1,024 slots every slot is claimed a few times a second, and reading all of them
        each tick (16 calls: ~15 ms of the consumer's CPU and ~30 ms of wall time a tick at
        load 5-7) held back the claims of the messages due meanwhile."""
        now = self.server_now_ms()
        slots = [
            state.slot
            for state in self._owned
            if state.slot not in self._claiming and now - state.claimed_ms >= STALL_BOUND_MS
        ]
        if not slots:
            return
        stats = await self.queue.stats(slots)
        for slot_stats in stats.slots:
            state = self._owned.get(slot_stats.slot)
            heads = [t for t in (slot_stats.next_due_ms, slot_stats.next_deadline_ms) if t]
            if state is None or not heads or slot_stats.slot in self._claiming:
                continue
            head = min(heads)
            overdue = slot_stats.now_ms - head >= STALL_BOUND_MS
            expected = state.next_ms is not None and state.next_ms <= head + STALL_BOUND_MS
            if overdue and not expected:
                self.counters.stalled_slots_recovered += 1
                log.warning(
                    "slot %d stalled: head overdue %d ms with no claim; claiming it again",
                    slot_stats.slot,
                    slot_stats.now_ms - head,
                )
                self._set_next(slot_stats.slot, 0)
                self._changed.set()


class _Outbox:
    """A batch's finished messages waiting for their ack or nack call, sent in groups: a group
    goes when it reaches `ack_group_size`, or once its oldest has waited `ACK_FLUSH_S` (a slow
    batch must not hold finished acks back: an ack not yet sent is a redelivery if the process
    or Redis dies meanwhile), and whatever is left when a worker runs out of messages. A sent
    message leaves the batch's `pending` (whose leases the heartbeat keeps) only then: acks
    wait for the batch, which may take longer than a lease."""

    __slots__ = ("batch", "consumer", "done", "group", "retries", "sending", "unsent_since")

    def __init__(self, consumer: Consumer, batch: _Batch) -> None:
        self.consumer = consumer
        self.batch = batch
        self.group = consumer.settings.ack_group_size
        self.done: list[Message] = []  # acked by their lease fields (model.Leased)
        self.retries: list[Retry] = []
        self.unsent_since = 0.0  # monotonic time the oldest unsent ack or nack was ready (0: none)
        self.sending = asyncio.Lock()  # one ack/nack call of a batch at a time

    def ready(self) -> int:
        """The threshold to send with now (`send`): the group size once a group is full, 1
        once the oldest unsent has waited `ACK_FLUSH_S`, 0 for not yet. Checked after every
        message, so it stays cheap: one clock read while something is unsent."""
        if len(self.done) >= self.group or len(self.retries) >= self.group:
            return self.group
        if self.done or self.retries:
            now_s = time.monotonic()
            if not self.unsent_since:
                self.unsent_since = now_s
            elif now_s - self.unsent_since >= ACK_FLUSH_S:
                return 1
        return 0

    async def send(self, threshold: int) -> None:
        """Send the acks, then the nacks, of whichever has at least `threshold` waiting.
        A Redis error is logged: the leases expire and the messages come again."""
        self.unsent_since = 0.0
        async with self.sending:
            try:
                if self.done and len(self.done) >= threshold:
                    leases, self.done = self.done, []
                    await self._acked(leases)
                if self.retries and len(self.retries) >= threshold:
                    failed, self.retries = self.retries, []
                    await self._nacked(failed)
            except redis.RedisError as error:
                log.warning(
                    "slot %d: ack/nack failed (%s); the leases will expire and redeliver",
                    self.batch.slot,
                    error,
                )

    async def _acked(self, leases: list[Message]) -> None:
        consumer = self.consumer
        acked = await consumer._acks.submit(leases)
        consumer._count_lost(acked)
        if consumer.on_acked is not None:
            consumer.on_acked(acked)
        for message in leases:
            del self.batch.pending[message.id]

    async def _nacked(self, failed: list[Retry]) -> None:
        consumer = self.consumer
        nacked = await consumer._nacks.submit(failed)
        consumer._count_lost(nacked)
        if consumer.on_nacked is not None:
            consumer.on_nacked(nacked)
        for retry in failed:
            del self.batch.pending[retry.lease.id]


class _BatchRun:
    """One claimed batch's handlers, run on at most `batch_concurrency` workers sharing one
    iterator (no task per message), their acks and nacks sent by an `_Outbox`, so one slow
    handler delays only its own ack, never its batch's. A message this consumer no longer
    holds (slot released, lease gone) is skipped: given back instead of handled.

    Workers are added one event-loop turn at a time, and only while handlers give the loop a
    turn: a handler that waits on I/O gets up to `batch_concurrency` workers within as many
    turns, while handlers that never suspend are served by one worker instead of creating
    tasks that would find the batch already done."""

    __slots__ = (
        "batch", "consumer", "handled", "helper_starting", "helpers", "max_helpers", "outbox",
        "remaining", "skipped",
    )  # fmt: skip

    def __init__(self, consumer: Consumer, batch: _Batch, messages: list[Message]) -> None:
        self.consumer = consumer
        self.batch = batch
        self.remaining = iter(messages)
        self.outbox = _Outbox(consumer, batch)
        self.skipped: list[Message] = []  # not handed over: given back
        self.handled = 0  # messages whose handler ran or that were skipped: room given back
        self.helpers: list[asyncio.Task[None]] = []
        self.max_helpers = min(consumer.settings.batch_concurrency, len(messages)) - 1
        self.helper_starting = False  # a helper was created and has not run yet

    async def run(self) -> None:
        """Until every message is handled or skipped; cancelling it cancels its helpers."""
        try:
            await self._work()
            started = 0
            while started < len(self.helpers):  # a helper may add helpers while it is awaited
                await self.helpers[started]
                started += 1
        finally:
            for helper in self.helpers:
                helper.cancel()  # only if this batch itself was cancelled: else all are done

    async def _work(self) -> None:
        """One worker: the next message of the batch, until there is none."""
        self.helper_starting = False
        consumer, batch, outbox = self.consumer, self.batch, self.outbox
        for message in self.remaining:
            if not self.helper_starting and len(self.helpers) < self.max_helpers:
                self.helper_starting = True
                self.helpers.append(asyncio.create_task(self._work()))
            if consumer._deadline_in(batch, message) is None:  # as `holds`, batch known
                self._skip(message)
            else:
                try:
                    await consumer.handler(message)
                except GiveBackError:
                    self._skip(message)
                except Exception as error:  # the handler's failure is the message's outcome
                    outbox.retries.append(consumer._retry(message, error))
                else:
                    outbox.done.append(message)
            self.handled += 1
            consumer._give_room(1)
            if threshold := outbox.ready():
                await outbox.send(threshold)
        if outbox.done or outbox.retries:
            await outbox.send(1)

    def _skip(self, message: Message) -> None:
        self.skipped.append(message)
        del self.batch.pending[message.id]


def _woken_since_claim(state: _SlotState) -> bool:
    """The slot's wait took a wake-up that no claim sent since covers."""
    return state.wakes != state.wakes_at_claim


def _next_ms(batch: ClaimBatch) -> int | None:
    candidates = [t for t in (batch.next_due_ms, batch.next_deadline_ms) if t is not None]
    return min(candidates) if candidates else None
