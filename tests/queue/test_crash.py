"""Nothing is lost when Redis is killed -9 under a running consumer and comes back from its AOF.

With `appendfsync always` every acknowledged write is on disk before the reply, so every message
whose schedule succeeded must be delivered after the restart — at least once, never early. Acks
lost in the crash only cause redeliveries once their leases expire.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.consumer import Consumer, ConsumerSettings
from delayq.queue.model import Message, ScheduleRequest
from delayq.queue.topic import Topic

TOPIC = Topic("crash", slot_amount=8, ack_timeout_ms=1_500)
BEFORE, AFTER = 3_000, 1_000  # messages scheduled before the crash and after the restart


def schedule(url: str, prefix: str, count: int, spread_ms: int) -> set[str]:
    queue = Queue.from_url(url, TOPIC)
    requests = [
        ScheduleRequest(f"{prefix}-{i:05d}", b"p", delay_ms=i * spread_ms // count)
        for i in range(count)
    ]
    queue.schedule_many(requests)
    queue.close()
    return {request.id for request in requests}


async def test_a_redis_crash_loses_no_scheduled_message(durable_redis: RedisServer) -> None:
    seen: Counter[str] = Counter()
    early: list[str] = []

    async def handler(message: Message) -> None:
        seen[message.id] += 1
        if time.time() * 1000 < message.due_ms:
            early.append(message.id)

    expected = schedule(durable_redis.url, "before", BEFORE, spread_ms=3_000)
    client = redis.asyncio.Redis.from_url(durable_redis.url, socket_timeout=1.0)
    consumer = Consumer(AsyncQueue(client, TOPIC), handler, ConsumerSettings(batch_size=100))
    await consumer.own(TOPIC.slots)
    running = asyncio.create_task(consumer.run())
    try:
        await eventually(lambda: len(seen) >= BEFORE // 3, 20, "a third delivered")
        durable_redis.crash()  # mid-stream: claims, acks and the wake-up wait all fail now
        delivered_at_crash = len(seen)
        durable_redis.start()
        expected |= await asyncio.to_thread(
            schedule, durable_redis.url, "after", AFTER, spread_ms=500
        )
        await eventually(lambda: expected <= set(seen), 60, "every message delivered")
        # acks lost in the crash leave leases behind: they expire, redeliver and get acked
        queue = AsyncQueue(client, TOPIC)
        deadline = time.monotonic() + 30
        while (stats := await queue.stats()).scheduled + stats.prepared + stats.dead:
            assert time.monotonic() < deadline, f"never drained: {stats}"
            await asyncio.sleep(0.05)
    finally:
        consumer.stop()
        await asyncio.wait_for(running, 30)
        await client.aclose()
    assert delivered_at_crash < BEFORE  # the crash really happened mid-stream
    assert set(seen) == expected
    assert early == []
