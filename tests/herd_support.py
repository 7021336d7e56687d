"""A herd: many messages due at one instant, scheduled through a `delayq serve` process's HTTP
batch API (the flow-control tests of tests/service and the chaos tier's pace test)."""

from __future__ import annotations

import aiohttp
import redis.asyncio

from delayq.local.processes import ServeProcess

BATCH = 1000  # the batch API's most messages per call


async def schedule_herd(
    client: redis.asyncio.Redis, pod: ServeProcess, topic: str, count: int, lead_ms: int = 1500
) -> int:
    """`count` messages `h0`.. due at one instant, `lead_ms` from now on the Redis server's
    clock (the one due times are kept on); returns that instant (server ms)."""
    seconds, micros = await client.time()
    at_ms = int(seconds) * 1000 + int(micros) // 1000 + lead_ms
    url = f"{pod.url}/v1/topics/{topic}/messages/batch"
    async with aiohttp.ClientSession() as session:
        for start in range(0, count, BATCH):
            ids = range(start, min(count, start + BATCH))
            messages = [{"id": f"h{i}", "atMs": at_ms} for i in ids]
            async with session.post(url, json={"messages": messages}) as reply:
                assert reply.status == 200, await reply.text()
    return at_ms
