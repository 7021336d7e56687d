"""Webhook topics against a real local HTTP receiver: success, retries with backoff then dead,
timeouts, signatures (checked with the standardwebhooks library a receiver uses), rotation,
extra headers and the concurrency limit."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks import Webhook, WebhookVerificationError

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Message, State, Target
from delayq.queue.topic import Topic, TopicType, slot_of
from delayq.service.config import ServiceConfig
from delayq.service.delivery.signing import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Signer,
)
from delayq.service.delivery.sinks import DeliveryError
from delayq.service.delivery.targets import TargetPolicy
from delayq.service.delivery.webhook import BatchAnswer, WebhookSink, batch_answers
from delayq.service.metrics import ServiceMetrics
from delayq.service.service import DelayService
from tests.service.conftest import GrantedLater, Receiver, Running, StartService

SECRET = "whsec_EAnAFDzwz12NRaSZcqc57AdKtZKDoRdnC8y542nzx78="
PREVIOUS_SECRET = "whsec_e4PgkydFiiQ0ZklSnJXIF88pPfYnW5+5HlIO+97avtI="
OTHER_SECRET = "whsec_s90F3173TNnXZ6MHBkBQkEaPqCvo1HBDgjmnDI6Lxk0="


async def schedule(running: Running, message_id: str, **fields: object) -> None:
    body = {"id": message_id, "delayMs": 0, **fields}
    answer = await running.client.post(f"{running.base}/messages", json=body)
    assert answer.status == 201


async def state_of(running: Running, message_id: str) -> str:
    answer = await running.client.get(f"{running.base}/messages/{message_id}")
    return "absent" if answer.status == 404 else str((await answer.json())["state"])


async def test_success_posts_the_signed_message_and_acks(
    start_service: StartService, receiver: Receiver
):
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_secret=SECRET
    )
    await schedule(running, "a", payload="hello", headers={"k": "v"})
    await eventually(lambda: len(receiver.requests) == 1, 5, "one POST")
    headers, body = receiver.requests[0]
    message = json.loads(body)
    assert (message["id"], message["payload"], message["headers"]) == ("a", "hello", {"k": "v"})
    assert (message["attempt"], message["topic"], message["encoding"]) == (1, "orders", "utf-8")
    assert Webhook(SECRET).verify(body, headers) == message
    assert headers[ID_HEADER] == "a"
    assert abs(int(headers[TIMESTAMP_HEADER]) - time.time()) < 5
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", headers)
    with pytest.raises(WebhookVerificationError):  # the id is signed: no replay as another id
        Webhook(SECRET).verify(body, {**headers, ID_HEADER: "b"})
    # the receiver is told when the lease runs out (Redis clock = this host's clock here)
    deadline_ms = int(headers["X-Delayq-Lease-Deadline"])
    ack_timeout_ms = running.service.config.ack_timeout_ms
    assert message["dueMs"] < deadline_ms <= time.time() * 1000 + ack_timeout_ms

    async def acked() -> bool:
        return await state_of(running, "a") == "absent"

    await eventually(acked, 5, "the ack")


async def test_a_grouped_message_is_posted_with_its_group(
    start_service: StartService, receiver: Receiver
):
    """The body tells the group the message was scheduled with, read from the claimed record;
    an ungrouped message's body has no `group` at all."""
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)
    await schedule(running, "g", group="customer:7")
    await schedule(running, "u")
    await eventually(lambda: len(receiver.requests) == 2, 5, "two POSTs")
    bodies = {message["id"]: message for message in map(json.loads, receiver.bodies())}
    assert bodies["g"]["group"] == "customer:7"
    assert "group" not in bodies["u"]


async def test_server_errors_retry_with_backoff_then_dead(
    start_service: StartService, receiver: Receiver
):
    async def always_500(call: int) -> int:
        return 500

    receiver.answer = always_500
    # a URL holding credentials (run by hand; on Kubernetes it would come from a Secret)
    url = receiver.url.replace("http://", "http://shop:hunter2@") + "?token=hunter2"
    running = await start_service(
        topic_type="webhook", webhook_url=url, max_retries=2, retry_backoff_base_ms=100
    )
    await schedule(running, "p")

    async def dead() -> bool:
        return await state_of(running, "p") == "dead"

    await eventually(dead, 10, "the message to die after maxRetries")
    attempts = [json.loads(body)["attempt"] for body in receiver.bodies()]
    assert attempts == [1, 2, 3]
    info = await (await running.client.get(f"{running.base}/messages/p")).json()
    host = receiver.url.split("/")[2]
    assert info["deadReason"] == f"DeliveryError: POST http://{host}/…: HTTP 500"
    assert "hunter2" not in info["deadReason"]  # the URL is named, never its secrets
    # counted from the engine's answer to the nack, which reaches the process just after
    await eventually(
        lambda: counted(running, dead=1.0, retries=2.0), 5, "the failures in the metrics"
    )


async def counted(running: Running, *, dead: float, retries: float) -> bool:
    metrics = await (await running.client.get("/metrics")).text()
    labels = '{topic="orders",topic_namespace="shop"}'
    return (
        f"delayq_dead_total{labels} {dead}" in metrics
        and f"delayq_retries_total{labels} {retries}" in metrics
    )


async def test_a_give_up_before_max_retries_is_counted_as_dead(
    start_service: StartService, receiver: Receiver
):
    """retry.for 1 ms: the first failure's retry would fall after the window, so the engine
    gives the message up at once, well below maxRetries. The metrics say what the engine did
    (dead 1, retries 0), not what the attempt number predicts."""

    async def always_500(call: int) -> int:
        return 500

    receiver.answer = always_500
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, max_retries=5, retry_for_ms=1
    )
    await schedule(running, "g")

    async def dead() -> bool:
        return await state_of(running, "g") == "dead"

    await eventually(dead, 10, "the message given up after its first attempt")
    assert [json.loads(body)["attempt"] for body in receiver.bodies()] == [1]
    await eventually(
        lambda: counted(running, dead=1.0, retries=0.0), 5, "the give-up in the metrics"
    )


async def test_backoff_spaces_the_retries(start_service: StartService, receiver: Receiver):
    seen_at: list[float] = []

    async def fail_twice(call: int) -> int:
        seen_at.append(time.monotonic())
        return 503 if call <= 2 else 204

    receiver.answer = fail_twice
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, retry_backoff_base_ms=200
    )
    await schedule(running, "b")

    async def acked() -> bool:
        return len(seen_at) == 3 and await state_of(running, "b") == "absent"

    await eventually(acked, 10, "delivery on the third attempt")
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen_at)]
    assert gaps[0] >= 0.19
    assert gaps[1] >= 0.39


async def test_a_timeout_is_a_failure(start_service: StartService, receiver: Receiver):
    async def slow_first(call: int) -> int:
        if call == 1:
            await asyncio.sleep(1.0)  # the receiver hangs; the service gives up at 100 ms
        return 200

    receiver.answer = slow_first
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_timeout_ms=100
    )
    await schedule(running, "t")

    async def acked() -> bool:
        return len(receiver.requests) == 2 and await state_of(running, "t") == "absent"

    await eventually(acked, 10, "the retry after the timeout")
    assert [json.loads(b)["attempt"] for b in receiver.bodies()] == [1, 2]
    metrics = await (await running.client.get("/metrics")).text()
    assert 'delayq_webhook_duration_seconds_count{status="error"' in metrics


async def test_concurrency_is_limited_per_topic(start_service: StartService, receiver: Receiver):
    active, peak = 0, 0
    release = asyncio.Event()

    async def gated(call: int) -> int:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        return 200

    receiver.answer = gated
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_in_flight=2
    )
    messages = [{"id": f"c{i}", "delayMs": 0} for i in range(10)]
    await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})
    await eventually(lambda: active == 2, 5, "two concurrent POSTs")
    release.set()
    await eventually(lambda: len(receiver.requests) == 10, 10, "all ten POSTs")
    assert peak == 2


def first_held_until(release: asyncio.Event) -> Callable[[int], Awaitable[int]]:
    """A receiver's answer: 200, the first POST only once `release` is set (it holds the one
    POST slot, so the messages behind it pile up)."""

    async def answer(call: int) -> int:
        if call == 1:
            await release.wait()
        return 200

    return answer


def answer_each(request_body: bytes, statuses: dict[str, int] | None = None,
                skip: frozenset[str] = frozenset()) -> bytes:
    """A batch receiver's reply: 200 for each message, except on its first attempt: then
    `statuses` says otherwise, and the ids in `skip` get no answer at all."""
    results = []
    for message in json.loads(request_body)["messages"]:
        first = message["attempt"] == 1
        if not (first and message["id"] in skip):
            status = (statuses or {}).get(message["id"], 200) if first else 200
            results.append({"id": message["id"], "status": status})
    return json.dumps({"results": results}).encode()


async def test_messages_waiting_for_a_post_slot_go_out_together_each_answered(
    start_service: StartService, receiver: Receiver
):
    """maxBatch 10 with one POST slot: the first message leaves alone, the ones that pile up
    behind it leave together (at most 10 per POST), signed as one; the receiver's answer to
    each acks it (200), or retries it alone (500, or no answer)."""
    release = asyncio.Event()
    receiver.answer = first_held_until(release)
    receiver.reply = lambda body: answer_each(body, {"b3": 500}, frozenset({"b4"}))
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_secret=SECRET,
        webhook_max_in_flight=1, webhook_max_batch=10,
    )
    await schedule(running, "b0")
    await eventually(lambda: len(receiver.requests) == 1, 5, "the first POST")
    messages = [{"id": f"b{i}", "delayMs": 0} for i in range(1, 16)]
    await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})

    async def all_claimed() -> bool:
        return all([await state_of(running, f"b{i}") == "prepared" for i in range(1, 16)])

    await eventually(all_claimed, 5, "15 messages claimed, waiting behind the held POST")
    release.set()
    await eventually(lambda: all([
        any(m["id"] == "b3" and m["attempt"] == 2 for m in posted(receiver)),
        any(m["id"] == "b4" and m["attempt"] == 2 for m in posted(receiver)),
    ]), 10, "b3 and b4 retried")
    headers, body = receiver.requests[1]
    batch = json.loads(body)["messages"]
    assert len(batch) == 10
    assert headers["X-Delayq-Batch-Size"] == "10"
    assert Webhook(SECRET).verify(body, headers) == {"messages": batch}
    assert headers[ID_HEADER].startswith("batch_")
    sizes = [len(json.loads(body)["messages"]) for body in receiver.bodies()]
    assert sizes[0] == 1, sizes
    assert max(sizes) == 10, sizes
    firsts = [m for m in posted(receiver) if m["attempt"] == 1]
    assert sorted(m["id"] for m in firsts) == sorted(f"b{i}" for i in range(16))

    async def all_acked() -> bool:
        return all([await state_of(running, f"b{i}") == "absent" for i in range(16)])

    await eventually(all_acked, 10, "every message acked")


async def test_a_batch_reply_may_ask_for_time_per_message_spending_no_attempt(
    start_service: StartService, receiver: Receiver
):
    """A batch receiver answering one message `{"status": 429, "retryAfter": 1}` (its own
    Retry-After) gets it again at the same attempt once the time asked has passed, the topic
    held meanwhile; a 429 without `retryAfter` is an ordinary failure (attempt 2); every other
    message of the batch is acked at its first attempt."""
    release = asyncio.Event()
    receiver.answer = first_held_until(release)
    seen: dict[str, list[tuple[float, int]]] = {}

    def reply(body: bytes) -> bytes:
        results: list[dict[str, Any]] = []
        for message in json.loads(body)["messages"]:
            posts = seen.setdefault(message["id"], [])
            posts.append((time.monotonic(), message["attempt"]))
            result: dict[str, Any] = {"id": message["id"], "status": 200}
            if len(posts) == 1 and message["id"] in ("b3", "b4"):
                result = {"id": message["id"], "status": 429}
                result.update({"retryAfter": 1} if message["id"] == "b3" else {})
            results.append(result)
        return json.dumps({"results": results}).encode()

    receiver.reply = reply
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_in_flight=1,
        webhook_max_batch=10, retry_backoff_base_ms=100,
    )  # fmt: skip
    await schedule(running, "b0")
    await eventually(lambda: len(receiver.requests) == 1, 5, "the first POST")
    messages = [{"id": f"b{i}", "delayMs": 0} for i in range(1, 12)]
    await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})

    async def all_claimed() -> bool:
        return all([await state_of(running, f"b{i}") == "prepared" for i in range(1, 12)])

    await eventually(all_claimed, 5, "11 messages claimed, waiting behind the held POST")
    release.set()

    async def all_acked() -> bool:
        return all([await state_of(running, f"b{i}") == "absent" for i in range(12)])

    await eventually(all_acked, 15, "every message acked")
    assert [attempt for _, attempt in seen["b3"]] == [1, 1]  # no attempt spent on its 429
    assert seen["b3"][1][0] - seen["b3"][0][0] >= 0.8  # not before the second it asked for
    assert [attempt for _, attempt in seen["b4"]] == [1, 2]  # no retryAfter: a failure
    others = {i: posts for i, posts in seen.items() if i not in ("b3", "b4")}
    assert sorted(others) == sorted(f"b{i}" for i in range(12) if i not in (3, 4))
    assert all([attempt for _, attempt in posts] == [1] for posts in others.values())


def test_a_batch_answers_retry_after_is_seconds_or_an_http_date_and_nothing_else() -> None:
    now_s = 1_700_000_000.0

    def answer(**extra: Any) -> BatchAnswer:
        reply = {"results": [{"id": "a", "status": 429, **extra}]}
        return batch_answers(json.dumps(reply).encode(), now_s)["a"]

    assert answer(retryAfter=2) == BatchAnswer(429, 2000)
    assert answer(retryAfter="3") == BatchAnswer(429, 3000)
    assert answer(retryAfter="Tue, 14 Nov 2023 22:13:30 GMT") == BatchAnswer(429, 10_000)
    assert answer(retryAfter="soon") == answer(retryAfter=-1) == answer() == BatchAnswer(429)
    for bad in (1.5, True, [1], {"s": 1}):
        with pytest.raises(DeliveryError, match="retryAfter"):
            answer(retryAfter=bad)


def posted(receiver: Receiver) -> list[dict[str, Any]]:
    """Every message the receiver was sent, batch or not, in order."""
    messages: list[dict[str, Any]] = []
    for body in receiver.bodies():
        document = json.loads(body)
        messages.extend(document.get("messages", [document]))
    return messages


async def test_a_batch_reply_without_results_retries_the_whole_batch(
    start_service: StartService, receiver: Receiver
):
    """A 200 whose body does not answer each message (a receiver that does not speak batches)
    acks nothing: every message is retried, never lost."""
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_batch=5, max_retries=1,
    )
    await schedule(running, "n")
    await eventually(lambda: len(receiver.requests) == 2, 10, "the batch retried once")
    assert [m["attempt"] for m in posted(receiver)] == [1, 2]

    async def dead() -> bool:
        return await state_of(running, "n") == "dead"

    await eventually(dead, 10, "dead after maxRetries")
    info = await (await running.client.get(f"{running.base}/messages/n")).json()
    assert "batch reply is not" in info["deadReason"]


async def test_a_batch_reply_that_only_looks_like_an_ack_acks_nothing(
    start_service: StartService, receiver: Receiver
):
    """Regression: the reply was read leniently, so a receiver answering one id both 500 and
    200 (the last won), or with a status `"200"`, `299.9` or `true` (int() of them), had the
    message acked though it never plainly confirmed it. Each such reply retries the message;
    only the plain answer of the last POST acks it."""
    lies: list[Callable[[str], list[dict[str, Any]]]] = [
        lambda i: [{"id": i, "status": 500}, {"id": i, "status": 200}],
        lambda i: [{"id": i, "status": "200"}],
        lambda i: [{"id": i, "status": 299.9}],
        lambda i: [{"id": i, "status": True}],
        lambda i: [{"id": i, "status": 200}],  # the truth, at last
    ]

    def reply(body: bytes) -> bytes:
        [message] = json.loads(body)["messages"]
        return json.dumps({"results": lies[len(receiver.requests) - 1](message["id"])}).encode()

    receiver.reply = reply
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_batch=5,
    )
    await schedule(running, "l")

    async def acked() -> bool:
        return await state_of(running, "l") == "absent"

    await eventually(acked, 10, "the ack of the plain answer")
    assert [m["attempt"] for m in posted(receiver)] == [1, 2, 3, 4, 5]


async def serve_hook(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> tuple[web.AppRunner, str]:
    """A real receiver on loopback answering POST /hook with `handler`: (its runner, its URL)."""
    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook"


async def test_a_2xx_with_an_endless_body_acks_without_reading_it(start_service: StartService):
    """Regression: the sender read every reply whole, so a receiver answering 200 and then
    streaming a body without end made each POST buffer it until the timeout (memory at the
    receiver's will, 64 POSTs at once) and counted its own 200 as a failure: retried, then
    dead. The status is the answer; the body is read no further than a small bound."""
    posts: list[bytes] = []

    async def endless(request: web.Request) -> web.StreamResponse:
        posts.append(await request.read())
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        while True:
            await response.write(b"x" * 65536)
            await asyncio.sleep(0.005)

    runner, url = await serve_hook(endless)
    try:
        running = await start_service(
            topic_type="webhook", webhook_url=url, webhook_timeout_ms=2000, max_retries=1,
        )
        await schedule(running, "e")

        async def acked() -> bool:
            return await state_of(running, "e") == "absent"

        await eventually(acked, 10, "the ack of the 200")
        assert [json.loads(body)["attempt"] for body in posts] == [1]
    finally:
        await runner.cleanup()


async def test_a_batch_reply_over_its_bound_acks_nothing(
    start_service: StartService, receiver: Receiver
):
    """Regression: a batch reply was read whole whatever its size. One over the bound (64 KiB
    and 4 KiB per message) is not read on: the batch is retried, never acked by it."""
    def reply(body: bytes) -> bytes:
        answer: dict[str, Any] = json.loads(answer_each(body))
        if len(receiver.requests) == 1:
            answer["padding"] = "x" * (1 << 20)
        return json.dumps(answer).encode()

    receiver.reply = reply
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_batch=5,
    )
    await schedule(running, "o")

    async def acked() -> bool:
        return await state_of(running, "o") == "absent"

    await eventually(acked, 10, "the ack of the second, short reply")
    assert [m["attempt"] for m in posted(receiver)] == [1, 2]


async def test_one_id_twice_never_shares_a_batch(
    start_service: StartService, receiver: Receiver
):
    """Regression: the receiver answers by id, so two messages of one id (two slot bases) in
    one batch would both take one answer, acking a message the receiver refused. The second
    waits for the next batch: each is answered on its own."""
    release = asyncio.Event()
    receiver.answer = first_held_until(release)
    receiver.reply = answer_each
    running = await start_service(
        topic_type="webhook", webhook_url=receiver.url, webhook_max_in_flight=1,
        webhook_max_batch=10,
    )
    await schedule(running, "first")
    await eventually(lambda: len(receiver.requests) == 1, 5, "the first POST")
    for basis in ("a", "b", "d"):  # slots 3, 1 and 0 of the 4: three distinct messages
        await schedule(running, "twin", slotBasis=basis)
    await schedule(running, "other")

    async def all_claimed() -> bool:  # the held one and the four behind it
        return (await running.service.brokers.stats()).prepared == 5

    await eventually(all_claimed, 5, "all five claimed")
    release.set()
    await eventually(lambda: sum(m["id"] == "twin" for m in posted(receiver)) >= 3, 10,
                     "every twin posted")
    for body in receiver.bodies()[1:]:
        ids = [m["id"] for m in json.loads(body)["messages"]]
        assert len(ids) == len(set(ids)), ids


async def test_a_wait_cancelled_after_its_batch_was_taken_fails_no_other(receiver: Receiver):
    """Regression: a delivery cancelled (its slot released) after the batcher took it, before
    its POST, made the batch raise InvalidStateError and fail every other message of it."""
    receiver.reply = answer_each
    topic = Topic("orders", "shop", 4, TopicType.WEBHOOK)
    sink = WebhookSink(topic, receiver.url, Signer(""), 5000, 1, ServiceMetrics("shop", "orders"),
                       targets=TargetPolicy(allow_private=True), max_batch=10)
    loop = asyncio.get_running_loop()
    gone, kept = loop.create_future(), loop.create_future()
    gone.cancel()
    try:
        await sink._limit.acquire()  # the POST slot the batcher takes before a batch
        await sink._send_batch([(Message("gone", 0, b"", {}, 1, 0, 1, 1), gone),
                                (Message("kept", 1, b"", {}, 1, 0, 1, 1), kept)])
        assert kept.result() is None  # acked by the receiver's answer
        assert [m["id"] for m in posted(receiver)] == ["kept"]
    finally:
        await sink.close()


async def test_shutdown_finishes_in_flight_deliveries(
    start_service: StartService, receiver: Receiver, async_redis_client: redis.asyncio.Redis
):
    release = asyncio.Event()

    async def held(call: int) -> int:
        await release.wait()
        return 200

    receiver.answer = held
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)
    await schedule(running, "s")
    await eventually(lambda: len(receiver.requests) == 1, 5, "the POST to start")
    stopping = asyncio.create_task(running.service.stop())
    await eventually(lambda: running.service.owned_slots == [], 5, "claiming to stop")
    assert not stopping.done()  # waiting for the in-flight delivery
    release.set()
    await asyncio.wait_for(stopping, 10)
    info = await AsyncQueue(async_redis_client, running.service.topic).get("s")
    assert info.state is State.ABSENT  # acked before the slots were given up
    assert len(receiver.requests) == 1


async def test_a_taken_over_backlog_is_delivered_at_once(
    receiver: Receiver, redis_server: RedisServer, async_redis_client: redis.asyncio.Redis
):
    """A slot taken over from a dead owner, its due backlog's wake marker already consumed,
    on a process with nothing else to do: delivered right away, not at some later wake-up."""
    config = ServiceConfig(
        redis_url=redis_server.url,
        topic="takeover",
        slot_amount=4,
        topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url,
    )
    ownership = GrantedLater()
    service = DelayService(config, ownership)
    await service.start()
    try:
        queue = AsyncQueue(async_redis_client, service.topic)
        scheduled = await queue.schedule("backlog", b"", delay_ms=0)
        for slot in service.topic.slots:
            await async_redis_client.delete(slot_keys(service.topic, slot).key(Part.WAKE))
        await ownership.grant(frozenset(service.topic.slots))
        await eventually(lambda: len(receiver.requests) == 1, 5, "the backlog's delivery")
        assert json.loads(receiver.bodies()[0])["id"] == scheduled.id
    finally:
        await service.stop()


@contextlib.asynccontextmanager
async def serving_every_slot(
    config: ServiceConfig,
) -> AsyncIterator[tuple[DelayService, GrantedLater]]:
    """A delay service granted every slot, whose test takes slots back when it says (a
    handoff: `ownership.grant` returns once the slots taken back are free)."""
    ownership = GrantedLater()
    service = DelayService(config, ownership)
    await service.start()
    try:
        await ownership.grant(frozenset(service.topic.slots))
        yield service, ownership
    finally:
        await service.stop()


async def test_a_handoff_waits_for_a_post_as_long_as_the_webhook_timeout(
    receiver: Receiver, redis_server: RedisServer
):
    """Regression: releasing a slot waited 10 s for its deliveries, whatever the webhook
    timeout, so a receiver answering after 11 s (within a 15 s timeout) had its POST still in
    flight when the slot was handed over: the next owner's fence refuses the late ack and the
    message is delivered again. The release now lasts until the POST's answer is acked."""
    async def slow(call: int) -> int:
        await asyncio.sleep(11)  # the receiver is slow, not the test: it answers within 15 s
        return 200

    receiver.answer = slow
    config = ServiceConfig(
        redis_url=redis_server.url, topic="handoff", slot_amount=4, topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url, webhook_timeout_ms=15_000, ack_timeout_ms=30_000,
    )
    async with serving_every_slot(config) as (service, ownership):
        queue = service.queues[0]
        await queue.schedule("slow", b"", delay_ms=0)
        await eventually(lambda: len(receiver.requests) == 1, 5, "the POST")
        await ownership.grant(frozenset())  # the handoff: returns once the slots are free
        [info] = await queue.get_many([Target("slow")])
        assert info.state is State.ABSENT, info.state  # acked before the slot was let go


def ids_in_slot(slot: int, slot_amount: int, count: int, prefix: str) -> list[str]:
    """`count` message ids that land in `slot`."""
    found = (f"{prefix}{n}" for n in itertools.count())
    return list(itertools.islice((i for i in found if slot_of(i, slot_amount) == slot), count))


@pytest.mark.parametrize("max_batch", [1, 10])  # waiting alone for a POST slot, or for a batch
async def test_a_handoff_does_not_wait_for_messages_queued_behind_other_slots_posts(
    receiver: Receiver, redis_server: RedisServer, max_batch: int
):
    """Regression (chaos soak, seed 101, 2026-11-30): under a slow receiver (the POST limit
    shrunk to 1) a released slot's messages waiting for a POST slot behind other slots'
    messages held the handoff until each had its turn (up to the whole drain, 10 s), and
    nobody consumed the slot meanwhile while the process said ready. They now stop waiting
    at the release and are given back at once, never POSTed by the old owner. Here the
    receiver holds its first POST until the handoff is over: before, the handoff waited for
    it (and for the kept slot's queue) and timed out below."""
    gate = asyncio.Event()

    async def held(call: int) -> int:
        await gate.wait()
        return 200

    receiver.answer = held
    config = ServiceConfig(
        redis_url=redis_server.url, topic=f"queued{max_batch}", slot_amount=4,
        topic_type=TopicType.WEBHOOK, webhook_url=receiver.url, webhook_timeout_ms=15_000,
        ack_timeout_ms=30_000, webhook_max_in_flight=1, webhook_max_batch=max_batch,
    )
    kept, released = ids_in_slot(0, 4, 4, "kept-"), ids_in_slot(1, 4, 2, "released-")
    async with serving_every_slot(config) as (service, ownership):
        queue = service.queues[0]

        async def leased() -> bool:  # claimed, so waiting behind the POST in flight
            infos = await queue.get_many([Target(i) for i in released])
            return all(info.state is State.PREPARED for info in infos)

        try:
            for message_id in kept:
                await queue.schedule(message_id, b"", delay_ms=0)
            await eventually(lambda: len(receiver.requests) == 1, 5, "the first POST")
            for message_id in released:
                await queue.schedule(message_id, b"", delay_ms=0)
            await eventually(leased, 5, "the released slot's messages claimed")
            handoff = ownership.grant(frozenset(service.topic.slots) - {1})  # slot 1 goes
            await asyncio.wait_for(handoff, 5)  # before: until the held POST was answered
            infos = await queue.get_many([Target(i) for i in released])
            assert [(i.state, i.attempts) for i in infos] == [(State.SCHEDULED, 0)] * 2
        finally:
            gate.set()  # never leave the receiver holding a POST while the service stops

        def posted() -> set[str]:  # the ids of every POST, alone or in a batch
            bodies = [json.loads(body) for body in receiver.bodies()]
            return {m["id"] for body in bodies for m in body.get("messages", [body])}

        await eventually(lambda: posted() >= set(kept), 10, "the kept slot's messages POSTed")
        assert not posted() & set(released)  # they wait for their slot's next owner


async def test_a_slow_receiver_gets_each_message_once_and_nothing_dies(
    start_service: StartService, receiver: Receiver
):
    """The duplicate storm of a slow receiver, without any fault: 4 POSTs at a time of 100 ms
    each, up to 200 leased, leases of 1 s. Messages queued behind the concurrency limit wait
    far longer than a lease; their leases are extended, so each is POSTed exactly once and,
    with max_retries 1, none goes dead although every POST succeeded."""

    async def slow(call: int) -> int:
        await asyncio.sleep(0.1)
        return 204

    receiver.answer = slow
    running = await start_service(
        topic_type="webhook",
        webhook_url=receiver.url,
        webhook_max_in_flight=4,
        webhook_timeout_ms=500,
        worker_concurrency=200,
        ack_timeout_ms=1_000,
        max_retries=1,
    )
    messages: list[dict[str, Any]] = [{"id": f"s{i}", "delayMs": 0} for i in range(120)]
    batch = await running.client.post(f"{running.base}/messages/batch", json={"messages": messages})
    assert batch.status == 200

    async def drained() -> bool:
        stats = await (await running.client.get(f"{running.base}/stats")).json()
        return bool(stats["scheduled"] + stats["prepared"] + stats["dead"] == 0)

    await eventually(drained, 30, "every message acked")
    ids = [json.loads(body)["id"] for body in receiver.bodies()]
    assert sorted(ids) == sorted(m["id"] for m in messages)  # each exactly once


async def dead_reason(running: Running, message_id: str) -> str:
    info = await (await running.client.get(f"{running.base}/messages/{message_id}")).json()
    return str(info["deadReason"])


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # an IP literal, a resolved name
async def test_a_private_target_is_refused_retried_with_backoff_and_named(
    start_service: StartService, receiver: Receiver, host: str
):
    url = receiver.url.replace("127.0.0.1", host)
    running = await start_service(
        topic_type="webhook",
        webhook_url=url,
        webhook_allow_private_targets=False,
        max_retries=2,
        retry_backoff_base_ms=100,
    )
    started = time.monotonic()
    await schedule(running, "r")

    async def dead() -> bool:
        return await state_of(running, "r") == "dead"

    await eventually(dead, 10, "the refused message to die after maxRetries")
    assert time.monotonic() - started >= 0.29  # retried with backoff (100 + 200 ms), no spin
    assert receiver.requests == []  # nothing was sent
    reason = await dead_reason(running, "r")
    assert "webhook target 127.0.0.1 refused: loopback address" in reason
    assert "allowPrivateTargets" in reason
    metrics = await (await running.client.get("/metrics")).text()
    assert 'delayq_retries_total{topic="orders",topic_namespace="shop"} 2.0' in metrics
    assert 'delayq_webhook_duration_seconds_count{status="refused"' in metrics


async def test_a_fixed_topic_delivers_what_was_refused(
    start_service: StartService, receiver: Receiver
):
    """The refusal is an ordinary failure: the message waits for its retry, and a service
    started with the target allowed (the tenant fixed the topic) delivers it."""
    refusing = await start_service(
        topic_type="webhook",
        webhook_url=receiver.url,
        webhook_allow_private_targets=False,
        retry_backoff_base_ms=300,
    )
    await schedule(refusing, "f")
    labels = {"topic_namespace": "shop", "topic": "orders"}
    registry = refusing.service.metrics.registry
    await eventually(
        lambda: (registry.get_sample_value("delayq_retries_total", labels) or 0) >= 1,
        5,
        "a refused attempt",
    )
    await refusing.service.stop()
    assert receiver.requests == []
    fixed = await start_service(
        topic_type="webhook",
        webhook_url=receiver.url,
        webhook_allow_private_targets=False,
        webhook_allowed_cidrs="127.0.0.0/8",
    )
    await eventually(lambda: len(receiver.requests) == 1, 10, "delivery once allowed")

    async def acked() -> bool:
        return await state_of(fixed, "f") == "absent"

    await eventually(acked, 5, "the ack")


async def test_a_redirect_is_not_followed_and_counts_as_a_failure(start_service: StartService):
    """A receiver answering 3xx cannot send the POST on (to an address of its choosing)."""
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async def elsewhere(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", redirect)
    app.router.add_post("/elsewhere", elsewhere)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        running = await start_service(
            topic_type="webhook", webhook_url=str(server.make_url("/hook")), max_retries=1
        )
        await schedule(running, "d")

        async def dead() -> bool:
            return await state_of(running, "d") == "dead"

        await eventually(dead, 10, "the redirected message to die after maxRetries")
        assert hits == ["/hook", "/hook"]  # two attempts, never the redirect's target
        assert "HTTP 307" in await dead_reason(running, "d")
    finally:
        await server.close()


async def test_a_serve_process_signs_with_both_secrets_and_sends_the_extra_headers(
    redis_server: RedisServer, receiver: Receiver, tmp_path: Path
):
    """A real `delayq serve` mid-rotation (the new and the old secret, as the Secret's value
    holds them), posting to plain http on loopback (the hand-run default allows it): a receiver
    on either secret verifies with the standardwebhooks library, and the topic's extra headers
    arrive with every POST."""
    config = ServiceConfig(
        redis_url=redis_server.url,
        topic="rotating",
        slot_amount=4,
        port=free_port(),
        topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url,
        webhook_secret=f"{SECRET} {PREVIOUS_SECRET}",
        webhook_extra_headers="Authorization: Bearer receiver-token\nX-Tenant: shop\n",
        grace_ms=2000,
    )
    process = ServeProcess(config, tmp_path / "serve.log").start()
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert process.running(), process.log_path.read_text()
                try:
                    async with session.get(process.url + "/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(ready, 15, "the serve process to be ready")
            url = f"{process.url}/v1/topics/rotating/messages"
            async with session.post(url, json={"id": "r 1", "delayMs": 0}) as response:
                assert response.status == 201, await response.text()
            await eventually(lambda: len(receiver.requests) == 1, 10, "one POST")
    finally:
        process.terminate()
        assert process.wait(10) == 0, process.log_path.read_text()
    headers, body = receiver.requests[0]
    assert json.loads(body)["id"] == "r 1"
    assert headers[ID_HEADER] == "r%201"  # the header form of the id, as X-Delayq-Id
    assert len(headers[SIGNATURE_HEADER].split(" ")) == 2
    for secret in (SECRET, PREVIOUS_SECRET):
        Webhook(secret).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(body, headers)
    assert headers["Authorization"] == "Bearer receiver-token"
    assert headers["X-Tenant"] == "shop"
