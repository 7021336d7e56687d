"""Shared fixtures: one real redis-server (flushed between tests) and one ZooKeeper per session,
and a second redis-server of its own for the tests of a topic on two brokers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def second_broker() -> Iterator[RedisServer]:
    """A redis-server of the test alone, the topic's broker 1 (broker 0: ``redis_server``)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def async_redis_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One real standalone ZooKeeper per test session; tests isolate by topic path."""
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()
