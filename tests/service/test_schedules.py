"""Recurring schedules over HTTP, against a real `delayq serve` process: CRUD, 4xx naming the
field, and a series delivered through pull leases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
import requests

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig

TOKEN = "schedule-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def served(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    config = ServiceConfig(
        redis_url=redis_server.url,
        namespace="series",
        topic="reports",
        slot_amount=4,
        topic_type=TopicType.PULL,
        port=free_port(),
        api_token=TOKEN,
        max_payload_bytes=1024,
    )
    process = ServeProcess(config, tmp_path_factory.mktemp("serve") / "serve.log").start()

    def ready() -> bool:
        assert process.running(), process.log_path.read_text()
        try:
            return requests.get(process.url + "/readyz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(ready, 30, "delayq serve ready")
        yield process
    finally:
        process.terminate()
        process.wait()


@pytest.fixture
def api(served: ServeProcess, redis_client: redis.Redis) -> Iterator[str]:
    yield f"{served.url}/v1/topics/reports"
    for key in redis_client.scan_iter("dq:{series/reports*"):  # the session's Redis is shared
        redis_client.delete(key)


def call(method: str, url: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    answer = requests.request(method, url, json=body, headers=AUTH, timeout=10)
    return answer.status_code, answer.json()


def test_crud(api: str) -> None:
    url = f"{api}/schedules/{quote('daily/report', safe='')}"
    body: dict[str, Any] = {"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin", "payload": "go"}
    body |= {"catchUp": "skip", "priority": 4, "group": "tenant:9"}  # every occurrence's
    status, created = call("PUT", url, body)
    assert status == 201, created
    assert created["id"] == "daily/report"
    assert (created["cron"], created["timeZone"], created["catchUp"]) == (
        "0 9 * * 1-5",
        "Europe/Berlin",
        "skip",
    )
    assert created["waiting"] is True
    assert created["nextDueMs"] > created["currentDueMs"]
    assert (created["priority"], created["group"]) == (4, "tenant:9")
    # the waiting occurrence is an ordinary message, routed by the schedule id
    occurrence = quote(created["currentId"], safe="")
    status, message = call("GET", f"{api}/messages/{occurrence}?slotBasis=daily%2Freport")
    assert (status, message["state"], message["payload"]) == (200, "scheduled", "go")
    assert (message["priority"], message["group"]) == (4, "tenant:9")

    status, replaced = call("PUT", url, {"everyMs": 60_000, "payload": "v2"})
    assert (status, replaced["everyMs"], replaced["payload"]) == (200, 60_000, "v2")
    assert (replaced["priority"], "cron" in replaced, "group" in replaced) == (0, False, False)
    assert call("GET", url) == (200, replaced)
    status, listed = call("GET", f"{api}/schedules")
    assert (status, [s["id"] for s in listed["schedules"]]) == (200, ["daily/report"])

    assert call("DELETE", url) == (200, {"id": "daily/report", "result": "cancelled"})
    for method in ("GET", "DELETE"):
        status, error = call(method, url)
        assert (status, error["field"]) == (404, "id")
        assert "schedule 'daily/report': NOT_FOUND" in error["error"]
        assert "message" not in error["error"]
        assert "drop-7" not in error["error"]
    assert call("GET", f"{api}/schedules") == (200, {"schedules": []})


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "cron", "exactly one of cron"),
        ({"cron": "* * * * *", "everyMs": 5}, "cron", "exactly one of cron"),
        ({"everyMs": 0}, "everyMs", "between 1 and"),
        ({"everyMs": "5"}, "everyMs", "integer"),
        ({"cron": "61 * * * *"}, "cron", "Bad minute"),
        ({"cron": "* * * * *", "timeZone": "Mars/Olympus"}, "timeZone", "IANA"),
        ({"cron": "* * * * *", "timeZone": "Europe"}, "timeZone", "IANA"),
        ({"everyMs": 5, "startMs": 10, "endMs": 9}, "endMs", "endMs 9 is before startMs 10"),
        ({"everyMs": 5, "startMs": 0, "endMs": 1}, "endMs", "no occurrence after now"),
        ({"everyMs": 5, "startMs": -1}, "startMs", "between 0 and"),
        ({"everyMs": 5, "startMs": 2**50}, "startMs", "more than"),
        ({"everyMs": 5, "catchUp": "sometimes"}, "catchUp", "once"),
        ({"everyMs": 5, "catchUpMax": 0}, "catchUpMax", "between 1 and"),
        ({"everyMs": 5, "every": 5}, "every", "not a schedule field"),
        ({"everyMs": 5, "priority": 10}, "priority", "between 0 and 9"),
        ({"everyMs": 5, "priority": True}, "priority", "integer"),
        ({"everyMs": 5, "group": ""}, "group", "1 to 128 bytes"),
        ({"everyMs": 5, "group": "a\u0007"}, "group", "control"),
        ({"everyMs": 5, "headers": {"a": 1}}, "headers", "strings"),
        ({"everyMs": 5, "payload": "x", "encoding": "base64"}, "payload", "base64"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    api: str, body: dict[str, Any], field: str, words: str
) -> None:
    status, error = call("PUT", f"{api}/schedules/s", body)
    assert (status, error["field"]) == (400, field), error
    assert words in error["error"]
    for engine_word in ("_ms", "time_zone", "message"):  # the API's names (issue 29)
        assert engine_word not in error["error"]


def test_bad_ids_and_sizes(api: str) -> None:
    status, error = call("PUT", f"{api}/schedules/{'x' * 240}", {"everyMs": 5})
    assert (status, error["field"]) == (400, "id")
    assert "longer than 239 bytes" in error["error"]
    status, error = call("PUT", f"{api}/schedules/s", {"everyMs": 5, "payload": "x" * 2000})
    assert (status, error["field"]) == (413, "payload")
    answer = requests.put(f"{api}/schedules/s", data=b"[1]", headers=AUTH, timeout=10)
    assert (answer.status_code, answer.json()["field"]) == (400, "body")
    status, error = call("PUT", f"{served_topic_url(api, 'other')}/schedules/s", {"everyMs": 5})
    assert (status, error["field"]) == (404, "topic")
    no_token = requests.put(f"{api}/schedules/s", json={"everyMs": 5}, timeout=10)
    assert no_token.status_code == 401


def served_topic_url(api: str, topic: str) -> str:
    return api.rsplit("/", 1)[0] + "/" + topic


def test_a_series_is_delivered_through_pull_leases(api: str) -> None:
    """catchUp all: a pull consumer that asks later than a period still gets every occurrence
    (with `once`, an occurrence whose successor is due when it is claimed counts as missed)."""
    body = {"everyMs": 200, "payload": "t", "catchUp": "all"}
    status, created = call("PUT", f"{api}/schedules/tick", body)
    assert status == 201
    first = created["currentDueMs"]
    leased: list[dict[str, Any]] = []

    def four() -> bool:
        status, answer = call("POST", f"{api}/leases", {"max": 10, "waitMs": 500})
        assert status == 200, answer
        leased.extend(answer["leases"])
        if answer["leases"]:
            tokens = [lease["token"] for lease in answer["leases"]]
            assert call("POST", f"{api}/leases/ack", {"tokens": tokens})[0] == 200
        return len(leased) >= 4

    wait_until(four, 15, "four occurrences leased")
    assert [lease["id"] for lease in leased[:4]] == [f"tick@{first + k * 200}" for k in range(4)]
    assert all(lease["dueMs"] == int(lease["id"].split("@")[1]) for lease in leased)
    status, info = call("GET", f"{api}/schedules/tick")
    assert info["nextDueMs"] == info["currentDueMs"] + 200  # topped up by the serving process
