"""One delay-service process: takes the slots its Ownership grants and delivers their messages.

The service never picks slots itself. `Ownership.on_change` hands it the complete owned set;
the difference with the previous set goes to the delivery engine (`Consumer` for webhook and
stream topics, `PullLeaser` for pull), which fences each new slot on takeover. Shutdown runs in
the safe order: stop claiming, let in-flight deliveries finish (bounded), then give the slots
back, so the next owner does not redeliver what was just acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

import redis.asyncio

from delayq.coordination.ownership import EmbeddedOwnership, Ownership
from delayq.queue.backoff import Backoff
from delayq.queue.client import AsyncQueue
from delayq.queue.consumer import WAKE_BLOCK_S, Consumer, ConsumerSettings
from delayq.queue.model import Message
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig
from delayq.service.delivery.pull import PullLeaser
from delayq.service.delivery.sinks import Sink
from delayq.service.delivery.stream import StreamSink
from delayq.service.delivery.webhook import WebhookSink, wall_ms
from delayq.service.metrics import ServiceMetrics

log = logging.getLogger(__name__)
READY_PING_TIMEOUT_S = 1.0
# Longer than the engine's blocking wake-up wait (WAKE_BLOCK_S), which redis-py 8's default
# 5 s read timeout would cut short; still bounded, so a dead peer is noticed.
SOCKET_TIMEOUT_S = WAKE_BLOCK_S + 10


def connect(url: str, max_connections: int) -> redis.asyncio.Redis:
    """A client whose pool waits for a free connection instead of failing when all are busy,
    so a burst of deliveries queues for Redis rather than erroring into retries."""
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=None, socket_timeout=SOCKET_TIMEOUT_S
    )
    return redis.asyncio.Redis(connection_pool=pool)


class SlotEngine(Protocol):
    """What consumes owned slots: the push Consumer or the PullLeaser."""

    @property
    def owned_slots(self) -> list[int]: ...

    async def own(self, slots: frozenset[int]) -> None: ...

    async def release(self, slots: frozenset[int]) -> None: ...


class DelayService:
    def __init__(self, config: ServiceConfig, ownership: Ownership | None = None) -> None:
        self.config = config
        self.topic = config.to_topic()
        self.metrics = ServiceMetrics(self.topic.namespace, self.topic.name)
        self.redis = connect(config.redis_url, config.redis_max_connections)
        self.queue = AsyncQueue(self.redis, self.topic)
        self.ownership = ownership or EmbeddedOwnership(self.topic.slot_amount)
        self.leaser: PullLeaser | None = None
        self.consumer: Consumer | None = None
        self._sink: Sink | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._closing = False
        self._lock = asyncio.Lock()
        self.broken = asyncio.Event()  # the delivery loop died: the process must restart

    @property
    def engine(self) -> SlotEngine:
        engine: SlotEngine | None = self.consumer or self.leaser
        if engine is None:
            raise RuntimeError("the service is not started")
        return engine

    @property
    def owned_slots(self) -> list[int]:
        return self.engine.owned_slots

    @property
    def closing(self) -> bool:
        return self._closing

    async def start(self) -> None:
        if self.topic.topic_type is TopicType.PULL:
            self.leaser = PullLeaser(self.queue)
        else:
            self._sink = self._open_sink()
            settings = ConsumerSettings(
                batch_size=self.config.batch_size,
                max_in_flight=self.config.max_in_flight,
                lease_ms=self.config.ack_timeout_ms,
                backoff=Backoff(self.config.backoff_base_ms, 2.0, self.config.backoff_max_ms),
            )
            self.consumer = Consumer(self.queue, self._deliver, settings, self._on_slot_lost)
            self._run_task = asyncio.create_task(self.consumer.run())
            self._run_task.add_done_callback(self._on_run_done)
        await self.ownership.start(self._on_change)
        log.info("service started", extra={"topic": self.topic.name, "type": self.topic.topic_type})

    def _open_sink(self) -> Sink:
        config = self.config
        if self.topic.topic_type is TopicType.WEBHOOK:
            return WebhookSink(
                self.topic,
                config.webhook_url,
                config.webhook_secret,
                config.webhook_timeout_ms,
                config.webhook_concurrency,
                self.metrics,
                config.member,
            )
        if config.stream_url:
            client = connect(config.stream_url, config.redis_max_connections)
            return StreamSink(self.topic, client, config.target_stream, config.stream_maxlen, True)
        return StreamSink(self.topic, self.redis, config.target_stream, config.stream_maxlen, False)

    async def _on_change(self, slots: frozenset[int]) -> None:
        """Apply the owned set: release first (stop claiming), then take over the new ones."""
        async with self._lock:
            wanted = frozenset() if self._closing else slots
            owned = frozenset(self.engine.owned_slots)
            if owned - wanted:
                await self.engine.release(owned - wanted)
            if wanted - owned:
                await self.engine.own(wanted - owned)
            log.info("owned slots changed", extra={"owned": sorted(wanted)})

    def _on_run_done(self, task: asyncio.Task[None]) -> None:
        """The Consumer's loop ends only on stop(); anything else (a Redis outage it does not
        survive) makes the service unready and `serve` exit non-zero, so it gets restarted."""
        if self._closing or task.cancelled():
            return
        error = task.exception()
        log.error("delivery loop ended unexpectedly", exc_info=error)
        self.broken.set()

    def _on_slot_lost(self, slot: int) -> None:
        log.warning("fenced out of a slot by a newer owner", extra={"slot": slot})

    async def _deliver(self, message: Message) -> None:
        """The Consumer's handler: return acks, raise retries (dead past maxRetries)."""
        assert self._sink is not None
        self.metrics.observe_lateness(wall_ms() - message.due_ms)
        try:
            await self._sink.deliver(message)
        except Exception as error:
            dead = message.attempt > self.topic.max_retries
            self.metrics.count_failure(dead)
            log.warning(
                "delivery failed",
                extra={
                    "id": message.id,
                    "attempt": message.attempt,
                    "dead": dead,
                    "error": str(error),
                },
            )
            raise
        self.metrics.count_delivery("acked")

    async def is_ready(self) -> bool:
        """Ready while not stopping, holding an assignment and answering on Redis."""
        if self._closing or self.broken.is_set() or not self.ownership.ready:
            return False
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), READY_PING_TIMEOUT_S))
        except (redis.RedisError, OSError, TimeoutError):
            return False

    async def refresh_depth(self) -> None:
        stats = await self.queue.stats(self.owned_slots)
        self.metrics.set_depth(stats)

    async def stop(self) -> None:
        """Stop claiming, finish in-flight deliveries within the grace period, release slots."""
        self._closing = True
        started = time.monotonic()
        await self._on_change(frozenset())
        if self.leaser is not None:
            self.leaser.stop()
        if self.consumer is not None and self._run_task is not None:
            self.consumer.stop()
            try:
                await asyncio.wait_for(asyncio.shield(self._run_task), self.config.grace_ms / 1000)
            except redis.RedisError:
                log.exception("delivery loop failed while draining")
            except TimeoutError:
                log.warning("grace period over: abandoning in-flight deliveries to their leases")
                self._run_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._run_task
        await self.ownership.stop()
        if self._sink is not None:
            await self._sink.close()
        await self.redis.aclose()
        log.info("service stopped", extra={"took_ms": int((time.monotonic() - started) * 1000)})
