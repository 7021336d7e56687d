"""Make a real redis-server run out of memory part-way through a write (maxmemory with
noeviction, set for one test and restored after), so partial batches are tested for real."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis


def footprint(client: redis.Redis, namespace: str, write: Callable[[], object]) -> int:
    """How many bytes of memory `write()` takes in Redis; it must write only keys of topics in
    `namespace`, which are deleted after (synchronously, so the memory is back)."""
    before = int(client.info("memory")["used_memory"])
    write()
    grown = int(client.info("memory")["used_memory"]) - before
    keys = list(client.scan_iter(match=f"dq:{{{namespace}/*", count=1000))
    if keys:
        client.delete(*keys)
    return grown


# A limit of 1 byte: every write is refused, even if Redis frees memory meanwhile (a lazy free
# of an earlier test's data, client buffers), which a bound of "used - 1 byte" does not guarantee.
FULL = -(1 << 62)


@contextmanager
def memory_for(client: redis.Redis, extra_bytes: int) -> Iterator[None]:
    """Redis refuses writes once it uses `extra_bytes` more than now (noeviction)."""
    saved = client.config_get("maxmemory*")
    memory, policy = saved["maxmemory"], saved["maxmemory-policy"]
    assert memory is not None  # redis-py types every value as optional
    assert policy is not None
    client.config_set("maxmemory-policy", "noeviction")
    limit = max(1, int(client.info("memory")["used_memory"]) + extra_bytes)
    client.config_set("maxmemory", limit)
    try:
        yield
    finally:
        client.config_set("maxmemory", memory)
        client.config_set("maxmemory-policy", policy)
