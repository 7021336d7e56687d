"""Pure builders of script calls and parsers of their replies, shared by the sync and async clients.

A `Plan` is the list of script calls one API operation needs (one per slot touched) and the
function that turns their raw replies into typed results. The clients only execute plans, so
the two flavours cannot drift apart and everything here is unit-testable without Redis.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from redis import ResponseError

from delayq.queue.backoff import Backoff
from delayq.queue.backup import Item
from delayq.queue.codec import (
    as_text,
    decode_record,
    encode_group,
    encode_headers,
    encode_id,
    expiry_argument,
    validate_id,
    validate_payload,
    validate_priority,
    when_argument,
)
from delayq.queue.codes import (
    Code,
    ReplicationTimeoutError,
    StaleEpochError,
    as_typed_error,
    raise_for_code,
)
from delayq.queue.keys import Part, SlotKeys, pace_key, slot_keys
from delayq.queue.model import (
    SLOT_BASIS,
    ClaimBatch,
    DeadBatchResult,
    DeadPage,
    Draw,
    Leased,
    Message,
    MessageInfo,
    Mode,
    Outcome,
    PartlyStoredError,
    Retry,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    SlotClaim,
    SlotStats,
    State,
    Target,
    TopicStats,
)
from delayq.queue.scripts import Script
from delayq.queue.topic import MAX_DELAY_MS, Topic, slot_of

T = TypeVar("T")
Arg = str | bytes | int
Reply = Any  # what redis-py returns for a script: nested lists of bytes and ints

CODES = {code.value: code for code in Code}  # faster than Code(n) per message
STATES = {state.value.encode(): state for state in State}
MAX_MESSAGES_PER_CALL = 1000  # keeps any one script call short, so Redis never stalls on a batch
ROLLBACK_PER_CLAIM = 1000
_SLOT_MOVING = Code.SLOT_MOVING.value  # an int: compared once per scheduled message
_NO_EXTRAS_NO_HEADERS = b"0:"  # a record's rest after its lease: no tagged field, no headers


@dataclass(frozen=True)
class ScriptCall:
    script: Script
    keys: list[str]
    args: list[Arg]


@dataclass(frozen=True)
class Plan(Generic[T]):
    """`partial`: the calls are independent (schedule's per-slot chunks), so `combine` gets a
    failed call's exception in place of its reply and reports which items were stored; any
    other plan's replies are raised at the first error."""

    calls: list[ScriptCall]
    combine: Callable[[list[Reply]], T]
    partial: bool = False


def _optional_ms(value: int) -> int | None:
    return None if value < 0 else int(value)


def groups(reply: Reply, stride: int, head: int = 0) -> Iterator[tuple[Any, ...]]:
    """The per-message groups of a flat script reply: after `head` leading values, one tuple of
    `stride` values per message or row (every list reply has this one shape, lua/includes/
    append.lua)."""
    values = iter(reply[head:])
    return zip(*[values] * stride, strict=True)


def _chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _per_slot_calls(
    topic: Topic,
    items: Sequence[T],
    slot_of: Callable[[T], int],
    build: Callable[[int, Sequence[T]], ScriptCall],
) -> tuple[list[ScriptCall], list[list[int]]]:
    """Group items by slot (one call per slot and chunk) and remember each item's position."""
    positions: dict[int, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        positions[slot_of(item)].append(index)
    calls: list[ScriptCall] = []
    order: list[list[int]] = []
    for slot, indexes in positions.items():
        for chunk in _chunks(indexes, MAX_MESSAGES_PER_CALL):
            calls.append(build(slot, [items[i] for i in chunk]))
            order.append(list(chunk))
    return calls, order


def _scatter(order: list[list[int]], per_call: list[list[T]], size: int) -> list[T]:
    """Put per-call results back in the order the caller gave the items."""
    results: list[T | None] = [None] * size
    for indexes, values in zip(order, per_call, strict=True):
        for index, value in zip(indexes, values, strict=True):
            results[index] = value
    return [r for r in results if r is not None]


def checked(plan: Plan[list[Outcome]], script: Script) -> Plan[Outcome]:
    """The single outcome of a one-message plan, raising the exception of a refusal code."""

    def combine(replies: list[Reply]) -> Outcome:
        outcome = plan.combine(replies)[0]
        raise_for_code(outcome.code, script.value, outcome.id)
        return outcome

    return Plan(plan.calls, combine)


def first(plan: Plan[list[T]]) -> Plan[T]:
    return Plan(plan.calls, lambda replies: plan.combine(replies)[0])


# --- producing -------------------------------------------------------------------------------


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
    `_per_slot_calls` afterwards."""
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
        return _scatter(order, per_call, len(requests))

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

    calls, order = _per_slot_calls(topic, items, lambda item: topic.slot_of(item.route), build)

    def combine(replies: list[Reply]) -> list[Outcome]:
        per_call = [
            [
                Outcome(items[i].id, CODES[code], _optional_ms(int(ms)) if ms != b"" else None)
                for i, (code, ms) in zip(indexes, groups(reply, 2), strict=True)
            ]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return _scatter(order, per_call, len(items))

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
    calls, order = _per_slot_calls(topic, targets, lambda t: t.slot(topic), build)

    def combine(replies: list[Reply]) -> list[Outcome]:
        per_call = [
            [Outcome(targets[i].id, CODES[code]) for i, code in zip(indexes, reply, strict=True)]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return _scatter(order, per_call, len(targets))

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

    calls, order = _per_slot_calls(
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
        return _scatter(order, per_call, len(moves))

    return Plan(calls, combine)


# --- consuming -------------------------------------------------------------------------------


def fence(topic: Topic, slot: int) -> Plan[int]:
    """Take the slot over: a new epoch, and the previous owners' leases rolled back (fence-10)."""
    keys = slot_keys(topic, slot).keys(
        Part.EPOCH,
        Part.STORE,
        Part.PREPARE,
        Part.DEAD,
        Part.MSG,
        Part.REASON,
        Part.JOURNAL,
        Part.OUTCOME,
        Part.FINISHED,
        Part.BASIS,
    )
    args: list[Arg] = [
        topic.max_retries,
        topic.journal_max_len,
        topic.retry_for_ms,
        topic.retry_exhausted_action.value,
        topic.outcome_retention_ms,
    ]
    return Plan([ScriptCall(Script.FENCE, keys, args)], lambda replies: int(replies[0]))


def fence_slots(topic: Topic, slots: Sequence[int]) -> Plan[list[int | Exception]]:
    """Take several slots over in one round trip (one `fence` call per slot, pipelined): each
    slot's new epoch, or the error that refused it (SlotMovingError) in its place. A process
    handed many slots at once (a rejoin, a rebalance) consumes them all a round trip after
    they are granted, not one round trip per slot later."""
    calls = [call for slot in slots for call in fence(topic, slot).calls]
    return Plan(
        calls,
        lambda replies: [r if isinstance(r, Exception) else int(r) for r in replies],
        partial=True,
    )


def freeze(topic: Topic, slot: int) -> Plan[int]:
    """Refuse every write into the slot on this broker while it moves (freeze-1)."""
    call = ScriptCall(Script.FREEZE, slot_keys(topic, slot).keys(Part.EPOCH), [])
    return Plan([call], lambda replies: int(replies[0]))


def thaw(topic: Topic, slot: int) -> Plan[int]:
    """Take writes into the slot again (thaw-1)."""
    call = ScriptCall(Script.THAW, slot_keys(topic, slot).keys(Part.EPOCH), [])
    return Plan([call], lambda replies: int(replies[0]))


def pace(
    topic: Topic, per_second: float, burst: int, want: int, least: int, returned: int
) -> Plan[Draw]:
    """Draw up to `want` tokens from the topic's pace (pace-1), at the limit of the topic's
    settings record (slot 0's, which its owner writes on every broker), `per_second` and
    `burst` while it has none."""
    record = slot_keys(topic, 0).settings
    args: list[Arg] = [repr(float(per_second)), burst, want, least, returned, record]
    call = ScriptCall(Script.PACE, [pace_key(topic)], args)

    def parse(replies: list[Reply]) -> Draw:
        granted, wait_ms, limit, size, held = replies[0]
        return Draw(int(granted), int(wait_ms), float(limit), int(size), bool(held))

    return Plan([call], parse)


def hold(topic: Topic, hold_ms: int, max_ms: int) -> Plan[int]:
    """Hold the topic's delivery for `hold_ms` (at most `max_ms`; hold-1): when it ends."""
    call = ScriptCall(Script.HOLD, [pace_key(topic)], [hold_ms, max_ms])
    return Plan([call], lambda replies: int(replies[0]))


def claim(
    topic: Topic,
    slot: int,
    epoch: int,
    max_count: int,
    lease_ms: int,
    backoff: Backoff | None = None,
) -> Plan[ClaimBatch]:
    """Claim due messages of one slot (claim-13); leases that ran out are retried after
    `backoff` (None: at once)."""

    def combine(replies: list[Reply]) -> ClaimBatch:
        batch = _claim_batch(replies[0], slot, epoch)
        if isinstance(batch, StaleEpochError):
            raise batch
        return batch

    return Plan([_claim_call(topic, slot, epoch, max_count, lease_ms, backoff)], combine)


def claim_slots(
    topic: Topic, claims: Sequence[SlotClaim], lease_ms: int, backoff: Backoff | None = None
) -> Plan[list[ClaimBatch | StaleEpochError]]:
    """Claim from several slots in one round trip, each (slot, epoch, max_count) its own count;
    a slot with a newer owner yields its StaleEpochError in place instead of failing the others.

    The slots share the client's broker: one call (claimmany-13, claim-13 slot after slot, each
    slot fenced by its own epoch) per MAX_MESSAGES_PER_CALL messages claimed at most, rather
    than one per slot; a call of one slot stays claim-13."""
    calls: list[ScriptCall] = []
    sizes: list[int] = []  # the claims of each call
    size = count = 0
    for claim in claims:
        if size and count + claim.max_count > MAX_MESSAGES_PER_CALL:
            sizes.append(size)
            size = count = 0
        size, count = size + 1, count + claim.max_count
    if size:
        sizes.append(size)
    start = 0
    for size in sizes:
        part = [
            _claim_call(topic, *claim, lease_ms, backoff) for claim in claims[start : start + size]
        ]
        start += size
        if len(part) == 1:
            calls.append(part[0])
        else:
            keys = [key for call in part for key in call.keys]
            args: list[Arg] = []
            for call in part:  # each slot's count first: claim-13's arguments may grow
                args += [len(call.args), *call.args]
            calls.append(ScriptCall(Script.CLAIM_MANY, keys, args))

    def combine(replies: list[Reply]) -> list[ClaimBatch | StaleEpochError]:
        slot_replies: list[Reply] = []
        for size, reply in zip(sizes, replies, strict=True):
            if size == 1:
                slot_replies.append(reply)
                continue
            at = 0
            for _ in range(size):
                end = at + 1 + 5 + 2 * int(reply[at])
                slot_replies.append(reply[at + 1 : end])
                at = end
        return [
            _claim_batch(reply, claim.slot, claim.epoch)
            for claim, reply in zip(claims, slot_replies, strict=True)
        ]

    return Plan(calls, combine)


def _claim_call(
    topic: Topic, slot: int, epoch: int, max_count: int, lease_ms: int, backoff: Backoff | None
) -> ScriptCall:
    if max_count < 0 or lease_ms < 1:
        raise ValueError(
            f"claim needs max_count >= 0 and lease_ms >= 1, got {max_count}, {lease_ms}"
        )
    keys = slot_keys(topic, slot).keys(
        Part.STORE,
        Part.PREPARE,
        Part.DEAD,
        Part.MSG,
        Part.REASON,
        Part.EPOCH,
        Part.JOURNAL,
        Part.LEASES,
        Part.OUTCOME,
        Part.FINISHED,
        Part.SCHEDULES,
        Part.TOPUP,
        Part.BASIS,
    )
    args: list[Arg] = [
        epoch,
        max_count,
        lease_ms,
        topic.max_retries,
        topic.journal_max_len,
        ROLLBACK_PER_CLAIM,
        topic.retry_for_ms,
        topic.retry_exhausted_action.value,
        topic.expiry_action.value,
        topic.outcome_retention_ms,
        *(backoff.claim_args() if backoff is not None else []),
    ]
    return ScriptCall(Script.CLAIM, keys, args)


def received(batch: ClaimBatch, received_s: float) -> ClaimBatch:
    """The batch stamped with the monotonic time its reply arrived (see ClaimBatch)."""
    return dataclasses.replace(batch, received_s=received_s)


def received_all(
    batches: list[ClaimBatch | StaleEpochError], received_s: float
) -> list[ClaimBatch | StaleEpochError]:
    return [b if isinstance(b, StaleEpochError) else received(b, received_s) for b in batches]


def _claim_batch(reply: Reply, slot: int, epoch: int) -> ClaimBatch | StaleEpochError:
    """The claim's batch. Its records were all just written by the claim, so they hold due and
    lease; the usual one (no optional field, no headers: `<attempts>:<due>:<lease>:0:<payload>`)
    is read with one split and no `Record` (a consumer's largest Python cost per delivery was
    decoding its claim), any other through `decode_record`."""
    if reply[0] == Code.STALE_EPOCH:
        return StaleEpochError(Script.CLAIM.value, f"<slot {slot}>", f"epoch {epoch}")
    messages = []
    for raw_id, raw_record in groups(reply, 2, head=5):
        attempts, due, lease, rest = raw_record.split(b":", 3)
        if rest[:2] == _NO_EXTRAS_NO_HEADERS:
            message = Message(
                raw_id.decode(), slot, rest[2:], {}, int(attempts), int(due), epoch, int(lease)
            )
        else:
            record = decode_record(raw_record)
            assert record.due_ms is not None
            assert record.lease_id is not None
            message = Message(
                raw_id.decode(),
                slot,
                record.payload,
                record.headers,
                record.attempts,
                record.due_ms,
                epoch,
                record.lease_id,
            )
        messages.append(message)
    return ClaimBatch(
        slot, int(reply[1]), _optional_ms(reply[2]), _optional_ms(reply[3]), messages, int(reply[4])
    )


def _per_lease_calls(
    topic: Topic,
    items: Sequence[T],
    lease_of: Callable[[T], Leased],
    build: Callable[[int, int, Sequence[T]], ScriptCall],
) -> tuple[list[ScriptCall], list[list[int]]]:
    """Group by (slot, epoch): each call carries one slot's keys and one fencing epoch."""
    by_lease: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        lease = lease_of(item)
        by_lease[(lease.slot, lease.epoch)].append(index)
    calls: list[ScriptCall] = []
    order: list[list[int]] = []
    for (slot, epoch), indexes in by_lease.items():
        slot_keys(topic, slot)  # validates the slot number
        for chunk in _chunks(indexes, MAX_MESSAGES_PER_CALL):
            calls.append(build(slot, epoch, [items[i] for i in chunk]))
            order.append(list(chunk))
    return calls, order


def _outcomes(
    order: list[list[int]], replies: list[Reply], ids: Sequence[str], has_time: bool
) -> list[Outcome]:
    per_call: list[list[Outcome]] = []
    for indexes, reply in zip(order, replies, strict=True):
        if has_time:
            per_call.append(
                [
                    Outcome(ids[i], CODES[c], int(t) or None)
                    for i, (c, t) in zip(indexes, groups(reply, 2), strict=True)
                ]
            )
        else:
            per_call.append(
                [Outcome(ids[i], CODES[c]) for i, c in zip(indexes, reply, strict=True)]
            )
    return _scatter(order, per_call, len(ids))


def _token_plan(
    topic: Topic,
    leases: Sequence[Leased],
    script: Script,
    parts: tuple[Part, ...],
    head: list[Arg],
    has_time: bool,
) -> Plan[list[Outcome]]:
    """A transition whose arguments are `[epoch, *head]` then `id, lease_id` per lease (ack,
    extend, give-back): one call per slot, epoch and chunk."""

    def build(slot: int, epoch: int, chunk: Sequence[Leased]) -> ScriptCall:
        pairs: list[Arg] = [0] * (2 * len(chunk))  # interleaved by slices: no list per lease
        pairs[0::2] = [lease.id for lease in chunk]
        pairs[1::2] = [lease.lease_id for lease in chunk]
        return ScriptCall(script, slot_keys(topic, slot).keys(*parts), [epoch, *head, *pairs])

    calls, order = _per_lease_calls(topic, leases, lambda lease: lease, build)
    ids = [lease.id for lease in leases]
    return Plan(calls, lambda replies: _outcomes(order, replies, ids, has_time=has_time))


#: ack-7's keys of a slot, in its KEYS order (ackmany-7: the same, slot after slot)
ACK_PARTS = (
    Part.PREPARE,
    Part.MSG,
    Part.EPOCH,
    Part.JOURNAL,
    Part.OUTCOME,
    Part.FINISHED,
    Part.BASIS,
)


def ack(topic: Topic, leases: Sequence[Leased]) -> Plan[list[Outcome]]:
    """One call per broker (ackmany-7, ack-7 run slot after slot, each slot fenced by its own
    epoch) per MAX_MESSAGES_PER_CALL leases: at 1,024 slots a consumer's herd was acked in one
    call per slot. The leases of one slot and epoch stay one call of ack-7."""
    head: list[Arg] = [topic.journal_max_len, topic.outcome_retention_ms]
    by_lease: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, lease in enumerate(leases):
        by_lease[(lease.slot, lease.epoch)].append(index)
    if len(by_lease) <= 1:
        return _token_plan(topic, leases, Script.ACK, ACK_PARTS, head, has_time=False)
    calls: list[ScriptCall] = []
    order: list[list[int]] = []
    keys: list[str] = []
    args: list[Arg] = [*head]
    positions: list[int] = []
    for (slot, epoch), indexes in by_lease.items():
        slot_keys(topic, slot)  # validates the slot number
        for chunk in _chunks(indexes, MAX_MESSAGES_PER_CALL):
            if positions and len(positions) + len(chunk) > MAX_MESSAGES_PER_CALL:
                calls.append(ScriptCall(Script.ACK_MANY, keys, args))
                order.append(positions)
                keys, args, positions = [], [*head], []
            keys += slot_keys(topic, slot).keys(*ACK_PARTS)
            args += [epoch, len(chunk)]
            for i in chunk:
                args += [leases[i].id, leases[i].lease_id]
            positions += chunk
    calls.append(ScriptCall(Script.ACK_MANY, keys, args))
    order.append(positions)
    ids = [lease.id for lease in leases]
    return Plan(calls, lambda replies: _outcomes(order, replies, ids, has_time=False))


def nack(topic: Topic, retries: Sequence[Retry]) -> Plan[list[Outcome]]:
    for retry in retries:
        if not 0 <= retry.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms {retry.delay_ms} must be between 0 and {MAX_DELAY_MS}")

    def build(slot: int, epoch: int, chunk: Sequence[Retry]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            Part.STORE,
            Part.PREPARE,
            Part.DEAD,
            Part.MSG,
            Part.REASON,
            Part.EPOCH,
            Part.WAKE,
            Part.JOURNAL,
            Part.OUTCOME,
            Part.FINISHED,
            Part.BASIS,
        )
        args: list[Arg] = [
            epoch,
            topic.max_retries,
            topic.journal_max_len,
            topic.retry_for_ms,
            topic.retry_exhausted_action.value,
            topic.expiry_action.value,
            topic.outcome_retention_ms,
        ]
        for r in chunk:
            args += [
                r.lease.id,
                r.lease.lease_id,
                r.delay_ms,
                r.reason[:1000],
                "1" if r.dead else "0",
            ]
        return ScriptCall(Script.NACK, keys, args)

    calls, order = _per_lease_calls(topic, retries, lambda r: r.lease, build)
    ids = [r.lease.id for r in retries]
    return Plan(calls, lambda replies: _outcomes(order, replies, ids, has_time=True))


def extend(topic: Topic, leases: Sequence[Leased], lease_ms: int) -> Plan[list[Outcome]]:
    if lease_ms < 1:
        raise ValueError(f"lease_ms {lease_ms} must be at least 1")
    parts = (Part.PREPARE, Part.MSG, Part.EPOCH)
    return _token_plan(topic, leases, Script.EXTEND, parts, [lease_ms], has_time=True)


def giveback(topic: Topic, leases: Sequence[Leased]) -> Plan[list[Outcome]]:
    """Leased messages back to store undelivered, attempt not counted (a graceful handoff)."""
    parts = (Part.STORE, Part.PREPARE, Part.MSG, Part.EPOCH, Part.WAKE, Part.JOURNAL)
    return _token_plan(
        topic, leases, Script.GIVEBACK, parts, [topic.journal_max_len], has_time=False
    )


# --- dead letters ------------------------------------------------------------------------------


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
                )
            )
        return DeadPage(int(reply[0]), messages)

    return Plan([ScriptCall(Script.DEAD_PAGE, keys, [offset, count])], combine)


# --- reading ---------------------------------------------------------------------------------


def get(topic: Topic, targets: Sequence[Target]) -> Plan[list[MessageInfo]]:
    def build(slot: int, chunk: Sequence[Target]) -> ScriptCall:
        keys = slot_keys(topic, slot).keys(
            Part.STORE, Part.PREPARE, Part.DEAD, Part.MSG, Part.REASON, Part.OUTCOME, Part.EPOCH
        )
        args: list[Arg] = [topic.outcome_retention_ms, *(validate_id(t.id) for t in chunk)]
        return ScriptCall(Script.GET, keys, args)

    calls, order = _per_slot_calls(topic, targets, lambda t: t.slot(topic), build)

    def combine(replies: list[Reply]) -> list[MessageInfo]:
        per_call = [
            [
                _message_info(targets[i].id, targets[i].slot(topic), row)
                for i, row in zip(indexes, groups(reply, 4), strict=True)
            ]
            for indexes, reply in zip(order, replies, strict=True)
        ]
        return _scatter(order, per_call, len(targets))

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


def stats(topic: Topic, slots: Iterable[int] | None = None) -> Plan[TopicStats]:
    wanted = list(topic.slots if slots is None else slots)
    calls = [
        ScriptCall(
            Script.STATS, slot_keys(topic, slot).keys(Part.STORE, Part.PREPARE, Part.DEAD), []
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
                    _optional_ms(r[5]),
                    _optional_ms(r[6]),
                )
                for slot, r in zip(wanted, replies, strict=True)
            ]
        )

    return Plan(calls, combine)
