"""The read-only topic views (`/overview`, `/slots`), the read-only token and the dashboard's
files, on a real service and the session's real redis-server."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.queue.keys import Part, slot_keys
from delayq.queue.topic import TopicType
from delayq.service.overview import STALLED_AFTER_MS, quantile_ms
from tests.queue.conftest import ENGINE_PASSWORD, ENGINE_USER, engine_user
from tests.service.conftest import StartService


async def schedule(running, message_id: str, delay_ms: int, **extra) -> dict[str, Any]:
    answer = await running.client.post(
        f"{running.base}/messages", json={"id": message_id, "delayMs": delay_ms, **extra}
    )
    assert answer.status == 201, await answer.text()
    return await answer.json()


async def make_stalled(running, async_redis_client: redis.asyncio.Redis) -> int:
    """Schedule "late" and make it overdue by more than the stall threshold, as if nobody had
    claimed it for long; its slot."""
    slot: int = (await schedule(running, "late", 60_000))["slot"]
    store = slot_keys(running.service.topic, slot).key(Part.STORE)
    now_s, now_us = await async_redis_client.time()
    overdue_at = now_s * 1000 + now_us // 1000 - STALLED_AFTER_MS - 5_000
    await async_redis_client.zadd(store, {"late": overdue_at})
    return slot


async def test_overview_counts_depth_and_due_windows(start_service: StartService):
    running = await start_service(topic_type="pull")
    for number, delay_ms in enumerate((30_000, 50_000, 600_000, 7_200_000, 3 * 86_400_000)):
        await schedule(running, f"m{number}", delay_ms)
    answer = await running.client.get(f"{running.base}/overview")
    assert answer.status == 200
    body = await answer.json()
    assert body["depth"] == {"scheduled": 5, "due": 0, "prepared": 0, "dead": 0}
    assert body["dueHistogram"] == {
        "overdue": 0,
        "nextMinute": 2,
        "nextHour": 1,
        "nextDay": 1,
        "later": 1,
    }
    assert body["fleet"]["heldSlots"] == 4
    assert body["fleet"]["unownedSlots"] == 0
    assert body["process"]["member"] == running.service.config.member
    assert 0 < body["nextDueMs"] - body["nowMs"] <= 30_000
    stats = await (await running.client.get(f"{running.base}/stats")).json()
    assert stats["scheduled"] == body["depth"]["scheduled"]


async def test_views_run_as_the_topics_restricted_redis_user(
    start_service: StartService, redis_server: RedisServer, redis_client: redis.Redis
):
    """A pod logs in as the topic's ACL user: the views need no command it lacks (no KEYS, no
    code of their own: the `overview` function of the library the admin loaded)."""
    engine_user(redis_client)
    host_port = redis_server.url.removeprefix("redis://")
    url = f"redis://{ENGINE_USER}:{ENGINE_PASSWORD}@{host_port}"
    running = await start_service(redis_url=url, topic_type="pull")
    await schedule(running, "a", 1000)
    for path in ("/overview", "/slots"):
        answer = await running.client.get(running.base + path)
        assert answer.status == 200, await answer.text()
    body = await (await running.client.get(f"{running.base}/overview")).json()
    assert body["depth"]["scheduled"] == 1


async def test_slots_show_epoch_owner_and_flag_stalled_slots(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
):
    running = await start_service(topic_type="pull")
    slot = await make_stalled(running, async_redis_client)
    page = await (await running.client.get(f"{running.base}/slots?only=attention")).json()
    assert [s["slot"] for s in page["slots"]] == [slot]
    row = page["slots"][0]
    assert row["stalled"] is True
    assert row["due"] == 1
    assert row["oldestOverdueMs"] >= STALLED_AFTER_MS
    assert row["owner"] == running.service.config.member
    epoch = await async_redis_client.get(slot_keys(running.service.topic, slot).key(Part.EPOCH))
    assert epoch is not None
    assert row["epoch"] == int(epoch)
    everything = await (await running.client.get(f"{running.base}/slots?count=3")).json()
    assert [s["slot"] for s in everything["slots"]] == [0, 1, 2]
    assert everything["nextStart"] == 3


async def test_pause_shows_on_the_overview_at_once_and_a_paused_slot_is_not_stalled(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
):
    """Paused is read from Redis by the view (every process answers the same), the cached
    view is dropped by pause and resume (no second of stale state), and a slot that waits
    because delivery is paused is not reported stalled: it waits on purpose."""
    running = await start_service(topic_type="pull")
    client, base = running.client, running.base
    slot = await make_stalled(running, async_redis_client)
    before = await (await client.get(f"{base}/overview")).json()
    assert (before["paused"], before["pausedBrokers"], before["fleet"]["stalled"]) == (
        False,
        [],
        [slot],
    )
    assert (await client.post(f"{base}/pause")).status == 200
    paused = await (await client.get(f"{base}/overview")).json()
    assert (paused["paused"], paused["pausedBrokers"], paused["fleet"]["stalledSlots"]) == (
        True,
        [0],
        0,
    )
    [row] = (await (await client.get(f"{base}/slots?start={slot}&count=1")).json())["slots"]
    assert (row["paused"], row["stalled"], row["due"]) == (True, False, 1)
    assert (await client.post(f"{base}/resume")).status == 200
    resumed = await (await client.get(f"{base}/overview")).json()
    assert (resumed["paused"], resumed["pausedBrokers"]) == (False, [])


async def test_slots_refuse_bad_paging_naming_the_parameter(start_service: StartService):
    running = await start_service()
    for query, field in (
        ("start=4", "start"),
        ("start=-1", "start"),
        ("count=0", "count"),
        ("count=1025", "count"),
        ("count=%EF%BC%95", "count"),
        ("only=everything", "only"),
    ):
        answer = await running.client.get(f"{running.base}/slots?{query}")
        assert answer.status == 400, query
        assert (await answer.json())["field"] == field


async def test_read_token_reads_but_never_writes(start_service: StartService):
    running = await start_service(api_token="admin", read_token="viewer")
    client, base = running.client, running.base
    viewer = {"Authorization": "Bearer viewer"}
    for path in ("/overview", "/slots", "/stats", "/dead"):
        assert (await client.get(base + path, headers=viewer)).status == 200, path
    write = await client.post(f"{base}/messages", json={"id": "a", "delayMs": 1}, headers=viewer)
    assert write.status == 403
    assert "read-only" in (await write.json())["error"]
    purge = await client.post(f"{base}/dead/purge", json={"all": True}, headers=viewer)
    assert purge.status == 403
    assert (await client.get(f"{base}/overview")).status == 401
    admin = {"Authorization": "Bearer admin"}
    stored = await client.post(f"{base}/messages", json={"id": "a", "delayMs": 1}, headers=admin)
    assert stored.status == 201


async def test_dashboard_files_are_served_with_a_strict_policy(start_service: StartService):
    running = await start_service(api_token="admin")
    page = await running.client.get("/ui")  # no token: the files hold no data
    assert page.status == 200
    assert page.content_type == "text/html"
    assert 'name="delayq-topic" content="orders"' in await page.text()
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    script = await running.client.get("/ui/app.js")
    assert script.status == 200
    assert script.content_type == "text/javascript"
    assert "innerHTML" not in await script.text()
    assert (await running.client.get("/ui/nothing.js")).status == 404
    assert (await running.client.get("/ui/..%2Fapi.py")).status == 404


def test_quantile_is_the_upper_bound_of_the_bucket():
    bounds = (0.001, 0.01, 0.1, float("inf"))
    assert quantile_ms(bounds, (0, 0, 0, 0), 0.5) is None
    assert quantile_ms(bounds, (10, 90, 100, 100), 0.5) == 10.0
    assert quantile_ms(bounds, (10, 90, 99, 100), 0.99) == 100.0
    assert quantile_ms(bounds, (0, 0, 0, 5), 0.5) == 100.0


async def test_overview_keeps_its_depths_when_zookeeper_is_down(redis_server: RedisServer):
    """Depths matter most when the coordination is in trouble: the overview still answers
    (ownership marked unknown, with why), the heat map keeps its depths without owners, the
    slot map's table says 503 instead of guessing."""
    from aiohttp.test_utils import TestClient, TestServer

    from delayq.local.waiting import eventually
    from delayq.local.zookeeper_server import ZooKeeperServer
    from delayq.service.api import build_app
    from delayq.service.config import ServiceConfig
    from delayq.service.serve import make_ownership
    from delayq.service.service import DelayService

    zookeeper = ZooKeeperServer().start()
    config = ServiceConfig(
        redis_url=redis_server.url,
        namespace="zk-down",
        topic="orders",
        slot_amount=4,
        topic_type=TopicType.PULL,
        zookeeper_connect=zookeeper.hosts,
        zookeeper_session_timeout_ms=30_000,
        member_id="solo",
    )
    service = DelayService(config, make_ownership(config))
    await service.start()
    client = TestClient(TestServer(build_app(service)))
    await client.start_server()
    base = "/v1/topics/orders"
    try:
        await client.post(f"{base}/messages", json={"id": "a", "delayMs": 60_000})

        async def all_held() -> bool:
            fleet = (await (await client.get(f"{base}/overview")).json())["fleet"]
            return bool((fleet["members"], fleet["heldSlots"]) == (["solo"], 4))

        await eventually(all_held, 30, "the solo member holding every slot")
        heat = await (await client.get(f"{base}/slots/heat")).json()
        assert (heat["members"], heat["owner"], sum(heat["scheduled"])) == (["solo"], [0] * 4, 1)
        zookeeper.stop(keep_data=True)

        async def ownership_unknown() -> dict[str, Any] | None:
            body: dict[str, Any] = await (await client.get(f"{base}/overview")).json()
            return body if body["fleet"].get("error") else None

        down = await eventually(ownership_unknown, 30, "the overview to mark ownership unknown")
        assert down["depth"]["scheduled"] == 1
        assert down["fleet"]["heldSlots"] is None
        assert "ZooKeeper" in down["fleet"]["error"]
        heat = await (await client.get(f"{base}/slots/heat")).json()
        assert (heat["owner"], sum(heat["scheduled"])) == (None, 1)  # depths without owners
        assert "ZooKeeper" in heat["fleetError"]
        slots = await client.get(f"{base}/slots")
        assert slots.status == 503
        assert "ownership unknown" in (await slots.json())["error"]
    finally:
        zookeeper.start()
        await service.stop()
        await client.close()
        zookeeper.stop()


async def test_batched_reads_equal_one_slot_per_call(start_service: StartService):
    """64 slots a call is the fast path; one slot a call is what a Redis Cluster gets (each
    call within one hash tag): both must read the same."""
    from delayq.service.overview import read_slots

    running = await start_service(topic_type="pull", slot_amount=16)
    for number in range(40):
        await schedule(running, f"b{number}", [0, 30_000, 600_000, 7_200_000][number % 4])
    one = await read_slots(running.service, 1)
    three = await read_slots(running.service, 3)
    batched = await read_slots(running.service, 64)

    def comparable(views):
        return [(v.slot, v.epoch, v.scheduled, v.overdue, v.due_in, v.later) for v in views]

    assert comparable(one) == comparable(three) == comparable(batched)
    assert [v.slot for v in batched] == list(range(16))
    assert sum(v.scheduled for v in batched) == 40
    assert sum(v.overdue for v in batched) == 10


async def test_views_read_every_broker_and_mark_slots_nobody_holds(redis_server: RedisServer):
    """Two brokers (read at once), and an ownership that grants only half the slots: the
    others are unowned, in the overview and in `/slots?only=attention`."""
    from aiohttp.test_utils import TestClient, TestServer

    from delayq.service.api import build_app
    from delayq.service.config import ServiceConfig
    from delayq.service.service import DelayService
    from tests.service.conftest import GrantedLater

    second = RedisServer().start()
    ownership = GrantedLater()
    config = ServiceConfig(
        broker_urls=f"{redis_server.url},{second.url}",
        namespace="two",
        topic="brokers",
        slot_amount=8,
        topic_type=TopicType.PULL,
    )
    service = DelayService(config, ownership)
    await service.start()
    await ownership.grant(frozenset(range(4)))
    client = TestClient(TestServer(build_app(service)))
    await client.start_server()
    base = "/v1/topics/brokers"
    try:
        for number in range(32):
            body = {"id": f"x{number}", "delayMs": 600_000}
            assert (await client.post(f"{base}/messages", json=body)).status == 201
        overview = await (await client.get(f"{base}/overview")).json()
        assert overview["depth"]["scheduled"] == 32
        assert (overview["fleet"]["heldSlots"], overview["fleet"]["unowned"]) == (4, [4, 5, 6, 7])
        page = await (await client.get(f"{base}/slots")).json()
        assert {s["broker"] for s in page["slots"]} == {0, 1}  # the first routing: halves
        assert sum(s["scheduled"] for s in page["slots"]) == 32
        attention = await (await client.get(f"{base}/slots?only=attention")).json()
        assert [(s["slot"], s["held"], s["owner"]) for s in attention["slots"]] == [
            (slot, False, None) for slot in (4, 5, 6, 7)
        ]
    finally:
        await service.stop()
        await client.close()
        second.stop()
