"""hiredis packing for asyncio clients sends exactly what redis-py's own packer sends."""

from __future__ import annotations

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
