"""What the consumer's tests share: the server's clock and a running `Consumer`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import redis.asyncio

from delayq.queue.client import AsyncQueue
from delayq.queue.consumer import Consumer, ConsumerSettings
from delayq.queue.model import Message

from .conftest import TOPIC


async def server_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@contextlib.asynccontextmanager
async def running(
    queue: AsyncQueue,
    handler: Callable[[Message], Awaitable[None]],
    settings: ConsumerSettings | None = None,
    on_slot_lost: Callable[[int], None] | None = None,
) -> AsyncIterator[Consumer]:
    consumer = Consumer(queue, handler, settings, on_slot_lost)
    await consumer.own(TOPIC.slots)
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)
