"""Plans of the producer's operations: schedule, restore, cancel and reschedule (pure).

Every one writes messages into their slots; scheduling is a producer's hot path, so its
encoding is written for speed (`schedule_answers`) and the others share `per_slot_calls`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import cast

from redis import ResponseError

from delayq.queue.backup import Item
from delayq.queue.codec import (
    as_text,
    encode_group,
    encode_headers,
    encode_id,
    expiry_argument,
    validate_id,
    validate_payload,
    validate_priority,
    when_argument,
)
from delayq.queue.codes import Code, ReplicationTimeoutError, as_typed_error
from delayq.queue.keys import Part, SlotKeys, slot_keys
from delayq.queue.model import (
    SLOT_BASIS,
    Mode,
    Outcome,
    PartlyStoredError,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    Target,
)
from delayq.queue.plans import (
    CODES,
    MAX_MESSAGES_PER_CALL,
    STATES,
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
from delayq.queue.topic import MAX_DELAY_MS, Topic, slot_of

_SLOT_MOVING = Code.SLOT_MOVING.value  # an int: compared once per scheduled message


def schedule(
    topic: Topic, requests: Sequence[ScheduleRequest], mode: Mode
) -> Plan[list[ScheduleResult]]:
    """One call per broker (and chunk of MAX_MESSAGES_PER_CALL). An item that failed stored
    nothing (a call is refused before its first write, e.g. out of memory; a slot being moved
    refuses its own items only); when some items failed and others stored, the plan raises
    PartlyStoredError, and when all failed, the first item's error."""
    answers = schedule_answers(topic, requests, mode)

    def combine(replies: list[Reply]) -> list[ScheduleResult]:
        results = answers.combine(replies)
        failures = [r for r in results if isinstance(r, ScheduleFailure)]
        if not failures:
            return cast(list[ScheduleResult], results)
        if len(failures) == len(results):
            raise failures[0].error  # nothing was stored
        raise PartlyStoredError(results)

    return Plan(answers.calls, combine, partial=True)


#: schedule-10's keys of a slot, in its KEYS order (schedulemany-1 declares the first, `store`,
#: and names the others after it)
SCHEDULE_PARTS = (
    Part.STORE,
    Part.PREPARE,
    Part.DEAD,
    Part.MSG,
    Part.REASON,
    Part.WAKE,
    Part.JOURNAL,
    Part.OUTCOME,
    Part.EPOCH,
    Part.BASIS,
)


@functools.lru_cache(maxsize=16_384)
def _schedule_keys(namespace: str, topic: str, generation: int, slot: int) -> tuple[str, ...]:
    """A slot's SCHEDULE_PARTS keys, made once: at 1,024 slots a batch of 1,000 names ~630
    slots, and formatting their 6,300 key names was half of its plan's Python. The slot is one
    `slot_of` computed, so within the topic's amount."""
    return tuple(SlotKeys(namespace, topic, slot, generation).keys(*SCHEDULE_PARTS))


def schedule_answers(
    topic: Topic, requests: Sequence[ScheduleRequest], mode: Mode
) -> Plan[list[ScheduleResult | ScheduleFailure]]:
    """As `schedule`, but never raising for a failed call: each request gets its own answer, a
    result or the failure of its call (or of its slot, refused as moving). For a caller that
    merges the answers of several calls (the routed client, over brokers), where one error for
    all would be wrong.

    The slots of a topic on one client share its broker, so a batch over many slots is one
    call (schedulemany-1, which runs schedule-10 slot after slot) per MAX_MESSAGES_PER_CALL
    messages rather than one per slot: at 1,024 slots a batch of 1,000 touched ~630 slots, each
    a call of its own. It declares each slot by its store key alone (the script names the
    other parts after it): ten keys a slot were most of the call's arguments. A call of one
    slot stays schedule-10.

    Every request is validated before anything is sent. This is a producer's hot path (about
    half of its Python per message before it was written this way): the requests are encoded
    straight into their slot's argument list in one loop, rather than grouped by the generic
    `per_slot_calls` afterwards."""
    slots, ids, by_slot, stride = _encode_requests(topic, requests)
    head: list[Arg] = [
        mode.value,
        MAX_DELAY_MS,
        topic.journal_max_len,
        topic.outcome_retention_ms,
        topic.expiry_ttl_ms,
        topic.max_pending_per_slot,
        stride,
    ]
    calls: list[ScriptCall] = []
    order: list[list[int]] = []
    namespace, name, generation = topic.namespace, topic.name, topic.slot_generation
    for chunks in _packed(by_slot, stride):
        if len(chunks) == 1:
            slot, indexes, fields = chunks[0]
            keys = [*_schedule_keys(namespace, name, generation, slot)]
            calls.append(ScriptCall(Script.SCHEDULE, keys, head + fields))
            order.append(indexes)
            continue
        keys, args, positions = [], list(head), []
        for slot, indexes, fields in chunks:
            keys.append(_schedule_keys(namespace, name, generation, slot)[0])
            args.append(len(indexes))
            args += fields
            positions += indexes
        calls.append(ScriptCall(Script.SCHEDULE_MANY, keys, args))
        order.append(positions)

    def call_results(indexes: list[int], reply: Reply) -> list[ScheduleResult | ScheduleFailure]:
        if isinstance(reply, Exception):
            return [ScheduleFailure(ids[i], slots[i], reply) for i in indexes]
        answers: list[ScheduleResult | ScheduleFailure] = []
        refusals: dict[bytes, Exception] = {}  # one error per slot refused, as its call's was
        for i, (code, due, state) in zip(indexes, groups(reply, 3), strict=True):
            if code == _SLOT_MOVING:
                if (error := refusals.get(state)) is None:
                    error = refusals[state] = as_typed_error(ResponseError(as_text(state)))
                answers.append(ScheduleFailure(ids[i], slots[i], error))
            else:
                answers.append(ScheduleResult(ids[i], slots[i], CODES[code], due, STATES[state]))
        return answers

    def combine(replies: list[Reply]) -> list[ScheduleResult | ScheduleFailure]:
        per_call = [call_results(i, reply) for i, reply in zip(order, replies, strict=True)]
        return scatter(order, per_call, len(requests))

    return Plan(calls, combine, partial=True)


def _packed(
    by_slot: dict[int, tuple[list[int], list[Arg]]], stride: int
) -> Iterator[list[tuple[int, list[int], list[Arg]]]]:
    """The slots' messages (`stride` arguments each) cut into calls of MAX_MESSAGES_PER_CALL
    messages (the last fewer), each a list of its slots' parts (slot, positions, arguments). A
    slot that fits whole into a call is not sliced. A slot may end one call and
    open the next, as a slot of more messages than a call always did: an id given twice then
    meets its first copy stored, which answers as it would in one call."""
    call: list[tuple[int, list[int], list[Arg]]] = []
    size = 0
    for slot, (indexes, fields) in by_slot.items():
        if size + len(indexes) < MAX_MESSAGES_PER_CALL:  # the common case: the whole slot
            call.append((slot, indexes, fields))
            size += len(indexes)
            continue
        start = 0
        while start < len(indexes):
            end = min(len(indexes), start + MAX_MESSAGES_PER_CALL - size)
            arguments = fields[stride * start : stride * end]
            call.append((slot, indexes[start:end], arguments))
            size += end - start
            start = end
            if size == MAX_MESSAGES_PER_CALL:
                yield call
                call, size = [], 0
    if call:
        yield call


def unconfirmed(error: ReplicationTimeoutError) -> list[ScheduleResult | ScheduleFailure]:
    """The answers of a `schedule_answers` plan whose replicas did not confirm in time: each
    item written on the broker's master becomes a failure whose ReplicationTimeoutError carries
    its own result (resending it is safe); refusals, which wrote nothing, stay as they are."""
    answers = cast(list[ScheduleResult | ScheduleFailure], error.result)
    return [
        ScheduleFailure(
            answer.id,
            answer.slot,
            ReplicationTimeoutError(error.wanted, error.confirmed, error.timeout_ms, answer),
        )
        if isinstance(answer, ScheduleResult) and not answer.code.is_error
        else answer
        for answer in answers
    ]


#: id, when kind, when ms, expiry kind, expiry ms, headers, payload, slot basis ('' = the id);
#: and the priority (0..9) in a call of which some message has one above 0 (schedule-10's
#: ARGV[7] says which), then the group ('' for none) in a call of which some message has one:
#: a batch without priorities or groups sends no argument more per message
FIELDS_PER_REQUEST = 8
FIELDS_WITH_PRIORITY = FIELDS_PER_REQUEST + 1
FIELDS_WITH_GROUP = FIELDS_WITH_PRIORITY + 1
_NO_EXPIRY = expiry_argument(None, None)


def _encode_requests(
    topic: Topic, requests: Sequence[ScheduleRequest]
) -> tuple[list[int], list[str], dict[int, tuple[list[int], list[Arg]]], int]:
    """Each request's slot and id, per slot the requests' positions and their script arguments
    (the id encoded once for both hashing and sending), and how many arguments each request
    has: FIELDS_PER_REQUEST, FIELDS_WITH_PRIORITY when one has a priority above 0, or
    FIELDS_WITH_GROUP when one has a group.

    The common request (no slot basis, no headers, no expiry of its own, a bytes payload) skips
    the calls that would only confirm its defaults; every other value goes through the one
    validator of its field, so a bad request fails exactly as it always did."""
    slot_amount, max_payload_bytes = topic.slot_amount, topic.max_payload_bytes
    slots: list[int] = []
    ids: list[str] = []
    by_slot: dict[int, tuple[list[int], list[Arg]]] = {}
    priorities: dict[int, int] = {}  # request position -> its priority, when above 0
    groups: dict[int, bytes] = {}  # request position -> its group, when it has one
    for index, request in enumerate(requests):
        (message_id, payload, delay_ms, at_ms, slot_basis, headers, expire_at_ms, ttl_ms,
         priority, group) = request
        encoded_id = encode_id(message_id)
        if slot_basis is None:
            basis, recorded_basis = encoded_id, b""
        else:  # recorded so that a doubling of the slots places the message by it too
            basis = recorded_basis = encode_id(slot_basis, SLOT_BASIS)
        when_kind, when_ms = when_argument(delay_ms, at_ms)
        expire_kind, expire_ms = (
            _NO_EXPIRY
            if expire_at_ms is None and ttl_ms is None
            else expiry_argument(expire_at_ms, ttl_ms)
        )
        encoded_headers = encode_headers(headers) if headers else b""
        if type(payload) is not bytes or len(payload) > max_payload_bytes:
            payload = validate_payload(payload, max_payload_bytes)
        if (priority != 0 or type(priority) is not int) and validate_priority(priority):
            priorities[index] = priority
        if group is not None:
            groups[index] = encode_group(group)
        slot = slot_of(basis, slot_amount)
        slots.append(slot)
        ids.append(message_id)
        if (entry := by_slot.get(slot)) is None:
            entry = by_slot[slot] = ([], [])
        entry[0].append(index)
        entry[1].extend(
            (
                encoded_id,
                when_kind,
                when_ms,
                expire_kind,
                expire_ms,
                encoded_headers,
                payload,
                recorded_basis,
            )
        )
    if groups:
        return slots, ids, _widened(by_slot, priorities, groups), FIELDS_WITH_GROUP
    if priorities:
        return slots, ids, _widened(by_slot, priorities, None), FIELDS_WITH_PRIORITY
    return slots, ids, by_slot, FIELDS_PER_REQUEST


def _widened(
    by_slot: dict[int, tuple[list[int], list[Arg]]],
    priorities: dict[int, int],
    groups: dict[int, bytes] | None,
) -> dict[int, tuple[list[int], list[Arg]]]:
    """`by_slot` with each request's priority after its other arguments (0 for none), and
    with `groups` its group after that (b'' for none)."""
    stride = FIELDS_PER_REQUEST
    widened: dict[int, tuple[list[int], list[Arg]]] = {}
    for slot, (indexes, fields) in by_slot.items():
        arguments: list[Arg] = []
        for n, index in enumerate(indexes):
            arguments += fields[stride * n : stride * (n + 1)]
            arguments.append(priorities.get(index, 0))
            if groups is not None:
                arguments.append(groups.get(index, b""))
        widened[slot] = (indexes, arguments)
    return widened


def restore(topic: Topic, items: Sequence[Item]) -> Plan[list[Outcome]]:
    """Restore backup items create-only (restore-13): one call per slot and chunk, each item
    in the slot its `route` names under `topic`'s slot amount; `Outcome.at_ms` is the item's ms
    (its finished ms for ALREADY_DONE)."""

    def build(slot: int, chunk: Sequence[Item]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            *SCHEDULE_PARTS, Part.FINISHED, Part.SCHEDULES, Part.TOPUP
        )
        args: list[Arg] = [
            topic.journal_max_len,
            topic.outcome_retention_ms,
            MAX_DELAY_MS,
            topic.max_pending_per_slot,
        ]
        for item in chunk:
            ms = "" if item.ms is None else item.ms
            args += [item.kind, item.id, ms, item.value, item.reason or "", item.basis]
        return ScriptCall(Script.RESTORE, keys, args)

    calls, order = per_slot_calls(topic, items, lambda item: topic.slot_of(item.route), build)

    def combine(replies: list[Reply]) -> list[Outcome]:
        per_call = [
            [
                Outcome(items[i].id, CODES[code], optional_ms(int(ms)) if ms != b"" else None)
                for i, (code, ms) in zip(indexes, groups(reply, 2), strict=True)
            ]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return scatter(order, per_call, len(items))

    return Plan(calls, combine)


def cancel(topic: Topic, targets: Sequence[Target]) -> Plan[list[Outcome]]:
    def build(slot: int, chunk: Sequence[Target]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            Part.STORE,
            Part.PREPARE,
            Part.DEAD,
            Part.MSG,
            Part.REASON,
            Part.JOURNAL,
            Part.OUTCOME,
            Part.FINISHED,
            Part.SCHEDULES,
            Part.TOPUP,
            Part.WAKE,
            Part.EPOCH,
            Part.BASIS,
        )
        args: list[Arg] = [topic.journal_max_len, topic.outcome_retention_ms]
        return ScriptCall(Script.CANCEL, keys, [*args, *(t.id for t in chunk)])

    for target in targets:
        validate_id(target.id)
    calls, order = per_slot_calls(topic, targets, lambda t: t.slot(topic), build)

    def combine(replies: list[Reply]) -> list[Outcome]:
        per_call = [
            [Outcome(targets[i].id, CODES[code]) for i, code in zip(indexes, reply, strict=True)]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return scatter(order, per_call, len(targets))

    return Plan(calls, combine)


def reschedule(
    topic: Topic, moves: Sequence[tuple[Target, int | None, int | None]]
) -> Plan[list[Outcome]]:
    """Each move is (target, delay_ms, at_ms) with exactly one of the two set."""
    whens = [when_argument(delay_ms, at_ms) for _, delay_ms, at_ms in moves]

    def build(slot: int, chunk: Sequence[int]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            Part.STORE, Part.PREPARE, Part.DEAD, Part.MSG, Part.WAKE, Part.JOURNAL, Part.EPOCH
        )
        args: list[Arg] = [MAX_DELAY_MS, topic.journal_max_len]
        for index in chunk:
            args.extend([validate_id(moves[index][0].id), *whens[index]])
        return ScriptCall(Script.RESCHEDULE, keys, args)

    calls, order = per_slot_calls(
        topic, range(len(moves)), lambda i: moves[i][0].slot(topic), build
    )

    def combine(replies: list[Reply]) -> list[Outcome]:
        per_call = [
            [
                Outcome(moves[i][0].id, CODES[code], int(due))
                for i, (code, due) in zip(indexes, groups(reply, 2), strict=True)
            ]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return scatter(order, per_call, len(moves))

    return Plan(calls, combine)
