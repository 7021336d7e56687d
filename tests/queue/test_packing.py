"""hiredis packing for asyncio clients sends exactly what redis-py's own packer sends, and
writes without a task per command, still bounded by the socket timeout."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError
from redis.typing import EncodableT

from delayq.local.redis_server import RedisServer
from delayq.queue.packing import (
    HiredisConnection,
    HiredisUnixConnection,
    pack,
    use_hiredis_packing,
)

COMMANDS: list[tuple[EncodableT, ...]] = [
    ("EVALSHA", "abc", 2, "k1", "k2", 7, -3, 1.5, b"\x00\xff", "é", bytearray(b"ba")),
    ("CONFIG GET", "maxmemory"),
    (b"SET", memoryview(b"key"), b""),
    # a strided view: hiredis alone would send the first bytes of its buffer ("abc")
    ("SET", "key", memoryview(b"abcdef")[::2]),
]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_bytes_equal_redis_pys_python_packer(command: tuple[EncodableT, ...]) -> None:
    reference = b"".join(bytes(part) for part in Connection().pack_command(*command))
    assert pack(command) == reference
    assert b"".join(HiredisConnection().pack_commands([command, command])) == reference * 2


@pytest.mark.parametrize("bad", [None, True, object()])
def test_an_unsendable_value_is_a_data_error(bad: object) -> None:
    with pytest.raises(DataError):
        pack(("SET", "key", bad))


def test_the_pool_gets_the_twin_of_its_connection_class() -> None:
    tcp = use_hiredis_packing(redis.asyncio.Redis.from_url("redis://127.0.0.1:1"))
    unix = use_hiredis_packing(redis.asyncio.Redis.from_url("unix:///tmp/none.sock"))
    assert tcp.connection_pool.connection_class is HiredisConnection
    assert unix.connection_pool.connection_class is HiredisUnixConnection
    assert issubclass(HiredisUnixConnection, UnixDomainSocketConnection)


async def test_a_packed_client_talks_to_a_real_server(redis_server: RedisServer) -> None:
    client = use_hiredis_packing(redis.asyncio.Redis.from_url(redis_server.url))
    await client.set("packing:é", b"\x00value")
    assert await client.get("packing:é") == b"\x00value"
    pipe = client.pipeline(transaction=False)
    pipe.incrby("packing:n", 5)
    pipe.incrby("packing:n", 2)
    assert await pipe.execute() == [5, 7]
    await client.aclose()


async def test_a_command_with_a_socket_timeout_is_written_without_a_task(
    redis_server: RedisServer,
) -> None:
    """The service's pools have a socket timeout: redis-py's `asyncio.wait_for` around each
    write made a task per command (Python 3.11), its bytes sent turns of the loop later."""
    client = use_hiredis_packing(redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=20))
    await client.ping()  # connected before counting
    loop = asyncio.get_running_loop()
    created: list[str] = []
    previous = loop.get_task_factory()

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **options: Any
    ) -> asyncio.Task[Any]:
        created.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        for _ in range(5):
            assert await client.ping()
        pipe = client.pipeline(transaction=False)
        pipe.incrby("packing:tasks", 1)
        pipe.incrby("packing:tasks", 1)
        assert await pipe.execute() == [1, 2]
    finally:
        loop.set_task_factory(previous)
        await client.aclose()
    # (the pipeline's reset releases its connection in a task: not a write)
    assert [name for name in created if "send" in name] == []


async def test_a_write_the_server_does_not_take_times_out(second_broker: RedisServer) -> None:
    """The write is still bounded: a stopped server takes no more bytes, and the command
    fails after the socket timeout, as with redis-py's own write."""
    client = use_hiredis_packing(
        redis.asyncio.Redis.from_url(second_broker.url, socket_timeout=0.3)
    )
    await client.ping()
    assert second_broker.process is not None
    os.kill(second_broker.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(redis.TimeoutError, match="writing"):
            await client.set("packing:big", b"x" * (64 << 20))  # more than the socket buffers
    finally:
        os.kill(second_broker.process.pid, signal.SIGCONT)
        await client.aclose()
