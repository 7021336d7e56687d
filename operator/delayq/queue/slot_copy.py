"""Copy one slot's data between two brokers, key by key (the Redis half of a slot move).

Every key of a slot is one `Part` of `keys.py`, so iterating `Part` copies all of it (store,
prepare with its lease deadlines, dead, records, reasons, outcomes, journal, wake list, epoch,
lease counter, schedules, ...); `PART_TYPES` names each part's Redis type (a part added
later without one fails every move test).

The copy reads each key's content (ZRANGE WITHSCORES, HGETALL, GET, LRANGE, XRANGE) and writes
it with the engine's own commands (ZADD, HSET, SET, RPUSH, XADD with the entry's id), not with
DUMP/RESTORE: the restricted service user that runs a move may not RESTORE (a crafted payload
is a way into Redis's memory), and scores, fields and stream ids carry over exactly as values.

The source must be frozen (`consume_plans.freeze`) first: then nothing writes into the slot
there, and a copy is a snapshot. The target side runs in one MULTI that deletes the slot's keys
first, so a copy is all or nothing, and a copy repeated after a crash replaces the earlier one
(no key of the slot is left from before).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from delayq.queue.keys import Part, SlotKeys
from delayq.queue.record_buckets import (
    RECORD_BUCKETS_FIELD,
    bucket_count,
    bucket_key,
    bucket_records,
    record_keys,
)
from delayq.queue.store_buckets import (
    STORE_BUCKETS_FIELD,
    store_bucket_count,
    store_bucket_key,
    store_keys,
)

#: Members, fields or entries per write command: one command never holds a whole large slot.
BATCH = 2000


class RedisType(enum.Enum):
    ZSET = "zset"
    HASH = "hash"
    STRING = "string"
    LIST = "list"
    STREAM = "stream"


#: A doubling's own bookkeeping (`slot_split.py`: the messages its catch-up copies again): no
#: move runs while a doubling is recorded (`coordination/splitting.py`), so a move neither
#: copies these nor leaves them on its target.
DOUBLING_PARTS = frozenset({Part.CHANGES, Part.RECOPY})

PART_TYPES: dict[Part, RedisType] = {
    Part.STORE: RedisType.ZSET,
    Part.HEADS: RedisType.ZSET,
    Part.PREPARE: RedisType.ZSET,
    Part.DEAD: RedisType.ZSET,
    Part.FINISHED: RedisType.ZSET,
    Part.TOPUP: RedisType.ZSET,
    Part.PRIORITY: RedisType.ZSET,
    Part.GROUP_WAIT: RedisType.ZSET,
    Part.GROUPS: RedisType.ZSET,
    Part.GROUP_LEASES: RedisType.ZSET,
    Part.MSG: RedisType.HASH,
    Part.BUCKETS: RedisType.HASH,
    Part.STORE_BUCKETS: RedisType.HASH,
    Part.REASON: RedisType.HASH,
    Part.OUTCOME: RedisType.HASH,
    Part.SCHEDULES: RedisType.HASH,
    Part.BASIS: RedisType.HASH,
    Part.EPOCH: RedisType.STRING,
    Part.LEASES: RedisType.STRING,
    Part.WAKE: RedisType.LIST,
    Part.JOURNAL: RedisType.STREAM,
}


def read_value(pipe: Any, kind: RedisType, name: str) -> None:
    """Queue the read of a whole key of that type (a pipeline's reply: its content)."""
    if kind is RedisType.ZSET:
        pipe.zrange(name, 0, -1, withscores=True)
    elif kind is RedisType.HASH:
        pipe.hgetall(name)
    elif kind is RedisType.STRING:
        pipe.get(name)
    elif kind is RedisType.LIST:
        pipe.lrange(name, 0, -1)
    else:
        pipe.xrange(name)


def _batches(items: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


def write_value(pipe: Any, kind: RedisType, name: str, content: Any) -> None:
    """Queue the commands that rebuild `content` (as `read_value` read it) under `name`, an
    absent key (a stream's entries keep their ids)."""
    if kind is RedisType.ZSET:
        for chunk in _batches(content):
            pipe.zadd(name, {member: score for member, score in chunk})
    elif kind is RedisType.HASH:
        for chunk in _batches(list(content.items())):
            pipe.hset(name, mapping=dict(chunk))
    elif kind is RedisType.STRING:
        pipe.set(name, content)
    elif kind is RedisType.LIST:
        for chunk in _batches(content):
            pipe.rpush(name, *chunk)
    else:
        for entry_id, fields in content:
            pipe.xadd(name, fields, id=entry_id)


def present(kind: RedisType, content: Any) -> bool:
    return content is not None if kind is RedisType.STRING else bool(content)


@dataclass(frozen=True)
class Bucketed:
    """A part a slot may keep in buckets (`record_buckets.py`, `store_buckets.py`): the flat
    part, the hash holding the bucket count, the index beside the buckets (if any), the
    settings record's field that makes the scripts look in buckets, the buckets' keys, and a
    bucket's content as the flat part holds it (a bucket keeps some records short)."""

    flat: Part
    meta: Part
    index: Part | None
    field: str
    kind: RedisType
    bucket: Callable[[SlotKeys, int], str]
    count: Callable[[redis.Redis, SlotKeys], int]
    unbucketed: Callable[[Any], Any]


BUCKETED = (
    Bucketed(
        Part.MSG,
        Part.BUCKETS,
        None,
        RECORD_BUCKETS_FIELD,
        RedisType.HASH,
        bucket_key,
        bucket_count,
        bucket_records,
    ),
    Bucketed(
        Part.STORE,
        Part.STORE_BUCKETS,
        Part.HEADS,
        STORE_BUCKETS_FIELD,
        RedisType.ZSET,
        store_bucket_key,
        store_bucket_count,
        lambda entries: entries,
    ),
)


def copy_slot(source: redis.Redis, target: redis.Redis, keys: SlotKeys) -> int:
    """Replace the slot's keys on `target` with those on `source`; returns how many keys the
    slot has. Keys without a TTL stay so (the engine sets none). The buckets of the records and
    of the waiting messages (`BUCKETED`) go with their part: the bucket count is the source's
    meta part. Onto a broker whose record of the slot lacks the part's field (the owner has not
    published there since the topic turned those buckets on, or a new broker) they go into the
    flat part, where the scripts there look: only a record with the field makes them look in
    buckets. The field, once there, stays (publish-1), so it cannot go between this read and
    the copy."""
    parts = [part for part in Part if part not in DOUBLING_PARTS]
    read = source.pipeline(transaction=False)
    for part in parts:
        read_value(read, PART_TYPES[part], keys.key(part))
    contents = dict(zip(parts, read.execute(), strict=True))
    extra: list[tuple[str, RedisType, Any]] = []
    stale: list[str] = []
    for layout in BUCKETED:
        count = int(contents[layout.meta].get(b"n", 0))
        read = source.pipeline(transaction=False)
        for number in range(count):
            read_value(read, layout.kind, layout.bucket(keys, number))
        buckets = read.execute() if count else []
        if count and target.hget(keys.settings, layout.field) is None:
            whole = [layout.unbucketed(content) for content in buckets]
            contents[layout.flat] = _flattened(layout.kind, contents[layout.flat], whole)
            contents[layout.meta], buckets, count = {}, [], 0
            if layout.index is not None:
                contents[layout.index] = []
        extra.extend((layout.bucket(keys, b), layout.kind, buckets[b]) for b in range(count))
        stale.extend(layout.bucket(keys, b) for b in range(layout.count(target, keys)))
    write = target.pipeline(transaction=True)
    write.delete(*keys.keys(*parts, *DOUBLING_PARTS), *stale)
    copied = 0
    for name, kind, content in [
        *((keys.key(part), PART_TYPES[part], contents[part]) for part in parts),
        *extra,
    ]:
        if present(kind, content):
            write_value(write, kind, name, content)
            copied += 1
    write.execute()
    return copied


def _flattened(kind: RedisType, flat: Any, buckets: list[Any]) -> Any:
    """The flat part's content with every bucket's in it (an id is in one place at most)."""
    if kind is RedisType.HASH:
        for bucket in buckets:
            flat.update(bucket)
        return flat
    return [entry for content in (flat, *buckets) for entry in content]


#: What a move deletes on the broker the slot left: everything but its frozen epoch, which
#: stays as a tombstone ('moving:<epoch>'), so a writer still routing the slot there (a process
#: whose routing watch has not fired yet) is refused with SLOT_MOVING instead of writing into a
#: slot nobody consumes. A later move back onto this broker replaces it.
MOVED_AWAY_PARTS = tuple(part for part in Part if part is not Part.EPOCH)


def delete_slot(client: redis.Redis, keys: SlotKeys, parts: tuple[Part, ...] = tuple(Part)) -> int:
    """Delete the slot's keys of `parts` on one broker (the target's copy when a move is
    rolled back; MOVED_AWAY_PARTS on the source after it), the records' buckets with `msg` and
    the waiting messages' with `store`; returns how many existed. UNLINK: Redis frees a large
    slot in the background instead of blocking the broker's other slots. Nothing writes the
    slot meanwhile (frozen, or not yet routed), so its bucket counts hold."""
    buckets = record_keys(keys, bucket_count(client, keys))[1:] if Part.MSG in parts else []
    if Part.STORE in parts:
        buckets += store_keys(keys, store_bucket_count(client, keys))[1:]
    return int(client.unlink(*keys.keys(*parts), *buckets))
