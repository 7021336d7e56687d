"""The HTTP API of a real service on the session's redis-server: producer routes, errors,
auth, size limits, probes, metrics and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import redis
import yaml
from aiohttp.test_utils import TestServer

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue import functions
from delayq.service.openapi import openapi_document
from delayq.service.readiness import PROBE_INTERVAL_S, READY_AFTER, UNREADY_AFTER_S
from tests.queue.conftest import ENGINE_PASSWORD, ENGINE_USER, engine_user
from tests.service.conftest import StartService

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"


async def test_schedule_get_reschedule_cancel(start_service: StartService):
    running = await start_service()
    client, base = running.client, running.base
    created = await client.post(
        f"{base}/messages",
        json={"id": "a", "delayMs": 60_000, "payload": "hi", "headers": {"k": "v"}},
    )
    assert created.status == 201
    body = await created.json()
    assert (body["id"], body["result"], body["state"]) == ("a", "created", "scheduled")

    again = await client.post(f"{base}/messages", json={"id": "a", "delayMs": 1})
    assert (again.status, (await again.json())["result"]) == (200, "exists")

    got = await (await client.get(f"{base}/messages/a")).json()
    assert (got["payload"], got["encoding"], got["headers"]) == ("hi", "utf-8", {"k": "v"})
    assert got["dueMs"] == body["dueMs"]

    moved = await client.post(f"{base}/messages/a/reschedule", json={"atMs": 2**41})
    assert moved.status == 200
    assert (await moved.json())["dueMs"] == 2**41

    cancelled = await client.delete(f"{base}/messages/a")
    assert (cancelled.status, (await cancelled.json())["result"]) == (200, "cancelled")
    assert (await client.get(f"{base}/messages/a")).status == 404


async def test_the_slot_that_holds_a_message_addresses_it(start_service: StartService):
    """What the dashboard's dead list knows of a message scheduled with a slot basis: its
    slot. `?slot=` finds it where the id alone does not; a wrong slot is a 404 that says
    where it looked; a slot beside a slotBasis, or outside the topic, is a 400 on `slot`."""
    running = await start_service()  # 4 slots
    client, base = running.client, running.base
    topic = running.service.topic
    basis = next(
        b for b in (f"c-{n}" for n in range(100)) if topic.slot_of(b) != topic.slot_of("m")
    )
    created = await client.post(
        f"{base}/messages", json={"id": "m", "slotBasis": basis, "delayMs": 60_000}
    )
    slot = (await created.json())["slot"]
    assert (await client.get(f"{base}/messages/m")).status == 404
    got = await client.get(f"{base}/messages/m", params={"slot": str(slot)})
    assert (got.status, (await got.json())["slot"]) == (200, slot)

    wrong = (slot + 1) % topic.slot_amount
    missing = await client.get(f"{base}/messages/m", params={"slot": str(wrong)})
    assert missing.status == 404
    assert f"looked up in slot {wrong}" in (await missing.json())["error"]

    for params in ({"slot": str(slot), "slotBasis": basis}, {"slot": "4"}, {"slot": "-1"}):
        refused = await client.get(f"{base}/messages/m", params=params)
        assert (refused.status, (await refused.json())["field"]) == (400, "slot"), params
        assert (await client.delete(f"{base}/messages/m", params=params)).status == 400

    moved = await client.post(
        f"{base}/messages/m/reschedule", params={"slot": str(slot)}, json={"atMs": 2**41}
    )
    assert (moved.status, (await moved.json())["dueMs"]) == (200, 2**41)
    cancelled = await client.delete(f"{base}/messages/m", params={"slot": str(slot)})
    assert (cancelled.status, (await cancelled.json())["result"]) == (200, "cancelled")


async def test_a_finished_id_is_remembered_over_http(start_service: StartService):
    """outcomeRetention on: GET answers a cancelled id's outcome, a create-only retry of it
    answers already_done (200) without scheduling it, an upsert schedules it anew."""
    running = await start_service(outcome_retention_ms=3_600_000)
    client, base = running.client, running.base
    await client.post(f"{base}/messages", json={"id": "once", "delayMs": 60_000})
    assert (await client.delete(f"{base}/messages/once")).status == 200

    got = await client.get(f"{base}/messages/once")
    assert got.status == 200
    body = await got.json()
    assert (body["state"], body["attempts"]) == ("cancelled", 0)
    assert "dueMs" not in body

    retried = await client.post(f"{base}/messages", json={"id": "once", "delayMs": 0})
    answer = await retried.json()
    assert (retried.status, answer["result"], answer["state"]) == (200, "already_done", "cancelled")
    assert answer["dueMs"] == body["finishedMs"]
    assert (await client.delete(f"{base}/messages/once")).status == 404  # nothing live

    upsert = {"id": "once", "delayMs": 60_000, "mode": "upsert"}
    replaced = await client.post(f"{base}/messages", json=upsert)
    assert (replaced.status, (await replaced.json())["result"]) == (201, "created")


async def test_priority_over_http(start_service: StartService):
    """priority reaches the message (GET shows it, 0 for a message without one), in a batch
    too."""
    running = await start_service()
    client, base = running.client, running.base
    one = await client.post(f"{base}/messages", json={"id": "p", "delayMs": 60_000, "priority": 7})
    assert one.status == 201
    batch = {"messages": [{"id": "q", "delayMs": 60_000, "priority": 2}, {"id": "r", "delayMs": 1}]}
    assert (await client.post(f"{base}/messages/batch", json=batch)).status == 200
    for message_id, priority in (("p", 7), ("q", 2), ("r", 0)):
        got = await (await client.get(f"{base}/messages/{message_id}")).json()
        assert got["priority"] == priority, got


async def test_group_over_http(start_service: StartService):
    """group reaches the message (GET shows it, absent for a message without one), in a batch
    too."""
    running = await start_service()
    client, base = running.client, running.base
    one = await client.post(f"{base}/messages", json={"id": "g", "delayMs": 1, "group": "c:42"})
    assert one.status == 201
    batch = {"messages": [{"id": "h", "delayMs": 1, "group": "é"}, {"id": "i", "delayMs": 1}]}
    assert (await client.post(f"{base}/messages/batch", json=batch)).status == 200
    for message_id, group in (("g", "c:42"), ("h", "é"), ("i", None)):
        got = await (await client.get(f"{base}/messages/{message_id}")).json()
        assert got.get("group") == group, got


async def test_expiry_over_http(start_service: StartService):
    """ttlMs and expireAtMs reach the message (GET shows expireAtMs); both at once, or an
    expiry not after the due time, are 400 naming the field; batches answer per message."""
    running = await start_service()
    client, base = running.client, running.base
    created = await client.post(
        f"{base}/messages", json={"id": "t", "atMs": 2**41, "ttlMs": 60_000}
    )
    assert created.status == 201
    got = await (await client.get(f"{base}/messages/t")).json()
    assert got["expireAtMs"] == 2**41 + 60_000

    both = {"id": "b", "delayMs": 0, "ttlMs": 5, "expireAtMs": 2**41}
    answer = await client.post(f"{base}/messages", json=both)
    assert (answer.status, (await answer.json())["field"]) == (400, "ttlMs")
    early = {"id": "e", "atMs": 2**41, "expireAtMs": 2**41}
    answer = await client.post(f"{base}/messages", json=early)
    assert (answer.status, (await answer.json())["field"]) == (400, "expireAtMs")
    fine = {"id": "f", "delayMs": 60_000}
    batch = await client.post(f"{base}/messages/batch", json={"messages": [fine, early]})
    results = [r["result"] for r in (await batch.json())["results"]]
    assert results == ["created", "expires_before_due"]
    # regression: a 200 ("every message stored") told a client reading the status that this
    # one was; refused for good, so no Retry-After either
    assert (batch.status, batch.headers.get("Retry-After")) == (207, None)
    assert (await client.get(f"{base}/messages/e")).status == 404


async def test_over_quota_is_429_with_retry_after(start_service: StartService):
    """limits.maxPending 4 over 4 slots: one message per slot; a second new one in a slot is
    429 with Retry-After, in a batch `over_quota` per message."""
    running = await start_service(limits_max_pending=4)
    client, base = running.client, running.base
    topic = running.service.topic
    first, second = [i for i in (f"m{n}" for n in range(100)) if topic.slot_of(i) == 0][:2]
    assert (await client.post(f"{base}/messages", json={"id": first, "delayMs": 0})).status == 201
    refused = await client.post(f"{base}/messages", json={"id": second, "delayMs": 0})
    assert refused.status == 429
    assert refused.headers["Retry-After"]
    assert "maxPending" in (await refused.json())["error"]
    batch = await client.post(
        f"{base}/messages/batch", json={"messages": [{"id": second, "delayMs": 0}]}
    )
    assert [r["result"] for r in (await batch.json())["results"]] == ["over_quota"]
    assert (batch.status, batch.headers["Retry-After"]) == (207, "5")  # regression: was 200


async def test_batch_schedule_and_binary_payloads(start_service: StartService):
    running = await start_service()
    messages = [{"id": f"m{i}", "delayMs": 60_000} for i in range(50)]
    messages.append({"id": "bin", "delayMs": 60_000, "payload": "/wA=", "encoding": "base64"})
    answer = await running.client.post(
        f"{running.base}/messages/batch", json={"messages": messages}
    )
    assert answer.status == 200
    results = (await answer.json())["results"]
    assert [r["id"] for r in results] == [m["id"] for m in messages]
    got = await (await running.client.get(f"{running.base}/messages/bin")).json()
    assert (got["payload"], got["encoding"]) == ("/wA=", "base64")
    stats = await (await running.client.get(f"{running.base}/stats")).json()
    assert stats["scheduled"] == 51


async def test_bad_input_is_400_naming_the_field(start_service: StartService):
    running = await start_service()
    client, base = running.client, running.base
    cases = [
        ({"delayMs": 1}, "id"),
        ({"id": "a"}, "delayMs"),
        ({"id": "a", "delayMs": "soon"}, "delayMs"),
        ({"id": "a", "delayMs": 1, "mode": "maybe"}, "mode"),
    ]
    for body, field in cases:
        answer = await client.post(f"{base}/messages", json=body)
        assert answer.status == 400, body
        error = await answer.json()
        assert error["field"] == field
        assert field in error["error"]
    not_json = await client.post(
        f"{base}/messages", data=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert (not_json.status, (await not_json.json())["field"]) == (400, "body")
    not_object = await client.post(f"{base}/messages", json=[1, 2])
    assert (await not_object.json())["field"] == "body"


async def test_size_limits_are_413(start_service: StartService):
    running = await start_service(max_payload_bytes=100, max_body_bytes=10_000)
    client, base = running.client, running.base
    too_big = await client.post(
        f"{base}/messages", json={"id": "a", "delayMs": 1, "payload": "x" * 101}
    )
    assert (too_big.status, (await too_big.json())["field"]) == (413, "payload")
    huge = await client.post(
        f"{base}/messages", data=b"x" * 20_000, headers={"Content-Type": "application/json"}
    )
    assert huge.status == 413
    assert "error" in await huge.json()


async def test_unknown_ids_and_topics_are_404(start_service: StartService):
    running = await start_service()
    client, base = running.client, running.base
    missing = await client.get(f"{base}/messages/nobody")
    assert (missing.status, (await missing.json())["field"]) == (404, "id")
    assert (await client.delete(f"{base}/messages/nobody")).status == 404
    moved = await client.post(f"{base}/messages/nobody/reschedule", json={"delayMs": 5})
    assert moved.status == 404
    other = await client.get("/v1/topics/other/messages/a")
    assert (other.status, (await other.json())["field"]) == (404, "topic")


async def test_bearer_token(start_service: StartService):
    running = await start_service(api_token="t0ken")
    client, base = running.client, running.base
    body = {"id": "a", "delayMs": 1000}
    wrong = ("Bearer wrong", "Bearer ", "Basic t0ken")  # "Bearer ": no empty token matches
    for headers in ({}, *({"Authorization": header} for header in wrong)):
        answer = await client.post(f"{base}/messages", json=body, headers=headers)
        assert answer.status == 401
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await answer.json())["field"] == "Authorization"
    ok = await client.post(f"{base}/messages", json=body, headers={"Authorization": "Bearer t0ken"})
    assert ok.status == 201
    for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await client.get(open_path)).status == 200, open_path


async def test_a_token_of_bytes_that_are_not_utf8_is_401_not_500(start_service: StartService):
    """Regression: an Authorization header with bytes that are not UTF-8 (which aiohttp keeps
    as lone surrogates) made the token check raise: a 500 with a traceback, for anyone."""
    running = await start_service(api_token="t0ken", read_token="r3ad")
    body = b'{"id": "a", "delayMs": 1000}'
    for method, token in ((b"POST", b"\xff\xfe"), (b"POST", b"t0ken\xff"), (b"GET", b"r3ad\xff")):
        reader, writer = await asyncio.open_connection("127.0.0.1", running.client.port)
        try:
            writer.write(
                method + b" /v1/topics/orders/messages" + (b"" if method == b"POST" else b"/a")
                + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: Bearer "
                + token + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                + body
            )
            status_line = await asyncio.wait_for(reader.readline(), 5)
        finally:
            writer.close()
        assert status_line.startswith(b"HTTP/1.1 401 "), (token, status_line)


async def test_rotation_accepts_the_current_and_the_previous_token(
    start_service: StartService,
):
    running = await start_service(api_token="new-token", api_token_previous="old-token")
    client, base = running.client, running.base
    for number, token in enumerate(("new-token", "old-token")):
        answer = await client.post(
            f"{base}/messages",
            json={"id": f"m{number}", "delayMs": 1000},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status == 201, token
    for wrong in ("Bearer wrong", "Bearer ", "Bearer old-token2", "Basic old-token"):
        answer = await client.get(f"{base}/stats", headers={"Authorization": wrong})
        assert answer.status == 401, wrong


async def test_metrics_token_guards_metrics_only(start_service: StartService):
    running = await start_service(
        api_token="api-token", metrics_token="scrape-token", operator_metrics_token="operator"
    )
    client = running.client
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = await client.get("/metrics", headers=headers)
        assert answer.status == 401, headers
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    for token in ("scrape-token", "operator", "api-token"):
        answer = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert answer.status == 200, token
        assert "delayq_owned_slots" in await answer.text()
    for token in ("scrape-token", "operator"):  # /metrics only
        scrape = {"Authorization": f"Bearer {token}"}
        assert (await client.get(f"{running.base}/stats", headers=scrape)).status == 401
    for probe in ("/healthz", "/readyz", "/openapi.json"):
        assert (await client.get(probe)).status == 200, probe


async def test_readiness_follows_the_service(start_service: StartService):
    running = await start_service()
    ready = await running.client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json()) == {
        "ready": True,
        "reason": "ready",
        "ownedSlots": 4,
        "consumedSlots": [0, 1, 2, 3],
        "grantedSlots": [0, 1, 2, 3],
        "unconsumedSlots": {},
    }
    assert (await running.client.get("/healthz")).status == 200
    await running.service.stop()
    assert (await running.client.get("/readyz")).status == 503


async def test_metrics_expose_depth_and_owned_slots(start_service: StartService):
    running = await start_service()
    await running.client.post(f"{running.base}/messages", json={"id": "a", "delayMs": 60_000})
    text = await (await running.client.get("/metrics")).text()
    labels = 'state="scheduled",topic="orders",topic_namespace="shop"'
    assert f"delayq_messages{{{labels}}} 1.0" in text
    assert 'delayq_owned_slots{topic="orders",topic_namespace="shop"} 4.0' in text
    assert "delayq_delivery_lateness_seconds_bucket" in text
    assert 'delayq_oldest_overdue_seconds{topic="orders",topic_namespace="shop"} 0.0' in text
    # Prometheus' Kubernetes discovery sets `namespace` on the target: never exported here
    assert "namespace=" not in text.replace("topic_namespace=", "")

    # due since 1970 and not leased (a pull topic nobody polls): overdue, for the alert
    await running.client.post(f"{running.base}/messages", json={"id": "old", "atMs": 1000})
    text = await (await running.client.get("/metrics")).text()
    [line] = [row for row in text.splitlines() if row.startswith("delayq_oldest_overdue_seconds{")]
    assert float(line.rsplit(" ", 1)[1]) > 1e9


async def test_metrics_count_stored_messages_and_time_requests_by_route(
    start_service: StartService,
):
    """The enqueue counter counts what was stored (by result), never a refusal; every request
    is timed under its route's template, so ids never become series."""
    running = await start_service()
    topic = 'topic="orders",topic_namespace="shop"'
    for _ in range(2):
        await running.client.post(f"{running.base}/messages", json={"id": "a", "delayMs": 60_000})
    await running.client.post(
        f"{running.base}/messages/batch",
        json={"mode": "upsert", "messages": [{"id": "a", "delayMs": 1}, {"id": "b", "delayMs": 1}]},
    )
    refused = await running.client.post(f"{running.base}/messages", json={"id": "c"})
    assert refused.status == 400
    await running.client.get(f"{running.base}/messages/a")
    await running.client.get(f"{running.base}/messages/some-other-id")
    await running.client.get("/no/such/path")
    text = await (await running.client.get("/metrics")).text()

    def sample(name: str, labels: str) -> float:
        [line] = [row for row in text.splitlines() if row.startswith(f"{name}{{{labels}}} ")]
        return float(line.rsplit(" ", 1)[1])

    assert sample("delayq_scheduled_total", f'result="created",{topic}') == 2.0
    assert sample("delayq_scheduled_total", f'result="exists",{topic}') == 1.0
    assert sample("delayq_scheduled_total", f'result="updated",{topic}') == 1.0
    # the refused message (400) counts nothing
    assert set(re.findall(r'delayq_scheduled_total\{result="(\w+)"', text)) == {
        "created", "exists", "updated"
    }

    requests = "delayq_http_request_duration_seconds_count"
    messages = "/v1/topics/{topic}/messages"
    assert sample(requests, f'code="201",method="POST",route="{messages}",{topic}') == 1.0
    assert sample(requests, f'code="200",method="POST",route="{messages}",{topic}') == 1.0
    assert sample(requests, f'code="400",method="POST",route="{messages}",{topic}') == 1.0
    assert sample(requests, f'code="200",method="POST",route="{messages}/batch",{topic}') == 1.0
    by_id = f"{messages}/{{id}}"
    assert sample(requests, f'code="200",method="GET",route="{by_id}",{topic}') == 1.0
    assert sample(requests, f'code="404",method="GET",route="{by_id}",{topic}') == 1.0
    assert sample(requests, f'code="404",method="GET",route="unmatched",{topic}') == 1.0
    assert "some-other-id" not in text
    assert "/no/such/path" not in text
    # no ZooKeeper, no session: the series exists only on a ZooKeeper-coordinated process
    assert "delayq_zookeeper_session_state" not in text


async def test_served_openapi_equals_the_checked_in_document(start_service: StartService):
    """The served document is the checked-in one with the topic's own slot bounds."""
    running = await start_service()
    served = await (await running.client.get("/openapi.json")).json()
    assert yaml.safe_load(DOCS.read_text()) == openapi_document(), (
        "docs/openapi.yaml is stale: python -m delayq.service.openapi > docs/openapi.yaml"
    )
    topic = running.service.topic
    assert served == json.loads(json.dumps(openapi_document(topic.slot_amount, topic.name)))
    [served_topic, start, *_] = served["paths"]["/v1/topics/{topic}/slots"]["get"]["parameters"]
    assert (served_topic["schema"]["enum"], start["schema"]["maximum"]) == (
        [topic.name],
        topic.slot_amount - 1,
    )


async def test_every_route_is_documented(start_service: StartService):
    running = await start_service()
    documented = yaml.safe_load(DOCS.read_text())["paths"]
    server = running.client.server
    assert isinstance(server, TestServer)  # the client's server is typed as its base class
    app = server.app
    assert app is not None
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path == "/openapi.json" or route.method == "HEAD":
            continue
        assert route.method.lower() in documented.get(path, {}), f"{route.method} {path}"


async def test_redis_outage_is_503_and_not_ready(start_service: StartService):
    own_redis = RedisServer().start()
    try:
        running = await start_service(redis_url=own_redis.url)
        assert (await running.client.get("/readyz")).status == 200
    finally:
        own_redis.stop()
    down = await running.client.post(f"{running.base}/messages", json={"id": "a", "delayMs": 1})
    assert down.status == 503
    assert "redis unavailable" in (await down.json())["error"]

    async def unready() -> bool:
        return (await running.client.get("/readyz")).status == 503

    # hysteresis: unready once the outage has lasted UNREADY_AFTER_S (a probe a second)
    await eventually(unready, UNREADY_AFTER_S + 3 * PROBE_INTERVAL_S, "readyz to answer 503")


async def test_a_broker_that_lost_the_functions_library_is_not_ready_until_it_is_back(
    start_service: StartService, redis_server: RedisServer, redis_client: redis.Redis
):
    """FUNCTION FLUSH under a pod logged in as the topic's restricted user: it cannot load
    the library itself, so it answers 503 (retryable) and reports not-ready saying why, until
    the admin (the operator's health pass) has loaded it again; then it is ready by itself."""
    engine_user(redis_client)
    url = redis_server.url.replace("redis://", f"redis://{ENGINE_USER}:{ENGINE_PASSWORD}@")
    running = await start_service(redis_url=url, topic_type="pull")
    client, base = running.client, running.base
    assert (await client.get("/readyz")).status == 200
    running.service.readiness.unready_after_s = 0.0  # the hysteresis is not under test here
    redis_client.function_flush()
    refused = await client.post(f"{base}/messages", json={"id": "a", "delayMs": 1})
    assert refused.status == 503
    assert refused.headers["Retry-After"]

    async def reason() -> str:
        return str((await (await client.get("/readyz")).json())["reason"])

    async def says_missing() -> bool:
        return "lacks the engine's functions library" in await reason()

    await eventually(says_missing, 5 * PROBE_INTERVAL_S, "readyz to name the library")
    assert (await client.get("/readyz")).status == 503
    functions.load(redis_client)  # the operator's part

    async def ready() -> bool:
        return (await client.get("/readyz")).status == 200

    await eventually(ready, (READY_AFTER + 3) * PROBE_INTERVAL_S, "readyz to answer 200")
    stored = await client.post(f"{base}/messages", json={"id": "a", "delayMs": 1})
    assert stored.status == 201, await stored.text()


async def test_a_write_no_replica_confirmed_is_a_retryable_503(start_service: StartService):
    """redis_sync_replicas 1 on a master with no replica: the schedule happened on the master
    but is not answered as done (503 + Retry-After, saying so); reads and the pull path's
    claims never wait."""
    running = await start_service(redis_sync_replicas=1, redis_sync_timeout_ms=50)
    client, base = running.client, running.base
    answer = await client.post(f"{base}/messages", json={"id": "w", "delayMs": 0})
    assert answer.status == 503
    assert answer.headers["Retry-After"]
    assert "confirmed by 0 of 1 replicas" in (await answer.json())["error"]
    assert (await client.get(f"{base}/messages/w")).status == 200  # it is on the master
    leased = await client.post(f"{base}/leases", json={"max": 1})
    assert [lease["id"] for lease in (await leased.json())["leases"]] == ["w"]


async def test_a_reschedule_to_a_past_instant_is_due_at_once(start_service: StartService):
    """atMs 1 (1970) is accepted as scheduling takes it: due now, the answer's dueMs the
    instant given (issue 29 asked that it be said: docs/service.md, the reschedule row)."""
    running = await start_service()
    client, base = running.client, running.base
    await client.post(f"{base}/messages", json={"id": "late", "delayMs": 3_600_000})
    moved = await client.post(f"{base}/messages/late/reschedule", json={"atMs": 1})
    assert (moved.status, (await moved.json())["dueMs"]) == (200, 1)
    stats = await (await client.get(f"{base}/stats")).json()
    assert stats["due"] == 1
