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
    Arg,
    Plan,
    Reply,
    ScriptCall,
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
    the consumer's watchdog, which reads every owned slot each second, does not)."""
    wanted = list(topic.slots if slots is None else slots)
    args: list[Arg] = [1] if groups else []
    calls = [
        ScriptCall(
            Script.STATS, slot_keys(topic, slot).keys(Part.STORE, Part.PREPARE, Part.DEAD), args
        )
        for slot in wanted
    ]

    def combine(replies: list[Reply]) -> TopicStats:
        return TopicStats(
            [
                SlotStats(
                    slot,
                    int(r[0]),
                    int(r[1]),
                    int(r[2]),
                    int(r[3]),
                    int(r[4]),
                    optional_ms(r[5]),
                    optional_ms(r[6]),
                    _group_counts(r),
                )
                for slot, r in zip(wanted, replies, strict=True)
            ]
        )

    return Plan(calls, combine)


def _group_counts(reply: Reply) -> GroupCounts:
    """stats-3's counts of a slot's round, when it has one: the groups neither due nor held
    wait for later."""
    if len(reply) <= 7:
        return NO_GROUPS
    due, held, waiting = int(reply[7]), int(reply[8]), int(reply[9])
    return GroupCounts(due, held, max(0, waiting - due - held))
