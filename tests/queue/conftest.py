"""Engine fixtures on the session's real redis-server."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import functions
from delayq.queue.acl import service_user_rules
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.model import Message
from delayq.queue.topic import Topic

TOPIC = Topic("orders", namespace="shop", slot_amount=4, max_retries=2, journal_max_len=10_000)


@pytest.fixture
def durable_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own that survives kill -9 (AOF, fsync on every write)."""
    server = RedisServer(appendonly=True, extra_config={"appendfsync": "always"}).start()
    try:
        yield server
    finally:
        server.stop()


#: The engine fixtures connect as the topic's restricted ACL user (delayq.queue.acl), as the
#: delay services do in a cluster: every test using them proves the rules are sufficient.
ENGINE_USER, ENGINE_PASSWORD = "shop.orders", "engine-secret"


def engine_user(admin: redis.Redis, topic: Topic = TOPIC) -> None:
    """Create (or reset) the topic's restricted user, and load the engine's functions as the
    admin (the operator's part on Kubernetes): the restricted user may not."""
    rules = service_user_rules(topic)
    admin.execute_command("ACL", "SETUSER", ENGINE_USER, *rules, f">{ENGINE_PASSWORD}")
    functions.load(admin)


def engine_client(server: RedisServer, admin: redis.Redis) -> redis.Redis:
    """A client logged in as the topic's restricted user."""
    engine_user(admin)
    return redis.Redis.from_url(server.url, username=ENGINE_USER, password=ENGINE_PASSWORD)


@pytest.fixture
def queue(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Queue]:
    client = engine_client(redis_server, redis_client)
    try:
        yield Queue(client, TOPIC)
    finally:
        client.close()


@pytest.fixture
async def async_queue(
    redis_server: RedisServer, redis_client: redis.Redis
) -> AsyncIterator[AsyncQueue]:
    engine_user(redis_client)
    client = redis.asyncio.Redis.from_url(
        redis_server.url, username=ENGINE_USER, password=ENGINE_PASSWORD
    )
    try:
        yield AsyncQueue(client, TOPIC)
    finally:
        await client.aclose()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for_server_ms(client: redis.Redis, instant_ms: int) -> None:
    """Wait (by condition, with a deadline) until the Redis clock has passed `instant_ms`."""
    wait_until(lambda: server_ms(client) > instant_ms, 5.0, f"server time past {instant_ms}")


MakeQueue = Callable[..., Queue]


@pytest.fixture
def make_queue(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[MakeQueue]:
    """Queues of TOPIC with some settings changed (keywords of Topic), as the topic's
    restricted ACL user."""
    client = engine_client(redis_server, redis_client)
    try:
        yield lambda **changes: Queue(client, dataclasses.replace(TOPIC, **changes))
    finally:
        client.close()


def claim(queue: Queue, message_id: str, ack_timeout_ms: int = 60_000) -> list[Message]:
    """Take the slot of `message_id` over and claim: the message if it was delivered."""
    slot = queue.topic.slot_of(message_id)
    batch = queue.claim(slot, queue.take_over(slot), 100, ack_timeout_ms)
    return [m for m in batch.messages if m.id == message_id]
