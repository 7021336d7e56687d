"""Recurring schedules: the definition, its occurrences' ids and its packed form in Redis (pure).

A schedule lives in the slot its id routes to, as one field of the slot's `schedules` hash:
`"<current_due_ms>:<next>:<catch_up>:<definition_len>:" + definition_json + template`, where
`next` is the precomputed successor of the current occurrence (empty while a top-up is owed,
`end` when the series has no further occurrence) and `template` is the tail of a new message
record (`[p<priority>:][g<group length>:<group>]<headers_len>:<headers_json><payload>`, the
tagged fields only when the schedule has them, as codec.py lays a record out), so the scripts
materialise an occurrence by string concatenation alone and index its priority and group from
it (lua/includes/materialize.lua; lua/includes/series_fields.lua reads the same layout).

Occurrences are ordinary messages with the derived id `<schedule id>@<due ms>`, routed by the
schedule id as their slot basis: they share the schedule's slot, and scheduling one twice is a
no-op (create-only), which is what makes every materialisation safe to retry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from delayq.queue.codec import (
    Headers,
    as_text,
    decode_record,
    encode_group,
    encode_headers,
    encode_id,
    validate_payload,
    validate_priority,
)
from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.model import Target
from delayq.queue.recurrence import MAX_CATCH_UP, CatchUp, Recurrence
from delayq.queue.topic import MAX_ID_BYTES, Topic

#: room an occurrence id needs after the schedule id: "@" and a due time in ms (16 digits)
OCCURRENCE_SUFFIX_BYTES = 17
MAX_SCHEDULE_ID_BYTES = MAX_ID_BYTES - OCCURRENCE_SUFFIX_BYTES
DEFAULT_CATCH_UP_MAX = 100
#: between a schedule's id and its occurrence's due ms in the occurrence's message id
OCCURRENCE_SEPARATOR = "@"
PENDING, ENDED = "", "end"  # the `next` field while a top-up is owed / after the last occurrence


@dataclass(frozen=True)
class Schedule:
    """A recurring message: `recurrence` says when, `payload`, `headers`, `priority` and `group`
    are what each occurrence carries, `catch_up` what happens to occurrences missed during
    downtime."""

    id: str
    recurrence: Recurrence
    payload: bytes | str = b""
    headers: Headers = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.ONCE
    catch_up_max: int = DEFAULT_CATCH_UP_MAX
    priority: int = 0  # 0..9, each occurrence's (codec.MAX_PRIORITY)
    group: str | None = None  # each occurrence's fair group

    def __post_init__(self) -> None:
        if len(encode_id(self.id, "schedule id")) > MAX_SCHEDULE_ID_BYTES:
            raise InvalidMessageError(
                f"schedule id {self.id[:40]!r} is longer than {MAX_SCHEDULE_ID_BYTES} bytes "
                f"(its occurrences' ids append @<due ms>)"
            )
        if not isinstance(self.catch_up, CatchUp):
            raise InvalidMessageError(f"catch_up must be one of {[c.value for c in CatchUp]}")
        count = self.catch_up_max
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CATCH_UP:
            raise InvalidMessageError(
                f"catch_up_max {count!r} must be an integer 1..{MAX_CATCH_UP}"
            )
        validate_priority(self.priority)
        if self.group is not None:
            encode_group(self.group)

    def target(self) -> Target:
        """Where the schedule lives: the slot its id routes to."""
        return Target(self.id)


@dataclass(frozen=True)
class ScheduleInfo:
    """A stored schedule and where its series stands.

    `current_due_ms` is the occurrence materialised last: waiting in the store, never claimed
    (`waiting`), or claimed at least once (a retry waiting again is not `waiting`).
    `next_due_ms` is its precomputed successor, None while a top-up is owed or once the series
    has `ended`."""

    schedule: Schedule
    slot: int
    current_due_ms: int
    next_due_ms: int | None
    ended: bool
    waiting: bool

    @property
    def current_id(self) -> str:
        return occurrence_id(self.schedule.id, self.current_due_ms)


@dataclass(frozen=True)
class DefineResult:
    """A schedule stored: CREATED or UPDATED (it replaced one), and its first occurrence."""

    id: str
    slot: int
    code: Code
    first_due_ms: int


def occurrence_id(schedule_id: str, due_ms: int) -> str:
    """The message id of the occurrence due at `due_ms` (deterministic: idempotent)."""
    return f"{schedule_id}{OCCURRENCE_SEPARATOR}{due_ms}"


def occurrence_target(schedule_id: str, due_ms: int) -> Target:
    """An occurrence as a message (`Queue.get`, `cancel`): routed by its schedule's id."""
    return Target(occurrence_id(schedule_id, due_ms), slot_basis=schedule_id)


def encode_schedule(topic: Topic, schedule: Schedule, current_due_ms: int, next_due: str) -> bytes:
    """The packed hash value (module docstring); `next_due` is ms as text, PENDING or ENDED."""
    recurrence = schedule.recurrence
    definition = json.dumps(
        {
            "cron": recurrence.cron,
            "time_zone": recurrence.time_zone,
            "every_ms": recurrence.every_ms,
            "start_ms": recurrence.start_ms,
            "end_ms": recurrence.end_ms,
            "catch_up_max": schedule.catch_up_max,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    headers = encode_headers(schedule.headers)
    payload = validate_payload(schedule.payload, topic.max_payload_bytes)
    head = f"{current_due_ms}:{next_due}:{schedule.catch_up.value}:{len(definition)}:".encode()
    tags = f"p{schedule.priority}:".encode() if schedule.priority else b""
    if schedule.group is not None:
        group = encode_group(schedule.group)
        tags += b"g%d:" % len(group) + group
    return head + definition + tags + str(len(headers)).encode() + b":" + headers + payload


def decode_schedule(schedule_id: str, slot: int, raw: bytes, waiting: bool) -> ScheduleInfo:
    current, next_due, catch_up, definition_len, rest = raw.split(b":", 4)
    size = int(definition_len)
    definition = json.loads(rest[:size])
    template = decode_record(b"0:::" + rest[size:])  # an occurrence's record, as materialised
    catch_up_max = definition.pop("catch_up_max")
    schedule = Schedule(
        schedule_id,
        Recurrence(**definition),
        template.payload,
        template.headers,
        CatchUp(as_text(catch_up)),
        catch_up_max,
        template.priority,
        template.group,
    )
    text = as_text(next_due)
    return ScheduleInfo(
        schedule,
        slot,
        int(current),
        int(text) if text not in (PENDING, ENDED) else None,
        text == ENDED,
        waiting,
    )
