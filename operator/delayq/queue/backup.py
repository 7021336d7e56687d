"""A slot's pending state as backup items, and those items shifted in time (pure but `snapshot`).

A backup holds, per slot, what a restore needs to deliver everything that was pending and to
answer for what had finished: the waiting messages (an in-flight one waits again at the due its
lease was for: its lease is void on another broker), the dead letters with their reasons, the
recurring schedules (their packed value and owed top-up) and the remembered outcomes; each
message with its recorded custom slot basis. Not the epoch, the lease counter, the wake list or
the journal: a restore starts the slot's ownership afresh, and the journal is the archive's.

`snapshot` reads one slot in one MULTI of reads (ZRANGE, HGETALL: commands the topic's
restricted Redis user has; no write, no script), so each slot is taken at one instant: a
message is in exactly one of its states, with its record. The slot's broker runs nothing else
meanwhile: the read blocks it for time proportional to the slot's size (docs/pipeline.md,
"backup"), while the other slots keep delivering.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any, NamedTuple

from delayq.queue.codec import split_record
from delayq.queue.keys import Part, SlotKeys
from delayq.queue.record_buckets import (
    bucket_count,
    bucket_records,
    counted,
    queue_bucket_count,
    record_keys,
)
from delayq.queue.schedules import ENDED, OCCURRENCE_SEPARATOR, PENDING
from delayq.queue.slot_copy import PART_TYPES, RedisType, read_value
from delayq.queue.store_buckets import queue_store_bucket_count, store_bucket_count, store_keys

#: A frozen epoch's prefix (freeze-1.lua): the slot is moving, or moved away.
FROZEN = b"moving:"


class Kind(enum.StrEnum):
    """What a backup item restores as."""

    WAITING = "waiting"  # scheduled, or in flight at the snapshot
    DEAD = "dead"
    OUTCOME = "outcome"  # a finished id the topic remembers (outcomeRetention)
    SCHEDULE = "schedule"  # a recurring schedule


class Item(NamedTuple):
    """One row of a backup. `ms`: the due (waiting), time of death (dead), finished ms
    (outcome) or the top-up owed since (schedule, None when none is owed). `value`: the record,
    the outcome or the packed schedule. `basis`: the custom slot basis recorded for a message
    ('' for none), restored with it; `route`: what the item routes by in any slot amount (that
    basis, the schedule id of an occurrence or of a schedule, else the id); `taken_ms`: the
    broker's clock when its slot was read (a journal replay starts after it)."""

    kind: str
    id: str
    ms: int | None
    value: bytes
    reason: str | None
    basis: str
    route: str
    taken_ms: int = 0


class SlotMovedError(Exception):
    """The slot's broker holds only its frozen epoch: it moved away during the backup."""


SNAPSHOT_PARTS = (
    Part.STORE,
    Part.PREPARE,
    Part.DEAD,
    Part.FINISHED,
    Part.TOPUP,
    Part.MSG,
    Part.REASON,
    Part.OUTCOME,
    Part.SCHEDULES,
    Part.BASIS,
    Part.EPOCH,
)


def snapshot(client: Any, keys: SlotKeys) -> list[Item]:
    """The slot's items, read at one instant (one MULTI of reads on its broker). The buckets
    of the records and of the waiting messages are read under the bucket counts read before;
    the MULTI reads the counts again, and a slot whose buckets split in between is read anew
    (`record_buckets.py`, `store_buckets.py`)."""
    counts = (bucket_count(client, keys), store_bucket_count(client, keys))
    while True:
        read = client.pipeline(transaction=True)
        for part in SNAPSHOT_PARTS:
            read_value(read, PART_TYPES[part], keys.key(part))
        for name in record_keys(keys, counts[0])[1:]:
            read_value(read, RedisType.HASH, name)
        for name in store_keys(keys, counts[1])[1:]:
            read_value(read, RedisType.ZSET, name)
        queue_bucket_count(read, keys)
        queue_store_bucket_count(read, keys)
        read.time()
        *replies, records_after, store_after, (seconds, micros) = read.execute()
        after = (counted(records_after), counted(store_after))
        if after == counts:
            break
        counts = after
    contents = dict(zip(SNAPSHOT_PARTS, replies, strict=False))
    buckets = replies[len(SNAPSHOT_PARTS) :]
    for bucket in buckets[: counts[0]]:  # a bucketed record wins over `msg`'s copy
        contents[Part.MSG].update(bucket_records(bucket))
    for entries in buckets[counts[0] :]:  # an id waits in one place at most
        contents[Part.STORE].extend(entries)
    taken_ms = int(seconds) * 1000 + int(micros) // 1000
    items = [item._replace(taken_ms=taken_ms) for item in items_of(contents)]
    epoch = contents[Part.EPOCH]
    if epoch is not None and epoch.startswith(FROZEN) and not items:
        raise SlotMovedError(f"slot {keys.slot} moved during the backup")
    return items


def items_of(contents: dict[Part, Any]) -> Iterator[Item]:
    """The items of one slot's parts as `snapshot` read them (ZSETs as (member, score) lists,
    hashes as dicts, bytes throughout)."""
    records, bases = contents[Part.MSG], contents[Part.BASIS]
    schedules = contents[Part.SCHEDULES]

    def message(kind: Kind, member: bytes, ms: int, record: bytes, reason: str | None) -> Item:
        text, basis = member.decode(), bases.get(member, b"").decode()
        return Item(kind, text, ms, record, reason, basis, basis or _route(text, schedules))

    for member, due in contents[Part.STORE]:
        if (record := records.get(member)) is not None:
            yield message(Kind.WAITING, member, int(due), without_lease(record), None)
    for member, deadline in contents[Part.PREPARE]:
        if (record := records.get(member)) is not None:  # waits again at the due it was for
            leased_due = split_record(record)[1]
            due = int(leased_due) if leased_due else int(deadline)
            yield message(Kind.WAITING, member, due, without_lease(record), None)
    reasons = contents[Part.REASON]
    for member, died in contents[Part.DEAD]:
        if (record := records.get(member)) is not None:
            reason = reasons.get(member, b"").decode()
            yield message(Kind.DEAD, member, int(died), without_lease(record), reason)
    outcomes = contents[Part.OUTCOME]
    for member, finished in contents[Part.FINISHED]:
        if (outcome := outcomes.get(member)) is not None:
            yield message(Kind.OUTCOME, member, int(finished), outcome, None)
    topups = {member: int(score) for member, score in contents[Part.TOPUP]}
    for member, value in schedules.items():
        text = member.decode()
        yield Item(Kind.SCHEDULE, text, topups.get(member), value, None, "", text)


def _route(message_id: str, schedules: dict[bytes, bytes]) -> str:
    """An occurrence `<schedule id>@<due ms>` of a schedule in the slot routes by the schedule
    id (as `slot_split.Halves.of_message` places it), any other message by its id."""
    schedule_id, separator, due = message_id.rpartition(OCCURRENCE_SEPARATOR)
    if separator and due.isdigit() and schedule_id.encode() in schedules:
        return schedule_id
    return message_id


def without_lease(record: bytes) -> bytes:
    """The record with no lease: neither the due its lease was for nor the lease number (the
    layout of lua/includes/record_fields.lua), attempts and everything after kept."""
    attempts, _, _, rest = split_record(record)
    return attempts + b":::" + rest


_INSTANT_TAGS = (ord("x"), ord("f"))  # the record's tagged instants: expiry, first attempt


def _shift_record(record: bytes, shift_ms: int) -> bytes:
    """A lease-free record with its tagged instants (expiry, first attempt) moved by shift_ms."""
    head, rest = record[: record.index(b":::") + 3], record[record.index(b":::") + 3 :]
    tags = []
    while rest and rest[0] in _INSTANT_TAGS:
        field, rest = rest.split(b":", 1)
        instant = int(float(field[1:]))
        tags.append(field[:1] + str(instant + shift_ms).encode() + b":")
    return head + b"".join(tags) + rest


def shifted(item: Item, shift_ms: int) -> Item:
    """The item with every instant it carries moved by `shift_ms`: its ms, a record's expiry
    and first attempt, an outcome's finished ms, a schedule's current and next occurrences, and
    the due an occurrence's id names (`<schedule id>@<due ms>`), so the claim of the shifted
    occurrence materialises the shifted series. Recurrence rules stay as they are: a cron or
    every-N schedule keeps its grid from the occurrence after the shifted next one, so shift a
    recurring schedule by whole periods (days for a daily cron) to see its firings move
    exactly."""
    if shift_ms == 0:
        return item
    ms = None if item.ms is None else item.ms + shift_ms
    if item.kind == Kind.SCHEDULE:
        current, next_due, rest = item.value.split(b":", 2)
        if next_due not in (PENDING.encode(), ENDED.encode()):
            next_due = str(int(next_due) + shift_ms).encode()
        value = str(int(current) + shift_ms).encode() + b":" + next_due + b":" + rest
        return item._replace(ms=ms, value=value)
    if item.kind == Kind.OUTCOME:
        state, finished, attempts = item.value.split(b":", 2)
        value = state + b":" + str(int(finished) + shift_ms).encode() + b":" + attempts
        return item._replace(ms=ms, value=value)
    message_id = item.id
    schedule_id, separator, due = message_id.rpartition(OCCURRENCE_SEPARATOR)
    if separator and schedule_id == item.route and due.isdigit():
        message_id = f"{schedule_id}{OCCURRENCE_SEPARATOR}{int(due) + shift_ms}"
    return item._replace(id=message_id, ms=ms, value=_shift_record(item.value, shift_ms))
