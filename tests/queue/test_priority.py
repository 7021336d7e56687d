"""Message priority on a real redis-server, as the topic's restricted user: among messages
already due a higher priority is claimed first, never one early; the priority stays with the
message through every transition that puts it back to wait (nack, an expired lease, give-back,
reschedule, redrive, a backup's restore) and leaves no index behind."""

from __future__ import annotations

import pytest
import redis

from delayq.queue import produce_plans
from delayq.queue.backup import snapshot
from delayq.queue.client import Queue
from delayq.queue.codes import Code, InvalidMessageError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Mode, ScheduleRequest

from .conftest import TOPIC, server_ms, wait_for_server_ms

BASIS = "one-slot"  # every message of a test in one slot, so one claim sees them all
SLOT = TOPIC.slot_of(BASIS)
HOUR_MS = 3_600_000


def _schedule(queue: Queue, message_id: str, at_ms: int, priority: int = 0) -> None:
    queue.schedule(message_id, at_ms=at_ms, slot_basis=BASIS, priority=priority)


def _claimed_ids(queue: Queue, epoch: int, count: int) -> list[str]:
    return [m.id for m in queue.claim(SLOT, epoch, count, 60_000).messages]


def _index_key() -> str:
    return slot_keys(TOPIC, SLOT).key(Part.PRIORITY)


def test_a_higher_priority_due_message_is_claimed_first_never_early(
    queue: Queue, redis_client: redis.Redis
) -> None:
    now = server_ms(redis_client)
    for i in range(5):
        _schedule(queue, f"low{i}", 1_000 + i)
    _schedule(queue, "p3", now - 10, priority=3)
    _schedule(queue, "p9", now - 5, priority=9)
    _schedule(queue, "p3-older", now - 20, priority=3)
    _schedule(queue, "p9-later", now + HOUR_MS, priority=9)  # not due: never claimed early
    epoch = queue.take_over(SLOT)
    claimed = queue.claim(SLOT, epoch, 4, 60_000).messages
    # each claimed message tells its priority (read from the record the claim answers)
    assert [m.id for m in claimed] == ["p9", "p3-older", "p3", "low0"]
    assert [m.priority for m in claimed] == [9, 3, 3, 0]
    assert _claimed_ids(queue, epoch, 10) == ["low1", "low2", "low3", "low4"]
    assert queue.get("p9-later", slot_basis=BASIS).priority == 9
    # the not-yet-due entry is all the index still holds
    assert redis_client.zrange(_index_key(), 0, -1) == [b"p9-later"]


def test_without_priorities_no_index_exists_and_order_is_due_order(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for i in range(3):
        _schedule(queue, f"m{i}", 1_000 + 10 * (3 - i))
    assert redis_client.exists(_index_key()) == 0
    epoch = queue.take_over(SLOT)
    assert _claimed_ids(queue, epoch, 10) == ["m2", "m1", "m0"]
    assert queue.get("m0", slot_basis=BASIS).priority == 0


def test_a_message_keeps_its_priority_through_every_return_to_waiting(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for i in range(3):
        _schedule(queue, f"low{i}", 1_000 + i)
    _schedule(queue, "high", 2_000, priority=5)
    epoch = queue.take_over(SLOT)
    [high] = queue.claim(SLOT, epoch, 1, 60_000).messages
    assert high.id == "high"
    queue.nack(high.lease)  # retried at once: first again
    [high] = queue.claim(SLOT, epoch, 1, 60_000).messages
    assert high.id == "high"
    queue.giveback_many([high])
    [high] = queue.claim(SLOT, epoch, 1, 1).messages  # a lease of 1 ms runs out
    assert high.id == "high"
    wait_for_server_ms(redis_client, server_ms(redis_client) + 5)
    [high] = queue.claim(SLOT, epoch, 1, 60_000).messages  # rolled back, then claimed first
    assert (high.id, high.attempt) == ("high", 3)
    queue.nack(high.lease, dead=True)
    assert [m.priority for m in queue.dead_page(SLOT).messages] == [5]  # the dead page's too
    assert queue.redrive(SLOT, ["high"])[0].id == "high"
    queue.reschedule("high", at_ms=3_000, slot_basis=BASIS)
    assert _claimed_ids(queue, epoch, 2) == ["high", "low0"]


def test_upsert_and_cancel_take_the_priority_away(
    queue: Queue, redis_client: redis.Redis
) -> None:
    _schedule(queue, "low", 1_000)
    _schedule(queue, "was-high", 2_000, priority=7)
    _schedule(queue, "cancelled", 2_000, priority=7)
    queue.cancel("cancelled", slot_basis=BASIS)
    queue.schedule("was-high", at_ms=2_000, slot_basis=BASIS, mode=Mode.UPSERT)
    assert redis_client.exists(_index_key()) == 0
    epoch = queue.take_over(SLOT)
    assert _claimed_ids(queue, epoch, 10) == ["low", "was-high"]


def test_a_restored_backup_keeps_each_priority(queue: Queue, redis_client: redis.Redis) -> None:
    _schedule(queue, "low", 1_000)
    _schedule(queue, "high", 2_000, priority=4)
    items = snapshot(redis_client, slot_keys(TOPIC, SLOT))
    redis_client.delete(*slot_keys(TOPIC, SLOT).keys(*Part))
    queue.run(produce_plans.restore(TOPIC, items))
    assert queue.get("high", slot_basis=BASIS).priority == 4
    epoch = queue.take_over(SLOT)
    assert _claimed_ids(queue, epoch, 10) == ["high", "low"]


@pytest.mark.parametrize("priority", [-1, 10, True, 1.5, "3", None])
def test_a_priority_out_of_range_or_not_an_integer_is_refused(
    queue: Queue, redis_client: redis.Redis, priority: object
) -> None:
    with pytest.raises(InvalidMessageError, match=r"priority .* must be an integer from 0 to 9"):
        queue.schedule_many([ScheduleRequest("m", delay_ms=0, priority=priority)])  # type: ignore[arg-type]
    assert redis_client.dbsize() == 0


def test_a_batch_sends_priorities_only_when_one_has_one(queue: Queue) -> None:
    """A batch without priorities sends the 8 values per message it always did; one with a
    priority sends 9 for each, in every call of the batch, and each message keeps its own."""
    plain = [ScheduleRequest(f"m{i}", delay_ms=HOUR_MS) for i in range(2_500)]
    [call, *_] = produce_plans.schedule_answers(TOPIC, plain, Mode.CREATE).calls
    assert call.args[6] == produce_plans.FIELDS_PER_REQUEST == 8
    mixed = [r._replace(priority=i % 10) for i, r in enumerate(plain)]
    calls = produce_plans.schedule_answers(TOPIC, mixed, Mode.CREATE).calls
    assert [c.args[6] for c in calls] == [9, 9, 9]
    queue.schedule_many(mixed)
    for i in (0, 1, 999, 1_000, 2_499):
        assert queue.get(f"m{i}").priority == i % 10


def test_prioritized_messages_past_a_claims_byte_bound_stay_due_with_their_priority(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Regression (the byte bound met the priority pass): a claim stops at 1 MiB of records,
    and the prioritized messages it did not reach must stay in store and in the index, not
    be left with a record and no place (lost)."""
    now = server_ms(redis_client)
    large = b"p" * (256 * 1024)
    for i in range(8):
        queue.schedule(f"big{i}", large, at_ms=now - 100 + i, slot_basis=BASIS, priority=5)
    _schedule(queue, "low", now - 200)
    epoch = queue.take_over(SLOT)
    first = _claimed_ids(queue, epoch, 100)
    assert 1 <= len(first) <= 4
    assert first == [f"big{i}" for i in range(len(first))]
    rest = [f"big{i}" for i in range(len(first), 8)]
    assert sorted(redis_client.zrange(_index_key(), 0, -1)) == [i.encode() for i in rest]
    claimed = list(first)
    for _ in range(10):
        claimed += _claimed_ids(queue, epoch, 100)
    assert claimed == [f"big{i}" for i in range(8)] + ["low"], "priority first, none lost"


@pytest.mark.parametrize("part", [Part.STORE, Part.PREPARE])
def test_a_reschedule_moves_an_id_without_a_record_as_it_did(
    queue: Queue, redis_client: redis.Redis, part: Part
) -> None:
    """Regression: reschedule-7 reads the record for its priority; an id in store or prepare
    without one (an orphan, which a claim removes: it must never block its slot) made the
    script fail with a Lua error, the rest of its batch unapplied. It is moved as it was
    before priorities, and the claim removes it."""
    redis_client.zadd(slot_keys(TOPIC, SLOT).key(part), {"ghost": 1_000})
    _schedule(queue, "real", 2_000, priority=2)
    assert queue.reschedule("ghost", at_ms=3_000, slot_basis=BASIS).code is Code.RESCHEDULED
    assert redis_client.zscore(slot_keys(TOPIC, SLOT).key(Part.STORE), "ghost") == 3_000
    epoch = queue.take_over(SLOT)
    assert _claimed_ids(queue, epoch, 10) == ["real"]
    assert redis_client.zscore(slot_keys(TOPIC, SLOT).key(Part.STORE), "ghost") is None
