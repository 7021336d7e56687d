"""Lease tokens name one lease; give-back; the consuming transitions run on a full Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from delayq.queue.client import Queue
from delayq.queue.codes import Code, LeaseLostError
from delayq.queue.model import Message, Mode, Retry, ScheduleRequest, SlotClaim, State

from .conftest import TOPIC

LONG_LEASE_MS = 60_000


def claim(
    queue: Queue, slot: int, epoch: int, ack_timeout_ms: int = LONG_LEASE_MS
) -> list[Message]:
    return queue.claim(slot, epoch, 100, ack_timeout_ms).messages


def test_a_stale_token_cannot_ack_the_upserted_version(queue: Queue) -> None:
    """Lease v1, upsert v2, lease v2: both were attempt 1, but v1's token must not ack v2."""
    slot = TOPIC.slot_of("m")
    epoch = queue.take_over(slot)
    queue.schedule("m", b"v1", delay_ms=0)
    [v1] = claim(queue, slot, epoch)
    queue.schedule_many([ScheduleRequest("m", b"v2", delay_ms=0)], mode=Mode.UPSERT)
    [v2] = claim(queue, slot, epoch)
    assert (v1.attempt, v2.attempt) == (1, 1)
    assert v1.lease != v2.lease
    with pytest.raises(LeaseLostError):
        queue.ack(v1.lease)
    info = queue.get("m")
    assert (info.state, info.payload) == (State.PREPARED, b"v2")
    assert queue.ack(v2.lease).code is Code.ACKED


def test_a_stale_token_cannot_touch_a_new_message_with_the_same_id(queue: Queue) -> None:
    """Attempt 1 expires, attempt 2 is acked, the id is scheduled again and claimed (attempt 1
    again): the first delivery's late ack, nack or extend must all be refused."""
    slot = TOPIC.slot_of("n")
    epoch = queue.take_over(slot)
    queue.schedule("n", b"first", delay_ms=0)
    [first] = claim(queue, slot, epoch)
    queue.reschedule("n", delay_ms=0)  # the lease is lost, as by an expiry
    [second] = claim(queue, slot, epoch)
    queue.ack(second.lease)
    queue.schedule("n", b"again", delay_ms=0)
    [again] = claim(queue, slot, epoch)
    assert again.attempt == first.attempt == 1
    assert queue.ack_many([first])[0].code is Code.LEASE_LOST
    assert queue.extend_many([first], LONG_LEASE_MS)[0].code is Code.LEASE_LOST
    assert queue.nack_many([Retry(first.lease, 0, "late")])[0].code is Code.LEASE_LOST
    assert queue.giveback_many([first])[0].code is Code.LEASE_LOST
    assert queue.get("n").payload == b"again"
    assert queue.ack(again.lease).code is Code.ACKED


def test_giveback_returns_messages_undelivered_and_uncounted(queue: Queue) -> None:
    slot = TOPIC.slot_of("g")
    epoch = queue.take_over(slot)
    queue.schedule("g", b"x", delay_ms=0)
    [message] = claim(queue, slot, epoch)
    [outcome] = queue.giveback_many([message])
    assert outcome.code is Code.GIVEN_BACK
    info = queue.get("g")
    assert (info.state, info.attempts, info.due_ms) == (State.SCHEDULED, 0, message.due_ms)
    [again] = claim(queue, slot, epoch)
    assert again.attempt == 1  # the given-back claim did not count
    [twice] = queue.giveback_many([message])
    assert twice.code is Code.LEASE_LOST  # the old lease cannot give back the new one
    stale_epoch = queue.take_over(slot)
    assert stale_epoch > epoch
    [fenced] = queue.giveback_many([again])
    assert fenced.code is Code.STALE_EPOCH


@pytest.fixture
def full_redis(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """maxmemory just above what is used, noeviction: writes that grow memory are refused."""
    before = redis_client.config_get("maxmemory")["maxmemory"]
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    assert before is not None  # redis-py types every value as optional
    assert policy is not None
    redis_client.config_set("maxmemory-policy", "noeviction")
    try:
        yield redis_client
    finally:
        redis_client.config_set("maxmemory", before)
        redis_client.config_set("maxmemory-policy", policy)


def test_ownership_and_consumption_work_on_a_full_redis(
    queue: Queue, full_redis: redis.Redis
) -> None:
    """A full Redis refuses new messages, but slots still change owner (fence) and what is
    stored is still claimed, acked, nacked, extended and given back: draining frees memory."""
    slot = TOPIC.slot_of("a")
    queue.schedule_many(
        [ScheduleRequest(f"m{i}", b"p" * 100, delay_ms=0, slot_basis="a") for i in range(5)]
    )
    used = int(full_redis.info("memory")["used_memory"])
    full_redis.config_set("maxmemory", used - 1024 * 1024 if used > 2**21 else 1)
    with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
        queue.schedule("refused", b"x" * 1000, delay_ms=0)
    epoch = queue.take_over(slot)
    messages = claim(queue, slot, epoch)
    assert len(messages) == 5
    [extended] = queue.extend_many([messages[0]], LONG_LEASE_MS)
    assert extended.code is Code.EXTENDED
    assert queue.ack_many(messages[:2])[0].code is Code.ACKED
    assert queue.nack_many([Retry(messages[2].lease, 0, "x")])[0].code is Code.RETRY_SCHEDULED
    assert queue.giveback_many(messages[3:])[0].code is Code.GIVEN_BACK
    new_epoch = queue.take_over(slot)
    assert new_epoch > epoch


LARGE_PAYLOAD = b"p" * (256 * 1024)


def test_a_claim_of_large_payloads_stops_near_one_mib(queue: Queue) -> None:
    """A claim holds several copies of what it claims above maxmemory (records read, leased
    records, Redis's new values, the AOF buffer, the reply): with 256 KiB payloads a claim of
    20 took a full 64 MiB broker's container past its limit (OOM-killed on real pods,
    e2e/test_real_pods.py). A claim stops once its records reach 1 MiB (CLAIM_MAX_BYTES; a
    claimmany's slots share it), and what is left stays due: the reply says so and the next
    claims take it, nothing lost."""
    slots = [TOPIC.slot_of(basis) for basis in ("a", "b", "d")]
    assert len(set(slots)) == 3
    queue.schedule_many([
        ScheduleRequest(f"{basis}{i}", LARGE_PAYLOAD, delay_ms=0, slot_basis=basis)
        for basis in ("a", "b", "d") for i in range(8)
    ])
    epochs = {slot: queue.take_over(slot) for slot in slots}
    first = queue.claim(slots[0], epochs[slots[0]], 100, LONG_LEASE_MS)
    assert 1 <= len(first.messages) <= 4, "a claim past the byte bound"
    assert first.next_due_ms is not None
    assert first.next_due_ms <= first.now_us // 1000, "what is left is still due"
    together = queue.claim_slots(
        [SlotClaim(slot, epochs[slot], 100) for slot in slots], LONG_LEASE_MS
    )
    batches = [batch for batch in together if not isinstance(batch, BaseException)]
    assert 1 <= sum(len(batch.messages) for batch in batches) <= 4, "slots share one bound"
    seen = {m.id for m in first.messages} | {m.id for b in batches for m in b.messages}
    for _ in range(30):
        for slot in slots:
            seen |= {m.id for m in claim(queue, slot, epochs[slot])}
    assert seen == {f"{basis}{i}" for basis in ("a", "b", "d") for i in range(8)}
