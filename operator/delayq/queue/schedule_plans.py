"""Plans of the recurring-schedule operations, and the steps that chain them (pure).

Defining a schedule and topping one up need the server's clock before Python can compute an
occurrence, then a write that compares-and-sets on what was read. Both are written once as
generators of plans (`Steps`): a client runs each plan it is handed and sends the result back
(`Queue.run_steps`, `AsyncQueue.run_steps`), so the sync and async clients share the logic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from delayq.queue.codec import as_text, validate_id
from delayq.queue.codes import (
    Code,
    InvalidMessageError,
    NotFoundError,
    WrongStateError,
    raise_for_code,
)
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Outcome
from delayq.queue.plans import CODES, MAX_MESSAGES_PER_CALL, Arg, Plan, Reply, ScriptCall, groups
from delayq.queue.recurrence import following_due_ms
from delayq.queue.schedules import (
    ENDED,
    PENDING,
    DefineResult,
    Schedule,
    ScheduleInfo,
    decode_schedule,
    encode_schedule,
)
from delayq.queue.scripts import Script
from delayq.queue.topic import MAX_DELAY_MS, Topic

T = TypeVar("T")
Steps = Generator[Plan[Any], Any, T]
#: the first occurrence of a schedule is at least this far after the server's now when it is
#: computed, so it is still ahead when define-9 runs; a try that missed anyway (a slow round
#: trip) is computed again from a fresh clock with ten times the margin
DEFINE_MARGINS_MS = (100, 1_000, 10_000)
#: rounds of one page of top-ups: a catch-up needs two (materialise, then precompute)
MAX_TOP_UP_ROUNDS = 4
#: pages of owed top-ups (MAX_MESSAGES_PER_CALL each) one pass works through at most
MAX_TOP_UP_PAGES = 100


@dataclass(frozen=True)
class SlotSchedules:
    """What schedules-4 read: the server clock and the schedules found (absent ids left out)."""

    now_ms: int
    schedules: list[ScheduleInfo]


def read(
    topic: Topic, slot: int, ids: Sequence[str] | None = None, owed: bool = False
) -> Plan[SlotSchedules]:
    """The slot's schedules: those with `ids`, those owing a top-up (`owed`), or all."""
    keys = slot_keys(topic, slot).keys(Part.SCHEDULES, Part.TOPUP, Part.STORE, Part.MSG)
    args: list[Arg]
    if owed:
        args = ["owed", MAX_MESSAGES_PER_CALL]
    elif ids is None:
        args = ["all", 0]
    else:
        args = ["ids", 0, *ids]

    def combine(replies: list[Reply]) -> SlotSchedules:
        reply = replies[0]
        found = [
            decode_schedule(as_text(sid), slot, value, bool(waiting))
            for sid, value, waiting in groups(reply, 3, head=1)
            if value
        ]
        return SlotSchedules(int(reply[0]), found)

    return Plan([ScriptCall(Script.SCHEDULES, keys, args)], combine)


def define(topic: Topic, schedule: Schedule) -> Steps[DefineResult]:
    """Create or replace `schedule`: its first occurrence after the server's now is scheduled
    and its successor precomputed (so the first claim materialises the second)."""
    slot = schedule.target().slot(topic)
    keys = slot_keys(topic, slot).keys(
        Part.SCHEDULES,
        Part.TOPUP,
        Part.STORE,
        Part.MSG,
        Part.WAKE,
        Part.JOURNAL,
        Part.PREPARE,
        Part.EPOCH,
        Part.BASIS,
    )
    encode_schedule(topic, schedule, 0, PENDING)  # refuses a bad payload before any round trip
    for margin_ms in DEFINE_MARGINS_MS:
        now_ms = (yield read(topic, slot, [])).now_ms
        recurrence = schedule.recurrence.anchored(now_ms)
        anchored = dataclasses.replace(schedule, recurrence=recurrence)
        first = recurrence.next_after(now_ms + margin_ms)
        if first is None:
            raise InvalidMessageError(
                f"schedule {schedule.id!r} has no occurrence after now (its end_ms is past)"
            )
        if first > now_ms + MAX_DELAY_MS:
            raise InvalidMessageError(
                f"schedule {schedule.id!r}: its first occurrence {first} (start_ms) is more "
                f"than {MAX_DELAY_MS} ms away"
            )
        second = recurrence.next_after(first)
        value = encode_schedule(topic, anchored, first, ENDED if second is None else str(second))
        call = ScriptCall(Script.DEFINE, keys, [topic.journal_max_len, schedule.id, value])
        code, due_ms = yield Plan([call], lambda replies: replies[0])
        if CODES[code] is not Code.WRONG_STATE:
            return DefineResult(schedule.id, slot, CODES[code], int(due_ms))
    raise WrongStateError(
        "put",
        schedule.id,
        "its first occurrence was never ahead of the server clock",
        subject="schedule",
    )


def drop(topic: Topic, schedule_id: str) -> Plan[Outcome]:
    """Delete a schedule and its waiting occurrence; raises NotFoundError when there is none."""
    slot = topic.slot_of(validate_id(schedule_id, "schedule id"))
    keys = slot_keys(topic, slot).keys(
        Part.SCHEDULES, Part.TOPUP, Part.STORE, Part.MSG, Part.JOURNAL, Part.EPOCH, Part.BASIS
    )

    def combine(replies: list[Reply]) -> Outcome:
        code = CODES[replies[0][0]]
        raise_for_code(code, "delete", schedule_id, subject="schedule")
        return Outcome(schedule_id, code)

    return Plan([ScriptCall(Script.DROP, keys, [topic.journal_max_len, schedule_id])], combine)


def read_slots(topic: Topic, slots: Iterable[int]) -> Plan[list[ScheduleInfo]]:
    """Every schedule of `slots`, one pipelined round trip (a slot's are read at once: this
    lists schedules for operators, it is not meant for millions of them)."""
    plans = [read(topic, slot) for slot in slots]

    def combine(replies: list[Reply]) -> list[ScheduleInfo]:
        return [
            info
            for plan, reply in zip(plans, replies, strict=True)
            for info in plan.combine([reply]).schedules
        ]

    return Plan([plan.calls[0] for plan in plans], combine)


def get(topic: Topic, schedule_id: str) -> Plan[ScheduleInfo]:
    slot = topic.slot_of(validate_id(schedule_id, "schedule id"))
    plan = read(topic, slot, [schedule_id])

    def combine(replies: list[Reply]) -> ScheduleInfo:
        found = plan.combine(replies).schedules
        if not found:
            raise NotFoundError("get", schedule_id, subject="schedule")
        return found[0]

    return Plan(plan.calls, combine)


def top_up(topic: Topic, slot: int) -> Steps[int]:
    """Precompute the next occurrence of every schedule of `slot` that owes it (the claim that
    materialised an occurrence leaves its schedule in `topup`), a page of the oldest owed at a
    time; returns how many were topped up.

    Safe to run anywhere, any number of times, concurrently: each write compares-and-sets on
    what was read and materialises by derived id, create-only."""
    topped_up = 0
    for _ in range(MAX_TOP_UP_PAGES):
        page = yield read(topic, slot, owed=True)
        topped_up += yield from _top_up_page(topic, slot, page)
        if len(page.schedules) < MAX_MESSAGES_PER_CALL:
            break
    return topped_up


def _top_up_page(topic: Topic, slot: int, page: SlotSchedules) -> Steps[int]:
    keys = slot_keys(topic, slot).keys(
        Part.SCHEDULES, Part.TOPUP, Part.STORE, Part.MSG, Part.WAKE, Part.JOURNAL, Part.EPOCH
    )
    owed, now_ms = page.schedules, page.now_ms
    topped_up = 0
    for _ in range(MAX_TOP_UP_ROUNDS):
        if not owed:
            break
        args: list[Arg] = [topic.journal_max_len]
        for info in owed:
            following = following_due_ms(
                info.schedule.recurrence,
                info.current_due_ms,
                now_ms,
                info.schedule.catch_up,
                info.schedule.catch_up_max,
                info.waiting,
            )
            args += [
                info.schedule.id,
                info.current_due_ms,
                "1" if info.waiting else "0",
                ENDED if following is None else following,
            ]
        reply = yield Plan([ScriptCall(Script.TOPUP, keys, args)], lambda replies: replies[0])
        codes = [CODES[code] for code, _ in groups(reply, 2)]
        topped_up += codes.count(Code.TOPPED_UP)
        again = [
            info.schedule.id
            for info, code in zip(owed, codes, strict=True)
            if code in (Code.ADVANCED, Code.WRONG_STATE)
        ]
        if not again:
            break
        read_again = yield read(topic, slot, again)
        owed, now_ms = read_again.schedules, read_again.now_ms
    return topped_up
