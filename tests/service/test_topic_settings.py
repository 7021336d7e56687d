"""`delayq serve` publishes the settings of the topic it runs on a Redis of its own
(queue/topic_record.py), so every client's scripts obey them; a pod's restricted user leaves
that to the operator."""

from __future__ import annotations

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue import acl
from delayq.queue.client import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import slot_keys
from delayq.queue.model import ScheduleRequest
from delayq.queue.topic import Topic

from .conftest import NAMESPACE, TOPIC, StartService

#: What a producer built by hand knows of the topic: its name and slot amount, no limits.
BARE = Topic(TOPIC, namespace=NAMESPACE, slot_amount=4)


async def test_serve_publishes_its_settings_and_a_bare_producer_obeys_them(
    start_service: StartService, redis_client: redis.Redis
) -> None:
    await start_service(limits_max_pending=4)  # 1 per slot
    record = slot_keys(BARE, 3).settings
    assert redis_client.hget(record, "owner") == b"delayq-serve"
    slot = BARE.slot_of("a")
    ids = [i for i in (f"m{n}" for n in range(100)) if BARE.slot_of(i) == slot][:2]
    producer = Queue(redis_client, BARE)
    results = producer.schedule_many([ScheduleRequest(i, b"", delay_ms=60_000) for i in ids])
    assert [r.code for r in results] == [Code.CREATED, Code.OVER_QUOTA]


async def test_a_service_whose_user_may_not_write_the_record_starts_without_it(
    start_service: StartService, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    rules = acl.service_user_rules(BARE)
    redis_client.execute_command("ACL", "SETUSER", "svc", *rules, ">pw")
    url = redis_server.url.replace("redis://", "redis://svc:pw@")
    Queue(redis_client, BARE).schedule("loads-the-library", b"", delay_ms=0)  # as an admin
    running = await start_service(redis_url=url, limits_max_pending=4)
    assert running.service.topic.limits_max_pending == 4
    assert redis_client.exists(slot_keys(BARE, 0).settings) == 0
