"""Bad input to a real service (in process, on the session's redis-server) is a 400 that names
the field and the rule — never a 5xx, never accepted-but-undeliverable — and the OpenAPI
document states every bound the parser enforces; partly stored batches say what was stored."""

from __future__ import annotations

import gzip
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue.model import Lease
from tests.redis_memory import FULL, memory_for
from tests.service.conftest import Running, StartService


async def post(running: Running, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    answer = await running.client.post(running.base + path, json=body)
    return answer.status, await answer.json()


async def test_control_characters_in_ids_and_slot_bases_are_400(start_service: StartService):
    running = await start_service()
    for bad in ("a\x00", "a\r\nX-Evil: 1", "a\x7f", "a\x9b"):
        for field in ("id", "slotBasis"):
            status, error = await post(running, "/messages", {"id": "a", "delayMs": 1, field: bad})
            assert (status, error["field"]) == (400, field), (bad, error)
            assert "control character" in error["error"]
    status, error = await post(running, "/dead/redrive", {"ids": ["ok", "a\nb"]})
    assert (status, error["field"]) == (400, "ids[1].id")


async def test_lone_surrogates_are_400(start_service: StartService):
    running = await start_service()
    for body, field in [
        (b'{"id": "\\ud800", "delayMs": 1}', "id"),
        (b'{"id": "a", "slotBasis": "\\udc00", "delayMs": 1}', "slotBasis"),
    ]:
        answer = await running.client.post(
            f"{running.base}/messages", data=body, headers={"Content-Type": "application/json"}
        )
        assert (answer.status, (await answer.json())["field"]) == (400, field)
    status, error = await post(running, "/dead/purge", {"ids": ["\ud800"]})
    assert (status, error["field"]) == (400, "ids[0].id")


async def test_bodies_are_parsed_as_the_standard_library_parses_them(
    start_service: StartService,
):
    """orjson parses the bodies; what it refuses goes to the standard library, so the API takes
    and refuses what it did before: UTF-16 and a UTF-8 byte order mark are JSON, deep nesting
    and bad syntax are a 400 naming `body`."""
    running = await start_service()
    text = '{"id": "%s", "delayMs": 60000}'
    for message_id, data in [
        ("utf16", (text % "utf16").encode("utf-16")),
        ("bom", (text % "bom").encode("utf-8-sig")),
    ]:
        answer = await running.client.post(f"{running.base}/messages", data=data)
        assert (answer.status, (await answer.json())["id"]) == (201, message_id)
    for data, message in [
        (b"[" * 100_000, "body nests too deeply to parse"),
        (b'{"id": "a",', "body must be valid JSON"),
    ]:
        answer = await running.client.post(f"{running.base}/messages", data=data)
        assert (answer.status, await answer.json()) == (400, {"error": message, "field": "body"})


async def test_a_body_not_in_its_content_encoding_is_400_not_500(start_service: StartService):
    """Regression: a body whose bytes do not follow its Content-Encoding (aiohttp inflates
    gzip and deflate bodies) made reading it raise RequestPayloadError: a 500, logged with a
    traceback (test_serve_contract: one warning). Correctly compressed JSON is read as ever,
    on a new connection (the 400 closes its own rather than read on in the broken body)."""
    running = await start_service()
    for encoding in ("gzip", "deflate"):
        answer = await running.client.post(
            f"{running.base}/messages",
            data=b"not compressed at all",
            headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
        )
        assert (answer.status, (await answer.json())["field"]) == (400, "body"), encoding
    zipped = gzip.compress(b'{"id": "zipped", "delayMs": 60000}')
    answer = await running.client.post(
        f"{running.base}/messages", data=zipped, headers={"Content-Encoding": "gzip"}
    )
    assert answer.status == 201


async def test_ids_with_braces_and_slashes_are_addressable(start_service: StartService):
    """aiohttp's default `{id}` pattern refused braces: such ids were stored, then 404."""
    running = await start_service()
    client, base = running.client, running.base
    for message_id, path_id in (("a{b}", "a%7Bb%7D"), ("x/y", "x%2Fy"), ("é %", "%C3%A9%20%25")):
        status, _ = await post(running, "/messages", {"id": message_id, "delayMs": 60_000})
        assert status == 201
        got = await client.get(f"{base}/messages/{path_id}")
        assert (got.status, (await got.json())["id"]) == (200, message_id)
        moved = await client.post(f"{base}/messages/{path_id}/reschedule", json={"delayMs": 5000})
        assert moved.status == 200
        assert (await client.delete(f"{base}/messages/{path_id}")).status == 200


async def test_a_message_with_a_slot_basis_is_addressed_with_it(start_service: StartService):
    running = await start_service(slot_amount=64)
    client, base = running.client, running.base
    status, created = await post(
        running, "/messages", {"id": "a", "slotBasis": "customer-1", "delayMs": 60_000}
    )
    assert status == 201
    missing = await client.get(f"{base}/messages/a")
    assert missing.status == 404
    assert "slotBasis" in (await missing.json())["error"]
    found = await client.get(f"{base}/messages/a", params={"slotBasis": "customer-1"})
    assert (found.status, (await found.json())["slot"]) == (200, created["slot"])
    empty = await client.get(f"{base}/messages/a", params={"slotBasis": ""})
    assert (empty.status, (await empty.json())["field"]) == (400, "slotBasis")
    two = [
        {"id": "b", "slotBasis": "customer-1", "delayMs": 1},
        {"id": "b", "slotBasis": "customer-2", "delayMs": 1},
    ]
    status, error = await post(running, "/messages/batch", {"messages": two})
    assert (status, error["field"]) == (400, "messages[1].slotBasis")


async def test_one_id_twice_in_a_batch_is_400_and_nothing_is_stored(
    start_service: StartService,
):
    """Regression: a batch giving one message twice was stored in part: 200 with the first
    `created` and the second `exists` (its own payload dropped, as if it had been there
    before), or in upsert mode whichever came last."""
    running = await start_service()
    for mode in ("create", "upsert"):
        twice = [
            {"id": "keep", "delayMs": 60_000},
            {"id": "twice", "delayMs": 60_000, "payload": "first"},
            {"id": "twice", "delayMs": 60_000, "payload": "second"},
        ]
        status, error = await post(running, "/messages/batch", {"messages": twice, "mode": mode})
        assert (status, error["field"]) == (400, "messages[2].id"), error
        for message_id in ("keep", "twice"):
            got = await running.client.get(f"{running.base}/messages/{message_id}")
            assert got.status == 404, message_id


async def test_deeply_nested_json_is_400(start_service: StartService):
    running = await start_service()
    answer = await running.client.post(
        f"{running.base}/messages",
        data=b"[" * 100_000 + b"]" * 100_000,
        headers={"Content-Type": "application/json"},
    )
    assert (answer.status, (await answer.json())["field"]) == (400, "body")


async def test_a_bad_ack_on_a_lease_is_400_naming_it_and_nothing_is_acked_or_leased(
    start_service: StartService,
):
    """The lease's `ack` is checked whole before Redis is touched: one bad token refuses the
    request, so the good tokens before it are not acked and nothing due is leased."""
    running = await start_service(outcome_retention_ms=60_000)
    for message_id in ("a", "b"):
        assert (await post(running, "/messages", {"id": message_id, "delayMs": 0}))[0] == 201
    status, leased = await post(running, "/leases", {"max": 1})
    good = leased["leases"][0]["token"]
    forged = running.service.lease_tokens.encode(Lease(4, "a", 1, 1))  # slot 4 of 0..3
    for ack, field in (
        ([good, "not a token"], "ack[1]"),
        ([good, forged], "ack[1]"),
        ([good, good[:-4] + "AAAA"], "ack[1]"),  # its MAC altered: a 403
        ([good, 7], "ack[1]"),
        ("tokens", "ack"),
        ([good] * 1001, "ack"),
    ):
        status, error = await post(running, "/leases", {"max": 5, "ack": ack})
        assert status in (400, 403)
        assert error["field"] == field, (ack, error)
    leased_id = leased["leases"][0]["id"]
    [due_id] = {"a", "b"} - {leased_id}
    for message_id, state in ((leased_id, "prepared"), (due_id, "scheduled")):
        got = await running.client.get(f"{running.base}/messages/{message_id}")
        assert (await got.json())["state"] == state, message_id


async def test_lease_slots_outside_the_topic_are_400(start_service: StartService):
    running = await start_service()
    for slot in (-1, 4, 2**40):
        token = running.service.lease_tokens.encode(Lease(slot, "a", 1, 1))
        for action in ("ack", "nack", "extend"):
            status, error = await post(
                running, f"/leases/{action}", {"tokens": [token], "ackTimeoutMs": 1000}
            )
            assert (status, error["field"]) == (400, "tokens[0]"), (slot, action, error)
            assert "outside 0..3" in error["error"]


async def test_huge_dead_cursors_are_400_not_503(start_service: StartService):
    running = await start_service()
    for cursor in ("0:100000000000000000000", "1e20", "0:-1", "\u0663:0"):
        answer = await running.client.get(f"{running.base}/dead", params={"cursor": cursor})
        assert (answer.status, (await answer.json())["field"]) == (400, "cursor"), cursor
    answer = await running.client.get(f"{running.base}/dead", params={"count": "9" * 5000})
    assert (answer.status, (await answer.json())["field"]) == (400, "count")


async def test_405_names_the_allowed_methods(start_service: StartService):
    running = await start_service()
    answer = await running.client.request("TRACE", f"{running.base}/messages")
    assert answer.status == 405
    assert answer.headers["Allow"] == "POST"
    assert "error" in await answer.json()


def _body_for(path: str, field: str, value: Any) -> tuple[str, dict[str, Any]]:
    """A request that is valid except, possibly, `field` = `value`."""
    message = {"id": "bound", "delayMs": 1}
    if field in ("delayMs", "atMs"):
        return "/messages", {"id": "bound", field: value}
    if field == "messages":
        return "/messages/batch", {"messages": [{**message, "id": f"b{i}"} for i in range(value)]}
    if field == "id":
        return "/messages", {**message, "id": "x" * value}
    if field == "priority":
        return "/messages", {**message, "id": f"p{value}", field: value}
    return path, {field: value}


async def test_a_priority_not_an_integer_from_0_to_9_is_400_naming_it(
    start_service: StartService,
):
    running = await start_service()
    for bad in (True, 1.5, "3", 10, -1, [1]):
        for path, body, field in (
            ("/messages", {"id": "p", "delayMs": 1, "priority": bad}, "priority"),
            (
                "/messages/batch",
                {"messages": [{"id": "p", "delayMs": 1, "priority": bad}]},
                "messages[0].priority",
            ),
        ):
            status, error = await post(running, path, body)
            assert (status, error["field"]) == (400, field), (bad, error)
            assert error["error"] == f"{field} must be an integer between 0 and 9"
    assert (await running.client.get(f"{running.base}/messages/p")).status == 404


async def test_a_bad_group_is_400_naming_it(start_service: StartService):
    running = await start_service()
    for bad, problem in (
        ("", "must be a non-empty string"),
        (7, "must be a non-empty string"),
        (["a"], "must be a non-empty string"),
        ("a\u0000b", "contains the control character U+0000"),
        ("x" * 129, "is longer than 128 bytes"),
        ("\ud800", "lone surrogate"),
    ):
        for path, body, field in (
            ("/messages", {"id": "p", "delayMs": 1, "group": bad}, "group"),
            (
                "/messages/batch",
                {"messages": [{"id": "p", "delayMs": 1, "group": bad}]},
                "messages[0].group",
            ),
        ):
            status, error = await post(running, path, body)
            assert (status, error["field"]) == (400, field), (bad, error)
            assert problem in error["error"], (bad, error)
    assert (await running.client.get(f"{running.base}/messages/p")).status == 404


async def test_a_due_time_too_far_ahead_names_the_field_given(start_service: StartService):
    """Regression: an atMs past now + 20 years (TOO_FAR, which only the script can tell) was
    a 400 naming `delayMs`, a field the request did not have."""
    running = await start_service()
    far = {"atMs": 2**52}
    status, error = await post(running, "/messages", {"id": "far", **far})
    assert (status, error["field"]) == (400, "atMs"), error
    assert (await post(running, "/messages", {"id": "near", "delayMs": 60_000}))[0] == 201
    for when, field in ((far, "atMs"), ({"delayMs": 2**52}, "delayMs")):
        status, error = await post(running, "/messages/near/reschedule", when)
        assert (status, error["field"]) == (400, field), error


async def test_every_documented_bound_is_the_enforced_bound(start_service: StartService):
    """Values at each bound the OpenAPI document states pass the parser; one beyond it is a
    400 naming the field: the document and the parser share their constants."""
    running = await start_service(topic_type="pull", pull_max_lease_batch=1000)
    document = await (await running.client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    paths = document["paths"]
    lease = paths["/v1/topics/{topic}/leases"]["post"]["requestBody"]["content"]
    lease_props = lease["application/json"]["schema"]["properties"]
    batch = paths["/v1/topics/{topic}/messages/batch"]["post"]["requestBody"]["content"]
    bounds = [
        ("/messages", "delayMs", schemas["ScheduleRequest"]["properties"]["delayMs"]),
        ("/messages", "atMs", schemas["ScheduleRequest"]["properties"]["atMs"]),
        ("/messages", "priority", schemas["ScheduleRequest"]["properties"]["priority"]),
        ("/leases", "ackTimeoutMs", lease_props["ackTimeoutMs"]),
        ("/leases", "waitMs", lease_props["waitMs"]),
        ("/leases", "max", lease_props["max"]),
    ]
    for path, field, schema in bounds:
        low, high = schema["minimum"], schema["maximum"]
        for value, accepted in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
            if field in ("waitMs", "atMs") and value == high:
                continue  # a 30 s long poll; an instant past now + 20 years (TOO_FAR, a 400)
            status, answer = await post(running, *_body_for(path, field, value))
            assert (status < 400) is accepted, (field, value, answer)
            if not accepted:
                assert answer["field"] == field
    items = batch["application/json"]["schema"]["properties"]["messages"]
    id_schema = schemas["ScheduleRequest"]["properties"]["id"]
    for field, low, high in (
        ("messages", items["minItems"], items["maxItems"]),
        ("id", id_schema["minLength"], id_schema["maxLength"]),
    ):
        for value, accepted in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
            status, answer = await post(running, *_body_for("", field, value))
            assert (status < 400) is accepted, (field, value, answer)
    cursor = paths["/v1/topics/{topic}/dead"]["get"]["parameters"][1]["schema"]["pattern"]
    assert cursor == "^[0-9]{1,5}:[0-9]{1,15}$"
    # a cursor past the last slot (4 of 4) is the end: an empty page, as the pattern allows
    for value, status in (("3:" + "9" * 15, 200), ("3:" + "9" * 16, 400), ("4:0", 200)):
        response = await running.client.get(f"{running.base}/dead", params={"cursor": value})
        assert response.status == status, value


async def test_a_partly_stored_batch_says_which_items_to_resend(
    second_broker: RedisServer,  # first: torn down after the service stops
    redis_server: RedisServer,
    start_service: StartService,
    redis_client: redis.Redis,
):
    """Redis out of memory on one broker of two for a batch over 64 slots: 207, each item
    stored or failed as it really is, Retry-After; a batch of which nothing fits is 429 (broker
    full). (One broker writes a batch of up to 1,000 in one call, all of it or nothing.)"""
    running = await start_service(
        slot_amount=64, broker_urls=f"{redis_server.url},{second_broker.url}"
    )
    messages: list[dict[str, Any]] = [
        {"id": f"m{i}", "delayMs": 60_000, "payload": "x" * 1024} for i in range(640)
    ]
    with memory_for(redis_client, FULL):
        answer = await running.client.post(
            f"{running.base}/messages/batch", json={"messages": messages}
        )
        assert answer.status == 207
        assert int(answer.headers["Retry-After"]) > 0
        results = (await answer.json())["results"]
    assert [r["id"] for r in results] == [m["id"] for m in messages]
    assert {r["result"] for r in results} == {"created", "failed"}
    failed = {r["id"] for r in results if r["result"] == "failed"}
    errors = {r["error"].partition(":")[0] for r in results if r["result"] == "failed"}
    assert errors == {"BrokerFullError"}
    for result in results:
        got = await running.client.get(f"{running.base}/messages/{result['id']}")
        assert got.status == (404 if result["id"] in failed else 200)
    resend = [m for m in messages if m["id"] in failed]
    status, again = await post(running, "/messages/batch", {"messages": resend})
    assert (status, {r["result"] for r in again["results"]}) == (200, {"created"})
    second = redis.Redis.from_url(second_broker.url)
    with memory_for(redis_client, FULL), memory_for(second, FULL):
        for path, body in (
            (
                "/messages/batch",
                {"messages": [{"id": "n1", "delayMs": 1}, {"id": "n2", "delayMs": 1}]},
            ),
            ("/messages", {"id": "n3", "delayMs": 1}),
        ):
            full = await running.client.post(running.base + path, json=body)
            assert full.status == 429, path
            assert int(full.headers["Retry-After"]) > 0
            assert "broker is full" in (await full.json())["error"]
    second.close()
