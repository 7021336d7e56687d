"""Where a slot keeps its waiting messages, for the code that reads them outside the scripts
(pure rules plus reads; docs/contracts.md §1, "Store in buckets").

The scripts reach a slot's waiting messages through `lua/includes/store_buckets.lua`: in the
slot's `store` sorted set, or, once its `storebuckets` hash exists, in the buckets
`<store key>:<b>` (b in 0 .. n - 1, n growing one at a time by the linear hashing of
`record_buckets.bucket_of`) and then in `store` for what was written before or was due soon
when written (the topic's storeBucketsAfter), with the `heads` index (bucket -> its earliest
due) beside them. A slot move's copy, a doubling's division and a
backup read them here, by the same rule.

A reader of a live slot (a doubling copies a slot before freezing it) must not miss an entry
that a script moves meanwhile. An entry only moves when its bucket splits, and then to a higher
bucket: so `store_pages` scans the buckets in order and asks for the bucket count again after
each, and a reader of given members repeats its reads until the count it read them under is
still the count after them (it never shrinks): `queue_store_reads`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import redis

from delayq.queue.keys import Part, SlotKeys
from delayq.queue.record_buckets import bucketed_pages, counted, queue_bucketed_reads
from delayq.queue.reply_cap import scan_pages

#: The settings record's field (queue/topic_record.py) that sends a slot's waiting messages
#: into buckets: `True` while the topic has them on, kept as `False` once given (publish-1),
#: as RECORD_BUCKETS_FIELD is.
STORE_BUCKETS_FIELD = "redis_store_buckets"
#: A ZSCAN's COUNT hint: entries per page.
PAGE = 2000


def store_bucket_key(keys: SlotKeys, bucket: int) -> str:
    return f"{keys.key(Part.STORE)}:{bucket}"


def store_bucket_count(client: redis.Redis, keys: SlotKeys) -> int:
    """How many buckets the slot's store has: 0 while it keeps its entries in `store` alone."""
    return counted(client.hgetall(keys.key(Part.STORE_BUCKETS)))


def queue_store_bucket_count(pipe: Any, keys: SlotKeys) -> None:
    """Queue the read of the slot's store bucket count (`record_buckets.counted` reads it)."""
    pipe.hgetall(keys.key(Part.STORE_BUCKETS))


def store_keys(keys: SlotKeys, count: int) -> list[str]:
    """Every key that may hold a waiting message of the slot with `count` buckets: `store`
    first."""
    return [keys.key(Part.STORE), *(store_bucket_key(keys, b) for b in range(count))]


def store_pages(client: redis.Redis, keys: SlotKeys) -> Iterator[list[tuple[bytes, float]]]:
    """The slot's waiting messages (id, due) page by page (ZSCAN of `store`, then of each
    bucket in order): each entry present throughout is seen at least once while scripts write
    the slot."""
    return bucketed_pages(
        lambda key: zset_pages(client, key),
        keys.key(Part.STORE),
        lambda number: store_bucket_key(keys, number),
        lambda: store_bucket_count(client, keys),
    )


def zset_pages(client: redis.Redis, key: str) -> Iterator[list[tuple[bytes, float]]]:
    """A sorted set page by page (ZSCAN: every member present throughout is seen, at least
    once, even while scripts change the set; each page fitted to a capped client's cap:
    `reply_cap.scan_pages`)."""

    def scan(cursor: int, entries: int) -> tuple[int, list[tuple[bytes, float]]]:
        return cast(
            "tuple[int, list[tuple[bytes, float]]]", client.zscan(key, cursor, count=entries)
        )

    return scan_pages(client, scan, PAGE, key)


def queue_store_reads(read: Any, keys: SlotKeys, members: Sequence[bytes], count: int) -> Any:
    """Queue on `read` the ZMSCOREs that find each member's due under `count` buckets; returns
    the parser of their answers (an iterator at the first of them) into one due or None a
    member. Valid only if the slot still has `count` buckets after the reads."""
    return queue_bucketed_reads(
        read.zmscore, keys.key(Part.STORE), lambda b: store_bucket_key(keys, b), members, count
    )
