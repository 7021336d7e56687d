"""Fair groups on a real redis-server, as the topic's restricted user: among due messages the
groups are claimed in turn, a group's leases stay within maxInFlightPerGroup, every path that
ends a lease takes it off its group's count, and store stays the truth (a grouped message whose
index entry is missing is still claimed)."""

from __future__ import annotations

import pytest
import redis

from delayq.queue import produce_plans
from delayq.queue.backup import snapshot
from delayq.queue.client import Queue
from delayq.queue.codes import InvalidMessageError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import GroupCounts, Message, Mode, ScheduleRequest
from delayq.queue.topic import Topic
from delayq.queue.topic_record import recorded_values

from .conftest import TOPIC, server_ms, wait_for_server_ms

BASIS = "one-slot"  # every message of a test in one slot, so one claim sees them all
SLOT = TOPIC.slot_of(BASIS)
KEYS = slot_keys(TOPIC, SLOT)


def _schedule(queue: Queue, message_id: str, at_ms: int, group: str | None = None) -> None:
    queue.schedule(message_id, at_ms=at_ms, slot_basis=BASIS, group=group)


def _claim(queue: Queue, epoch: int, count: int, lease_ms: int = 60_000) -> list[Message]:
    return list(queue.claim(SLOT, epoch, count, lease_ms).messages)


def _ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


def _bound_in_flight(admin: redis.Redis, per_group: int) -> None:
    """The slot's share of maxInFlightPerGroup as the topic's owner publishes it in the slot's
    settings record (recorded_values)."""
    admin.hset(KEYS.settings, "max_in_flight_per_group", per_group)


def _leases(admin: redis.Redis) -> list[bytes]:
    members: list[bytes] = admin.zrange(KEYS.key(Part.GROUP_LEASES), 0, -1)  # type: ignore[assignment]
    return members


def test_due_groups_are_claimed_in_turn_not_in_due_order(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for i in range(20):  # a herd of group a, due before any of b's
        _schedule(queue, f"a{i:02}", 1_000 + i, group="a")
    for i in range(3):
        _schedule(queue, f"b{i}", 2_000 + i, group="b")
    epoch = queue.take_over(SLOT)
    assert _ids(_claim(queue, epoch, 6)) == ["a00", "b0", "a01", "b1", "a02", "b2"]
    assert _ids(_claim(queue, epoch, 3)) == ["a03", "a04", "a05"]


def test_a_claim_comes_back_full_while_a_group_has_more_due(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A short batch tells the consumer its slot is drained: the few's leftover share goes to
    the herd."""
    for i in range(20):
        _schedule(queue, f"a{i:02}", 1_000 + i, group="a")
    _schedule(queue, "b0", 2_000, group="b")
    epoch = queue.take_over(SLOT)
    claimed = _ids(_claim(queue, epoch, 10))
    assert claimed == ["a00", "b0", "a01", "a02", "a03", "a04", "a05", "a06", "a07", "a08"]


def test_a_slot_whose_groups_are_at_their_bound_is_not_due_until_a_lease_ends(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Not 'due now' (its consumer would claim it again at once, for nothing): the end of a
    lease wakes it."""
    _bound_in_flight(redis_client, 1)
    for i in range(3):
        _schedule(queue, f"a{i}", 1_000 + i, group="a")
    epoch = queue.take_over(SLOT)
    [first] = _claim(queue, epoch, 10)
    batch = queue.claim(SLOT, epoch, 10, 60_000)
    assert batch.messages == []
    assert batch.next_due_ms is None  # nothing else waits in the slot
    redis_client.delete(KEYS.key(Part.WAKE))
    queue.ack(first.lease)
    assert redis_client.llen(KEYS.key(Part.WAKE)) == 1
    assert _ids(_claim(queue, epoch, 10)) == ["a1"]


def test_a_lease_s_end_wakes_its_slot_now_though_a_later_wake_up_waits(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A wake-up holds a due time for the consumer to claim at (lua/includes/wake_at.lua): a
    later one, not popped yet, must not put off the claim a lease's end owes its group now."""
    _bound_in_flight(redis_client, 1)
    for i in range(2):
        _schedule(queue, f"a{i}", 1_000 + i, group="a")
    epoch = queue.take_over(SLOT)
    [first] = _claim(queue, epoch, 10)
    assert queue.claim(SLOT, epoch, 10, 60_000).messages == []  # the group parked at its bound
    redis_client.delete(KEYS.key(Part.WAKE))
    redis_client.rpush(KEYS.key(Part.WAKE), "99999999999999")
    queue.ack(first.lease)
    assert redis_client.lrange(KEYS.key(Part.WAKE), 0, -1) == [b"1"]


def test_more_due_groups_than_a_claim_takes_are_served_round_robin(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for n, group in enumerate("abc"):  # a's all due first, then b's, then c's
        for i in range(4):
            _schedule(queue, f"{group}{i}", 1_000 * (n + 1) + i, group=group)
    epoch = queue.take_over(SLOT)
    served = [_ids(_claim(queue, epoch, 1))[0][0] for _ in range(9)]
    assert served == list("abcabcabc")


def test_ungrouped_messages_keep_due_order_and_no_group_part_exists(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for i in range(3):
        _schedule(queue, f"m{i}", 1_000 + 10 * (3 - i))
    assert redis_client.exists(*KEYS.keys(Part.GROUP_WAIT, Part.GROUPS, Part.GROUP_LEASES)) == 0
    epoch = queue.take_over(SLOT)
    messages = _claim(queue, epoch, 10)
    assert _ids(messages) == ["m2", "m1", "m0"]
    queue.ack(messages[0].lease)
    assert queue.get("m1", slot_basis=BASIS).group is None
    assert redis_client.exists(*KEYS.keys(Part.GROUP_WAIT, Part.GROUPS, Part.GROUP_LEASES)) == 0


def test_a_group_at_its_in_flight_bound_waits_while_others_and_ungrouped_go(
    queue: Queue, redis_client: redis.Redis
) -> None:
    _bound_in_flight(redis_client, 2)
    for i in range(10):
        _schedule(queue, f"a{i}", 1_000 + i, group="a")
    _schedule(queue, "b0", 2_000, group="b")
    _schedule(queue, "plain", 3_000)
    epoch = queue.take_over(SLOT)
    first = _claim(queue, epoch, 10)
    assert _ids(first) == ["a0", "b0", "a1", "plain"]  # store's pass leaves a's for its turn
    assert _claim(queue, epoch, 10) == []
    queue.ack(first[0].lease)  # one of a's leases ends: one more of a's
    assert _ids(_claim(queue, epoch, 10)) == ["a2"]
    assert _claim(queue, epoch, 10) == []


def test_every_end_of_a_lease_takes_it_off_its_groups_count(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Ack, nack, expiry (a consumer killed: nobody acks), give-back, cancel, reschedule,
    replacement and a new owner's fence each end a lease: each leaves the count at 0 and the
    group, parked at its bound of 1, served again. Each path has a message of its own (the
    topic retries twice)."""
    _bound_in_flight(redis_client, 1)
    epoch = queue.take_over(SLOT)

    def lease(message_id: str, lease_ms: int = 60_000) -> Message:
        _schedule(queue, message_id, 1_000, group="a")
        _schedule(queue, message_id + "-next", 1_001, group="a")  # waits for the bound
        [message] = _claim(queue, epoch, 10, lease_ms)
        assert message.id == message_id
        assert _leases(redis_client) == [b"a\0" + message_id.encode()]
        if lease_ms > 1:
            assert _claim(queue, epoch, 10) == []  # at the bound
        return message

    def ended(message_id: str, by_the_claim: bool = False) -> None:
        if not by_the_claim:
            assert _leases(redis_client) == []
        served = _claim(queue, epoch, 10)
        assert len(served) == 1  # the group is back in the round, within its bound
        assert _leases(redis_client) == [b"a\0" + served[0].id.encode()]
        queue.cancel(served[0].id, slot_basis=BASIS)
        for message_id_left in (message_id, message_id + "-next"):
            queue.cancel(message_id_left, slot_basis=BASIS)
        assert _leases(redis_client) == []  # cancelled while leased: ended too

    queue.ack(lease("acked").lease)
    ended("acked")
    queue.nack(lease("nacked").lease, delay_ms=3_600_000)
    ended("nacked")
    queue.giveback_many([lease("given")])
    ended("given")
    lease("expired", lease_ms=1)
    wait_for_server_ms(redis_client, server_ms(redis_client) + 5)
    ended("expired", by_the_claim=True)  # the claim rolls the expired lease back first
    queue.reschedule(lease("moved").id, at_ms=server_ms(redis_client) + 3_600_000,
                     slot_basis=BASIS)
    ended("moved")
    lease("replaced")
    queue.schedule("replaced", at_ms=server_ms(redis_client) + 3_600_000, slot_basis=BASIS,
                   group="a", mode=Mode.UPSERT)
    ended("replaced")
    lease("fenced")
    epoch = queue.take_over(SLOT)  # a new owner fences the old one's leases
    assert _leases(redis_client) == []
    assert len(_claim(queue, epoch, 10)) == 1


def test_a_count_left_by_a_lost_end_is_dropped_at_the_bound(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A count entry whose lease is gone (a path that missed it) cannot hold its group back."""
    _bound_in_flight(redis_client, 1)
    redis_client.zadd(KEYS.key(Part.GROUP_LEASES), {b"a\0ghost": 0})
    _schedule(queue, "a0", 1_000, group="a")
    epoch = queue.take_over(SLOT)
    assert _ids(_claim(queue, epoch, 10)) == ["a0"]
    assert _leases(redis_client) == [b"a\0a0"]


def test_a_grouped_message_without_its_index_entry_is_still_claimed(
    queue: Queue, redis_client: redis.Redis
) -> None:
    _schedule(queue, "a0", 1_000, group="a")
    _schedule(queue, "a1", 1_001, group="a")
    redis_client.delete(KEYS.key(Part.GROUP_WAIT), KEYS.key(Part.GROUPS))  # e.g. a doubling's
    epoch = queue.take_over(SLOT)
    assert _ids(_claim(queue, epoch, 10)) == ["a0", "a1"]


def _counted(queue: Queue) -> GroupCounts:
    return queue.stats([SLOT], groups=True).groups


def test_stats_count_the_groups_due_held_and_later_never_naming_them(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """What an operator sees of fair groups at work (delayq_fair_groups{state}): counts read
    from the claims' round in the stats call /metrics makes. A group at its bound counts as
    held once a claim found it there."""
    assert _counted(queue) == GroupCounts(0, 0, 0)  # no group: no round
    _bound_in_flight(redis_client, 1)
    for group in ("a", "b"):
        _schedule(queue, f"{group}0", 1_000, group=group)
        _schedule(queue, f"{group}1", 1_001, group=group)
    _schedule(queue, "c0", server_ms(redis_client) + 3_600_000, group="c")
    _schedule(queue, "plain", 2_000)
    epoch = queue.take_over(SLOT)
    assert _counted(queue) == GroupCounts(due=2, held=0, later=1)
    assert queue.stats([SLOT]).groups == GroupCounts()  # not asked: not counted (the watchdog)
    [a0] = _claim(queue, epoch, 1)
    assert _ids([a0, *_claim(queue, epoch, 1)]) == ["a0", "b0"]
    assert _counted(queue) == GroupCounts(due=2, held=0, later=1)  # not seen full yet
    assert _ids(_claim(queue, epoch, 1)) == ["plain"]  # found a at its bound: held
    assert _counted(queue) == GroupCounts(due=1, held=1, later=1)
    assert _claim(queue, epoch, 1) == []  # found b at its bound too
    assert _counted(queue) == GroupCounts(due=0, held=2, later=1)
    queue.ack(a0.lease)  # room for a: its turn again
    assert _counted(queue) == GroupCounts(due=1, held=1, later=1)


def test_a_group_travels_with_its_message(queue: Queue, redis_client: redis.Redis) -> None:
    group = "tenant:42/ü é"  # ':' and any printable text
    _schedule(queue, "m", 1_000, group=group)
    assert queue.get("m", slot_basis=BASIS).group == group
    epoch = queue.take_over(SLOT)
    [message] = _claim(queue, epoch, 1)
    queue.nack(message.lease, dead=True)
    [dead] = queue.dead_page(SLOT).messages  # the dead letters list it with its group
    assert (dead.id, dead.group) == ("m", group)
    assert queue.redrive(SLOT, ["m"])[0].id == "m"
    info = queue.get("m", slot_basis=BASIS)
    assert (info.group, info.state.value) == (group, "scheduled")
    assert _ids(_claim(queue, epoch, 1)) == ["m"]


def test_a_restored_backup_keeps_each_group_and_its_turn(
    queue: Queue, redis_client: redis.Redis
) -> None:
    for i in range(3):
        _schedule(queue, f"a{i}", 1_000 + i, group="a")
    _schedule(queue, "b0", 2_000, group="b")
    items = snapshot(redis_client, KEYS)
    redis_client.delete(*KEYS.keys(*Part))
    queue.run(produce_plans.restore(TOPIC, items))
    assert queue.get("b0", slot_basis=BASIS).group == "b"
    epoch = queue.take_over(SLOT)
    assert _ids(_claim(queue, epoch, 3)) == ["a0", "b0", "a1"]


@pytest.mark.parametrize(
    ("group", "problem"),
    [
        ("", "must be a non-empty string"),
        (7, "must be a non-empty string"),
        ("a\0b", "contains the control character U\\+0000"),
        ("x" * 129, "is longer than 128 bytes"),
        ("é" * 65, "is longer than 128 bytes"),
    ],
)
def test_a_bad_group_is_refused_naming_the_field(
    queue: Queue, redis_client: redis.Redis, group: object, problem: str
) -> None:
    with pytest.raises(InvalidMessageError, match=rf"^group .*{problem}"):
        queue.schedule_many([ScheduleRequest("m", delay_ms=0, group=group)])  # type: ignore[arg-type]
    assert redis_client.dbsize() == 0


def test_the_settings_record_holds_each_slots_share_of_the_bound() -> None:
    topic = Topic("orders", namespace="shop", slot_amount=4, max_in_flight_per_group=9)
    assert recorded_values(topic)["max_in_flight_per_group"] == "3"  # ceil(9 / 4)
    assert recorded_values(TOPIC)["max_in_flight_per_group"] == "0"  # no bound
