"""Deliver due messages of owned slots to a handler, waking at each due time and no later.

Precise wake-up without polling: every claim returns the slot's next due time and lease
deadline on the Redis server clock, so the consumer sleeps exactly until the earliest of them
(measured as a duration, so client clock skew never matters). A producer that schedules a new
earliest message pushes onto the slot's `wake` list (inside the schedule script); one blocking
BLPOP over the wake lists of all owned slots cuts the sleep short. An idle slot therefore costs
one key in one blocking call, and a message is claimed within the event loop's timer resolution
of its due instant — never before it, since the claim script compares against server time.

Flow control: at most `max_in_flight` messages are leased at once; when handlers are slow the
consumer stops claiming rather than buffering (the seed's per-partition pause), and a burst of
millions due at one instant is drained `batch_size` at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import redis.asyncio

from delayq.queue.backoff import Backoff
from delayq.queue.client import AsyncQueue
from delayq.queue.codec import as_text
from delayq.queue.codes import StaleEpochError
from delayq.queue.keys import Part, parse_wake_key, slot_keys
from delayq.queue.model import ClaimBatch, Message
from delayq.queue.plans import Retry

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[None]]
STOP_WAKER_S = 2.0  # how long stopping waits for the blocking wait to take its interrupt
RETRY_MS = 200  # after a failed claim, the slot is tried again this much later
WAKE_BLOCK_S = 10.0  # upper bound of one blocking wait; only a liveness refresh, not a poll


class PoisonMessageError(Exception):
    """Raised by a handler for a message that can never succeed: it goes to dead at once."""


@dataclass
class ConsumerSettings:
    batch_size: int = 500
    max_in_flight: int = 2000
    lease_ms: int | None = None  # default: the topic's ack timeout
    batch_concurrency: int = 64  # handlers running at once within one claimed batch
    ack_group_size: int = 256  # acks (and nacks) sent together once this many are ready
    release_drain_s: float = 10.0  # how long releasing a slot waits for its in-flight acks
    backoff: Backoff = field(default_factory=Backoff)


@dataclass
class _SlotState:
    epoch: int
    next_ms: float | None = 0  # server ms when the slot next needs a claim (0 = now)
    wakes: int = 0  # wake-ups received; one arriving during a claim invalidates its next_ms


class Consumer:
    """Owns a set of slots of one topic and runs the claim → handle → ack/nack loop."""

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Handler,
        settings: ConsumerSettings | None = None,
        on_slot_lost: Callable[[int], None] | None = None,
    ) -> None:
        self.queue = queue
        self.handler = handler
        self.settings = settings or ConsumerSettings()
        self.on_slot_lost = on_slot_lost
        self._slots: dict[int, _SlotState] = {}
        self._timers: list[tuple[float, int]] = []  # heap of (next_ms, slot); stale ones skipped
        self._changed = asyncio.Event()
        self._stopping = False
        self._in_flight = 0
        self._capacity = asyncio.Condition()
        self._tasks: dict[asyncio.Task[None], int] = {}  # delivery task -> its slot
        self._stop_notice: asyncio.Task[None] | None = None
        # server clock estimate: server_ms ~= _server_base_ms + (monotonic - _local_base) * 1000,
        # in fractional ms (claims report µs): a floored estimate would wake up to 1 ms late
        self._server_base_ms = 0.0
        self._local_base = time.monotonic()
        self._waker = _blocking_client(queue.redis, WAKE_BLOCK_S)
        # the smallest claim worth a round trip: a quarter batch (never more than fits in flight)
        batch_limit = min(self.settings.batch_size, self.settings.max_in_flight)
        self._min_batch = max(1, batch_limit // 4)
        topic = queue.topic
        self._control_key = f"dq:{{{topic.namespace}/{topic.name}}}:wake-control:{uuid.uuid4().hex}"

    # ownership --------------------------------------------------------------------------------

    @property
    def owned_slots(self) -> list[int]:
        return sorted(self._slots)

    async def own(self, slots: Iterable[int]) -> None:
        """Take over slots (bumping their fencing epochs) and start consuming them."""
        for slot in slots:
            if slot not in self._slots:
                self._slots[slot] = _SlotState(await self.queue.take_over(slot))
                self._set_next(slot, 0)
        self._changed.set()  # the loop may be asleep with no timer at all: claim the new slots now
        await self._interrupt_waker()

    async def release(self, slots: Iterable[int]) -> None:
        """Stop claiming from slots, then wait (at most `release_drain_s`) for their in-flight
        deliveries to be acked: the next owner's fence would reject those acks and redeliver."""
        released = set(slots)
        for slot in released:
            self._slots.pop(slot, None)
        await self._interrupt_waker()
        draining = [task for task, slot in self._tasks.items() if slot in released]
        if draining:
            await asyncio.wait(draining, timeout=self.settings.release_drain_s)

    # the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()`; then wait for in-flight deliveries to finish."""
        waker = asyncio.create_task(self._wait_for_wakes())
        try:
            while not self._stopping:
                await self._drain(self._pop_due_slots())
                await self._sleep_until_next()
        finally:
            self._stopping = True
            with contextlib.suppress(redis.RedisError):
                await self._interrupt_waker()
            try:
                await asyncio.wait_for(waker, STOP_WAKER_S)
            except (TimeoutError, redis.RedisError):
                waker.cancel()  # the interrupt did not get through; its connection is closed below
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(redis.RedisError):
                await self.queue.redis.delete(self._control_key)
            await self._waker.aclose(close_connection_pool=True)

    def stop(self) -> None:
        self._stopping = True
        self._changed.set()
        with contextlib.suppress(RuntimeError):  # no running loop: nothing can be waiting
            self._stop_notice = asyncio.get_running_loop().create_task(self._notify_capacity())

    async def _notify_capacity(self) -> None:
        """Wake a claim waiting for room in flight, so stopping never waits on slow handlers."""
        async with self._capacity:
            self._capacity.notify_all()

    def _server_now_ms(self) -> float:
        return self._server_base_ms + (time.monotonic() - self._local_base) * 1000

    def _set_next(self, slot: int, next_ms: float | None) -> None:
        state = self._slots.get(slot)
        if state is None:
            return
        state.next_ms = next_ms
        if next_ms is not None:
            heapq.heappush(self._timers, (next_ms, slot))

    def _is_current(self, entry: tuple[float, int]) -> bool:
        state = self._slots.get(entry[1])
        return state is not None and state.next_ms == entry[0]

    def _next_timer(self) -> float | None:
        while self._timers and not self._is_current(self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _pop_due_slots(self) -> list[int]:
        now = self._server_now_ms()
        due: list[int] = []
        while (next_ms := self._next_timer()) is not None and next_ms <= now:
            due.append(heapq.heappop(self._timers)[1])
        return due

    async def _drain(self, slots: list[int]) -> None:
        """Claim the due messages of these slots, all slots in one pipelined round trip per
        round, while there is room in flight; a slot whose claim came back full goes again."""
        pending = slots
        while pending and not self._stopping:
            room = await self._wait_for_capacity()
            owned = [(slot, state) for slot in pending if (state := self._slots.get(slot))]
            wakes_before = {slot: state.wakes for slot, state in owned}
            if self._stopping or not owned:
                return
            # Few slots with worthwhile batches rather than many slivers: each claimed batch
            # costs its own Lua call, ack call and workers. Slots left out go first next round.
            count = max(1, min(len(owned), room // self._min_batch))
            waiting = [slot for slot, _ in owned[count:]]
            owned = owned[:count]
            share = min(self.settings.batch_size, room // count)  # shares add up to <= room
            try:
                results = await self.queue.claim_slots(
                    [(slot, state.epoch) for slot, state in owned], share, self.settings.lease_ms
                )
            except redis.RedisError as error:
                # Redis unreachable or failing over: keep the slots and try again shortly
                log.warning("claim failed (%s); retrying in %d ms", error, RETRY_MS)
                for slot, _ in owned:
                    self._set_next(slot, self._server_now_ms() + RETRY_MS)
                return
            pending = waiting
            for (slot, state), result in zip(owned, results, strict=True):
                if self._slots.get(slot) is not state:
                    continue  # released while the claim was in flight
                if isinstance(result, StaleEpochError):
                    self._lose(slot)
                    continue
                self._server_base_ms, self._local_base = result.now_us / 1000, result.received_s
                if result.messages:
                    self._deliver(result)
                if state.wakes != wakes_before[slot]:
                    # woken while the claim was in flight: the reply's next due time predates
                    # the message that caused the wake-up, so claim again rather than trust it
                    self._set_next(slot, 0)
                elif len(result.messages) < share:
                    self._set_next(slot, _next_ms(result))
                else:
                    pending.append(slot)

    async def _sleep_until_next(self) -> None:
        self._changed.clear()
        if self._stopping:
            return  # stop() came during the claim: its signal was just cleared with the others
        next_ms = self._next_timer()
        timeout = None if next_ms is None else (next_ms - self._server_now_ms()) / 1000
        if timeout is not None and timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def _wait_for_capacity(self) -> int:
        """Wait until a worthwhile claim fits in flight: at least a quarter batch of room, so a
        backlog is not drained in slivers (each sliver would cost its own claim and ack calls)."""
        limit = self.settings.max_in_flight
        async with self._capacity:
            await self._capacity.wait_for(
                lambda: self._stopping or limit - self._in_flight >= self._min_batch
            )
            return limit - self._in_flight

    def _lose(self, slot: int) -> None:
        log.warning("slot %d has a newer owner: stopped consuming it", slot)
        self._slots.pop(slot, None)
        if self.on_slot_lost is not None:
            self.on_slot_lost(slot)

    # delivery ---------------------------------------------------------------------------------

    def _deliver(self, batch: ClaimBatch) -> None:
        self._in_flight += len(batch.messages)
        task = asyncio.create_task(self._handle_batch(batch))
        self._tasks[task] = batch.slot
        task.add_done_callback(lambda done: self._tasks.pop(done, None))

    async def _handle_batch(self, batch: ClaimBatch) -> None:
        """Run the batch's handlers on at most `batch_concurrency` workers sharing one iterator
        (no task per message), acking and nacking in groups: a group is sent when it reaches
        `ack_group_size`, and each worker sends what is left once the batch has no more
        messages to start, so one slow handler delays only its own ack, never its batch's.

        Workers are added one event-loop turn at a time, and only while handlers give the loop
        a turn: a handler that waits on I/O gets up to `batch_concurrency` workers within as
        many turns, while handlers that never suspend are served by one worker instead of
        creating tasks that would find the batch already done."""
        remaining = iter(batch.messages)
        done: list[Message] = []  # acked by their lease fields (model.Leased)
        retries: list[Retry] = []
        group = self.settings.ack_group_size
        helpers: list[asyncio.Task[None]] = []
        helper_starting = False  # a helper was created and has not run yet
        max_helpers = min(self.settings.batch_concurrency, len(batch.messages)) - 1

        sending = asyncio.Lock()  # one ack/nack call of a batch at a time

        async def send(threshold: int) -> None:
            nonlocal done, retries
            async with sending:
                try:
                    if done and len(done) >= threshold:
                        leases, done = done, []
                        await self.queue.ack_many(leases)
                    if retries and len(retries) >= threshold:
                        failed, retries = retries, []
                        await self.queue.nack_many(failed)
                except redis.RedisError:
                    log.exception(
                        "slot %d: ack/nack failed; the leases will expire and redeliver",
                        batch.slot,
                    )

        async def worker() -> None:
            nonlocal helper_starting
            helper_starting = False
            for message in remaining:
                if not helper_starting and len(helpers) < max_helpers:
                    helper_starting = True
                    helpers.append(asyncio.create_task(worker()))
                try:
                    await self.handler(message)
                except Exception as error:  # the handler's failure is the message's outcome
                    retries.append(self._retry(message, error))
                else:
                    done.append(message)
                if len(done) >= group or len(retries) >= group:  # checked inline: per message
                    await send(group)
            if done or retries:
                await send(1)

        try:
            await worker()
            started = 0
            while started < len(helpers):  # a helper may add helpers while it is awaited
                await helpers[started]
                started += 1
        finally:
            for helper in helpers:
                helper.cancel()  # only if this batch itself was cancelled: else all are done
            async with self._capacity:
                self._in_flight -= len(batch.messages)
                self._capacity.notify_all()

    def _retry(self, message: Message, error: BaseException) -> Retry:
        reason = f"{type(error).__name__}: {error}"[:1000]
        if isinstance(error, PoisonMessageError):
            return Retry(message.lease, 0, reason, kill=True)
        return Retry(message.lease, self.settings.backoff.delay_ms(message.attempt), reason)

    # wake-ups ---------------------------------------------------------------------------------

    async def _interrupt_waker(self) -> None:
        """Unblock the blocking wait so it picks up a changed set of slots (or stops)."""
        await self.queue.redis.rpush(self._control_key, "1")

    async def _wait_for_wakes(self) -> None:
        while not self._stopping:
            keys = [self._control_key]
            keys += [slot_keys(self.queue.topic, slot).key(Part.WAKE) for slot in self._slots]
            try:
                popped = await self._waker.blpop(keys, timeout=WAKE_BLOCK_S)
            except redis.RedisError:
                log.exception("wake-up wait failed; retrying")
                await asyncio.sleep(0.1)
                continue
            if popped is None or as_text(popped[0]) == self._control_key:
                continue
            slot = parse_wake_key(as_text(popped[0]))
            if (state := self._slots.get(slot)) is not None:
                state.wakes += 1
                self._set_next(slot, 0)
                self._changed.set()


def _next_ms(batch: ClaimBatch) -> int | None:
    candidates = [t for t in (batch.next_due_ms, batch.next_deadline_ms) if t is not None]
    return min(candidates) if candidates else None


def _blocking_client(client: redis.asyncio.Redis, block_s: float) -> redis.asyncio.Redis:
    """A one-connection client for the blocking wait, with a read timeout longer than the block.

    The shared pool's socket timeout (redis-py defaults to 5 s) would cut a longer BLPOP short.
    """
    pool = client.connection_pool
    options = {**pool.connection_kwargs, "socket_timeout": block_s + 5}
    return redis.asyncio.Redis(
        connection_pool=redis.asyncio.ConnectionPool(
            connection_class=pool.connection_class, max_connections=1, **options
        )
    )
