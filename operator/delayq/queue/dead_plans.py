"""Plans of the dead-letter operations: redrive, purge and paging through a slot's dead
messages (pure).

Redrive and purge share one shape (the given ids, or the oldest up to a count), so both are
built by `_dead_batch` and the client passes either as a `DeadBatchBuilder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from delayq.queue.codec import as_text, decode_record, validate_id
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import DeadBatchResult, DeadPage, MessageInfo, Outcome, State
from delayq.queue.plans import CODES, Arg, Plan, Reply, ScriptCall, groups
from delayq.queue.scripts import Script
from delayq.queue.topic import Topic


def _dead_batch(
    topic: Topic,
    script: Script,
    parts: list[Part],
    head: list[Arg],
    slot: int,
    ids: Sequence[str] | None,
    max_count: int,
) -> Plan[DeadBatchResult]:
    """`head` then the mode: 'oldest', max_count or 'ids', 0, ids."""
    keys = slot_keys(topic, slot).keys(*parts)
    args = list(head)
    if ids is None:
        args += ["oldest", max_count]
    else:
        args += ["ids", 0, *(validate_id(i) for i in ids)]

    def combine(replies: list[Reply]) -> DeadBatchResult:
        reply = replies[0]
        outcomes = [Outcome(as_text(i), CODES[c]) for i, c in groups(reply, 2, head=1)]
        return DeadBatchResult(int(reply[0]), outcomes)

    return Plan([ScriptCall(script, keys, args)], combine)


DeadBatchBuilder = Callable[[Topic, int, Sequence[str] | None], Plan[DeadBatchResult]]


def redrive(
    topic: Topic, slot: int, ids: Sequence[str] | None, max_count: int = 1000
) -> Plan[DeadBatchResult]:
    """Redrive the given dead ids of a slot, or (ids=None) up to max_count of its oldest."""
    parts = [Part.DEAD, Part.STORE, Part.MSG, Part.REASON, Part.WAKE, Part.JOURNAL, Part.EPOCH]
    head: list[Arg] = [topic.journal_max_len]
    return _dead_batch(topic, Script.REDRIVE, parts, head, slot, ids, max_count)


def purge(
    topic: Topic, slot: int, ids: Sequence[str] | None, max_count: int = 1000
) -> Plan[DeadBatchResult]:
    parts = [
        Part.DEAD,
        Part.MSG,
        Part.REASON,
        Part.JOURNAL,
        Part.OUTCOME,
        Part.FINISHED,
        Part.EPOCH,
        Part.BASIS,
    ]
    head: list[Arg] = [topic.journal_max_len, topic.outcome_retention_ms]
    return _dead_batch(topic, Script.PURGE, parts, head, slot, ids, max_count)


def dead_page(topic: Topic, slot: int, offset: int, count: int) -> Plan[DeadPage]:
    if offset < 0 or not 1 <= count <= 1000:
        raise ValueError(
            f"dead page needs offset >= 0 and 1 <= count <= 1000, got {offset}, {count}"
        )
    keys = slot_keys(topic, slot).keys(Part.DEAD, Part.MSG, Part.REASON)

    def combine(replies: list[Reply]) -> DeadPage:
        reply = replies[0]
        messages = []
        for raw_id, died_ms, raw_record, reason in groups(reply, 4, head=1):
            record = decode_record(raw_record)
            messages.append(
                MessageInfo(
                    as_text(raw_id),
                    slot,
                    State.DEAD,
                    died_ms=int(died_ms),
                    attempts=record.attempts,
                    payload=record.payload,
                    headers=record.headers,
                    dead_reason=as_text(reason),
                    priority=record.priority,
                    group=record.group,
                )
            )
        return DeadPage(int(reply[0]), messages)

    return Plan([ScriptCall(Script.DEAD_PAGE, keys, [offset, count])], combine)
