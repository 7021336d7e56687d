"""Split one slot into the two slots it becomes when the slot amount doubles (the Redis half of
a doubling, docs/coordination.md "Doubling the slots").

Slot s of N becomes slots s and s + N of 2N: an id goes to `crc32(basis) & (2N - 1)`, which is
one of the two. The new slots are keys of the next generation (`keys.py`) on the same broker,
so the old slot is only read. It is copied while it still takes writes and delivers: `track`
first turns on the slot's `changes` set, into which every script notes each message and
schedule it changes (`lua/includes/track_changes.lua`); then `split_slot` copies the slot as
SCAN sees it (every member present throughout is seen: one changed meanwhile is in `changes`);
then, as often as the caller likes, `take_changes` + `recopy` copy again what changed since
(each member read again and written to its half, or deleted from both), and once the slot is
frozen (`consume_plans.freeze`) a last `catch_up` makes the halves exact: for every frozen slot
of a broker at once, in a few round trips whatever their number (the time they stay frozen is
what writers wait for). Each is idempotent: `split_slot` deletes the two new slots' keys first, and
taken changes stay in `recopy` until they are copied again, so a run repeated after a crash
copies them again. (Lua has no crc32, so the partition is computed here, not in a script.)

Each part is split on its own terms, listed in `PART_RULES` so a part added to `keys.Part`
without a rule fails the tests:
- per message (store, prepare with its lease deadlines, dead, records, reasons, outcomes,
  finished, slot bases): by the message's basis. The custom slot basis it was scheduled with,
  recorded in the slot's `basis` part; else its id, or for a recurring occurrence `<schedule
  id>@<due ms>` its schedule's id. A message scheduled with a custom basis before the `basis`
  part existed has no entry: when neither its id nor its schedule lands in s it stays in the
  lower slot s (delivered on time, only a lookup by (basis, id) may miss it);
- per schedule (schedules, topup): by the schedule id, which is always its basis;
- per slot, copied under the freeze only (`copy_per_slot`): the journal stays whole in the lower
  slot (one stream, its entry ids kept); the lease counter is copied to both (a lease number
  never repeats in a slot); a wake is pushed to both (each consumer looks at its head again);
  the epoch is copied to both, frozen, for the caller to thaw (on a topic with sync replicas the
  thaw waits for them). The halves' epochs are frozen from their first copy on: nobody writes
  into them before the doubling's switch;
- the tracking itself (changes, recopy): not copied.
- where the records and the waiting messages are kept (buckets, storebuckets, heads): not
  copied. Both are divided with the other per-message parts, read from `msg` or `store` and
  the buckets alike (`record_buckets.py`, `store_buckets.py`), and the halves keep theirs in
  `msg` and `store`, which the scripts read as well.
- the fair groups' indexes (groupwait, groups, groupleases): not copied. A claim of a half takes
  a grouped message without its entry in due order, as one without a group (store is the
  truth: nothing waits for an entry), and a message enters them again whenever it waits again
  (nack, expiry, give-back, reschedule); the leases in flight during the doubling are not
  counted against maxInFlightPerGroup.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from delayq.queue.keys import Part, SlotKeys
from delayq.queue.record_buckets import (
    counted,
    hash_pages,
    queue_bucket_count,
    queue_record_reads,
    record_pages,
)
from delayq.queue.reply_cap import (
    ReplyTooLarge,
    capped,
    fitted,
    fitted_chunks,
    holding_entries,
    scan_pages,
)
from delayq.queue.schedules import OCCURRENCE_SEPARATOR
from delayq.queue.slot_copy import RedisType, delete_slot, present, write_value
from delayq.queue.store_buckets import (
    queue_store_bucket_count,
    queue_store_reads,
    store_pages,
    zset_pages,
)
from delayq.queue.topic import slot_of

#: Members or fields per read and per write pipeline: large enough that round trips do not
#: dominate, small enough that no single command blocks the broker's other slots for long.
BATCH = 2000
#: An epoch's prefix while its slot is frozen (freeze-1.lua).
FROZEN = b"moving:"


class Rule(enum.Enum):
    """How a part of the slot is divided between the two new slots."""

    BY_MESSAGE = "by message"
    BY_SCHEDULE = "by schedule"
    LOWER = "kept whole in the lower slot"
    BOTH = "copied to both"
    WAKE = "a wake pushed to both"
    TRACKING = "the doubling's own bookkeeping, not copied"
    LAYOUT = "where messages are kept, not copied: the halves keep theirs in msg and store"
    GROUPS = "the fair groups' indexes, not copied: rebuilt as messages wait again"


PART_RULES: dict[Part, Rule] = {
    Part.STORE: Rule.BY_MESSAGE,
    Part.PREPARE: Rule.BY_MESSAGE,
    Part.DEAD: Rule.BY_MESSAGE,
    Part.MSG: Rule.BY_MESSAGE,
    Part.BUCKETS: Rule.LAYOUT,
    Part.STORE_BUCKETS: Rule.LAYOUT,
    Part.HEADS: Rule.LAYOUT,
    Part.REASON: Rule.BY_MESSAGE,
    Part.OUTCOME: Rule.BY_MESSAGE,
    Part.FINISHED: Rule.BY_MESSAGE,
    Part.BASIS: Rule.BY_MESSAGE,
    Part.PRIORITY: Rule.BY_MESSAGE,
    Part.SCHEDULES: Rule.BY_SCHEDULE,
    Part.TOPUP: Rule.BY_SCHEDULE,
    Part.JOURNAL: Rule.LOWER,
    Part.LEASES: Rule.BOTH,
    Part.EPOCH: Rule.BOTH,
    Part.WAKE: Rule.WAKE,
    Part.CHANGES: Rule.TRACKING,
    Part.RECOPY: Rule.TRACKING,
    Part.GROUP_WAIT: Rule.GROUPS,
    Part.GROUPS: Rule.GROUPS,
    Part.GROUP_LEASES: Rule.GROUPS,
}
ZSET_PARTS = (Part.STORE, Part.PREPARE, Part.DEAD, Part.FINISHED, Part.TOPUP, Part.PRIORITY)
HASH_PARTS = (Part.MSG, Part.REASON, Part.OUTCOME, Part.SCHEDULES, Part.BASIS)
#: How a script names what it changed in `changes` (track_changes.lua): a message, a schedule.
CHANGED_MESSAGE, CHANGED_SCHEDULE = b"m", b"s"


@dataclass(frozen=True)
class Division:
    """An old slot (`source`), the two slots it becomes under twice its slot amount (`lower`,
    `upper` = lower + N) and the stray keys divided with it (`split_slot`)."""

    source: SlotKeys
    lower: SlotKeys
    upper: SlotKeys
    strays: tuple[SlotKeys, ...] = ()


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


def split_slot(client: redis.Redis, division: Division) -> int:
    """Replace the keys of the division's `lower` and `upper` with its `source`'s messages and
    schedules, divided by `PART_RULES`, and copy its per-slot parts (`copy_per_slot`); returns
    how many members and fields were written. `source` is not changed; it is frozen, or
    `track`ed since before this call (then what changed meanwhile is copied again by `recopy`).
    `strays` (frozen) are keys no routing names that a writer at the new slot amount but not
    reading the routing may have stored into: their messages and schedules are divided the
    same way (before the source's: the source wins a field both have), their per-slot parts
    ignored."""
    with holding_entries():
        return _split_slot(capped(client), division)


def _split_slot(client: redis.Redis, division: Division) -> int:
    source, lower, upper = division.source, division.lower, division.upper
    delete_slot(client, lower)
    delete_slot(client, upper)
    sources = [*division.strays, source]  # the source last: its fields overwrite a stray's
    amount = _slot_amount(lower, upper)
    targets = {lower.slot: lower, upper.slot: upper}
    written = 0
    for keys in sources:
        for part in ZSET_PARTS:
            zpages = (
                store_pages(client, keys)
                if part is Part.STORE
                else zset_pages(client, keys.key(part))
            )
            for page in zpages:
                side = _side(_page_halves(client, sources, lower.slot, amount, part, page), part)
                write = client.pipeline(transaction=False)
                for slot, members in _divide(page, side).items():
                    write.zadd(targets[slot].key(part), dict(members))
                write.execute()
                written += len(page)
        for part in HASH_PARTS:
            pages: Iterator[Sequence[tuple[bytes, bytes | float]]] = (
                record_pages(client, keys)
                if part is Part.MSG
                else _hash_pages(client, keys.key(part), BATCH)
            )
            for hashed in pages:
                halves = _page_halves(client, sources, lower.slot, amount, part, hashed)
                side = _side(halves, part)
                write = client.pipeline(transaction=False)
                for slot, fields in _divide(hashed, side).items():
                    write.hset(targets[slot].key(part), mapping=dict(fields))
                write.execute()
                written += len(hashed)
    copy_per_slot(client, [division])
    return written


def track(client: redis.Redis, source: SlotKeys) -> None:
    """Turn on the slot's `changes` set (its '' member): from now on every script notes in it
    what it changes in the slot. Idempotent."""
    client.sadd(source.key(Part.CHANGES), b"")


def take_changes(client: redis.Redis, source: SlotKeys) -> int:
    """Move what changed in the slot since the last take into its `recopy` set (added to what a
    crashed run left there), tracking on; returns how many changes `recopy` holds (with '').
    One MULTI: no change is noted between the two sets."""
    changes, taken = source.key(Part.CHANGES), source.key(Part.RECOPY)
    move = client.pipeline(transaction=True)
    move.sunionstore(taken, [taken, changes])
    move.delete(changes)
    move.sadd(changes, b"")
    return int(move.execute()[0])


def untrack(client: redis.Redis, source: SlotKeys) -> None:
    """Turn tracking off and forget its changes (a doubling rolled back)."""
    client.unlink(source.key(Part.CHANGES), source.key(Part.RECOPY))


def recopy(client: redis.Redis, division: Division) -> int:
    """Copy each message and schedule in the source's `recopy` set again, as `split_slot` would
    now, then drop the set; returns how many. See `_recopy_pages`."""
    with holding_entries():
        return _recopy(capped(client), division)


def _recopy(client: redis.Redis, division: Division) -> int:
    count = 0
    for page in _set_pages(client, division.source.key(Part.RECOPY)):
        count += _recopy_pages(client, [(division, page)])
    client.unlink(division.source.key(Part.RECOPY))
    return count


def catch_up(client: redis.Redis, divisions: Sequence[Division]) -> int:
    """Make the halves of every division exact, its source frozen (`consume_plans.freeze`,
    before this call): its last changes taken and copied again, its per-slot parts copied;
    returns how many changes. A few pipelines for all the divisions, whatever their number,
    plus one per BATCH changes: the sources are frozen (nothing notes a change any more), so
    taking the changes needs no MULTI, and the time the slots stay frozen grows with the
    changes, hardly with the slots. Idempotent: run again after a crash, it copies again what
    it did not drop."""
    with holding_entries():
        return _catch_up(capped(client), divisions)


def _catch_up(client: redis.Redis, divisions: Sequence[Division]) -> int:
    take = client.pipeline(transaction=False)
    for division in divisions:
        changes, taken = division.source.key(Part.CHANGES), division.source.key(Part.RECOPY)
        take.sunionstore(taken, [taken, changes])
        take.delete(changes)
        take.sadd(changes, b"")
    take.execute()
    read = client.pipeline(transaction=False)
    for division in divisions:
        read.sscan(division.source.key(Part.RECOPY), 0, count=BATCH)
    try:
        firsts = read.execute()
    except ReplyTooLarge:  # together past the cap: each set page by page
        firsts = [(1, []) for _ in divisions]
    count = 0
    larger: list[Division] = []  # not seen whole in one page: page by page, below
    group: list[tuple[Division, list[bytes]]] = []  # several small sets per pipeline
    for division, (cursor, members) in zip(divisions, firsts, strict=True):
        if cursor != 0:
            larger.append(division)
            continue
        group.append((division, [member for member in members if member]))
        if sum(len(page) for _, page in group) >= BATCH:
            count += _recopy_pages(client, group)
            group = []
    count += _recopy_pages(client, group)
    for division in larger:
        for page in _set_pages(client, division.source.key(Part.RECOPY)):
            count += _recopy_pages(client, [(division, page)])
    copy_per_slot(client, divisions)
    client.unlink(*(division.source.key(Part.RECOPY) for division in divisions))
    return count


def _recopy_pages(client: redis.Redis, pages: Sequence[tuple[Division, list[bytes]]]) -> int:
    """`_recopy_changes` of the pages' changes, as many at a time as a capped client's cap
    lets read at once (`reply_cap.fitted_chunks`: their records are read whole, and a record
    is as large as its payload): its reads come before any write, so a read past the cap is
    made again for fewer changes."""
    changes = [(division, member) for division, page in pages for member in page]

    def recopy(chunk: Sequence[tuple[Division, bytes]]) -> int:
        return _recopy_changes(client, _paged(chunk))

    return sum(fitted_chunks(client, changes, recopy, "the changes' records"))


def _paged(changes: Sequence[tuple[Division, bytes]]) -> list[tuple[Division, list[bytes]]]:
    """Changes back into (division, its changes) in their order."""
    pages: list[tuple[Division, list[bytes]]] = []
    for division, member in changes:
        if not pages or pages[-1][0] is not division:
            pages.append((division, []))
        pages[-1][1].append(member)
    return pages


def _recopy_changes(client: redis.Redis, pages: Sequence[tuple[Division, list[bytes]]]) -> int:
    """For each (division, changes): every part of each changed message and schedule read from
    the source (else from a stray), written to its half and deleted from the other, or deleted
    from both when the slot no longer has it; returns how many. Its half is decided as
    `split_slot` does, on the schedules and bases as they are now. Three pipelines of variadic
    commands for all the pages: which strays hold anything (and the sources' bucket counts),
    the reads, the writes. The reads are made again while a source's buckets split under them
    (`record_buckets.py`, `store_buckets.py`): a record or due read from the bucket it left
    would look deleted."""
    if not pages:
        return 0
    look = client.pipeline(transaction=False)
    for division, _ in pages:
        for stray in division.strays:
            look.exists(*stray.keys(*ZSET_PARTS, *HASH_PARTS, Part.BUCKETS, Part.STORE_BUCKETS))
        for keys in (*division.strays, division.source):
            _queue_bucket_counts(look, keys)
    looked = iter(look.execute())
    chosen: list[list[SlotKeys]] = []
    counts: dict[SlotKeys, BucketCounts] = {}
    for division, _ in pages:
        holding = [next(looked) for _ in division.strays]
        counts.update(
            (keys, _bucket_counts(looked)) for keys in (*division.strays, division.source)
        )
        strays = [stray for stray, held in zip(division.strays, holding, strict=True) if held]
        chosen.append([*strays, division.source])
    named = [keys for sources in chosen for keys in sources]
    while True:
        read = client.pipeline(transaction=False)
        queued, count = _queue_recopy_reads(read, pages, chosen, counts)
        for keys in named:
            _queue_bucket_counts(read, keys)
        replies = read.execute()
        tail = iter(replies[-2 * len(named) :])
        after = {keys: _bucket_counts(tail) for keys in named}
        if all(counts[keys] == n for keys, n in after.items()):
            break
        counts.update(after)
    answers = iter(replies[: -2 * len(named)])
    write = client.pipeline(transaction=False)
    for division, sources, wanted, parsers in queued:
        found = _parse_reads(answers, iter(parsers), sources, wanted)
        existing = found.pop()
        wanted.pop()
        parts = [part for part, _ in wanted]
        bases = {m: v for m, v in found[parts.index(Part.BASIS)].items() if v is not None}
        halves = Halves(
            division.lower.slot,
            _slot_amount(division.lower, division.upper),
            {sid for sid, value in existing.items() if value is not None},
            cast("dict[bytes, bytes]", bases),
        )
        for part, values in zip(parts, found, strict=True):
            _put(write, part, division.lower, division.upper, _side(halves, part), values)
    write.execute()
    return count


Reader = Callable[[Iterator[Any]], Any]
#: A source's bucket counts: its records' and its store's (`record_buckets`, `store_buckets`).
BucketCounts = tuple[int, int]


def _queue_bucket_counts(pipe: Any, keys: SlotKeys) -> None:
    queue_bucket_count(pipe, keys)
    queue_store_bucket_count(pipe, keys)


def _bucket_counts(answers: Iterator[Any]) -> BucketCounts:
    """What `_queue_bucket_counts` queued, read from `answers`."""
    return counted(next(answers)), counted(next(answers))
Queued = tuple["Division", list[SlotKeys], list[tuple[Part, list[bytes]]], list[Reader]]


def _queue_recopy_reads(
    read: redis.client.Pipeline,
    pages: Sequence[tuple[Division, list[bytes]]],
    chosen: Sequence[list[SlotKeys]],
    counts: Mapping[SlotKeys, BucketCounts],
) -> tuple[list[Queued], int]:
    """Queue the reads of every changed message and schedule of the pages (`_recopy_pages`);
    returns what was queued for each division and how many changes."""
    separator = OCCURRENCE_SEPARATOR.encode()
    queued: list[Queued] = []
    count = 0
    for (division, page), sources in zip(pages, chosen, strict=True):
        messages = [m[1:] for m in page if m[:1] == CHANGED_MESSAGE]
        schedules = [m[1:] for m in page if m[:1] == CHANGED_SCHEDULE]
        named = sorted({m.rpartition(separator)[0] for m in messages if separator in m})
        wanted = [
            (part, messages if PART_RULES[part] is Rule.BY_MESSAGE else schedules)
            for part in (*ZSET_PARTS, *HASH_PARTS)
        ]
        wanted.append((Part.SCHEDULES, named))
        parsers = _queue_reads(read, sources, wanted, counts)
        queued.append((division, sources, wanted, parsers))
        count += len(messages) + len(schedules)
    return queued, count


def _slot_amount(lower: SlotKeys, upper: SlotKeys) -> int:
    return 2 * (upper.slot - lower.slot)


def _queue_reads(
    read: redis.client.Pipeline,
    sources: Sequence[SlotKeys],
    wanted: Sequence[tuple[Part, Sequence[bytes]]],
    counts: Mapping[SlotKeys, BucketCounts],
) -> list[Reader]:
    """Queue a ZMSCORE or HMGET per (part, members) and source, the records' and the store's
    reads under the source's bucket counts (`record_buckets.queue_record_reads`,
    `store_buckets.queue_store_reads`); returns, in that order, what takes each one's values
    from the answers (`_parse_reads`)."""
    readers: list[Reader] = []
    for part, members in wanted:
        for keys in sources:
            if not members:
                continue
            if part is Part.MSG:
                readers.append(queue_record_reads(read, keys, members, counts[keys][0]))
                continue
            if part is Part.STORE:
                readers.append(queue_store_reads(read, keys, members, counts[keys][1]))
                continue
            if part in ZSET_PARTS:
                read.zmscore(keys.key(part), cast("list[str]", list(members)))
            else:
                read.hmget(keys.key(part), list(members))
            readers.append(next)
    return readers


def _parse_reads(
    answers: Iterator[Any],
    readers: Iterator[Reader],
    sources: Sequence[SlotKeys],
    wanted: Sequence[tuple[Part, Sequence[bytes]]],
) -> list[dict[bytes, bytes | float | None]]:
    """For each (part, members) queued by `_queue_reads`: member -> its value in that part of
    the last source that has it, None where none has."""
    found = []
    for _part, members in wanted:
        values: dict[bytes, bytes | float | None] = dict.fromkeys(members)
        for _ in sources if members else ():
            for member, value in zip(members, next(readers)(answers), strict=True):
                if value is not None:
                    values[member] = value
        found.append(values)
    return found


def _put(
    write: redis.client.Pipeline,
    part: Part,
    lower: SlotKeys,
    upper: SlotKeys,
    side: Callable[[bytes], int],
    values: dict[bytes, bytes | float | None],
) -> None:
    """Queue each member's value into its half's `part` and its deletion from the other half
    (from both when its value is None)."""
    kept: dict[int, dict[bytes, Any]] = {lower.slot: {}, upper.slot: {}}
    dropped: dict[int, list[bytes]] = {lower.slot: [], upper.slot: []}
    for member, value in values.items():
        half = side(member)
        other = upper.slot if half == lower.slot else lower.slot
        dropped[other].append(member)
        if value is None:
            dropped[half].append(member)
        else:
            kept[half][member] = value
    for keys in (lower, upper):
        key = keys.key(part)
        if dropped[keys.slot]:
            if part in ZSET_PARTS:
                write.zrem(key, *dropped[keys.slot])
            else:
                write.hdel(key, *dropped[keys.slot])
        if kept[keys.slot]:
            if part in ZSET_PARTS:
                write.zadd(key, kept[keys.slot])
            else:
                write.hset(key, mapping=cast("Mapping[Any, Any]", kept[keys.slot]))


def _set_pages(client: redis.Redis, key: str) -> Iterator[list[bytes]]:
    """A set page by page (SSCAN), without the '' that marks tracking on."""

    def scan(cursor: int, entries: int) -> tuple[int, list[bytes]]:
        return cast("tuple[int, list[bytes]]", client.sscan(key, cursor, count=entries))

    for members in scan_pages(client, scan, BATCH, key):
        page = [member for member in members if member]
        if page:
            yield page


def _side(halves: Halves, part: Part) -> Callable[[bytes], int]:
    return halves.of_schedule if PART_RULES[part] is Rule.BY_SCHEDULE else halves.of_message


def _divide(
    page: Sequence[tuple[bytes, bytes | float]], side: Callable[[bytes], int]
) -> dict[int, list[tuple[bytes, bytes | float]]]:
    divided: dict[int, list[tuple[bytes, bytes | float]]] = {}
    for member, value in page:
        divided.setdefault(side(member), []).append((member, value))
    return divided


def _page_halves(
    client: redis.Redis,
    sources: Sequence[SlotKeys],
    lower: int,
    amount: int,
    part: Part,
    page: Sequence[tuple[bytes, Any]],
) -> Halves:
    """The Halves that place a page of `part`: for a part divided by message, with the slot
    bases the page's messages have recorded and the schedules its occurrences name, as the
    sources hold them now (the source last: its bases overwrite a stray's). Read page by page,
    not for the whole slot first: a slot may hold millions of messages with a custom basis,
    and the doubling runs in the operator."""
    halves = Halves(lower, amount, set(), {})
    if PART_RULES[part] is Rule.BY_MESSAGE:
        members = [member for member, _ in page]

        def look_up(chunk: Sequence[bytes]) -> tuple[dict[bytes, bytes], set[bytes]]:
            return _recorded(client, sources, chunk)

        for bases, schedules in fitted_chunks(client, members, look_up, "the slot bases"):
            halves.bases.update(bases)
            halves.schedules |= schedules
    return halves


def _recorded(
    client: redis.Redis, sources: Sequence[SlotKeys], members: Sequence[bytes]
) -> tuple[dict[bytes, bytes], set[bytes]]:
    """The slot bases recorded for `members` in the sources, and which of the schedules their
    ids name as occurrences (`<schedule id>@<due>`) the sources hold (HEXISTS: a schedule's
    value carries a payload the placing does not need)."""
    separator = OCCURRENCE_SEPARATOR.encode()
    named = sorted({m.rpartition(separator)[0] for m in members if separator in m})
    read = client.pipeline(transaction=False)
    for keys in sources:
        read.hmget(keys.key(Part.BASIS), list(members))
        for schedule_id in named:
            read.hexists(keys.key(Part.SCHEDULES), schedule_id)
    answers = iter(read.execute())
    bases: dict[bytes, bytes] = {}
    schedules: set[bytes] = set()
    for _ in sources:
        for member, basis in zip(members, next(answers), strict=True):
            if basis is not None:
                bases[member] = basis
        schedules.update(schedule_id for schedule_id in named if next(answers))
    return bases, schedules


def _hash_pages(
    client: redis.Redis, key: str, count: int
) -> Iterator[list[tuple[bytes, bytes | float]]]:
    """A hash page by page (HSCAN: every field present throughout is seen, as ZSCAN)."""
    return (list(fields.items()) for fields in hash_pages(client, key, count))


def copy_per_slot(client: redis.Redis, divisions: Sequence[Division]) -> None:
    """The per-slot parts of each division: journal to the lower slot, lease counter and epoch
    to both (frozen, whether the source is yet or not), a wake to both; exact once the source is
    frozen. The epoch last: a half with its epoch has everything else. One read and one write
    pipeline for all the divisions, and a round trip more a page of a journal longer than one
    (BATCH entries, fitted to a capped client's cap)."""
    read = client.pipeline(transaction=False)
    for division in divisions:
        source = division.source
        read.get(source.key(Part.LEASES))
        read.get(source.key(Part.EPOCH))
        read.xrange(source.key(Part.JOURNAL), count=BATCH)
    try:
        replies = read.execute()
        states = [replies[at : at + 2] for at in range(0, len(replies), 3)]
        firsts = [(page, BATCH) for page in replies[2::3]]
    except ReplyTooLarge:  # the journals' first pages together: each on its own
        read = client.pipeline(transaction=False)
        for division in divisions:
            read.get(division.source.key(Part.LEASES))
            read.get(division.source.key(Part.EPOCH))
        replies = read.execute()
        states = [replies[at : at + 2] for at in range(0, len(replies), 2)]
        firsts = [_journal_page(client, division.source, "-", BATCH) for division in divisions]
    write = client.pipeline(transaction=False)
    for division, (page, count) in zip(divisions, firsts, strict=True):
        # entry ids kept, without DUMP/RESTORE (queue.acl); the catch-up copies it again, so
        # the lower half's copy is replaced whole, never appended to
        journal = division.lower.key(Part.JOURNAL)
        write.delete(journal)
        if present(RedisType.STREAM, page):
            write_value(write, RedisType.STREAM, journal, page)
        while len(page) == count:  # longer than a page: page by page
            write.execute()
            write = client.pipeline(transaction=False)
            after = b"(" + page[-1][0]
            page, count = _journal_page(client, division.source, after, min(BATCH, 2 * count))
            write_value(write, RedisType.STREAM, journal, page)
    for division, (leases, epoch) in zip(divisions, states, strict=True):
        frozen = (
            epoch if epoch is not None and epoch.startswith(FROZEN) else FROZEN + (epoch or b"0")
        )
        for half in (division.lower, division.upper):
            if leases is not None:
                write.set(half.key(Part.LEASES), leases)
            write.delete(half.key(Part.WAKE))
            write.rpush(half.key(Part.WAKE), "1")
            write.set(half.key(Part.EPOCH), frozen)
    write.execute()


def _journal_page(
    client: redis.Redis, source: SlotKeys, after: bytes | str, count: int
) -> tuple[list[Any], int]:
    """The source's journal entries from `after` on, up to `count` (fewer if the cap asks),
    and the count asked for."""
    key = source.key(Part.JOURNAL)

    def read(entries: int) -> list[Any]:
        return cast("list[Any]", client.xrange(key, min=after, count=entries))

    return fitted(client, read, count, key)
