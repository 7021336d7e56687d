"""Split one frozen slot into the two slots it becomes when the slot amount doubles (the Redis
half of a doubling, docs/coordination.md "Doubling the slots").

Slot s of N becomes slots s and s + N of 2N: an id goes to `crc32(basis) & (2N - 1)`, which is
one of the two. The new slots are keys of the next generation (`keys.py`) on the same broker,
so the old slot is only read: it must be frozen (`plans.freeze`), then nothing writes into it
and the split is a snapshot. Idempotent: the two new slots' keys are deleted first, then
written in pipelined batches; a split repeated after a crash replaces a partial one. (Lua has
no crc32, so the partition is computed here, not in a script.)

Each part is split on its own terms, listed in `PART_RULES` so a part added to `keys.Part`
without a rule fails the tests:
- per message (store, prepare with its lease deadlines, dead, records, reasons, outcomes,
  finished, slot bases): by the message's basis. The custom slot basis it was scheduled with,
  recorded in the slot's `basis` part; else its id, or for a recurring occurrence `<schedule
  id>@<due ms>` its schedule's id. A message scheduled with a custom basis before the `basis`
  part existed has no entry: when neither its id nor its schedule lands in s it stays in the
  lower slot s (delivered on time, only a lookup by (basis, id) may miss it);
- per schedule (schedules, topup): by the schedule id, which is always its basis;
- per slot: the journal stays whole in the lower slot (one stream, its entry ids kept); the
  lease counter is copied to both (a lease number never repeats in a slot); a wake is pushed
  to both (each consumer looks at its head again); the epoch is copied to both, still frozen,
  for the caller to thaw (on a topic with sync replicas the thaw waits for them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import redis

from delayq.queue.keys import Part, SlotKeys
from delayq.queue.schedules import OCCURRENCE_SEPARATOR
from delayq.queue.slot_copy import RedisType, present, read_value, write_value
from delayq.queue.topic import slot_of

#: Members or fields per read and per write pipeline: large enough that round trips do not
#: dominate, small enough that no single command blocks the broker's other slots for long.
BATCH = 2000


class Rule(enum.Enum):
    """How a part of the slot is divided between the two new slots."""

    BY_MESSAGE = "by message"
    BY_SCHEDULE = "by schedule"
    LOWER = "kept whole in the lower slot"
    BOTH = "copied to both"
    WAKE = "a wake pushed to both"


PART_RULES: dict[Part, Rule] = {
    Part.STORE: Rule.BY_MESSAGE,
    Part.PREPARE: Rule.BY_MESSAGE,
    Part.DEAD: Rule.BY_MESSAGE,
    Part.MSG: Rule.BY_MESSAGE,
    Part.REASON: Rule.BY_MESSAGE,
    Part.OUTCOME: Rule.BY_MESSAGE,
    Part.FINISHED: Rule.BY_MESSAGE,
    Part.BASIS: Rule.BY_MESSAGE,
    Part.SCHEDULES: Rule.BY_SCHEDULE,
    Part.TOPUP: Rule.BY_SCHEDULE,
    Part.JOURNAL: Rule.LOWER,
    Part.LEASES: Rule.BOTH,
    Part.EPOCH: Rule.BOTH,
    Part.WAKE: Rule.WAKE,
}
ZSET_PARTS = (Part.STORE, Part.PREPARE, Part.DEAD, Part.FINISHED, Part.TOPUP)
HASH_PARTS = (Part.MSG, Part.REASON, Part.OUTCOME, Part.SCHEDULES, Part.BASIS)


class Halves:
    """Which of the two new slots (`lower`, `upper` = lower + N) a member of the old slot goes
    to, under `slot_amount` = 2N; `schedules` are the old slot's schedule ids, `bases` its
    recorded custom slot bases (id -> basis)."""

    def __init__(
        self, lower: int, slot_amount: int, schedules: set[bytes], bases: dict[bytes, bytes]
    ) -> None:
        self.lower = lower
        self.upper = lower + slot_amount // 2
        self.slot_amount = slot_amount
        self.schedules = schedules
        self.bases = bases

    def of_schedule(self, schedule_id: bytes) -> int:
        return slot_of(schedule_id, self.slot_amount)

    def of_message(self, message_id: bytes) -> int:
        """The new slot of a message: by its recorded custom basis when it has one, by its
        schedule when it is an occurrence of one (known in the slot, or whose id lands in it),
        else by its own id when that lands in the old slot, else (a custom basis scheduled
        before bases were recorded) the lower slot."""
        basis = self.bases.get(message_id)
        if basis is not None:
            return slot_of(basis, self.slot_amount)
        schedule_id, separator, due = message_id.rpartition(OCCURRENCE_SEPARATOR.encode())
        occurrence = bool(separator) and due.isdigit()
        if occurrence and schedule_id in self.schedules:
            return self.of_schedule(schedule_id)
        own = slot_of(message_id, self.slot_amount)
        if own in (self.lower, self.upper):
            return own
        if occurrence and self.of_schedule(schedule_id) in (self.lower, self.upper):
            return self.of_schedule(schedule_id)  # its schedule was deleted since
        return self.lower


def split_slot(
    client: redis.Redis,
    source: SlotKeys,
    lower: SlotKeys,
    upper: SlotKeys,
    strays: Sequence[SlotKeys] = (),
) -> int:
    """Replace the keys of `lower` and `upper` (the two halves of `source` under twice its slot
    amount) with `source`'s, divided by `PART_RULES`; returns how many members and fields were
    written. `source` must be frozen; it is not changed. `strays` (frozen too) are keys no
    routing names that a writer at the new slot amount but not reading the routing may have
    stored into before the freeze: their messages and schedules are divided the same way
    (after the source's: the source wins a field both have), their per-slot parts ignored."""
    slot_amount = 2 * (upper.slot - lower.slot)
    client.unlink(*lower.keys(*Part), *upper.keys(*Part))
    sources = [*strays, source]  # the source last: its fields overwrite a stray's
    schedules = {field for field, _ in _hash_fields(client, sources, Part.SCHEDULES)}
    bases = cast("dict[bytes, bytes]", dict(_hash_fields(client, sources, Part.BASIS)))
    halves = Halves(lower.slot, slot_amount, schedules, bases)
    targets = {lower.slot: lower, upper.slot: upper}
    written = 0
    for keys in sources:
        for part in ZSET_PARTS:
            side = _side(halves, part)
            for page in _zset_pages(client, keys.key(part)):
                write = client.pipeline(transaction=False)
                for slot, members in _divide(page, side).items():
                    write.zadd(targets[slot].key(part), dict(members))
                write.execute()
                written += len(page)
        for part in HASH_PARTS:
            side = _side(halves, part)
            for page in _hash_pages(client, keys.key(part), BATCH):
                write = client.pipeline(transaction=False)
                for slot, fields in _divide(page, side).items():
                    write.hset(targets[slot].key(part), mapping=dict(fields))
                write.execute()
                written += len(page)
    _copy_per_slot(client, source, lower, upper)
    return written


def _side(halves: Halves, part: Part) -> Callable[[bytes], int]:
    return halves.of_schedule if PART_RULES[part] is Rule.BY_SCHEDULE else halves.of_message


def _divide(
    page: list[tuple[bytes, bytes | float]], side: Callable[[bytes], int]
) -> dict[int, list[tuple[bytes, bytes | float]]]:
    divided: dict[int, list[tuple[bytes, bytes | float]]] = {}
    for member, value in page:
        divided.setdefault(side(member), []).append((member, value))
    return divided


def _hash_fields(
    client: redis.Redis, sources: Sequence[SlotKeys], part: Part
) -> Iterator[tuple[bytes, bytes | float]]:
    """Every field of a hash part of the sources, in their order (a later one's value wins
    when read into a dict)."""
    for keys in sources:
        for page in _hash_pages(client, keys.key(part), BATCH):
            yield from page


def _zset_pages(client: redis.Redis, key: str) -> Iterator[list[tuple[bytes, bytes | float]]]:
    """A frozen sorted set page by page, by rank (stable: nothing changes it)."""
    start = 0
    while True:
        page = cast(
            "list[tuple[bytes, float]]",
            client.zrange(key, start, start + BATCH - 1, withscores=True),
        )
        if not page:
            return
        yield [(member, score) for member, score in page]
        start += BATCH


def _hash_pages(
    client: redis.Redis, key: str, count: int
) -> Iterator[list[tuple[bytes, bytes | float]]]:
    """A frozen hash page by page (HSCAN: every field once, since nothing changes it)."""
    cursor = 0
    while True:
        cursor, fields = cast(
            "tuple[int, dict[bytes, bytes]]", client.hscan(key, cursor, count=count)
        )
        if fields:
            yield [(field, value) for field, value in fields.items()]
        if cursor == 0:
            return


def _copy_per_slot(client: redis.Redis, source: SlotKeys, lower: SlotKeys, upper: SlotKeys) -> None:
    """The per-slot parts: journal to the lower slot, lease counter and frozen epoch to both,
    a wake to both. The epoch last: a half with its epoch has everything else."""
    read = client.pipeline(transaction=False)
    read_value(read, RedisType.STREAM, source.key(Part.JOURNAL))
    read.get(source.key(Part.LEASES))
    read.get(source.key(Part.EPOCH))
    journal, leases, epoch = read.execute()
    write = client.pipeline(transaction=False)
    if present(RedisType.STREAM, journal):  # entry ids kept, without DUMP/RESTORE (queue.acl)
        write_value(write, RedisType.STREAM, lower.key(Part.JOURNAL), journal)
    for half in (lower, upper):
        if leases is not None:
            write.set(half.key(Part.LEASES), leases)
        write.rpush(half.key(Part.WAKE), "1")
        write.set(half.key(Part.EPOCH), epoch if epoch is not None else b"moving:0")
    write.execute()
