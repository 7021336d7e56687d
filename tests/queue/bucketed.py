"""What the tests of a slot's two bucketed parts share (records: test_record_buckets.py, dues:
test_store_buckets.py, what holds for both alike: test_bucketed_parts.py): the owner's
publish, the restricted user's queue, the measures, and each part described as a `Layout`, so
that a rule both parts follow is written once and run on each."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.queue.client import Queue
from delayq.queue.keys import Part, SlotKeys, slot_keys
from delayq.queue.model import ScheduleRequest
from delayq.queue.record_buckets import bucket_count, bucket_key, record_pages
from delayq.queue.store_buckets import store_bucket_count, store_bucket_key, store_pages
from delayq.queue.topic import Topic

from .conftest import ENGINE_PASSWORD, ENGINE_USER, engine_user

HOUR_MS = 3_600_000
OWNER = "tests"


@dataclasses.dataclass(frozen=True)
class Layout:
    """One bucketed part of a slot, as the tests drive it."""

    #: the topic's setting as the settings record carries it (and `Topic` names it)
    field: str
    #: a function a library of the version before the part registers (and not the part's own)
    older_function: str
    meta: Part  # the slot's {n, count} hash
    flat: Part  # the one key the part is kept in without buckets
    siblings: tuple[Part, ...]  # parts that exist while the buckets do
    count: Callable[[redis.Redis, SlotKeys], int]
    bucket: Callable[[SlotKeys, int], str]
    #: every entry, id -> value, read as a move or a doubling reads them
    contents: Callable[[redis.Redis, SlotKeys], dict[bytes, Any]]
    flat_size: Callable[[redis.Redis, str], int]
    write_one: Callable[[redis.Redis, str, str], object]  # an entry of `id` into a key


def records(client: redis.Redis, keys: SlotKeys) -> dict[bytes, bytes]:
    return {field: value for page in record_pages(client, keys) for field, value in page}


def waiting(client: redis.Redis, keys: SlotKeys) -> dict[bytes, float]:
    return {member: due for page in store_pages(client, keys) for member, due in page}


RECORDS = Layout(
    field="redis_record_buckets",
    older_function="version",
    meta=Part.BUCKETS,
    flat=Part.MSG,
    siblings=(),
    count=bucket_count,
    bucket=bucket_key,
    contents=records,
    flat_size=lambda client, key: int(client.hlen(key)),
    write_one=lambda client, key, member: client.hset(key, member, "from an earlier copy"),
)
STORE = Layout(
    field="redis_store_buckets",
    older_function="record_buckets",
    meta=Part.STORE_BUCKETS,
    flat=Part.STORE,
    siblings=(Part.HEADS,),
    count=store_bucket_count,
    bucket=store_bucket_key,
    contents=waiting,
    flat_size=lambda client, key: int(client.zcard(key)),
    write_one=lambda client, key, member: client.zadd(key, {member: 1}),
)


def publish(admin: redis.Redis, on: bool, version: int, topic: Topic, field: str) -> None:
    """The topic's owner (the admin) turns the part's buckets (its settings `field`) on or
    off."""
    changes: dict[str, Any] = {field: on}
    Queue(admin, dataclasses.replace(topic, **changes)).publish_settings(OWNER, version)


def queue_fixture(topic: Topic) -> Any:
    """A test module's `queue` fixture: the queue of `topic` as its restricted user, as the
    delay services log in (its rules must reach the buckets and their index); the admin
    publishes."""

    @pytest.fixture
    def queue(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Queue]:
        engine_user(redis_client, topic)
        client = redis.Redis.from_url(
            redis_server.url, username=ENGINE_USER, password=ENGINE_PASSWORD
        )
        try:
            yield Queue(client, topic)
        finally:
            client.close()

    return queue


def encodings(client: redis.Redis, layout: Layout, keys: SlotKeys) -> set[bytes]:
    """How Redis keeps each of the slot's buckets of the part."""
    count = layout.count(client, keys)
    return {client.object("encoding", layout.bucket(keys, b)) for b in range(count)} - {None}


def schedule_at(queue: Queue, dues: dict[str, int]) -> None:
    """40-byte messages due at the given instants, in batches of 1,000."""
    items = list(dues.items())
    for start in range(0, len(items), 1000):
        queue.schedule_many(
            [ScheduleRequest(i, b"p" * 40, at_ms=at) for i, at in items[start : start + 1000]]
        )


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def drain(queue: Queue, epoch: int, max_count: int) -> list[tuple[str, int]]:
    """Claim and ack until nothing is due; (id, due) in the order the claims gave them."""
    taken: list[tuple[str, int]] = []
    while batch := queue.claim(0, epoch, max_count=max_count).messages:
        for message in batch:
            queue.ack(message.lease)
        taken += [(message.id, message.due_ms) for message in batch]
    return taken


def bytes_added(client: redis.Redis, queue: Queue, write: Callable[[Queue], None]) -> int:
    """The Redis memory `write` adds to the topic of `queue`, measured after a warm-up message
    (the functions loaded, the slot's keys made)."""
    queue.schedule("warm", b"w", delay_ms=HOUR_MS)
    before = int(client.info("memory")["used_memory"])
    write(queue)
    return int(client.info("memory")["used_memory"]) - before


def bytes_an_entry(
    client: redis.Redis, queue: Queue, layout: Layout, write: Callable[[Queue], None], count: int
) -> tuple[float, float]:
    """What each of `count` entries `write` adds costs: in the part's flat key (a topic beside
    `queue`'s that leaves its buckets off), and in buckets (`queue`'s topic, the owner turning
    them on first), where every bucket must be a listpack and the flat key stay empty."""
    topic = queue.topic
    flat = bytes_added(client, Queue(client, dataclasses.replace(topic, name="flat")), write)
    publish(client, True, 1, topic, layout.field)
    bucketed = bytes_added(client, queue, write)
    keys = slot_keys(topic, 0)
    assert encodings(client, layout, keys) == {b"listpack"}
    assert layout.flat_size(client, keys.key(layout.flat)) == 0
    assert client.hget(keys.key(layout.meta), "count") == str(count + 1).encode()  # + warm-up
    return flat / count, bucketed / count


def calls_of(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}") or {"calls": 0}
    return int(stats["calls"])
