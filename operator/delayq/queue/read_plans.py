"""Plans that only read: a message's state (`get`) and a topic's counts (`stats`) (pure).

Kept apart from the writing plans: nothing here changes a message (get-7 runs with
no-writes), so neither takes an epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from delayq.queue.codec import as_text, decode_record, validate_id
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import (
    NO_GROUPS,
    GroupCounts,
    MessageInfo,
    SlotStats,
    State,
    Target,
    TopicStats,
)
from delayq.queue.plans import (
    SLOTS_PER_CALL,
    Arg,
    Plan,
    Reply,
    ScriptCall,
    chunks,
    groups,
    optional_ms,
    per_slot_calls,
    scatter,
)
from delayq.queue.scripts import Script
from delayq.queue.topic import Topic


def get(topic: Topic, targets: Sequence[Target]) -> Plan[list[MessageInfo]]:
    def build(slot: int, chunk: Sequence[Target]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            Part.STORE, Part.PREPARE, Part.DEAD, Part.MSG, Part.REASON, Part.OUTCOME, Part.EPOCH
        )
        args: list[Arg] = [topic.outcome_retention_ms, *(validate_id(t.id) for t in chunk)]
        return ScriptCall(Script.GET, keys, args)

    calls, order = per_slot_calls(topic, targets, lambda t: t.slot(topic), build)

    def combine(replies: list[Reply]) -> list[MessageInfo]:
        per_call = [
            [
                _message_info(targets[i].id, targets[i].slot(topic), row)
                for i, row in zip(indexes, groups(reply, 4), strict=True)
            ]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return scatter(order, per_call, len(targets))

    return Plan(calls, combine)


def _message_info(message_id: str, slot: int, row: tuple[Any, ...]) -> MessageInfo:
    state = State(as_text(row[0]))
    if state is State.ABSENT:
        return MessageInfo(message_id, slot, state)
    score = int(row[1])
    record = decode_record(row[2])
    return MessageInfo(
        message_id,
        slot,
        state,
        due_ms=score if state is State.SCHEDULED else record.due_ms,
        lease_deadline_ms=score if state is State.PREPARED else None,
        died_ms=score if state is State.DEAD else None,
        finished_ms=score if state.is_finished else None,
        expire_at_ms=record.expire_ms,
        priority=record.priority,
        group=record.group,
        attempts=record.attempts,
        payload=record.payload,
        headers=record.headers,
        dead_reason=as_text(row[3]),
    )


def stats(
    topic: Topic, slots: Iterable[int] | None = None, groups: bool = False
) -> Plan[TopicStats]:
    """The slots' depths and heads; with `groups`, their fair groups' counts too (/metrics asks,
    the consumer's watchdog, which reads every owned slot each second, does not). One stats-3
    call per SLOTS_PER_CALL slots (the client's broker holds them all): one call per slot cost
    an idle 1,024-slot topic ~1,000 script calls a second."""
    wanted = list(topic.slots if slots is None else slots)
    args: list[Arg] = [1] if groups else []
    width = 9 if groups else 6  # values per slot in a reply, after its now_ms
    calls = [
        ScriptCall(
            Script.STATS,
            [
                key
                for slot in chunk
                for key in slot_keys(topic, slot).keys(Part.STORE, Part.PREPARE, Part.DEAD)
            ],
            args,
        )
        for chunk in chunks(wanted, SLOTS_PER_CALL)
    ]

    def combine(replies: list[Reply]) -> TopicStats:
        rows = [
            (int(reply[0]), reply[at : at + width])
            for reply in replies
            for at in range(1, len(reply), width)
        ]
        return TopicStats(
            [
                SlotStats(
                    slot,
                    now_ms,
                    int(r[0]),
                    int(r[1]),
                    int(r[2]),
                    int(r[3]),
                    optional_ms(r[4]),
                    optional_ms(r[5]),
                    _group_counts(r),
                )
                for slot, (now_ms, r) in zip(wanted, rows, strict=True)
            ]
        )

    return Plan(calls, combine)


def _group_counts(row: Reply) -> GroupCounts:
    """stats-3's counts of a slot's round, when asked and it has one: the groups neither due
    nor held wait for later."""
    if len(row) <= 6 or not int(row[8]):
        return NO_GROUPS
    due, held, waiting = int(row[6]), int(row[7]), int(row[8])
    return GroupCounts(due, held, max(0, waiting - due - held))
