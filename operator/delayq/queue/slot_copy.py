"""Copy one slot's data between two brokers, key by key (the Redis half of a slot move).

Every key of a slot is one `Part` of `keys.py`, so iterating `Part` copies all of it (store,
prepare with its lease deadlines, dead, records, reasons, outcomes, journal, wake list, epoch,
lease counter, schedules, ...) and a part added later is copied without touching this module.
DUMP/RESTORE carries each key byte for byte, stream ids and all, with no decoding in Python.

The source must be frozen (`plans.freeze`) first: then nothing writes into the slot there, and
a copy is a snapshot. The target side runs in one MULTI, so a copy is all or nothing, and a copy
repeated after a crash replaces the earlier one (no key of the slot is left from before).
"""

from __future__ import annotations

import redis

from delayq.queue.keys import Part, SlotKeys


def copy_slot(source: redis.Redis, target: redis.Redis, keys: SlotKeys) -> int:
    """Replace the slot's keys on `target` with those on `source`; returns how many keys the
    slot has. Keys without a TTL stay so (the engine sets none)."""
    names = keys.keys(*Part)
    read = source.pipeline(transaction=False)
    for name in names:
        read.dump(name)
    dumps = read.execute()
    write = target.pipeline(transaction=True)
    write.delete(*names)
    for name, dumped in zip(names, dumps, strict=True):
        if dumped is not None:
            write.restore(name, 0, dumped)
    write.execute()
    return sum(dumped is not None for dumped in dumps)


#: What a move deletes on the broker the slot left: everything but its frozen epoch, which
#: stays as a tombstone ('moving:<epoch>'), so a writer still routing the slot there (a process
#: whose routing watch has not fired yet) is refused with SLOT_MOVING instead of writing into a
#: slot nobody consumes. A later move back onto this broker replaces it.
MOVED_AWAY_PARTS = tuple(part for part in Part if part is not Part.EPOCH)


def delete_slot(client: redis.Redis, keys: SlotKeys, parts: tuple[Part, ...] = tuple(Part)) -> int:
    """Delete the slot's keys of `parts` on one broker (the target's copy when a move is
    rolled back; MOVED_AWAY_PARTS on the source after it); returns how many existed. UNLINK:
    Redis frees a large slot in the background instead of blocking the broker's other slots."""
    return int(client.unlink(*keys.keys(*parts)))
