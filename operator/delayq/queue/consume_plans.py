"""Plans of the consumer's operations (pure): taking slots over, claiming, pacing, and the
lease transitions (ack, nack, extend, give-back).

A claim and every lease transition carry the epoch of the slot's owner (a newer owner refuses
them), so the transitions are grouped into calls by (slot, epoch) (`_per_lease_calls`) rather
than by slot alone as the producer's are.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TypeVar

from delayq.queue.backoff import Backoff
from delayq.queue.codec import decode_record
from delayq.queue.codes import Code, StaleEpochError
from delayq.queue.keys import Part, pace_key, paused_key, slot_keys, store_key
from delayq.queue.model import ClaimBatch, Draw, Leased, Message, Outcome, Retry, SlotClaim
from delayq.queue.plans import (
    CODES,
    MAX_MESSAGES_PER_CALL,
    Arg,
    Plan,
    Reply,
    ScriptCall,
    chunks,
    groups,
    optional_ms,
    scatter,
)
from delayq.queue.scripts import Script
from delayq.queue.topic import MAX_DELAY_MS, Topic

T = TypeVar("T")
ROLLBACK_PER_CLAIM = 1000
_NO_EXTRAS_NO_HEADERS = b"0:"  # a record's rest after its lease: no tagged field, no headers


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


def resume_as(topic: Topic, holder: str) -> Plan[bool]:
    """Resume the topic's delivery on this broker if the pause is still `holder`'s (resume-1):
    True when it resumed."""
    call = ScriptCall(Script.RESUME, [paused_key(topic)], [holder])
    return Plan([call], lambda replies: bool(replies[0]))


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

    The slots share the client's broker: one call (claimmany-1, claim-13 slot after slot, each
    slot fenced by its own epoch) per MAX_MESSAGES_PER_CALL messages claimed at most, rather
    than one per slot; a call of one slot stays claim-13. It declares each slot by its store
    key alone (the script names the other parts after it): in a burst over 1,024 slots each
    slot held a message or two, and building its thirteen key names was most of the plan's
    Python and of the call's bytes."""
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
        part = claims[start : start + size]
        start += size
        if len(part) == 1:
            calls.append(_claim_call(topic, *part[0], lease_ms, backoff))
            continue
        keys: list[str] = []
        args: list[Arg] = []
        for slot, epoch, max_count in part:  # each slot's count first: its arguments may grow
            keys.append(store_key(topic, slot))
            slot_args = _claim_args(topic, epoch, max_count, lease_ms, backoff)
            args += [len(slot_args), *slot_args]
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
    args = _claim_args(topic, epoch, max_count, lease_ms, backoff)
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
    return ScriptCall(Script.CLAIM, keys, args)


def _claim_args(
    topic: Topic, epoch: int, max_count: int, lease_ms: int, backoff: Backoff | None
) -> list[Arg]:
    """claim-13's ARGV for one slot (claimmany-1 takes them per slot)."""
    if max_count < 0 or lease_ms < 1:
        raise ValueError(
            f"claim needs max_count >= 0 and lease_ms >= 1, got {max_count}, {lease_ms}"
        )
    return [
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


def received(batch: ClaimBatch, sent_s: float, received_s: float) -> ClaimBatch:
    """The batch stamped with the monotonic times its claim was sent and its reply arrived
    (see ClaimBatch)."""
    return dataclasses.replace(batch, sent_s=sent_s, received_s=received_s)


def received_all(
    batches: list[ClaimBatch | StaleEpochError], sent_s: float, received_s: float
) -> list[ClaimBatch | StaleEpochError]:
    return [
        b if isinstance(b, StaleEpochError) else received(b, sent_s, received_s) for b in batches
    ]


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
                record.priority,
                record.group,
            )
        messages.append(message)
    return ClaimBatch(
        slot, int(reply[1]), optional_ms(reply[2]), optional_ms(reply[3]), messages, int(reply[4])
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
        for chunk in chunks(indexes, MAX_MESSAGES_PER_CALL):
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
    return scatter(order, per_call, len(ids))


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


#: ack-7's keys of a slot, in its KEYS order (ackmany-1 names them after the slot's store key)
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
    """One call per broker (ackmany-1, ack-7 run slot after slot, each slot fenced by its own
    epoch) per MAX_MESSAGES_PER_CALL leases: at 1,024 slots a consumer's herd was acked in one
    call per slot. It declares each slot by its store key alone, as `claim_slots`. The leases
    of one slot and epoch stay one call of ack-7."""
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
        key = store_key(topic, slot)
        for chunk in chunks(indexes, MAX_MESSAGES_PER_CALL):
            if positions and len(positions) + len(chunk) > MAX_MESSAGES_PER_CALL:
                calls.append(ScriptCall(Script.ACK_MANY, keys, args))
                order.append(positions)
                keys, args, positions = [], [*head], []
            keys.append(key)
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
