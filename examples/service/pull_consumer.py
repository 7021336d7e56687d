"""A pull consumer over the HTTP API: lease (long poll), handle, ack — or nack to retry later.

    delayq serve --topic orders --api-token t0ken --port 8080 &
    DELAYQ_URL=http://127.0.0.1:8080 DELAYQ_TOKEN=t0ken python3 examples/service/pull_consumer.py

A lease lasts `leaseMs`; extend it for long work. A token from before a failover is refused
with 409 (the slot's fencing epoch moved on): drop that work, the message will come back.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp

URL = os.environ.get("DELAYQ_URL", "http://127.0.0.1:8080")
TOPIC = os.environ.get("DELAYQ_TOPIC", "orders")
HEADERS = {"Authorization": f"Bearer {os.environ.get('DELAYQ_TOKEN', '')}"}


async def handle(message: dict[str, object]) -> bool:
    print(f"{message['id']} (attempt {message['attempt']}): {message['payload']}")
    return True


async def main() -> None:
    leases_url = f"{URL}/v1/topics/{TOPIC}/leases"
    async with aiohttp.ClientSession(headers=HEADERS) as session:
        while True:
            body = {"max": 100, "leaseMs": 30_000, "waitMs": 10_000}
            async with session.post(leases_url, json=body) as response:
                leases = (await response.json())["leases"]
            done, failed = [], []
            for message in leases:
                (done if await handle(message) else failed).append(message["token"])
            if done:
                await session.post(f"{leases_url}/ack", json={"tokens": done})
            if failed:
                await session.post(f"{leases_url}/nack", json={"tokens": failed, "delayMs": 5000})


if __name__ == "__main__":
    asyncio.run(main())
