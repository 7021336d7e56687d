"""Copy one slot's data between two brokers, key by key (the Redis half of a slot move).

Every key of a slot is one `Part` of `keys.py`, so iterating `Part` copies all of it (store,
prepare with its lease deadlines, dead, records, reasons, outcomes, journal, wake list, epoch,
lease counter, schedules, ...); `PART_TYPES` names each part's Redis type (a part added
later without one fails every move test).

The copy reads each key's content (ZRANGE WITHSCORES, HSCAN, GET, LRANGE, XRANGE) and writes
it with the engine's own commands (ZADD, HSET, SET, RPUSH, XADD with the entry's id), not with
DUMP/RESTORE: the restricted service user that runs a move may not RESTORE (a crafted payload
is a way into Redis's memory), and scores, fields and stream ids carry over exactly as values.

The source must be frozen (`consume_plans.freeze`) first: then nothing writes into the slot
there, and a copy is a snapshot. The copy deletes the slot's keys on the target first, then
writes them page by page: at most `GROUP` keys of at most `BATCH` entries each, and at most
`PAGE_MAX_BYTES` read at once (`reply_cap`: a read past it is made again at half the entries;
one entry past it is read alone, up to `ENTRY_MAX_BYTES`, by one copy at a time in the
process: `holding_entries`). The slot's size is the tenant's (its payloads, its broker's
memory), the copier's memory is the platform's: the operator moves slots in its leader, and a
copy that read the slot whole was killed for memory at a few hundred MB, by every leader in
turn; a page of 2,000 entries is no bound either when a tenant may write entries of any size.
The slot's strings (its epoch, its lease counter) go first. A copy cut short leaves a partial
copy on a target nobody routes to: the move's next run copies again from the deletion on, an abort
deletes it (`coordination/migration.py`).
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
    hash_pages,
    record_keys,
)
from delayq.queue.reply_cap import ReplyTooLarge, capped, fitted, holding_entries
from delayq.queue.store_buckets import (
    STORE_BUCKETS_FIELD,
    store_bucket_count,
    store_bucket_key,
    store_keys,
)

#: Members, fields or entries per read and per write command: one command never holds a whole
#: large slot (a hash Redis keeps as a listpack answers an HSCAN whole: up to its few hundred).
BATCH = 2000
#: Keys read in one round trip, each up to its first BATCH entries (a slot has ~20 parts and may
#: have thousands of buckets).
GROUP = 16


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


def copy_slot(
    source: redis.Redis,
    target: redis.Redis,
    keys: SlotKeys,
    before_write: Callable[[], None] = lambda: None,
) -> int:
    """Replace the slot's keys on `target` with those on `source`, page by page; returns how
    many keys of the slot the target got. `before_write` runs before each write (the mover
    checks that it still holds the slot: a mover that lost it stops at its next page). Keys
    without a TTL stay so (the engine sets none). The buckets of the records and of the
    waiting messages (`BUCKETED`) go with their part: the bucket count is the source's meta
    part. Onto a broker whose record of the slot lacks the part's field (the owner has not
    published there since the topic turned those buckets on, or a new broker) they go into the
    flat part, where the scripts there look: only a record with the field makes them look in
    buckets. The field, once there, stays (publish-1), so it cannot go between this read and
    the copy. Every read is capped in bytes (`reply_cap`)."""
    with holding_entries():
        return _copy(_Source(capped(source)), target, capped(target), keys, before_write)


def _copy(
    source: _Source,
    target: redis.Redis,
    target_reads: redis.Redis,
    keys: SlotKeys,
    before_write: Callable[[], None],
) -> int:
    parts = [part for part in Part if part not in DOUBLING_PARTS]
    read = source.reads.pipeline(transaction=False)
    for layout in BUCKETED:
        read.hget(keys.key(layout.meta), "n")
    counts = [int(count or 0) for count in read.execute()]
    left_out: set[Part | None] = set()
    buckets: list[_Copy] = []
    stale: list[str] = []
    for layout, count in zip(BUCKETED, counts, strict=True):
        flatten = count > 0 and target_reads.hget(keys.settings, layout.field) is None
        if flatten:
            left_out |= {layout.meta, layout.index}
        for number in range(count):
            name = layout.bucket(keys, number)
            into, content = (keys.key(layout.flat), layout.unbucketed) if flatten else (name, None)
            buckets.append(_Copy(name, layout.kind, into, content))
        stale.extend(layout.bucket(keys, b) for b in range(layout.count(target_reads, keys)))
    strings_first = sorted(
        (part for part in parts if part not in left_out),
        key=lambda part: PART_TYPES[part] is not RedisType.STRING,
    )
    copies = [_Copy(keys.key(p), PART_TYPES[p], keys.key(p), None) for p in strings_first]
    copies += buckets
    before_write()
    target.unlink(*keys.keys(*parts, *DOUBLING_PARTS), *stale)
    written: set[str] = set()
    for start in range(0, len(copies), GROUP):
        group = copies[start : start + GROUP]
        write = target.pipeline(transaction=False)
        rest: list[tuple[_Copy, Iterator[Any]]] = []
        firsts = source.first_pages(group)
        if firsts is None:  # together past the cap: each key on its own
            rest = [(copy, source.pages(copy, _FIRST[copy.kind])) for copy in group]
        else:
            for copy, reply in zip(group, firsts, strict=True):
                content = reply[1] if copy.kind is RedisType.HASH else reply
                _write(write, copy, content, written)
                after = _after(copy.kind, _FIRST[copy.kind], BATCH, reply)
                if after is not None:
                    rest.append((copy, source.pages(copy, after)))
        before_write()
        write.execute()
        for copy, pages in rest:  # the keys longer than a page, one page a round trip
            for content in pages:
                write = target.pipeline(transaction=False)
                _write(write, copy, content, written)
                before_write()
                write.execute()
    return len(written)


class _Source:
    """The source's reads, capped in bytes (`reply_cap`)."""

    def __init__(self, reads: redis.Redis) -> None:
        self.reads = reads

    def first_pages(self, group: list[_Copy]) -> list[Any] | None:
        """Each key's first page of BATCH entries, in one round trip; None if together they
        pass the cap."""
        read = self.reads.pipeline(transaction=False)
        for copy in group:
            _queue_page(read, copy, _FIRST[copy.kind], BATCH)
        try:
            return read.execute()
        except ReplyTooLarge:
            return None

    def pages(self, copy: _Copy, at: Any) -> Iterator[Any]:
        """The content of `copy.source` page by page from `at` on, each fitted to the cap
        (`reply_cap.fitted`; a hash's: `record_buckets.hash_pages`)."""
        if copy.kind is RedisType.HASH:
            yield from hash_pages(self.reads, copy.source, BATCH, at)
            return
        if copy.kind is RedisType.STRING:
            yield fitted(self.reads, lambda _: self.reads.get(copy.source), 1, copy.source)[0]
            return
        count = BATCH
        while at is not None:

            def read(entries: int, at: Any = at) -> Any:
                pipe = self.reads.pipeline(transaction=False)
                _queue_page(pipe, copy, at, entries)
                return pipe.execute()[0]

            reply, used = fitted(self.reads, read, count, copy.source)
            yield reply
            at, count = _after(copy.kind, at, used, reply), min(BATCH, 2 * used)


@dataclass(frozen=True)
class _Copy:
    """One key read from the source into one key of the target (a bucket into the flat part
    when the target reads no buckets: `content` makes its entries the flat part's)."""

    source: str
    kind: RedisType
    target: str
    content: Callable[[Any], Any] | None


#: Where each type's first page starts: an index, an HSCAN cursor, a stream id ('-': the first).
_FIRST: dict[RedisType, Any] = {
    RedisType.ZSET: 0,
    RedisType.HASH: 0,
    RedisType.STRING: None,
    RedisType.LIST: 0,
    RedisType.STREAM: "-",
}


def _queue_page(pipe: Any, copy: _Copy, at: Any, count: int) -> None:
    """Queue the read of the page of `copy.source` that starts `at`, of `count` entries (a
    hash's HSCAN takes it as a hint; the source is frozen, so an index is a stable place in a
    sorted set or a list)."""
    if copy.kind is RedisType.ZSET:
        pipe.zrange(copy.source, at, at + count - 1, withscores=True)
    elif copy.kind is RedisType.HASH:
        pipe.hscan(copy.source, at, count=count)
    elif copy.kind is RedisType.STRING:
        pipe.get(copy.source)
    elif copy.kind is RedisType.LIST:
        pipe.lrange(copy.source, at, at + count - 1)
    else:
        pipe.xrange(copy.source, min=at, count=count)


def _after(kind: RedisType, at: Any, count: int, reply: Any) -> Any:
    """Where the page after the one of `count` entries read from `at` starts; None after the
    last."""
    if kind is RedisType.HASH:
        return reply[0] or None
    if kind in (RedisType.ZSET, RedisType.LIST) and len(reply) == count:
        return at + count
    if kind is RedisType.STREAM and len(reply) == count:
        return b"(" + reply[-1][0]
    return None


def _write(pipe: Any, copy: _Copy, content: Any, written: set[str]) -> None:
    """Queue the writes of one page's content (noting its target key in `written`)."""
    if present(copy.kind, content):
        write_value(
            pipe, copy.kind, copy.target, copy.content(content) if copy.content else content
        )
        written.add(copy.target)


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
