"""Priority on a real service (in process, on the session's redis-server) and a real HTTP
receiver: when a backlog drains after an outage, the urgent messages go first, pushed to a
webhook and leased by pull consumers alike."""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.model import ScheduleRequest
from delayq.queue.topic import Topic, TopicType
from delayq.service.metrics import ServiceMetrics
from tests.service.conftest import NAMESPACE, TOPIC, Receiver, Running, StartService

#: The issue's backlog: 20,000 low and 200 high, every high one before the 1,000th low one
#: (about 2.5 s for the webhook, 1.2 s for pull leases on a loaded two-core host).
LOW, HIGH, BEFORE = 20_000, 200, 1_000


async def backlog(client: redis.asyncio.Redis, topic_type: TopicType) -> None:
    """LOW messages of priority 0 and HIGH of priority 5, all due already, the urgent ones
    due last: in due order every low one would go first."""
    seconds, _ = await client.time()
    now_ms = seconds * 1000
    topic = Topic(TOPIC, namespace=NAMESPACE, slot_amount=4, topic_type=topic_type)
    requests = [ScheduleRequest(f"low{i}", at_ms=now_ms - 60_000 + i) for i in range(LOW)]
    requests += [ScheduleRequest(f"high{i}", at_ms=now_ms - 1_000, priority=5) for i in range(HIGH)]
    for start in range(0, len(requests), 5_000):
        await AsyncQueue(client, topic).schedule_many(requests[start : start + 5_000])


async def started_by_priority(running: Running) -> dict[str, float]:
    """Deliveries started (pushed or leased) by priority, from the service's /metrics."""
    return counts_by_priority(await (await running.client.get("/metrics")).text())


def counts_by_priority(text: str) -> dict[str, float]:
    """The lateness histogram's count by priority in a /metrics answer."""
    return {
        sample.labels["priority"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "delayq_delivery_lateness_seconds_count"
    }


def assert_urgent_first(deliveries: list[dict[str, Any]]) -> None:
    """Every urgent delivery before the BEFORE-th other one, each telling its priority."""
    assert all(d["priority"] == (5 if d["id"].startswith("high") else 0) for d in deliveries)
    ids = [d["id"] for d in deliveries]
    lows = [n for n, message_id in enumerate(ids) if message_id.startswith("low")]
    highs = [n for n, message_id in enumerate(ids) if message_id.startswith("high")]
    assert len(lows) >= BEFORE
    assert len(highs) == HIGH, (len(highs), len(lows))
    assert max(highs) < lows[BEFORE - 1], (max(highs), lows[BEFORE - 1])


async def test_a_draining_backlog_pushes_every_urgent_message_before_the_1000th_other(
    start_service: StartService, receiver: Receiver, async_redis_client: redis.asyncio.Redis
) -> None:
    await backlog(async_redis_client, TopicType.WEBHOOK)
    started = time.monotonic()
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)

    def posted() -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in receiver.requests]

    await eventually(
        lambda: sum(d["id"].startswith("low") for d in posted()) >= BEFORE,
        30,
        f"{BEFORE} low POSTs",
    )
    assert_urgent_first(posted())
    assert time.monotonic() - started < 30
    started_by = await started_by_priority(running)
    assert started_by["5"] == HIGH
    assert started_by["0"] >= sum(d["id"].startswith("low") for d in posted())


async def test_pull_leases_hand_out_every_urgent_message_before_the_1000th_other(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
) -> None:
    await backlog(async_redis_client, TopicType.PULL)
    running = await start_service(topic_type="pull", pull_max_lease_batch=100)
    leased: list[dict[str, Any]] = []

    async def lease_some() -> bool:
        answer = await running.client.post(f"{running.base}/leases", json={"max": 100})
        leased.extend((await answer.json())["leases"])
        return sum(d["id"].startswith("low") for d in leased) >= BEFORE

    await eventually(lease_some, 30, f"{BEFORE} low leases")
    assert_urgent_first(leased)
    lows = sum(d["id"].startswith("low") for d in leased)
    assert await started_by_priority(running) == {"0": lows, "5": HIGH}
    # the dashboard's lateness counts every priority's leases
    assert running.service.metrics.activity().lateness_counts[-1] == lows + HIGH


def test_lateness_has_a_series_per_priority_and_ten_at_most() -> None:
    """A record a raw script call gave a priority outside 0..9 counts at the nearest bound:
    no writer adds series at will."""
    metrics = ServiceMetrics(NAMESPACE, TOPIC)
    for priority in (-1, 0, 5, 9, 12, 10**6, 5):
        metrics.observe_lateness(5.0, priority)
    assert counts_by_priority(metrics.render().decode()) == {"0": 2, "5": 2, "9": 3}
