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
    for message in messages[::3]:  # a third grouped: their entries tell it, the others not
        message["group"] = f"g{message['id']}"
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
    groups = {f[b"id"].decode(): f.get(b"group") for _, f in entries}
    assert groups == {m["id"]: m.get("group", "").encode() or None for m in messages}
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


async def test_an_external_target_on_loopback_is_refused_unless_the_topic_allows_it(
    start_service: StartService,
):
    """The SSRF guard holds for a tenant's Redis URL as for a webhook: `localhost` resolves to
    loopback, refused by name and address, nothing written; an admitted network delivers."""
    with RedisServer() as target:
        url = target.url.replace("127.0.0.1", "localhost")
        refusing = await start_service(
            topic_type="stream",
            stream_url=url,
            stream_key="forwarded",
            stream_allow_private_targets=False,
            max_retries=1,
        )
        await refusing.client.post(
            f"{refusing.base}/messages", json={"id": "x", "delayMs": 0, "payload": "y"}
        )

        async def dead() -> bool:
            info = await (await refusing.client.get(f"{refusing.base}/messages/x")).json()
            return info.get("state") == "dead"

        await eventually(dead, 10, "the refused message to die after maxRetries")
        info = await (await refusing.client.get(f"{refusing.base}/messages/x")).json()
        assert "stream target 127.0.0.1 refused: loopback address" in info["deadReason"]
        assert "allowPrivateTargets" in info["deadReason"]
        client = redis.asyncio.Redis.from_url(target.url)
        try:
            assert await client.exists("forwarded") == 0
            await refusing.service.stop()
            allowed = await start_service(
                topic_type="stream",
                stream_url=url,
                stream_key="forwarded",
                stream_allow_private_targets=False,
                stream_allowed_cidrs="127.0.0.0/8,::1/128",
            )
            await allowed.client.post(
                f"{allowed.base}/messages", json={"id": "z", "delayMs": 0, "payload": "y"}
            )

            async def forwarded() -> bool:
                return await client.xlen("forwarded") == 1

            await eventually(forwarded, 10, "the forwarded entry once admitted")
        finally:
            await client.aclose()
