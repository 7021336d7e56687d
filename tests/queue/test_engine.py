"""Every engine operation and return code against a real redis-server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.queue.acl import service_user_rules
from delayq.queue.backoff import Backoff, Jitter
from delayq.queue.client import Queue
from delayq.queue.codes import (
    Code,
    InvalidMessageError,
    LeaseLostError,
    NotFoundError,
    StaleEpochError,
    TooFarError,
    WrongStateError,
)
from delayq.queue.keys import Part, paused_key, slot_keys
from delayq.queue.model import Message, Mode, Retry, ScheduleRequest, State, Target
from delayq.queue.topic import MAX_DELAY_MS, Topic

from .conftest import (
    ENGINE_PASSWORD,
    ENGINE_USER,
    TOPIC,
    MakeQueue,
    engine_user,
    server_ms,
    wait_for_server_ms,
)

HOUR_MS = 3_600_000
TEN_YEARS_MS = 10 * 366 * 24 * HOUR_MS


def claim_one(queue: Queue, message_id: str, ack_timeout_ms: int = 60_000):
    slot = TOPIC.slot_of(message_id)
    epoch = queue.take_over(slot)
    batch = queue.claim(slot, epoch, 100, ack_timeout_ms)
    [message] = [m for m in batch.messages if m.id == message_id]
    return message


def journal_events(client: redis.Redis, message_id: str) -> list[str]:
    events = []
    for slot in TOPIC.slots:
        entries = client.xrange(slot_keys(TOPIC, slot).key(Part.JOURNAL))
        # redis-py types the answer loosely; a client without decode_responses reads bytes.
        for _, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries):
            if fields[b"id"].decode() == message_id:
                events.append(fields[b"e"].decode())
    return events


def test_schedule_create_is_idempotent_and_reports_existing(queue: Queue) -> None:
    first = queue.schedule("a", b"one", delay_ms=HOUR_MS, headers={"k": "v"})
    assert first.code is Code.CREATED
    assert first.state is State.SCHEDULED
    again = queue.schedule("a", b"two", delay_ms=1)
    assert again.code is Code.EXISTS
    assert again.due_ms == first.due_ms
    info = queue.get("a")
    assert (info.payload, info.headers, info.due_ms) == (b"one", {"k": "v"}, first.due_ms)


def test_upsert_replaces_payload_and_moves_due(queue: Queue) -> None:
    first = queue.schedule("a", b"one", delay_ms=HOUR_MS)
    moved = queue.schedule("a", b"two", delay_ms=10, mode=Mode.UPSERT)
    assert moved.code is Code.UPDATED
    assert moved.due_ms < first.due_ms
    assert queue.get("a").payload == b"two"


def test_due_time_comes_from_the_server_clock(queue: Queue, redis_client: redis.Redis) -> None:
    before = server_ms(redis_client)
    result = queue.schedule("a", delay_ms=5000)
    after = server_ms(redis_client)
    assert before + 5000 <= result.due_ms <= after + 5000


def test_delays_from_zero_to_ten_years_and_absolute_times(
    queue: Queue, redis_client: redis.Redis
) -> None:
    assert queue.schedule("now", delay_ms=0).code is Code.CREATED
    far = queue.schedule("far", delay_ms=TEN_YEARS_MS)
    assert far.code is Code.CREATED
    assert far.due_ms >= server_ms(redis_client) + TEN_YEARS_MS - 1000
    at = queue.schedule("at", at_ms=1_000)
    assert (at.code, at.due_ms) == (Code.CREATED, 1_000)


def test_an_absolute_time_beyond_the_maximum_is_refused(
    queue: Queue, redis_client: redis.Redis
) -> None:
    too_far = server_ms(redis_client) + MAX_DELAY_MS + HOUR_MS
    with pytest.raises(TooFarError, match="'x': TOO_FAR"):
        queue.schedule("x", at_ms=too_far)
    assert queue.get("x").state is State.ABSENT


def test_invalid_messages_never_reach_redis(queue: Queue, redis_client: redis.Redis) -> None:
    small = Queue(redis_client, Topic("small", max_payload_bytes=8))
    with pytest.raises(InvalidMessageError, match="payload of 9 bytes"):
        small.schedule("a", b"x" * 9, delay_ms=0)
    with pytest.raises(InvalidMessageError, match="non-empty"):
        queue.schedule("", delay_ms=0)
    with pytest.raises(InvalidMessageError, match="exactly one"):
        queue.schedule("a")
    assert redis_client.dbsize() == 0


def test_batch_schedule_preserves_order_and_per_message_results(queue: Queue) -> None:
    queue.schedule("m3", delay_ms=HOUR_MS)
    requests = [ScheduleRequest(f"m{i}", f"p{i}", delay_ms=HOUR_MS) for i in range(10)]
    requests.append(ScheduleRequest("m1", "dup", delay_ms=1))
    results = queue.schedule_many(requests)
    assert [r.id for r in results] == [r.id for r in requests]
    codes = [r.code for r in results]
    assert codes[3] is Code.EXISTS
    assert codes[10] is Code.EXISTS  # duplicate inside the same batch
    assert codes.count(Code.CREATED) == 9
    assert {r.slot for r in results} == {TOPIC.slot_of(f"m{i}") for i in range(10)}


def test_a_batch_is_one_script_call_per_broker_and_thousand_messages(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """The slots of a broker share one call (schedulemany-1) up to MAX_MESSAGES_PER_CALL
    messages; a call of one slot stays schedule-10."""
    redis_client.config_resetstat()
    queue.schedule_many([ScheduleRequest(f"m{i}", delay_ms=HOUR_MS) for i in range(400)])
    assert redis_client.info("commandstats")["cmdstat_fcall"]["calls"] == 1
    redis_client.config_resetstat()
    queue.schedule_many([ScheduleRequest(f"n{i}", delay_ms=HOUR_MS) for i in range(2_500)])
    assert redis_client.info("commandstats")["cmdstat_fcall"]["calls"] == 3
    redis_client.config_resetstat()
    queue.schedule_many([ScheduleRequest("one", delay_ms=HOUR_MS)])
    assert redis_client.info("commandstats")["cmdstat_fcall"]["calls"] == 1


def test_a_batch_stores_every_field_as_given_and_chunks_a_full_slot(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """schedule_many encodes its requests in one loop with shortcuts for the common request:
    every uncommon field still arrives as its validator encodes it, and a slot given more than
    MAX_MESSAGES_PER_CALL messages gets several calls."""
    now_ms = server_ms(redis_client)
    requests = [
        ScheduleRequest("plain", b"bytes", delay_ms=HOUR_MS),
        ScheduleRequest("text", "tëxt", at_ms=now_ms + HOUR_MS, headers={"b": "2", "a": "1"}),
        ScheduleRequest("array", bytearray(b"arr"), delay_ms=HOUR_MS, slot_basis="basis-1"),  # type: ignore[arg-type]
        ScheduleRequest("at", b"", delay_ms=HOUR_MS, expire_at_ms=now_ms + 2 * HOUR_MS),
        ScheduleRequest("ttl", b"t", delay_ms=HOUR_MS, ttl_ms=5_000),
    ]
    assert all(r.code is Code.CREATED for r in queue.schedule_many(requests))
    text, array = queue.get("text"), queue.get("array", slot_basis="basis-1")
    assert (text.payload, text.headers) == ("tëxt".encode(), {"a": "1", "b": "2"})
    assert (array.payload, array.slot) == (b"arr", TOPIC.slot_of("basis-1"))
    assert queue.get("at").expire_at_ms == now_ms + 2 * HOUR_MS
    ttl = queue.get("ttl")
    assert ttl.due_ms is not None
    assert ttl.expire_at_ms == ttl.due_ms + 5_000

    redis_client.config_resetstat()
    many = [ScheduleRequest(f"m{i}", slot_basis="one", delay_ms=HOUR_MS) for i in range(2_500)]
    assert {r.code for r in queue.schedule_many(many)} == {Code.CREATED}
    assert redis_client.info("commandstats")["cmdstat_fcall"]["calls"] == 3
    assert queue.stats().scheduled == len(requests) + len(many)


def test_one_bad_request_refuses_its_whole_batch(queue: Queue, redis_client: redis.Redis) -> None:
    good = [ScheduleRequest(f"g{i}", delay_ms=HOUR_MS) for i in range(20)]
    for bad in [
        ScheduleRequest("bad", delay_ms=HOUR_MS, headers={"k": 1}),  # type: ignore[dict-item]
        ScheduleRequest("bad", 7, delay_ms=HOUR_MS),  # type: ignore[arg-type]
        ScheduleRequest("bad", delay_ms=HOUR_MS, ttl_ms=0),
        ScheduleRequest("bad\n", delay_ms=HOUR_MS),
    ]:
        with pytest.raises(InvalidMessageError):
            queue.schedule_many([*good, bad])
    assert redis_client.dbsize() == 0


def test_slot_basis_routes_and_addresses_the_message(queue: Queue) -> None:
    result = queue.schedule("a", delay_ms=HOUR_MS, slot_basis="customer-7")
    assert result.slot == TOPIC.slot_of("customer-7")
    assert queue.get("a", slot_basis="customer-7").state is State.SCHEDULED
    assert queue.cancel("a", slot_basis="customer-7").code is Code.CANCELLED


def test_an_explicit_slot_addresses_a_message_without_its_basis(queue: Queue) -> None:
    """What a dead page offers: the slot that holds the message, its basis being unknown."""
    basis = next(
        b for b in (f"c-{n}" for n in range(100)) if TOPIC.slot_of(b) != TOPIC.slot_of("a")
    )
    slot = queue.schedule("a", delay_ms=HOUR_MS, slot_basis=basis).slot
    assert Target("a", explicit_slot=slot).slot(TOPIC) == slot
    [found, elsewhere] = queue.get_many([Target("a", explicit_slot=slot), Target("a")])
    assert (found.state, found.slot, elsewhere.state) == (State.SCHEDULED, slot, State.ABSENT)
    moved = queue.reschedule("a", delay_ms=2 * HOUR_MS, slot=slot)
    assert moved.code is Code.RESCHEDULED
    assert queue.cancel_many([Target("a", explicit_slot=slot)])[0].code is Code.CANCELLED


@pytest.mark.parametrize(
    "target", [Target("a", explicit_slot=-1), Target("a", "k", explicit_slot=0)]
)
def test_an_explicit_slot_outside_the_topic_or_beside_a_basis_is_refused(
    queue: Queue, target: Target
) -> None:
    with pytest.raises(InvalidMessageError, match="slot"):
        target.slot(TOPIC)
    with pytest.raises(InvalidMessageError):
        queue.get_many([target])
    outside = Target("a", explicit_slot=TOPIC.slot_amount)
    with pytest.raises(InvalidMessageError, match=f"outside 0..{TOPIC.slot_amount - 1}"):
        outside.slot(TOPIC)


def test_cancel_in_every_state(queue: Queue) -> None:
    queue.schedule("s", delay_ms=HOUR_MS)
    queue.schedule("p", delay_ms=0)
    leased = claim_one(queue, "p")
    assert queue.cancel("s").code is Code.CANCELLED
    assert queue.cancel("p").code is Code.CANCELLED
    assert queue.cancel("s").code is Code.NOT_FOUND
    with pytest.raises(LeaseLostError, match=r"^ack: message 'p': LEASE_LOST$"):
        queue.ack(leased.lease)
    assert queue.cancel_many([Target("nope")])[0].code is Code.NOT_FOUND


def test_reschedule_moves_due_and_revokes_a_lease(queue: Queue) -> None:
    queue.schedule("a", delay_ms=HOUR_MS)
    outcome = queue.reschedule("a", delay_ms=0)
    assert outcome.code is Code.RESCHEDULED
    leased = claim_one(queue, "a")
    moved = queue.reschedule("a", delay_ms=HOUR_MS)
    assert queue.get("a").state is State.SCHEDULED
    assert queue.get("a").due_ms == moved.at_ms
    with pytest.raises(LeaseLostError):
        queue.ack(leased.lease)
    with pytest.raises(NotFoundError, match=r"^reschedule: message 'zz': NOT_FOUND$"):
        queue.reschedule("zz", delay_ms=1)


def test_reschedule_refuses_dead_and_too_far(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("a", delay_ms=0)
    queue.nack(claim_one(queue, "a").lease, dead=True, reason="poison")
    with pytest.raises(WrongStateError):
        queue.reschedule("a", delay_ms=1)
    queue.schedule("b", delay_ms=0)
    with pytest.raises(TooFarError):
        queue.reschedule("b", at_ms=server_ms(redis_client) + MAX_DELAY_MS + HOUR_MS)


def test_claim_never_returns_a_message_early(queue: Queue, redis_client: redis.Redis) -> None:
    due = queue.schedule("a", delay_ms=150).due_ms
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    batch = queue.claim(slot, epoch)
    assert batch.messages == []
    assert batch.next_due_ms == due
    wait_for_server_ms(redis_client, due - 1)
    claimed: list[Message] = []
    while not claimed:
        batch = queue.claim(slot, epoch)
        claimed = batch.messages
        assert batch.now_ms >= due or not claimed
    assert claimed[0].due_ms == due
    assert claimed[0].attempt == 1


def test_claim_is_bounded_and_in_due_order(queue: Queue) -> None:
    queue.schedule_many([ScheduleRequest(f"m{i:03}", at_ms=1000 + i) for i in range(50)])
    for slot in TOPIC.slots:
        epoch = queue.take_over(slot)
        batch = queue.claim(slot, epoch, max_count=3)
        assert len(batch.messages) == 3
        dues = [m.due_ms for m in batch.messages]
        assert dues == sorted(dues)
        assert batch.next_due_ms is not None
        assert batch.next_due_ms >= dues[-1]


def test_a_claim_returns_every_record_shape_as_scheduled(redis_client: redis.Redis) -> None:
    """A claim's usual record (no optional field, no headers) is read with one split, every
    other through decode_record: both give what was scheduled, whatever the payload holds."""
    topic = Topic("shapes", slot_amount=1)
    queue = Queue(redis_client, topic)
    scheduled = {
        "plain": (b"0:looks:like:fields", {}),
        "empty": (b"", {}),
        "headed": (b"p:", {"k": "v"}),
        "expiring": (b"0:", {}),
    }
    for message_id, (payload, headers) in scheduled.items():
        ttl_ms = HOUR_MS if message_id == "expiring" else None
        queue.schedule(message_id, payload, delay_ms=0, headers=headers, ttl_ms=ttl_ms)
    epoch = queue.take_over(0)
    first = queue.claim(0, epoch, 10, ack_timeout_ms=1)
    assert {m.id: (m.payload, m.headers, m.attempt) for m in first.messages} == {
        message_id: (payload, headers, 1) for message_id, (payload, headers) in scheduled.items()
    }
    wait_for_server_ms(redis_client, first.now_ms + 2)  # the leases expire: claimed again
    again = queue.claim(0, epoch, 10)
    assert {m.id: (m.payload, m.headers, m.attempt) for m in again.messages} == {
        message_id: (payload, headers, 2) for message_id, (payload, headers) in scheduled.items()
    }
    assert {m.lease_id for m in again.messages} == {again.messages[0].lease_id}
    assert all(m.due_ms <= again.now_ms for m in again.messages)


@pytest.mark.parametrize("count", [1, 2, 125, 129, 600])
def test_a_claim_leases_exactly_its_ids_under_one_deadline(
    redis_client: redis.Redis, count: int
) -> None:
    """claim-13 adds its ids to prepare in reverse (a listpack finds each place at once): every
    claimed id, and no other, is leased until the claim's deadline, below, at and above the
    128 members where Redis converts a sorted set."""
    topic = Topic("leases", slot_amount=1)
    queue = Queue(redis_client, topic)
    queue.schedule_many([ScheduleRequest(f"m{i:04d}", delay_ms=0) for i in range(count + 5)])
    epoch = queue.take_over(0)
    batch = queue.claim(0, epoch, count, ack_timeout_ms=HOUR_MS)
    prepare = slot_keys(topic, 0).key(Part.PREPARE)
    # redis-py types the answer loosely; a client without decode_responses reads bytes
    leased = cast(list[tuple[bytes, float]], redis_client.zrange(prepare, 0, -1, withscores=True))
    assert sorted((m.id.encode(), float(batch.now_ms + HOUR_MS)) for m in batch.messages) == [
        (member, score) for member, score in leased
    ]
    assert [m.id for m in batch.messages] == [f"m{i:04d}" for i in range(count)]


def test_fencing_rejects_a_stale_owner(queue: Queue) -> None:
    queue.schedule("a", delay_ms=0)
    queue.schedule("b", delay_ms=0, slot_basis="a")
    slot = TOPIC.slot_of("a")
    old_epoch = queue.take_over(slot)
    leased = queue.claim(slot, old_epoch).messages
    new_epoch = queue.take_over(slot)
    assert new_epoch > old_epoch
    with pytest.raises(StaleEpochError, match=r"^claim: "):
        queue.claim(slot, old_epoch)
    with pytest.raises(StaleEpochError):
        queue.ack(leased[0].lease)
    with pytest.raises(StaleEpochError):
        queue.nack(leased[0].lease)
    with pytest.raises(StaleEpochError):
        queue.extend(leased[0].lease, 1000)
    # the takeover rolled the stale leases back (fence-10), the refused calls changed nothing
    assert queue.get("a").state is State.SCHEDULED


def test_a_takeover_rolls_the_previous_owners_leases_back_at_once(queue: Queue) -> None:
    """No message waits for a lease that can no longer be acked: the fence puts it back due
    now, its attempt counted (as an expired lease); one out of retries is given up instead."""
    queue.schedule("a", delay_ms=0)
    queue.schedule("b", delay_ms=0, slot_basis="a")
    slot = TOPIC.slot_of("a")
    old_epoch = queue.take_over(slot)
    leased = queue.claim(slot, old_epoch, ack_timeout_ms=3_600_000).messages
    assert {m.id for m in leased} == {"a", "b"}
    new_epoch = queue.take_over(slot)
    again = queue.claim(slot, new_epoch).messages  # no lease to wait for
    assert {(m.id, m.attempt) for m in again} == {("a", 2), ("b", 2)}
    retries = TOPIC.max_retries
    for _ in range(retries - 1):  # every further takeover counts one more attempt
        queue.claim(slot, queue.take_over(slot))
    queue.take_over(slot)
    assert queue.get("a").state is State.DEAD
    assert queue.get("a").attempts == retries + 1


def test_claim_before_any_takeover_is_stale(queue: Queue) -> None:
    with pytest.raises(StaleEpochError):
        queue.claim(0, 0)


def test_ack_removes_and_checks_the_lease_token(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("a", b"x", delay_ms=0)
    message = claim_one(queue, "a")
    wrong = type(message.lease)(message.slot, "a", message.attempt + 1, message.epoch)
    with pytest.raises(LeaseLostError):
        queue.ack(wrong)
    assert queue.ack(message.lease).code is Code.ACKED
    assert queue.get("a").state is State.ABSENT
    assert redis_client.hlen(slot_keys(TOPIC, message.slot).key(Part.MSG)) == 0
    with pytest.raises(LeaseLostError):
        queue.ack(message.lease)


def test_nack_backoff_is_honoured_exactly(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("a", delay_ms=0)
    message = claim_one(queue, "a")
    outcome = queue.nack(message.lease, delay_ms=200, reason="busy")
    assert outcome.code is Code.RETRY_SCHEDULED
    assert outcome.at_ms is not None
    info = queue.get("a")
    assert (info.state, info.due_ms, info.attempts) == (State.SCHEDULED, outcome.at_ms, 1)
    epoch = queue.take_over(message.slot)
    claimed: list[Message] = []
    while not claimed:
        batch = queue.claim(message.slot, epoch)
        claimed = batch.messages
        assert not claimed or batch.now_ms >= outcome.at_ms
    assert [(m.id, m.attempt) for m in claimed] == [("a", 2)]


@pytest.mark.parametrize("max_retries", [0, 1])
def test_max_retries_counts_retries_after_the_first_delivery(
    make_queue: MakeQueue, max_retries: int
) -> None:
    """`maxRetries` is what its name says (the CRD, docs/service.md): retries after the first
    delivery, so 1 + maxRetries deliveries in all; 0 retries nothing."""
    queue = make_queue(max_retries=max_retries)
    queue.schedule("a", b"", delay_ms=0)
    slot = queue.topic.slot_of("a")
    epoch = queue.take_over(slot)
    deliveries = 0
    while messages := queue.claim(slot, epoch).messages:
        deliveries += 1
        queue.nack(messages[0].lease, reason="failed")
    assert (deliveries, queue.get("a").state) == (1 + max_retries, State.DEAD)


def test_retries_exhausted_go_dead_then_redrive(queue: Queue) -> None:
    queue.schedule("a", b"payload", delay_ms=0)
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    for attempt in range(1, TOPIC.max_retries + 2):
        [message] = queue.claim(slot, epoch).messages
        assert message.attempt == attempt
        outcome = queue.nack(message.lease, reason=f"failure {attempt}")
    assert outcome.code is Code.DEAD
    info = queue.get("a")
    assert (info.state, info.dead_reason, info.attempts) == (State.DEAD, "failure 3", 3)
    page = queue.dead_page(slot)
    assert (page.total, [m.id for m in page.messages]) == (1, ["a"])
    assert page.messages[0].payload == b"payload"
    assert queue.redrive(slot, ["a", "nope"])[1].code is Code.WRONG_STATE
    info = queue.get("a")
    assert (info.state, info.attempts) == (State.SCHEDULED, 0)
    assert queue.claim(slot, epoch).messages[0].attempt == 1


def test_poison_message_is_killed_at_once(queue: Queue) -> None:
    queue.schedule("a", delay_ms=0)
    outcome = queue.nack(claim_one(queue, "a").lease, reason="unparseable", dead=True)
    assert outcome.code is Code.DEAD
    assert queue.get("a").dead_reason == "unparseable"


def test_expired_lease_rolls_back_and_counts_as_attempt(
    queue: Queue, redis_client: redis.Redis
) -> None:
    queue.schedule("a", delay_ms=0)
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    [first] = queue.claim(slot, epoch, ack_timeout_ms=50).messages
    batch = queue.claim(slot, epoch)
    assert batch.messages == []
    assert batch.next_deadline_ms is not None
    wait_for_server_ms(redis_client, batch.next_deadline_ms)
    [second] = queue.claim(slot, epoch).messages
    assert (second.id, second.attempt) == ("a", 2)
    with pytest.raises(LeaseLostError):
        queue.ack(first.lease)  # the slow first delivery cannot ack the second
    assert queue.ack(second.lease).code is Code.ACKED
    assert journal_events(redis_client, "a") == [
        "scheduled",
        "claimed",
        "expired",
        "claimed",
        "acked",
    ]


@pytest.mark.parametrize("jitter", [Jitter.NONE, Jitter.FULL])
def test_an_expired_lease_is_retried_after_the_backoff_a_nack_would_wait(
    queue: Queue, redis_client: redis.Redis, jitter: Jitter
) -> None:
    """Regression (issue 29): a lease that ran out was claimable again at once, whatever the
    retry policy. A claim given the policy puts it back due base * multiplier^(attempt - 1)
    after the lease's deadline (at most the ceiling with full jitter); never early."""
    backoff = Backoff(base_ms=400, multiplier=3.0, max_ms=60_000, jitter=jitter)
    # about 30 of one slot: a spread of full jitter below 200 ms is then one in 10^7
    ids = [f"a{n}" for n in range(120) if TOPIC.slot_of(f"a{n}") == TOPIC.slot_of("a0")]
    for message_id in ids:
        queue.schedule(message_id, delay_ms=0)
    slot = TOPIC.slot_of("a0")
    epoch = queue.take_over(slot)
    batch = queue.claim(slot, epoch, ack_timeout_ms=50, backoff=backoff)
    assert len(batch.messages) == len(ids)
    assert batch.next_deadline_ms is not None
    wait_for_server_ms(redis_client, batch.next_deadline_ms)
    rolled = queue.claim(slot, epoch, backoff=backoff)  # the claim that rolls them back
    deadline_ms = batch.next_deadline_ms  # every lease of the batch ends then
    # a retry due before the rolling claim's clock (a jitter near 0) is claimed by it
    early = {m.id: m.due_ms for m in rolled.messages}
    assert all(due_ms <= rolled.now_us // 1000 for due_ms in early.values())
    delays = [early.get(i, cast(int, queue.get(i).due_ms)) - deadline_ms for i in ids]
    if jitter is Jitter.NONE:  # attempt 1 failed: the base
        assert set(delays) == {400}
    else:  # spread over the range, within the ceiling
        assert all(0 <= delay <= 400 for delay in delays)
        assert max(delays) - min(delays) > 200
    wait_for_server_ms(redis_client, deadline_ms + 401)
    again = queue.claim(slot, epoch, backoff=backoff).messages + rolled.messages
    assert sorted(m.id for m in again) == sorted(ids)
    assert {m.attempt for m in again} == {2}


def test_a_claims_lease_head_is_the_slots_earliest_lease(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """The reply's next deadline is the earliest lease in the slot's prepare, whether the
    claim added leases, added an earlier one, added none, or rolled expired ones back (the
    claim reads prepare's head once and works the rest out unless a lease was over)."""
    slot = TOPIC.slot_of("a0")
    ids = [f"a{n}" for n in range(200) if TOPIC.slot_of(f"a{n}") == slot][:5]
    epoch = queue.take_over(slot)

    def claim(message_id: str | None, ack_timeout_ms: int) -> tuple[int, int | None]:
        if message_id is not None:
            queue.schedule(message_id, delay_ms=0)
        batch = queue.claim(slot, epoch, ack_timeout_ms=ack_timeout_ms)
        assert [m.id for m in batch.messages] == ([] if message_id is None else [message_id])
        return batch.now_us // 1000 + ack_timeout_ms, batch.next_deadline_ms

    first, head = claim(ids[0], 60_000)
    assert head == first  # prepare was empty: the claim's own
    _, head = claim(ids[1], 120_000)
    assert head == first  # a later lease added: the earlier one stays the head
    _, head = claim(None, 60_000)
    assert head == first  # nothing claimed
    short, head = claim(ids[2], 200)
    assert head == short  # an earlier lease added
    wait_for_server_ms(redis_client, short)
    rolled = queue.claim(slot, epoch, ack_timeout_ms=90_000)  # rolled back, claimed again
    assert [(m.id, m.attempt) for m in rolled.messages] == [(ids[2], 2)]
    assert rolled.next_deadline_ms == first


def test_a_claim_without_a_backoff_retries_an_expired_lease_at_once(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A caller of the previous version passes no backoff: as before, redelivered at once."""
    queue.schedule("a", delay_ms=0)
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    batch = queue.claim(slot, epoch, ack_timeout_ms=50)
    assert batch.next_deadline_ms is not None
    wait_for_server_ms(redis_client, batch.next_deadline_ms)
    [again] = queue.claim(slot, epoch).messages
    assert again.attempt == 2


def test_expired_leases_past_max_retries_go_dead(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("a", delay_ms=0)
    slot = TOPIC.slot_of("a")
    epoch = queue.take_over(slot)
    for _ in range(TOPIC.max_retries + 1):
        batch = queue.claim(slot, epoch, ack_timeout_ms=20)
        assert len(batch.messages) == 1
        assert batch.next_deadline_ms is not None
        wait_for_server_ms(redis_client, batch.next_deadline_ms)
    assert queue.claim(slot, epoch).messages == []
    info = queue.get("a")
    assert info.state is State.DEAD
    assert info.dead_reason == f"lease expired on attempt {TOPIC.max_retries + 1}"


def test_extend_moves_the_deadline(queue: Queue) -> None:
    queue.schedule("a", delay_ms=0)
    message = claim_one(queue, "a", ack_timeout_ms=1000)
    before = queue.get("a").lease_deadline_ms
    outcome = queue.extend(message.lease, 60_000)
    assert outcome.code is Code.EXTENDED
    assert before is not None
    assert outcome.at_ms is not None
    assert outcome.at_ms > before
    assert queue.get("a").lease_deadline_ms == outcome.at_ms


def test_extend_never_revives_an_expired_lease(queue: Queue, redis_client: redis.Redis) -> None:
    """A heartbeat held up past the deadline (Redis paused, a slow network) must not extend a
    lease the consumer has already stopped delivering under, even though nobody reclaimed it."""
    queue.schedule("a", delay_ms=0)
    message = claim_one(queue, "a", ack_timeout_ms=20)
    deadline_ms = queue.get("a").lease_deadline_ms
    assert deadline_ms is not None
    wait_for_server_ms(redis_client, deadline_ms + 1)
    with pytest.raises(LeaseLostError):
        queue.extend(message.lease, 60_000)
    assert queue.get("a").lease_deadline_ms == deadline_ms  # left for a claim to take back


def test_redrive_all_and_purge(queue: Queue) -> None:
    ids = [f"d{i}" for i in range(30)]
    queue.schedule_many([ScheduleRequest(i, delay_ms=0) for i in ids])
    for slot in TOPIC.slots:
        epoch = queue.take_over(slot)
        batch = queue.claim(slot, epoch)
        queue.nack_many([Retry(m.lease, dead=True, reason="x") for m in batch.messages])
    assert queue.stats().dead == 30
    assert queue.redrive_all() == 30
    assert queue.stats().dead == 0
    assert queue.stats().scheduled == 30
    for slot in TOPIC.slots:
        epoch = queue.take_over(slot)
        batch = queue.claim(slot, epoch)
        queue.nack_many([Retry(m.lease, dead=True) for m in batch.messages])
    slot = TOPIC.slot_of("d0")
    assert queue.purge(slot, ["d0"])[0].code is Code.PURGED
    assert queue.get("d0").state is State.ABSENT
    assert queue.purge_all() == 29
    assert queue.stats().dead == 0


def test_stats_per_slot_and_topic(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule("due", at_ms=1000)
    queue.schedule("later", delay_ms=HOUR_MS)
    queue.schedule("leased", delay_ms=0)
    claim_one(queue, "leased")
    stats = queue.stats()
    assert (stats.scheduled, stats.due, stats.prepared, stats.dead) == (2, 1, 1, 0)
    assert stats.next_due_ms == 1000
    assert stats.oldest_overdue_ms >= server_ms(redis_client) - 1000 - 1000
    slot_stats = queue.stats([TOPIC.slot_of("later")]).slots[0]
    assert slot_stats.slot == TOPIC.slot_of("later")


def test_stats_of_many_slots_match_each_slots_sets(redis_client: redis.Redis) -> None:
    """stats-3 reads up to 64 slots a call (the watchdog's read): over 128 slots in two calls,
    with slots empty, holding only later messages, due ones or leases, every slot's row is
    its own sets' counts and heads."""
    topic = Topic("wide", slot_amount=128)
    queue = Queue(redis_client, topic)
    queue.schedule_many(
        [ScheduleRequest(f"due{i}", at_ms=1000 + i) for i in range(60)]
        + [ScheduleRequest(f"later{i}", delay_ms=HOUR_MS + i) for i in range(90)]
    )
    due_slots = sorted({topic.slot_of(f"due{i}") for i in range(60)})
    leased = [due_slots[0], due_slots[-1]]  # one in each call
    for slot in leased:
        queue.claim(slot, queue.take_over(slot), max_count=1)
    redis_client.zadd(slot_keys(topic, 90).key(Part.DEAD), {"gone": 5})
    stats = queue.stats()
    now_ms = server_ms(redis_client)
    assert [s.slot for s in stats.slots] == list(topic.slots)
    for row in stats.slots:
        keys = slot_keys(topic, row.slot)
        store, prepare = keys.key(Part.STORE), keys.key(Part.PREPARE)
        heads = [redis_client.zrange(k, 0, 0, withscores=True) for k in (store, prepare)]
        assert (
            row.scheduled,
            row.due,
            row.prepared,
            row.dead,
            row.next_due_ms,
            row.next_deadline_ms,
        ) == (
            redis_client.zcard(store),
            redis_client.zcount(store, "-inf", now_ms),
            redis_client.zcard(prepare),
            redis_client.zcard(keys.key(Part.DEAD)),
            *(int(head[0][1]) if head else None for head in heads),
        ), row.slot
    assert (stats.scheduled, stats.prepared, stats.dead) == (148, 2, 1)
    assert leased[-1] >= 64


def test_journal_is_off_by_default(redis_client: redis.Redis) -> None:
    quiet = Queue(redis_client, Topic("quiet"))
    quiet.schedule("a", delay_ms=0)
    assert not [k for k in cast(list[bytes], redis_client.keys("*")) if k.endswith(b":journal")]


def test_orphan_id_without_record_never_blocks_the_slot(
    queue: Queue, redis_client: redis.Redis
) -> None:
    queue.schedule("good", at_ms=2000)
    slot = TOPIC.slot_of("good")
    redis_client.zadd(slot_keys(TOPIC, slot).key(Part.STORE), {"ghost": 1000})
    epoch = queue.take_over(slot)
    assert [m.id for m in queue.claim(slot, epoch).messages] == ["good"]
    assert redis_client.zscore(slot_keys(TOPIC, slot).key(Part.STORE), "ghost") is None


def test_the_pause_flag_is_read_without_its_value(queue: Queue, redis_client: redis.Redis) -> None:
    """Regression: the pause flag was read with GET, every second by every consumer and on
    every pass by the operator, and the topic's tenant holds the brokers' admin login: a flag
    set to a large value was sent whole each time (2 MB here; up to 512 MB a read)."""
    redis_client.set(paused_key(TOPIC), "x" * 2_000_000)
    before = int(redis_client.info("stats")["total_net_output_bytes"])
    assert queue.is_paused()
    assert int(redis_client.info("stats")["total_net_output_bytes"]) - before < 64 * 1024
    redis_client.delete(paused_key(TOPIC))
    assert not queue.is_paused()


class _PauseBeforeWrite(redis.Redis):
    """A client that runs `before_write` once, just before its first command that is not a
    read of the pause flag: what another holder does between a resume's check and its write."""

    before_write: Callable[[], object] | None = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.before_write is not None and args[0] not in ("GET", "EXISTS"):
            before, self.before_write = self.before_write, None
            before()
        return super().execute_command(*args, **options)


def test_a_pause_set_by_another_holder_before_a_resume_as_survives_it(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Regression: `resume_as` (the restore's final resume) was GET then DEL: a pause set in
    between by another holder (the API, the operator's spec.delivery.paused: "1") was deleted
    with the restore's. Now one script (resume-1) checks and deletes: the other pause stays. As
    the topic's service user, the restore's login (FCALL only)."""
    engine_user(redis_client)
    assert "+fcall" in service_user_rules(TOPIC)
    client = cast(
        _PauseBeforeWrite,
        _PauseBeforeWrite.from_url(
            redis_server.url, username=ENGINE_USER, password=ENGINE_PASSWORD
        ),
    )
    try:
        queue = Queue(client, TOPIC)
        assert queue.pause_as("restore")
        client.before_write = lambda: redis_client.set(paused_key(TOPIC), "1")
        assert not queue.resume_as("restore")
        assert client.before_write is None  # the other pause was set
        assert redis_client.get(paused_key(TOPIC)) == b"1"
        assert queue.is_paused()
        redis_client.set(paused_key(TOPIC), "restore")  # still its own: resumed
        assert queue.resume_as("restore")
        assert not queue.is_paused()
    finally:
        client.close()
