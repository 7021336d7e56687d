"""Where a slot keeps its records, for the code that reads them outside the scripts (pure rules
plus reads; docs/contracts.md §1, "Records in buckets").

The scripts reach a slot's records through `lua/includes/record_buckets.lua`: in the slot's
`msg` hash, or, once its `buckets` hash exists, in the buckets `<msg key>:<b>` (b in 0 .. n - 1,
n growing one at a time by linear hashing) and then in `msg` for what was written before. A
slot move's copy, a doubling's division and a backup read the records here, by the same rule:
`bucket_of` must pick the bucket the Lua does, for every id and bucket count (a test holds
them to it).

A reader of a live slot (a doubling copies a slot before freezing it) must not miss a record
that a script moves meanwhile. A record only moves when its bucket splits, and then to a higher
bucket, possibly a new one: so `record_pages` scans the buckets in order and asks for the bucket
count again after each, and a reader of given records repeats its reads until the count it read
them under is still the count after them (it never shrinks): `queue_record_reads`.

A bucket holds a fresh record in a short form (`codec.expanded_record`); every reader here
answers the whole record, as the scripts' reads do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import redis

from delayq.queue.codec import expanded_record
from delayq.queue.keys import Part, SlotKeys
from delayq.queue.reply_cap import (
    ReplyTooLarge,
    entry_reads,
    fitted_chunks,
    is_capped,
    scan_pages,
)

#: The settings record's field (queue/topic_record.py) that sends a slot's records into
#: buckets: `True` while the topic has them on. The owner gives it only then, and publish-1
#: keeps it, as `False`, once a record has held it: the scripts look for records in buckets only
#: where the record has it, so topics that never turned buckets on pay no lookup a slot, and a
#: slot's buckets may only exist where its record has the field (a copy onto a broker whose
#: record lacks it brings the records into `msg`: `queue/slot_copy.py`).
RECORD_BUCKETS_FIELD = "redis_record_buckets"
#: A HSCAN's COUNT hint: records per page.
PAGE = 2000
T = TypeVar("T")

#: Takes the answers of the reads `queue_record_reads` queued: one record or None a member.
RecordsParser = Callable[[Iterator[list[bytes | None]]], list[bytes | None]]


def record_hash(member: bytes) -> int:
    """The first 32 bits of the id's SHA-1 (the Lua's `hash_of`): independent of the CRC32
    that picks the id's slot, so a slot's ids spread over all its buckets."""
    return int.from_bytes(hashlib.sha1(member).digest()[:4], "big")


def bucket_of(member: bytes, count: int) -> int:
    """The bucket of `member` among `count` buckets (linear hashing, as the Lua's)."""
    low = 1 << (count.bit_length() - 1)
    hashed = record_hash(member)
    bucket = hashed % low
    return hashed % (2 * low) if bucket < count - low else bucket


def bucket_key(keys: SlotKeys, bucket: int) -> str:
    return f"{keys.key(Part.MSG)}:{bucket}"


def bucket_count(client: redis.Redis, keys: SlotKeys) -> int:
    """How many buckets the slot's records have: 0 while the slot keeps them in `msg` alone."""
    return counted(client.hgetall(keys.key(Part.BUCKETS)))


def queue_bucket_count(pipe: Any, keys: SlotKeys) -> None:
    """Queue the read of the slot's bucket count (`counted` reads the answer). HGETALL of the
    two fields: a command every reader of a slot may run, the read-only backup user too."""
    pipe.hgetall(keys.key(Part.BUCKETS))


def counted(reply: Any) -> int:
    """The bucket count in an answer of `queue_bucket_count`."""
    return int(cast("dict[bytes, bytes]", reply).get(b"n", 0))


def record_keys(keys: SlotKeys, count: int) -> list[str]:
    """Every key that may hold a record of the slot with `count` buckets: `msg` first."""
    return [keys.key(Part.MSG), *(bucket_key(keys, b) for b in range(count))]


def record_pages(client: redis.Redis, keys: SlotKeys) -> Iterator[list[tuple[bytes, bytes]]]:
    """The slot's records page by page (HSCAN of `msg`, then of each bucket in order), each
    whole: each record present throughout is seen at least once while scripts write the slot."""
    pages = bucketed_pages(
        lambda key: _hash_pages(client, key),
        keys.key(Part.MSG),
        lambda number: bucket_key(keys, number),
        lambda: bucket_count(client, keys),
    )
    return ([(field, expanded_record(value)) for field, value in page] for page in pages)


def bucket_records(content: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A bucket's fields (HGETALL) with each record whole, as the flat `msg` holds them."""
    return {field: expanded_record(value) for field, value in content.items()}


def bucketed_pages(
    pages: Callable[[str], Iterator[list[T]]],
    flat: str,
    bucket: Callable[[int], str],
    count: Callable[[], int],
) -> Iterator[list[T]]:
    """The `pages` of a part kept in buckets as well as in one flat key: the flat key's, then
    each bucket's in order, the bucket count asked again after each (entries only move to a
    higher bucket, possibly a new one: a scan in order sees each one present throughout)."""
    yield from pages(flat)
    number = 0
    while number < count():
        yield from pages(bucket(number))
        number += 1


def _hash_pages(client: redis.Redis, key: str) -> Iterator[list[tuple[bytes, bytes]]]:
    return (list(fields.items()) for fields in hash_pages(client, key, PAGE))


def hash_pages(
    client: redis.Redis, key: str, count: int, cursor: int = 0
) -> Iterator[dict[bytes, bytes]]:
    """A hash page by page from `cursor` on (HSCAN of up to `count` fields, each page fitted
    to a capped client's cap: `reply_cap.scan_pages`). An HSCAN answers a whole bucket of the
    hash's table, which may hold a few fields: when one bucket's fields pass the cap of a
    single entry together (fields of tens of MB each), the rest is read by name, every field
    again (HKEYS, then HMGETs fitted to the cap): the readers write what they read, so a field
    answered twice is written twice, the same."""

    def scan(at: int, entries: int) -> tuple[int, dict[bytes, bytes]]:
        return cast("tuple[int, dict[bytes, bytes]]", client.hscan(key, at, count=entries))

    try:
        yield from scan_pages(client, scan, count, key, cursor)
    except ReplyTooLarge:
        if not is_capped(client):
            raise
        yield from _hash_pages_by_name(client, key, count)


def _hash_pages_by_name(client: redis.Redis, key: str, count: int) -> Iterator[dict[bytes, bytes]]:
    with entry_reads(client):  # the names alone: ids, unless somebody wrote others
        names = cast("list[bytes]", client.hkeys(key))
    for start in range(0, len(names), count):

        def read(chunk: Sequence[bytes]) -> dict[bytes, bytes]:
            values = cast("list[bytes | None]", client.hmget(key, list(chunk)))
            return {n: v for n, v in zip(chunk, values, strict=True) if v is not None}

        for page in fitted_chunks(client, names[start : start + count], read, key):
            if page:
                yield page


def queue_record_reads(
    read: Any, keys: SlotKeys, members: Sequence[bytes], count: int
) -> RecordsParser:
    """Queue on `read` the HMGETs that find each member's record under `count` buckets; returns
    the parser of their answers (an iterator at the first of them) into one whole record or None
    a member. Valid only if the slot still has `count` buckets after the reads (n never shrinks,
    so equal before and after means no bucket split in between)."""
    parse = queue_bucketed_reads(
        read.hmget, keys.key(Part.MSG), lambda b: bucket_key(keys, b), members, count
    )

    def whole(answers: Iterator[list[bytes | None]]) -> list[bytes | None]:
        return [None if record is None else expanded_record(record) for record in parse(answers)]

    return whole


def queue_bucketed_reads(
    queue: Callable[[str, list[bytes]], object],
    flat: str,
    bucket: Callable[[int], str],
    members: Sequence[bytes],
    count: int,
) -> Any:
    """The reads of `queue_record_reads` for any part kept in buckets as well as in one flat
    key (`queue`: HMGET or ZMSCORE of a key and members): one read a bucket the members fall
    in under `count` buckets, then one of `flat`; returns the parser of their answers into one
    value or None a member, a bucket's answer first."""
    groups: dict[int, list[int]] = {}
    if count:
        for index, member in enumerate(members):
            groups.setdefault(bucket_of(member, count), []).append(index)
    for number, indexes in groups.items():
        queue(bucket(number), [members[i] for i in indexes])
    if members:
        queue(flat, list(members))

    def parse(answers: Iterator[list[Any]]) -> list[Any]:
        found: list[Any] = [None] * len(members)
        for indexes in groups.values():
            for index, value in zip(indexes, next(answers), strict=True):
                found[index] = value
        if members:
            for index, value in enumerate(next(answers)):
                if found[index] is None:
                    found[index] = value
        return found

    return parse
