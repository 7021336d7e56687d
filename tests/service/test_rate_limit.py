"""Flow control on real processes: two `delayq serve` pods of a webhook topic (real
redis-server, real ZooKeeper) and a real HTTP receiver that accepts a rate and answers 429 with
`Retry-After` beyond it. The topic's rate limit holds for the pods together; a receiver's
Retry-After holds every pod and spends no attempt."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.model import Message, ScheduleRequest, State
from delayq.queue.pacing import Pacer
from delayq.queue.topic import Topic, TopicType
from delayq.queue.topic_record import SERVE_OWNER
from delayq.service.config import ServiceConfig
from delayq.service.delivery.adaptive import AdaptiveLimit
from delayq.service.delivery.signing import Signer
from delayq.service.delivery.sinks import DeliveryError
from delayq.service.delivery.targets import TargetPolicy
from delayq.service.delivery.webhook import ReceiverHoldError, WebhookSink, retry_after_ms
from delayq.service.metrics import ServiceMetrics
from delayq.service.overview import STALLED_AFTER_MS, SlotView
from tests.herd_support import schedule_herd
from tests.service.conftest import Receiver

SLOTS = 8
PODS = 2


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class PacedReceiver:
    """Records every POST (monotonic time, id, attempt, status) and answers as `answer` says."""

    answer: Callable[[], Answer]
    url: str = ""
    posts: list[tuple[float, str, int, int]] = field(default_factory=list)

    def accepted(self) -> list[tuple[float, str, int, int]]:
        return [post for post in self.posts if post[3] == 200]


class Bucket:
    """The receiver's own capacity: `per_second`, bursts of `burst`, on its monotonic clock."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second, self.burst = per_second, burst
        self.tokens, self.at_s = float(burst), time.monotonic()

    def answer(self) -> Answer:
        now_s = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now_s - self.at_s) * self.per_second)
        self.at_s = now_s
        if self.tokens >= 1:
            self.tokens -= 1
            return Answer(200)
        return Answer(429, {"Retry-After": "1"})


@pytest.fixture
async def serve_receiver() -> AsyncIterator[Callable[[Callable[[], Answer]], Any]]:
    runners: list[web.AppRunner] = []

    async def start(answer: Callable[[], Answer]) -> PacedReceiver:
        receiver = PacedReceiver(answer)

        async def handle(request: web.Request) -> web.Response:
            body = json.loads(await request.read())
            told = receiver.answer()
            attempt = int(request.headers["X-Delayq-Attempt"])
            receiver.posts.append((time.monotonic(), body["id"], attempt, told.status))
            return web.Response(status=told.status, headers=told.headers)

        app = web.Application()
        app.router.add_post("/hook", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        receiver.url = f"http://127.0.0.1:{port}/hook"
        return receiver

    yield start
    for runner in runners:
        await runner.cleanup()


async def start_pods(
    redis_server: RedisServer, zookeeper: Any, url: str, tmp_path: Path, **settings: Any
) -> tuple[list[ServeProcess], ServiceConfig]:
    topic = f"paced{free_port()}"
    configs = [
        ServiceConfig(
            redis_url=redis_server.url,
            topic=topic,
            slot_amount=SLOTS,
            topic_type=TopicType.WEBHOOK,
            webhook_url=url,
            zookeeper_connect=zookeeper.hosts,
            zookeeper_session_timeout_ms=4000,
            member_id=f"p{i}",
            port=free_port(),
            **settings,
        )
        for i in range(PODS)
    ]
    pods = [ServeProcess(c, tmp_path / f"serve-{i}.log").start() for i, c in enumerate(configs)]
    async with aiohttp.ClientSession() as session:

        async def sharing() -> bool:
            owned = 0
            for pod in pods:
                assert pod.running(), pod.log_path.read_text()
                try:
                    async with session.get(pod.url + "/readyz") as answer:
                        owned += (await answer.json())["ownedSlots"]
                except aiohttp.ClientError:
                    return False
            return owned == SLOTS

        await eventually(sharing, 60, "two pods sharing the slots")
    return pods, configs[0]


@pytest.mark.slow
async def test_a_herd_drains_at_the_topics_rate_limit_over_every_pod(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    zookeeper_server: Any,
    serve_receiver: Callable[[Callable[[], Answer]], Any],
    tmp_path: Path,
) -> None:
    limit, herd = 500, 3000
    receiver = await serve_receiver(Bucket(limit * 1.2, 100).answer)
    pods, config = await start_pods(
        redis_server, zookeeper_server, receiver.url, tmp_path,
        rate_limit_per_second=limit, rate_limit_burst=25,
    )  # fmt: skip
    try:
        await schedule_herd(async_redis_client, pods[0], config.topic, herd)
        await eventually(lambda: len(receiver.accepted()) >= herd // 3, 30, "the drain under way")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{pods[1].url}/v1/topics/{config.topic}/overview") as answer,
        ):
            overview = await answer.json()
        # the backlog waits on purpose: paced, not stalled
        assert overview["paced"] is True
        assert overview["rateLimitPerSecond"] == limit
        assert overview["fleet"]["stalledSlots"] == 0
        await eventually(lambda: len(receiver.accepted()) >= herd, 60, "the herd delivered")
    finally:
        stop_all(pods)
    accepted = receiver.accepted()
    assert sorted(post[1] for post in accepted) == sorted(f"h{i}" for i in range(herd))
    span_s = accepted[-1][0] - accepted[0][0]
    rate = (herd - 1) / span_s
    # at most the limit (+10 %); at least 80 % of it: on a loaded host the POSTs bunch, the
    # receiver's 429 + Retry-After: 1 then holds the topic a second, and the pods now send
    # nothing they claimed during a hold (bench/bench_rate_limit.py measures the accuracy)
    assert limit * 0.8 <= rate <= limit * 1.1, (rate, span_s)
    answered = {post[1]: post[3] for post in receiver.posts if post[3] != 429}
    assert all(status == 200 for status in answered.values())
    # every message only ever answered 429 before its 200 is delivered at its first attempt
    assert {post[2] for post in accepted} == {1}
    stats = await AsyncQueue(async_redis_client, config.to_topic()).stats()
    assert (stats.scheduled, stats.due, stats.prepared, stats.dead) == (0, 0, 0, 0)


@pytest.mark.slow
async def test_retry_after_holds_every_pod_and_spends_no_attempt(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    zookeeper_server: Any,
    serve_receiver: Callable[[Callable[[], Answer]], Any],
    tmp_path: Path,
) -> None:
    window_s = 0.5  # every POST of the first half second is answered 429, Retry-After: 2

    def answer() -> Answer:
        busy = not receiver.posts or time.monotonic() - receiver.posts[0][0] < window_s
        return Answer(429, {"Retry-After": "2"}) if busy else Answer(200)

    receiver = await serve_receiver(answer)
    pods, config = await start_pods(redis_server, zookeeper_server, receiver.url, tmp_path)
    try:
        await schedule_herd(async_redis_client, pods[0], config.topic, 200)
        await eventually(lambda: len(receiver.accepted()) >= 200, 30, "every message")
    finally:
        stop_all(pods)
    accepted = receiver.accepted()
    assert sorted(post[1] for post in accepted) == sorted(f"h{i}" for i in range(200))
    assert {post[2] for post in accepted} == {1}  # no attempt spent on a 429
    first_s = receiver.posts[0][0]
    assert any(post[3] == 429 for post in receiver.posts)
    # both pods held: after the POSTs in flight at the first 429, nothing for the 2 s asked
    quiet = [post for post in receiver.posts if first_s + window_s <= post[0] < first_s + 1.9]
    assert not quiet, quiet[:3]
    stats = await AsyncQueue(async_redis_client, config.to_topic()).stats()
    assert (stats.scheduled, stats.due, stats.prepared, stats.dead) == (0, 0, 0, 0)


@pytest.mark.slow
async def test_a_limit_changed_under_a_draining_herd_applies_without_a_restart(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    zookeeper_server: Any,
    serve_receiver: Callable[[Callable[[], Answer]], Any],
    tmp_path: Path,
) -> None:
    """Two pods drain a herd at 60/s; the topic's owner publishes 300/s in its settings record
    (what the operator's health pass does on a spec change), then 60/s again: the same pod
    processes follow each limit. Bounds are counts over each phase, wide for a loaded host."""
    receiver = await serve_receiver(lambda: Answer(200))
    pods, config = await start_pods(
        redis_server, zookeeper_server, receiver.url, tmp_path,
        rate_limit_per_second=60, rate_limit_burst=10,
    )  # fmt: skip
    version = time.time_ns() // 1_000_000  # newer than the pods' own publication at start

    async def publish(per_second: float) -> float:
        nonlocal version
        version += 1
        topic = dataclasses.replace(config.to_topic(), rate_limit_per_second=per_second)
        await AsyncQueue(async_redis_client, topic).publish_settings(SERVE_OWNER, version)
        return time.monotonic()

    def delivered_since(since_s: float) -> list[float]:
        return [post[0] for post in receiver.accepted() if post[0] >= since_s]

    try:
        await schedule_herd(async_redis_client, pods[0], config.topic, 1500)
        await eventually(lambda: len(receiver.accepted()) >= 30, 30, "the drain under way")
        slow_s = receiver.accepted()[0][0]
        await eventually(lambda: len(delivered_since(slow_s)) >= 120, 30, "120 at 60/s")
        fast_s = await publish(300)
        slow_rate = (len(delivered_since(slow_s)) - 10) / (fast_s - slow_s)
        await eventually(lambda: len(delivered_since(fast_s)) >= 600, 30, "600 at 300/s")
        slow_again_s = await publish(60)
        fast = delivered_since(fast_s)
        fast_rate = len(fast) / (slow_again_s - fast_s)
        await eventually(lambda: len(delivered_since(slow_again_s)) >= 120, 30, "120 at 60/s")
        ended_s = time.monotonic()
        slow_again = len(delivered_since(slow_again_s)) / (ended_s - slow_again_s)
    finally:
        stop_all(pods)
    assert slow_rate <= 60 * 1.15, slow_rate
    assert 150 <= fast_rate <= 300 * 1.15 + 10, fast_rate  # the pods took the new limit
    # back at 60/s: at most the bucket refilled meanwhile (its burst) above the rate
    assert slow_again <= 60 * 1.15 + 10 / (ended_s - slow_again_s), slow_again
    assert len({post[1] for post in receiver.accepted()}) == len(receiver.accepted())


async def test_messages_claimed_before_a_hold_are_not_sent_during_it(
    start_service: Any, serve_receiver: Callable[[Callable[[], Answer]], Any]
) -> None:
    """Regression: a hold stopped claims only, so a pod went on POSTing what it had claimed
    already for the whole hold (one POST slot, 30 claimed at once: the other 29 POSTed within
    the 2 s asked; 200 claimed by each of two pods flaked the test above on a loaded host).
    They are given back, no attempt counted, and sent once the hold ends."""
    told: list[Answer] = [Answer(429, {"Retry-After": "2"})]
    receiver = await serve_receiver(lambda: told.pop() if told else Answer(200))
    running = await start_service(
        topic_type=TopicType.WEBHOOK, webhook_url=receiver.url, webhook_max_in_flight=1
    )
    queue = running.service.queues[0]
    await queue.schedule_many([ScheduleRequest(f"q{i}", b"x", delay_ms=0) for i in range(30)])
    await eventually(lambda: len(receiver.accepted()) >= 30, 20, "every message")
    held_s, _, _, status = receiver.posts[0]
    assert status == 429
    during = [post for post in receiver.posts[1:] if post[0] < held_s + 1.8]
    assert not during, during[:3]
    assert sorted(post[1] for post in receiver.accepted()) == sorted(f"q{i}" for i in range(30))
    assert {post[2] for post in receiver.accepted()} == {1}


async def test_the_aimd_limit_and_a_hold_are_reported_in_metrics_and_the_overview(
    start_service: Any, serve_receiver: Callable[[Callable[[], Answer]], Any]
) -> None:
    """What the dashboard and an alert read: three 500s halve the POSTs allowed (8 -> 4), then
    a 429 + Retry-After: 5 holds the topic; /metrics and /overview say both."""
    told = [Answer(429, {"Retry-After": "5"}), *[Answer(500)] * 3]
    receiver = await serve_receiver(lambda: told.pop() if told else Answer(200))
    running = await start_service(
        topic_type=TopicType.WEBHOOK, webhook_url=receiver.url, webhook_max_in_flight=8,
        rate_limit_per_second=1000, rate_limit_burst=50, retry_backoff_base_ms=10,
    )  # fmt: skip
    await running.service.queues[0].schedule_many(
        [ScheduleRequest(f"m{i}", b"x", delay_ms=0) for i in range(4)]
    )
    await eventually(lambda: not told, 10, "three 500s and the 429")

    async def overview() -> dict[str, Any]:
        answer = await running.client.get(f"{running.base}/overview")
        return dict(await answer.json())

    shown = await overview()
    assert (shown["webhookConcurrency"], shown["webhookMaxInFlight"]) == (4, 8)
    assert 3000 < shown["receiverHoldMs"] <= 5000
    assert (shown["rateLimitPerSecond"], shown["rateLimitBurst"]) == (1000, 50)
    metrics = (await (await running.client.get("/metrics")).read()).decode()
    hold = next(line for line in metrics.splitlines()
                if line.startswith("delayq_receiver_hold_seconds{"))  # fmt: skip
    assert 3 < float(hold.rsplit(" ", 1)[1]) <= 5
    assert 'delayq_rate_limit_burst{topic="' in metrics


def test_retry_after_is_seconds_or_an_http_date() -> None:
    now_s = 1_700_000_000.0
    assert retry_after_ms("3", now_s) == 3000
    assert retry_after_ms(" 0 ", now_s) == 0
    assert retry_after_ms("Tue, 14 Nov 2023 22:13:30 GMT", now_s) == 10_000
    assert retry_after_ms("Tue, 14 Nov 2023 22:13:10 GMT", now_s) == 0  # past
    assert retry_after_ms("-1", now_s) is None
    assert retry_after_ms("soon", now_s) is None
    assert retry_after_ms(None, now_s) is None


async def test_the_webhook_concurrency_halves_on_failure_and_grows_back() -> None:
    limit = AdaptiveLimit(8)
    limit.shrink()
    limit.shrink()  # the POSTs failing together are one signal
    assert limit.size == 4
    held = [asyncio.create_task(limit.acquire()) for _ in range(5)]
    await asyncio.sleep(0)
    assert sum(task.done() for task in held) == 4  # the fifth waits
    for _ in range(5):
        limit.grow()  # about a limit's worth of successes: one more slot
    await asyncio.sleep(0)
    assert limit.size == 5
    assert all(task.done() for task in held)
    for _ in range(100):
        limit.grow()
    assert limit.size == 8  # never above maxInFlight


async def test_a_freed_post_slot_goes_to_the_longest_waiter_not_a_newcomer() -> None:
    """Regression: a slot released went to whoever asked next while the woken waiter had not
    run yet, and the waiter queued again at the back, so the messages a consumer took first
    (a draining backlog's most urgent) could wait behind hundreds taken after them."""
    limit = AdaptiveLimit(1)
    served: list[int] = []

    async def post(n: int) -> None:
        async with limit:
            served.append(n)
            await asyncio.sleep(0)

    first = [asyncio.create_task(post(n)) for n in range(3)]
    await asyncio.sleep(0)  # 0 holds the slot, 1 and 2 wait
    later = []
    for n in range(3, 6):  # newcomers, each arriving as a slot is handed over
        later.append(asyncio.create_task(post(n)))
        await asyncio.sleep(0)
    await asyncio.gather(*first, *later)
    assert served == list(range(6))
    # a waiter cancelled before or after it is handed the slot loses no slot
    await limit.acquire()
    for hand_over_first in (False, True):
        waiter = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        if hand_over_first:
            limit.release()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        if not hand_over_first:
            limit.release()
        await asyncio.wait_for(limit.acquire(), 1)


async def test_an_abandoned_wait_for_a_post_slot_takes_none_and_leaves_no_trace() -> None:
    """A waiter whose message's slot was released gives up (False, nothing held), and its
    place in the queue does not make a slot freed later look waited for."""
    limit = AdaptiveLimit(1)
    assert await limit.acquire()
    abandoned: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiter = asyncio.create_task(limit.acquire(abandoned))
    behind = asyncio.create_task(limit.acquire())
    await asyncio.sleep(0)
    abandoned.set_result(None)
    assert await waiter is False
    limit.release()
    assert await behind is True  # the next waiter, not the abandoned one, got the slot
    limit.release()
    assert limit.try_acquire()  # nobody left waiting: free at once


async def test_pull_leases_obey_the_rate_limit(start_service: Any) -> None:
    """A pull topic's leases draw from the same bucket: 300 due messages leased as fast as a
    consumer asks come at 200/s after a burst of 20, the rest staying scheduled meanwhile."""
    running = await start_service(
        topic_type=TopicType.PULL, rate_limit_per_second=200, rate_limit_burst=20
    )
    service = running.service
    queue = service.queues[0]
    await queue.schedule_many([ScheduleRequest(f"p{i}", b"x", delay_ms=0) for i in range(300)])
    assert service.leaser is not None
    leased: list[str] = []
    started_s = time.monotonic()
    [first] = (await service.leaser.lease(1000, 30_000)).values()  # generation 0's
    assert 1 <= len(first) <= 20  # the burst, not the 300 due
    leased += [message.id for message in first]
    while len(leased) < 300:
        for batch in (await service.leaser.lease(1000, 30_000, wait_ms=1000)).values():
            leased += [m.id for m in batch]
    elapsed_s = time.monotonic() - started_s
    assert sorted(leased) == sorted(f"p{i}" for i in range(300))
    # never faster than the limit; the upper bound only says it was not stuck (a loaded host)
    assert (300 - 20) / 200 * 0.9 <= elapsed_s <= (300 - 20) / 200 * 2, elapsed_s


def test_a_paced_slot_is_not_stalled() -> None:
    """Due messages held back by the pace wait on purpose: the dashboard must not mark their
    slots stalled (it would hide the slots that really are)."""
    overdue = dict(epoch=1, scheduled=5, overdue=5, due_in=(), later=0, prepared=0, dead=0)
    late = STALLED_AFTER_MS + 1
    assert SlotView(0, 0, late, next_due_ms=0, **overdue).stalled  # type: ignore[arg-type]
    paced = SlotView(0, 0, late, next_due_ms=0, paced=True, **overdue)  # type: ignore[arg-type]
    assert not paced.stalled


async def test_5xx_answers_halve_a_sinks_posts_and_successes_grow_them_back(
    receiver: Receiver,
) -> None:
    """A real receiver answering 500, then 200: the sink's POSTs in flight halve (once per
    second at most), reported in delayq_webhook_concurrency, then grow back to maxInFlight."""
    status = 500
    receiver.answer = lambda _n: _status(status)
    metrics = ServiceMetrics("shop", "orders")
    sink = WebhookSink(Topic("orders", namespace="shop"), receiver.url, Signer(""), 5000, 8,
                       metrics, targets=TargetPolicy(allow_private=True))  # fmt: skip
    try:
        for i in range(3):
            with pytest.raises(DeliveryError):
                await sink.deliver(Message(f"f{i}", 0, b"", {}, 1, 0, 1, 1))
        assert sink.concurrency == 4  # three failures within a second: one halving
        assert b"delayq_webhook_concurrency{" in metrics.render()
        assert b'topic="orders",topic_namespace="shop"} 4.0' in metrics.render()
        status = 200
        for i in range(40):
            await sink.deliver(Message(f"s{i}", 0, b"", {}, 1, 0, 1, 1))
        assert sink.concurrency == 8
    finally:
        await sink.close()


async def test_a_429_whose_hold_redis_refuses_still_spends_no_attempt(
    serve_receiver: Callable[[Callable[[], Answer]], Any],
) -> None:
    """Regression (tests/chaos/test_pace.py): just after the first broker restarted, the
    hold's call took a pooled connection the server had closed and failed, and the message
    answered 429 + Retry-After was failed as an ordinary attempt (delivered later at attempt
    2). The receiver only asked for time: the message is given back, no attempt spent, and
    this process holds itself (`Pacer.hold` does first) though the others cannot know."""
    receiver = await serve_receiver(lambda: Answer(429, {"Retry-After": "2"}))
    down = redis.asyncio.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    topic = Topic("orders", namespace="shop")
    pacer = Pacer(AsyncQueue(down, topic), 100.0)
    sink = WebhookSink(topic, receiver.url, Signer(""), 5000, 8, ServiceMetrics("shop", "orders"),
                       targets=TargetPolicy(allow_private=True), hold=pacer.hold)  # fmt: skip
    try:
        now_ms = int(time.time() * 1000)
        with pytest.raises(ReceiverHoldError):
            await sink.deliver(Message("h", 0, b"", {}, 1, now_ms, 1, 1))
    finally:
        await sink.close()
        await down.aclose()
    assert 1000 < pacer.hold_left_ms <= 2000
    granted, wait_ms = await pacer.take(10)  # from its own hold, not asking Redis
    assert granted == 0
    assert 1000 < wait_ms <= 2000


async def _status(status: int) -> int:
    return status


async def test_a_receiver_answering_429_for_ever_cannot_park_a_message_for_ever(
    start_service: Any, serve_receiver: Callable[[Callable[[], Answer]], Any]
) -> None:
    """Regression: every hold gave the message back without spending an attempt, so a receiver
    answering 429 + Retry-After: 1 for ever kept it scheduled for ever (no expiry). Once it is
    `webhook_max_held_ms` overdue, each hold is a failed attempt: maxRetries ends it (dead)."""
    receiver = await serve_receiver(lambda: Answer(429, {"Retry-After": "1"}))
    running = await start_service(
        topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url,
        max_retries=1,
        webhook_max_held_ms=500,
    )
    queue = running.service.queues[0]
    await queue.schedule_many([ScheduleRequest("parked", b"x", delay_ms=0)])

    async def dead() -> bool:
        return (await queue.get("parked")).state is State.DEAD

    await eventually(dead, 20, "the message dead after its retries, not held for ever")
    info = await queue.get("parked")
    assert info.attempts == 2  # the first attempt and its one retry, each ended by a hold
    assert "a failed attempt" in info.dead_reason
    # held at first (given back, attempt 1 twice), then counted: never an endless hold
    assert [post[2] for post in receiver.posts][:2] == [1, 1]
