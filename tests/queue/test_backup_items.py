"""Backup items shifted in time (`queue/backup.py`, pure): every instant an item carries moves by
exactly the shift, nothing else changes, and a leased record loses only its lease."""

from __future__ import annotations

from typing import Any

from delayq.queue.backup import Item, Kind, items_of, shifted, without_lease
from delayq.queue.codec import decode_record
from delayq.queue.keys import Part
from delayq.queue.schedules import decode_schedule

SHIFT = 86_400_000
RECORD = b'2:::x1900000000000:f1800000000000:10:{"k": "v"}payload'


def test_a_leased_record_loses_its_lease_and_keeps_the_rest() -> None:
    leased = b'2:1790000000000:17:x1900000000000:f1800000000000:10:{"k": "v"}payload'
    assert without_lease(leased) == RECORD
    record = decode_record(RECORD)
    assert (record.attempts, record.due_ms, record.lease_id) == (2, None, None)


def test_a_waiting_message_moves_its_due_expiry_and_first_attempt() -> None:
    item = Item(Kind.WAITING, "m", 1_790_000_000_000, RECORD, None, "", "m")
    moved = shifted(item, SHIFT)
    record = decode_record(moved.value)
    assert moved.ms == 1_790_000_000_000 + SHIFT
    assert (record.expire_ms, record.first_attempt_ms) == (
        1_900_000_000_000 + SHIFT,
        1_800_000_000_000 + SHIFT,
    )
    assert (record.payload, record.headers, record.attempts) == (b"payload", {"k": "v"}, 2)
    assert shifted(item, 0) is item


def test_an_occurrence_moves_its_id_with_its_due_and_its_schedule_its_series() -> None:
    definition = (
        b'{"catch_up_max":100,"cron":null,"end_ms":null,"every_ms":3600000,'
        b'"start_ms":1789996400000,"time_zone":"UTC"}'
    )
    schedule = b"1790000000000:1790003600000:once:%d:%s0:t" % (len(definition), definition)
    contents: dict[Part, Any] = {
        Part.STORE: [(b"tick@1790000000000", 1_790_000_000_000.0)],
        Part.PREPARE: [],
        Part.DEAD: [],
        Part.FINISHED: [],
        Part.TOPUP: [],
        Part.MSG: {b"tick@1790000000000": b"0:::0:t"},
        Part.REASON: {},
        Part.OUTCOME: {},
        Part.BASIS: {},
        Part.SCHEDULES: {b"tick": schedule},
    }
    occurrence, series = items_of(contents)
    assert occurrence.route == "tick"
    assert shifted(occurrence, SHIFT).id == f"tick@{1_790_000_000_000 + SHIFT}"
    info = decode_schedule("tick", 0, shifted(series, SHIFT).value, True)
    assert (info.current_due_ms, info.next_due_ms) == (
        1_790_000_000_000 + SHIFT,
        1_790_003_600_000 + SHIFT,
    )


def test_an_outcome_moves_its_finished_ms() -> None:
    item = Item(Kind.OUTCOME, "o", 1_790_000_000_000, b"done:1790000000000:3", None, "", "o")
    assert shifted(item, SHIFT).value == f"done:{1_790_000_000_000 + SHIFT}:3".encode()
