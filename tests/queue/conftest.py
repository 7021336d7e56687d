"""Engine fixtures on the session's real redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.topic import Topic

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_retries=2, journal_maxlen=10_000)


@pytest.fixture
def durable_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own that survives kill -9 (AOF, fsync on every write)."""
    server = RedisServer(appendonly=True, extra_config={"appendfsync": "always"}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def queue(redis_client: redis.Redis) -> Queue:
    return Queue(redis_client, TOPIC)


@pytest.fixture
async def async_queue(async_redis_client: redis.asyncio.Redis) -> AsyncQueue:
    return AsyncQueue(async_redis_client, TOPIC)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for_server_ms(client: redis.Redis, instant_ms: int) -> None:
    """Wait (by condition, with a deadline) until the Redis clock has passed `instant_ms`."""
    wait_until(lambda: server_ms(client) > instant_ms, 5.0, f"server time past {instant_ms}")
