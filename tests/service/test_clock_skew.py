"""A real `delayq serve` process whose wall clock is five minutes off (libfaketime, +5 min and
-5 min): webhook signatures and the lateness histogram stay on the Redis server clock.

With the pod clock, a -5 min pod signs timestamps five minutes old (receivers' Standard
Webhooks libraries refuse them), and a +5 min pod measures every delivery 300 s late (the
histogram's +Inf bucket)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook, WebhookVerificationError

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig
from delayq.service.delivery.signing import TIMESTAMP_HEADER
from tests.faketime import faketime_env, faketime_library
from tests.service.conftest import Receiver

TOPIC = "skewed"
SECRET = "whsec_s90F3173TNnXZ6MHBkBQkEaPqCvo1HBDgjmnDI6Lxk0="
OTHER_SECRET = "whsec_e4PgkydFiiQ0ZklSnJXIF88pPfYnW5+5HlIO+97avtI="
SKEW_S = 300  # five minutes: the tolerance of the standardwebhooks library
MESSAGES = 5
DELAY_MS = 1000
CLOSE_S = 3.0  # how near the real time a signature timestamp must be
LATENESS = "delayq_delivery_lateness_seconds"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
async def serving() -> AsyncIterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.terminate()
        process.wait(10)


def real_ms() -> int:
    return int(time.time() * 1000)


def lateness_buckets(exposition: str) -> dict[float, float]:
    """Upper bound -> cumulative count of the lateness histogram."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == LATENESS + "_bucket" and sample.labels.get("topic") == TOPIC:
                buckets[float(sample.labels["le"])] = sample.value
    return buckets


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead-5min", "behind-5min"])
async def test_signatures_and_lateness_use_the_redis_clock_not_the_pod_clock(
    skew_s: int,
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    if faketime_library() is None:
        pytest.skip("libfaketime missing: install the Debian package faketime (scripts/setup.sh)")
    received_ms: list[int] = []

    async def record_time(_call: int) -> int:
        received_ms.append(real_ms())
        return 200

    receiver.answer = record_time
    config = ServiceConfig(
        redis_url=redis_server.url,
        topic=TOPIC,
        slot_amount=8,
        port=free_port(),
        topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url,
        webhook_secret=SECRET,
        grace_ms=2000,
    )
    process = ServeProcess(config, tmp_path / "serve.log", extra_env=faketime_env(skew_s)).start()
    serving.append(process)

    async def ready() -> bool:
        assert process.running(), process.log_path.read_text()
        try:
            async with session.get(process.url + "/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(ready, 15, "the skewed serve process to be ready")

    # the process's wall clock really is off (aiohttp stamps Date with it)
    async with session.get(process.url + "/healthz") as response:
        pod_s = parsedate_to_datetime(response.headers["Date"]).timestamp()
    assert abs(pod_s - time.time() - skew_s) < 5, "libfaketime did not skew the process clock"

    messages = [{"id": f"m{i}", "delayMs": DELAY_MS, "payload": f"p{i}"} for i in range(MESSAGES)]
    scheduled_ms = real_ms()
    url = f"{process.url}/v1/topics/{TOPIC}/messages/batch"
    async with session.post(url, json={"messages": messages}) as response:
        assert response.status == 200, await response.text()
    await eventually(
        lambda: len(receiver.requests) >= MESSAGES, 15, f"{MESSAGES} webhook deliveries"
    )

    for (headers, body), at_ms in zip(receiver.requests, received_ms, strict=True):
        Webhook(SECRET).verify(body, headers)  # raises when refused
        with pytest.raises(WebhookVerificationError):
            Webhook(OTHER_SECRET).verify(body, headers)
        signed_ms = int(headers[TIMESTAMP_HEADER]) * 1000  # whole seconds, rounded down
        # on the Redis clock: within a few seconds of the real time, not five minutes off
        assert abs(at_ms - signed_ms) < CLOSE_S * 1000, (signed_ms, at_ms, skew_s)
        assert signed_ms >= scheduled_ms + DELAY_MS - 1100, "signed before the message was due"

    async def scraped() -> dict[float, float]:
        async with session.get(process.url + "/metrics") as response:
            return lateness_buckets(await response.text())

    async def all_observed() -> bool:
        return (await scraped()).get(float("inf"), 0) >= MESSAGES

    await eventually(all_observed, 5, "the lateness of every delivery on /metrics")
    buckets = await scraped()
    # on the Redis clock every delivery starts within a second of its due time; on a +5 min pod
    # clock they would all be in +Inf (on a -5 min one clamped to 0: the timestamps above catch it)
    assert buckets[1.0] == buckets[float("inf")] == MESSAGES, buckets
