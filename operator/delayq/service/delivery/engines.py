"""The delivery engines behind one interface: the delay service hands them its owned slots and
never asks which kind of topic it serves.

- `PushDelivery`, webhook and stream topics: one `Consumer` per broker (each slot is consumed
  on the broker that stores it), every due message handed to the topic's sink; the consumers
  share one `Pacer` (the topic's rate limit and receivers' holds, queue/pacing.py);
- `PullDelivery`, pull topics: the `PullLeaser`, which claims on request (`POST /leases`).

Both are built with the service and started by `DelayService.start`; the shutdown order is the
service's: `stop` (stop claiming), `drain` (in-flight deliveries), then `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

import redis

from delayq.queue.backoff import Backoff
from delayq.queue.consumer import Consumer, ConsumerCounters, ConsumerSettings
from delayq.queue.model import Message, Outcome
from delayq.queue.pacing import Pacer
from delayq.service.brokers import Brokers
from delayq.service.delivery.pull import PullLeaser
from delayq.service.delivery.sinks import Sink
from delayq.service.metrics import ServiceMetrics
from delayq.service.tracing import Tracing

log = logging.getLogger(__name__)

RunDone = Callable[["asyncio.Task[None]"], None]


class Delivery(Protocol):
    @property
    def owned_slots(self) -> list[int]:
        """The slots it consumes now, sorted."""

    @property
    def paused(self) -> bool:
        """The topic's delivery is paused, as last read from the brokers."""

    def start(self, on_run_done: RunDone) -> None:
        """Start consuming (no slot yet: `own` grants them); `on_run_done` is told when a
        delivery loop ends, which only `stop` may make it do."""

    async def own(self, slots: frozenset[int]) -> dict[int, redis.RedisError | OSError]:
        """Take the slots over (fencing each); those that could not be taken now, with why."""

    async def release(self, slots: frozenset[int]) -> None:
        """Stop consuming the slots; returns once nothing claimed of them is in flight."""

    async def read_paused(self) -> bool:
        """`paused`, read from the brokers now where this engine would not read it on its
        own (an idle pull process reads it on lease requests only)."""

    async def refresh_paused(self) -> None:
        """Read the pause flag from the brokers now (after this process changed it)."""

    def counters(self) -> ConsumerCounters:
        """The engine's counters, summed over its consumers (for metrics)."""

    def stop(self) -> None:
        """Stop claiming."""

    async def drain(self, grace_s: float) -> None:
        """Let in-flight deliveries finish, at most `grace_s`; abandon the rest to their
        leases."""

    async def close(self) -> None:
        """Free what it holds (after the ownership stopped)."""


class PushDelivery:
    """Webhook and stream topics: one Consumer per broker, each due message handed to the
    sink `open_sink` makes at `start` (given this engine, for its clocks and lease checks).

    An engine made `beside` another (a doubling's halves, at the next generation, beside the
    old slots) hands its messages to that one's sink, so the topic's delivery bounds
    (`maxInFlight`) hold for both together; each message's lease is checked by the engine
    that claimed it (its slot numbers are its generation's), found by the message itself."""

    def __init__(
        self,
        brokers: Brokers,
        settings: ConsumerSettings,
        metrics: ServiceMetrics,
        on_slot_lost: Callable[[int], None],
        open_sink: Callable[[PushDelivery], Sink],
        pacer: Pacer | None = None,
        beside: PushDelivery | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.brokers = brokers
        self._beside = beside
        # id(message) -> the engine beside this one handing it to this one's sink right now
        self._handing: dict[int, PushDelivery] = {}
        self.metrics = metrics
        self.tracing = tracing
        self.topic_name = brokers.queues[0].topic.name
        self.consumers = [
            Consumer(
                queue,
                self._deliver if tracing is None else self._deliver_traced,
                settings,
                on_slot_lost,
                managed=True,
                on_nacked=metrics.count_nacked if tracing is None else self._nacked_traced,
                on_claimed=None if tracing is None else self._claimed_traced,
                on_acked=None if tracing is None else self._acked_traced,
                pacer=pacer,
                on_released=self._abandon,
            )
            for queue in brokers.queues
        ]
        self._open_sink = open_sink
        self._sink: Sink | None = None
        self._runs: list[asyncio.Task[None]] = []

    @property
    def owned_slots(self) -> list[int]:
        return sorted(slot for consumer in self.consumers for slot in consumer.owned_slots)

    @property
    def paused(self) -> bool:
        return any(consumer.paused for consumer in self.consumers)

    def start(self, on_run_done: RunDone) -> None:
        self._sink = self._open_sink(self) if self._beside is None else self._beside._sink
        for consumer in self.consumers:
            run = asyncio.create_task(consumer.run())
            run.add_done_callback(on_run_done)
            self._runs.append(run)

    async def own(self, slots: frozenset[int]) -> dict[int, redis.RedisError | OSError]:
        failed: dict[int, redis.RedisError | OSError] = {}
        for broker, broker_slots in self.brokers.split(slots).items():
            failed.update(await self.consumers[broker].own(broker_slots))
        return failed

    async def release(self, slots: frozenset[int]) -> None:
        for broker, broker_slots in self.brokers.split(slots).items():
            await self.consumers[broker].release(broker_slots)

    async def read_paused(self) -> bool:
        return self.paused  # the consumers read it every second on their own

    async def refresh_paused(self) -> None:
        for consumer in self.consumers:
            await consumer.refresh_paused()

    def server_ms(self, slot: int) -> float:
        """The clock of the Redis server storing the slot, as its consumer estimates it: every
        user-facing time (lateness, signature timestamps) is on it, never on this pod's clock.
        A slot of the engine beside this one (twice the slot amount: s + N is on the broker
        of s) is on the same server as its old slot."""
        routing = self.brokers.routing
        return self.consumers[routing[slot % len(routing)]].server_now_ms()

    def lease_deadline_ms(self, message: Message) -> float | None:
        """The message's lease deadline, None when it may not be delivered any more (checked
        again right before a POST, and sent along so a receiver knows how long it has); asked
        of the engine that claimed it."""
        engine = self._handing.get(id(message), self)
        return engine.consumers[engine.brokers.routing[message.slot]].lease_deadline_ms(message)

    def counters(self) -> ConsumerCounters:
        total = ConsumerCounters()
        for consumer in self.consumers:
            for name, value in vars(consumer.counters).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def stop(self) -> None:
        for consumer in self.consumers:
            consumer.stop()

    async def drain(self, grace_s: float) -> None:
        if not self._runs:
            return
        done, pending = await asyncio.wait(self._runs, timeout=grace_s)
        for run in done:
            if not run.cancelled() and isinstance(run.exception(), redis.RedisError):
                log.error("delivery loop failed while draining", exc_info=run.exception())
        if pending:
            log.warning("grace period over: abandoning in-flight deliveries to their leases")
            for run in pending:
                run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)

    def _abandon(self, slots: frozenset[int]) -> None:
        """A Consumer released `slots`: the sink stops the waits of their messages not sent."""
        if self._sink is not None:
            self._sink.abandon(slots)

    async def close(self) -> None:
        if self._sink is not None and self._beside is None:  # a shared one: its owner's
            await self._sink.close()

    async def _deliver(self, message: Message) -> None:
        """The Consumers' handler: return acks, raise retries (the engine's nack decides
        whether the message is retried or given up; `on_nacked` counts which)."""
        assert self._sink is not None
        self.metrics.observe_lateness(
            self.server_ms(message.slot) - message.due_ms, message.priority
        )
        if self._beside is not None:  # its sink asks that engine for the message's lease
            self._beside._handing[id(message)] = self
        try:
            await self._sink.deliver(message)
        except Exception as error:
            log.warning(
                "delivery failed",
                extra={"id": message.id, "attempt": message.attempt, "error": str(error)},
            )
            raise
        finally:
            if self._beside is not None:
                self._beside._handing.pop(id(message), None)
        self.metrics.count_delivery("acked")

    def _claimed_traced(self, messages: list[Message]) -> None:
        assert self.tracing is not None
        lateness_ms = [self.server_ms(message.slot) - message.due_ms for message in messages]
        self.tracing.claimed(self.topic_name, messages, lateness_ms)

    def _acked_traced(self, outcomes: list[Outcome]) -> None:
        assert self.tracing is not None
        self.tracing.acked(self.topic_name, outcomes)

    def _nacked_traced(self, outcomes: list[Outcome]) -> None:
        assert self.tracing is not None
        self.metrics.count_nacked(outcomes)
        self.tracing.nacked(self.topic_name, outcomes)

    async def _deliver_traced(self, message: Message) -> None:
        """`_deliver` in its span: the handler only when tracing is on, so the path without
        it is not one call longer."""
        assert self.tracing is not None
        lateness_ms = self.server_ms(message.slot) - message.due_ms
        with self.tracing.deliver(self.topic_name, message, lateness_ms):
            await self._deliver(message)


class PullDelivery:
    """Pull topics: the `PullLeaser` claims the owned slots' due messages on request.

    An engine made `beside` another (a doubling's halves, at the next generation, beside the
    old slots) owns its slots in that one's leaser (`PullLeaser.add_generation`), so a lease
    request leases from both, under one rate limit, and wakes on both; that engine stops and
    closes the leaser."""

    def __init__(
        self,
        brokers: Brokers,
        pacer: Pacer | None = None,
        backoff: Backoff | None = None,
        beside: PullDelivery | None = None,
        on_slot_lost: Callable[[int], None] | None = None,
    ) -> None:
        self._beside = beside
        if beside is None:
            self.leaser = PullLeaser(brokers, pacer, backoff)
            self.generation = self.leaser.generation
        else:
            self.leaser = beside.leaser
            self.generation = self.leaser.add_generation(brokers, on_slot_lost)
        self._started = False

    @property
    def owned_slots(self) -> list[int]:
        return self.leaser.owned_in(self.generation)

    @property
    def paused(self) -> bool:
        return self.leaser.paused

    def start(self, on_run_done: RunDone) -> None:
        self.leaser.start()  # no loop of its own: lease requests claim
        self._started = True

    async def own(self, slots: frozenset[int]) -> dict[int, redis.RedisError | OSError]:
        return await self.leaser.own(slots, self.generation)

    async def release(self, slots: frozenset[int]) -> None:
        await self.leaser.release(slots, self.generation)

    async def read_paused(self) -> bool:
        await self.leaser.refresh_paused()
        return self.leaser.paused

    async def refresh_paused(self) -> None:
        await self.leaser.refresh_paused()

    def counters(self) -> ConsumerCounters:
        return ConsumerCounters()  # the engine's counters are the push consumers'

    def stop(self) -> None:
        if self._started and self._beside is None:
            self.leaser.stop()

    async def drain(self, grace_s: float) -> None:
        return  # nothing is delivered by this process: leases run out on their own

    async def close(self) -> None:
        if self._started and self._beside is None:  # never started: nothing to free
            await self.leaser.close()
