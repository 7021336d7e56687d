"""The restore transition (`restore-13`) on a real redis-server, as the topic's restricted user:
create-only per item, the topic's limits (maximum delay, maxPending) held, a frozen slot
refused, and a restored message claimed with its attempts and never before its due."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.queue import produce_plans, topic_record
from delayq.queue.backup import Item, Kind
from delayq.queue.client import Queue
from delayq.queue.codes import Code, SlotMovingError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import State
from delayq.queue.topic import MAX_DELAY_MS

from .conftest import ENGINE_PASSWORD, ENGINE_USER, TOPIC, engine_user


def _waiting(message_id: str, due_ms: int, attempts: int = 0) -> Item:
    return Item(Kind.WAITING, message_id, due_ms, f"{attempts}:::0:p".encode(), None, "", "b")


def _now_ms(queue: Queue) -> int:
    seconds, micros = queue.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_restore_is_create_only_and_keeps_attempts(queue: Queue) -> None:
    due_ms = _now_ms(queue) - 1  # overdue: delivered at once, not before its due
    items = [_waiting("m", due_ms, attempts=2), _waiting("n", due_ms + 60_000)]
    dead = Item(Kind.DEAD, "d", due_ms, b"3:::0:p", "poison", "", "b")
    first = queue.run(produce_plans.restore(TOPIC, [*items, dead]))
    assert [o.code for o in first] == [Code.CREATED] * 3
    again = queue.run(produce_plans.restore(TOPIC, [*items, dead]))
    assert [o.code for o in again] == [Code.EXISTS] * 3
    slot = TOPIC.slot_of("b")
    [message] = queue.claim(slot, queue.take_over(slot), 10, 30_000).messages
    assert (message.id, message.attempt, message.due_ms) == ("m", 3, due_ms)
    info = queue.get("d", slot_basis="b")
    assert (info.state, info.dead_reason, info.attempts) == (State.DEAD, "poison", 3)


def test_restore_holds_the_topics_limits(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    limited = dataclasses.replace(TOPIC, name="limited", limits_max_pending=4)  # 1 per slot
    engine_user(redis_client, limited)
    client = redis.Redis.from_url(redis_server.url, username=ENGINE_USER, password=ENGINE_PASSWORD)
    queue = Queue(client, limited)
    try:
        now_ms = _now_ms(queue)
        items = [_waiting("a", now_ms + 60_000), _waiting("b2", now_ms + 60_000)]
        items.append(_waiting("far", now_ms + MAX_DELAY_MS + 60_000))
        codes = [o.code for o in queue.run(produce_plans.restore(limited, items))]
        assert codes == [Code.CREATED, Code.OVER_QUOTA, Code.TOO_FAR]
    finally:
        client.close()


def test_restore_obeys_the_topics_settings_record_over_its_flags(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A restore run without `--limits-max-pending` (its `Topic` has no quota) still holds the
    quota the topic's owner published (queue/topic_record.py), as every script does."""
    published = dataclasses.replace(TOPIC, limits_max_pending=TOPIC.slot_amount)  # 1 per slot
    Queue(redis_client, published).publish_settings(topic_record.SERVE_OWNER, 1)  # as the admin
    now_ms = _now_ms(queue)
    items = [_waiting("a", now_ms + 60_000), _waiting("b2", now_ms + 60_000)]
    codes = [o.code for o in queue.run(produce_plans.restore(TOPIC, items))]
    assert codes == [Code.CREATED, Code.OVER_QUOTA]


def test_restore_refuses_a_slot_frozen_for_a_move(queue: Queue, redis_client: redis.Redis) -> None:
    redis_client.set(slot_keys(TOPIC, TOPIC.slot_of("b")).key(Part.EPOCH), "moving:3")
    with pytest.raises(SlotMovingError):
        queue.run(produce_plans.restore(TOPIC, [_waiting("m", _now_ms(queue) + 1000)]))
    assert redis_client.hlen(slot_keys(TOPIC, TOPIC.slot_of("b")).key(Part.MSG)) == 0
