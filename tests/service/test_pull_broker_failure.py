"""A pull topic over two brokers, one of which refuses claims or is down: a lease request hands
out what the other broker leased, rather than leasing it and handing out nothing, and long-polls
the other broker rather than failing at once.

Broker 1 is made a replica of an address where nothing listens, as a master demoted by a
failover is: it still answers reads (the pause flag) and refuses every write (READONLY), so
its claims fail while broker 0's succeed in the same round.
"""

from __future__ import annotations

import time
from typing import cast

import redis

from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.queue.keys import Part, slot_keys
from tests.service.conftest import StartService

SLOTS = 4  # slots 0, 1 on broker 0, 2, 3 on broker 1


def demote(url: str) -> None:
    """Make the Redis at `url` a replica of an address where nothing listens: READONLY."""
    demoted = redis.Redis.from_url(url)
    demoted.replicaof("127.0.0.1", str(free_port()))
    demoted.close()


async def test_a_broker_refusing_claims_strands_no_lease_of_another(
    redis_server: RedisServer, start_service: StartService
) -> None:
    """Regression: the claims of one round went to every broker at once and the first
    broker's failure raised out of the lease: the messages the other brokers had just leased
    were answered to nobody (a 503), each waiting out its lease and then retried with an
    attempt counted, on every lease request for as long as the broker refused."""
    with RedisServer() as second:
        running = await start_service(
            slot_amount=SLOTS, broker_urls=f"{redis_server.url},{second.url}"
        )
        topic = running.service.topic
        on_0 = [f"m{i}" for i in range(40) if topic.slot_of(f"m{i}") < 2][:5]
        on_1 = [f"m{i}" for i in range(40) if topic.slot_of(f"m{i}") >= 2][:2]
        for message_id in on_0 + on_1:
            created = await running.client.post(
                f"{running.base}/messages", json={"id": message_id, "delayMs": 0}
            )
            assert created.status == 201
        demote(second.url)

        answer = await running.client.post(f"{running.base}/leases", json={"max": 10, "waitMs": 0})
        leased = (await answer.json()).get("leases", []) if answer.status == 200 else []
        broker_0 = redis.Redis.from_url(redis_server.url)
        in_prepare = [
            member.decode()
            for slot in (0, 1)
            for member in cast(
                list[bytes], broker_0.zrange(slot_keys(topic, slot).key(Part.PREPARE), 0, -1)
            )
        ]
        broker_0.close()
        assert sorted(in_prepare) == sorted(on_0)  # every due message of broker 0 leased
        assert answer.status == 200, await answer.text()
        assert sorted(m["id"] for m in leased) == sorted(on_0)  # ... and handed out


async def test_a_broker_down_stops_no_lease_of_another(
    redis_server: RedisServer, start_service: StartService
) -> None:
    """Regression: every lease read the pause flags of all brokers first, all or nothing, so
    one broker down (killed, its node lost) answered every lease request 503 and stopped the
    delivery of every other broker's slots for as long as it was down."""
    with RedisServer() as second:
        running = await start_service(
            slot_amount=SLOTS, broker_urls=f"{redis_server.url},{second.url}"
        )
        topic = running.service.topic
        on_0 = [f"m{i}" for i in range(40) if topic.slot_of(f"m{i}") < 2][:3]
        second.crash()
        for message_id in on_0:
            created = await running.client.post(
                f"{running.base}/messages", json={"id": message_id, "delayMs": 0}
            )
            assert created.status == 201
        leased: list[str] = []
        for _ in range(3):  # the pause flags are read again each second at most
            answer = await running.client.post(
                f"{running.base}/leases", json={"max": 10, "waitMs": 1_500}
            )
            assert answer.status == 200, await answer.text()
            leased += [m["id"] for m in (await answer.json())["leases"]]
            if len(leased) >= len(on_0):
                break
        assert sorted(leased) == sorted(on_0)


async def test_a_long_poll_with_one_broker_down_waits_on_the_others(
    start_service: StartService,
):
    """Regression: a pull lease with `waitMs` whose claim reached a broker that was down, with
    nothing due on the others, answered 503 at once. It now waits `waitMs` on the brokers that
    answer (200, empty, or with what comes due there), reports the one down in /metrics; only
    when no broker answers is it a 503."""
    brokers = [RedisServer().start(), RedisServer().start()]
    try:
        urls = ",".join(broker.url for broker in brokers)
        running = await start_service(slot_amount=SLOTS, broker_urls=urls)
        brokers[1].stop()
        started = time.monotonic()
        answer = await running.client.post(f"{running.base}/leases", json={"waitMs": 600})
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["leases"] == []
        assert time.monotonic() - started >= 0.55  # it waited (clock slack)
        metrics = await (await running.client.get("/metrics")).text()
        assert (
            'delayq_pull_broker_unreachable{broker="1",topic="orders",topic_namespace="shop"} 1.0'
            in metrics
        )
        # a message coming due on the broker that answers during a wait is leased
        topic = running.service.topic
        on_0 = next(f"m{n}" for n in range(100) if topic.slot_of(f"m{n}") < 2)
        scheduled = await running.client.post(
            f"{running.base}/messages", json={"id": on_0, "delayMs": 300}
        )
        assert scheduled.status == 201
        answer = await running.client.post(f"{running.base}/leases", json={"waitMs": 5000})
        assert answer.status == 200, await answer.text()
        assert [m["id"] for m in (await answer.json())["leases"]] == [on_0]
        brokers[0].stop()  # none answers: a 503 once its pause read failed too
        started = time.monotonic()
        answer = await running.client.post(f"{running.base}/leases", json={"waitMs": 5000})
        assert answer.status == 503, await answer.text()
        assert time.monotonic() - started < 3
    finally:
        for broker in brokers:
            broker.stop()


async def test_a_long_poll_with_a_broker_refusing_claims_waits_on_the_others(
    redis_server: RedisServer, start_service: StartService
) -> None:
    """Regression: as above, with broker 1 demoted (READONLY) and a message due only there."""
    with RedisServer() as second:
        running = await start_service(
            slot_amount=SLOTS, broker_urls=f"{redis_server.url},{second.url}"
        )
        topic = running.service.topic
        on_1 = next(f"m{n}" for n in range(100) if topic.slot_of(f"m{n}") >= 2)
        created = await running.client.post(
            f"{running.base}/messages", json={"id": on_1, "delayMs": 0}
        )
        assert created.status == 201
        demote(second.url)
        started = time.monotonic()
        answer = await running.client.post(f"{running.base}/leases", json={"waitMs": 600})
        assert answer.status == 200, await answer.text()
        assert (await answer.json())["leases"] == []
        assert time.monotonic() - started >= 0.55
