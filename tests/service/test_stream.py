"""Stream topics: each due message is XADDed to the target stream, then acked; none lost."""

from __future__ import annotations

import json
from typing import Any, cast

import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from tests.service.conftest import StartService


async def test_every_message_reaches_the_stream_once(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
):
    running = await start_service(topic_type="stream", stream_key="out", stream_max_len=10_000)
    messages: list[dict[str, Any]] = [
        {"id": f"s{i}", "delayMs": i % 50, "payload": f"p{i}", "headers": {"n": str(i)}}
        for i in range(300)
    ]
    await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})

    async def all_added() -> bool:
        return await async_redis_client.xlen("out") == 300

    await eventually(all_added, 10, "300 stream entries")

    async def drained() -> bool:
        stats = await running.service.brokers.stats()
        return stats.scheduled + stats.prepared == 0

    await eventually(drained, 10, "every message acked")
    answer = await async_redis_client.xrange("out")
    # redis-py types the answer loosely; a client without decode_responses reads bytes.
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], answer)
    ids = [fields[b"id"].decode() for _, fields in entries]
    assert sorted(ids) == sorted(m["id"] for m in messages)
    _, first = entries[0]
    number = json.loads(first[b"headers"])["n"]
    assert first[b"payload"] == f"p{number}".encode()
    assert first[b"topic"] == b"orders"


async def test_another_redis_as_target(start_service: StartService):
    with RedisServer() as target:
        running = await start_service(
            topic_type="stream", stream_url=target.url, stream_key="forwarded"
        )
        await running.client.post(
            f"{running.base}/messages", json={"id": "x", "delayMs": 0, "payload": "y"}
        )
        client = redis.asyncio.Redis.from_url(target.url)
        try:

            async def forwarded() -> bool:
                return await client.xlen("forwarded") == 1

            await eventually(forwarded, 10, "the forwarded entry")
        finally:
            await client.aclose()
        await running.service.stop()
