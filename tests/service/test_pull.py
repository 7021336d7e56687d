"""Pull topics over HTTP: lease batches, ack, nack with delay (and to dead), extend, fencing."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest
import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.keys import Part, slot_keys
from delayq.service.api import build_app
from delayq.service.config import ServiceConfig
from delayq.service.delivery.pull import _shares
from delayq.service.service import DelayService
from tests.service.conftest import NAMESPACE, TOPIC, GrantedLater, Running, StartService

Events = list[tuple[bytes, dict[bytes, bytes]]]  # a journal's XRANGE


async def schedule(running: Running, count: int, delay_ms: int = 0) -> None:
    messages = [{"id": f"m{i}", "delayMs": delay_ms, "payload": f"p{i}"} for i in range(count)]
    answer = await running.client.post(
        f"{running.base}/messages/batch", json={"messages": messages}
    )
    assert answer.status == 200


async def lease(running: Running, **body: int) -> list[dict[str, object]]:
    answer = await running.client.post(f"{running.base}/leases", json=body)
    assert answer.status == 200, await answer.text()
    leases: list[dict[str, object]] = (await answer.json())["leases"]
    return leases


async def test_lease_is_bounded_and_spread_over_slots(start_service: StartService):
    running = await start_service()
    await schedule(running, 40)
    first = await lease(running, max=10)
    assert len(first) == 10
    assert len({m["id"] for m in first}) == 10
    rest = await lease(running, max=1000)
    assert len(rest) == 30  # nothing leased twice, nothing over-claimed
    assert {m["id"] for m in first} | {m["id"] for m in rest} == {f"m{i}" for i in range(40)}
    assert await lease(running, max=10) == []


async def test_ack_removes_and_a_second_ack_conflicts(start_service: StartService):
    running = await start_service()
    await schedule(running, 3)
    leases = await lease(running, max=3)
    tokens = [m["token"] for m in leases]
    acked = await running.client.post(f"{running.base}/leases/ack", json={"tokens": tokens})
    assert acked.status == 200
    results = (await acked.json())["results"]
    assert [r["result"] for r in results] == ["acked"] * 3
    # a result per token, in order, carrying the token as sent (echoed, not re-encoded)
    assert [(r["id"], r["token"]) for r in results] == [(m["id"], m["token"]) for m in leases]
    again = await running.client.post(f"{running.base}/leases/ack", json={"tokens": tokens[:1]})
    assert again.status == 409
    assert (await again.json())["results"][0]["result"] == "lease_lost"
    stats = await (await running.client.get(f"{running.base}/stats")).json()
    assert stats["scheduled"] + stats["prepared"] == 0


async def _states(running: Running, ids: list[str]) -> dict[str, str]:
    """Each message's state (an acked one is `done` while the topic remembers outcomes)."""
    states = {}
    for message_id in ids:
        answer = await running.client.get(f"{running.base}/messages/{message_id}")
        states[message_id] = (await answer.json())["state"]
    return states


async def test_acks_carried_on_a_lease_ack_exactly_those_tokens(start_service: StartService):
    """A lease with `ack` acks exactly the given tokens (a result per token, in order, token
    echoed), leaves the other leases alone, and still leases what is due."""
    running = await start_service(outcome_retention_ms=60_000)
    await schedule(running, 7)
    first = await lease(running, max=3)
    second = await lease(running, max=3)
    answer = await running.client.post(
        f"{running.base}/leases", json={"max": 5, "ack": [m["token"] for m in first]}
    )
    assert answer.status == 200
    body = await answer.json()
    assert [(r["id"], r["result"], r["token"]) for r in body["acks"]] == [
        (m["id"], "acked", m["token"]) for m in first
    ]
    [third] = body["leases"]  # the one message left
    ids = {str(m["id"]) for m in [*first, *second, third]}
    assert ids == {f"m{i}" for i in range(7)}
    states = await _states(running, sorted(ids))
    acked = {m["id"] for m in first}
    assert {i for i, state in states.items() if state == "done"} == acked
    assert {i for i, state in states.items() if state == "prepared"} == ids - acked
    plain = await lease(running, max=5)  # without `ack`: no `acks` in the answer
    assert plain == []


async def test_a_lost_ack_on_a_lease_is_reported_and_the_lease_goes_on(
    start_service: StartService,
):
    """A token whose lease is gone (acked already) is reported per token; the lease answers
    200 with what is due, which a 409 would have made the consumer drop."""
    running = await start_service()
    await schedule(running, 2)
    [done] = await lease(running, max=1)
    await running.client.post(f"{running.base}/leases/ack", json={"tokens": [done["token"]]})
    answer = await running.client.post(
        f"{running.base}/leases", json={"max": 5, "ack": [done["token"]]}
    )
    assert answer.status == 200
    body = await answer.json()
    assert [(r["id"], r["result"]) for r in body["acks"]] == [(done["id"], "lease_lost")]
    assert [m["id"] for m in body["leases"]] == ["m1" if done["id"] == "m0" else "m0"]


async def test_a_lingering_lease_returns_its_acks_and_the_message_once_due(
    start_service: StartService,
):
    """A lease waiting (`waitMs`) with acks: the acks are applied before it waits, and it
    answers with a message scheduled meanwhile, never before its due time."""
    running = await start_service(outcome_retention_ms=60_000)
    await schedule(running, 1)
    [leased] = await lease(running)
    waiting = asyncio.create_task(
        running.client.post(
            f"{running.base}/leases", json={"waitMs": 20_000, "ack": [leased["token"]]}
        )
    )
    leaser = running.service.leaser
    assert leaser is not None
    await eventually(lambda: leaser.waiting == 1, 5.0, "the lease waiting")
    assert (await _states(running, ["m0"])) == {"m0": "done"}  # acked before the wait
    later = {"id": "later", "delayMs": 200, "payload": ""}
    created = await (await running.client.post(f"{running.base}/messages", json=later)).json()
    answer = await asyncio.wait_for(waiting, 10.0)
    body = await answer.json()
    assert [r["result"] for r in body["acks"]] == ["acked"]
    [message] = body["leases"]
    assert (message["id"], message["dueMs"]) == ("later", created["dueMs"])
    seconds, micros = await running.service.queues[0].redis.time()
    assert seconds * 1000 + micros // 1000 >= message["dueMs"]


def _example_consumer() -> ModuleType:
    path = Path(__file__).parents[2] / "examples" / "service" / "pull_consumer.py"
    spec = importlib.util.spec_from_file_location("pull_consumer_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_example_acks_on_its_own_when_a_lease_answer_has_no_acks(
    start_service: StartService,
):
    """The documented consumer sends its acks on the next lease. A serve process from before
    that (one not yet upgraded) ignores `ack` and answers without `acks`: the example then
    acks those tokens with a request of its own, instead of crashing on the missing field
    with its messages all coming again once their leases run out."""
    running = await start_service(outcome_retention_ms=60_000)
    await schedule(running, 2)
    handled = await lease(running, max=2)
    tokens = [str(m["token"]) for m in handled]
    example = _example_consumer()
    old_answer: dict[str, object] = {"leases": []}  # what a server ignoring `ack` answers
    await example.check_acks(running.client, f"{running.base}/leases", tokens, old_answer)
    assert await _states(running, ["m0", "m1"]) == {"m0": "done", "m1": "done"}


async def test_the_example_sends_its_acks_again_after_a_failed_lease(
    start_service: StartService, monkeypatch: pytest.MonkeyPatch
):
    """Regression: the documented consumer carried its acks on a lease request that failed
    (Redis restarting: a 503) and crashed on the answer's missing `leases`, its acks
    unapplied. It now pauses and sends the same acks with its next request: acked once Redis
    is back, the consumer still running."""
    with RedisServer(appendonly=True, extra_config={"appendfsync": "always"}) as server:
        running = await start_service(redis_url=server.url, outcome_retention_ms=60_000)
        await schedule(running, 1)
        example = _example_consumer()
        monkeypatch.setattr(example, "URL", str(running.client.make_url("")))
        monkeypatch.setattr(example, "TOPIC", TOPIC)
        handled: list[str] = []

        async def handle(message: dict[str, object]) -> bool:
            handled.append(str(message["id"]))
            server.crash()  # the next lease request, carrying this ack, fails
            return True

        monkeypatch.setattr(example, "handle", handle)
        consumer = asyncio.create_task(example.main())
        try:
            registry = running.service.metrics.registry
            labels = {
                "topic_namespace": NAMESPACE,
                "topic": TOPIC,
                "method": "POST",
                "route": "/v1/topics/{topic}/leases",
                "code": "503",
            }
            failed = "delayq_http_request_duration_seconds_count"
            await eventually(
                lambda: bool(registry.get_sample_value(failed, labels)), 10.0, "a lease 503"
            )
            server.start()

            async def acked() -> bool:
                answer = await running.client.get(f"{running.base}/messages/m0")
                return answer.status == 200 and (await answer.json())["state"] == "done"

            await eventually(acked, 10.0, "m0 acked by the consumer's next lease")
            assert not consumer.done(), consumer.exception()
            assert handled == ["m0"]
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)


async def test_nack_with_delay_redelivers_after_it(start_service: StartService):
    running = await start_service()
    await schedule(running, 1)
    [first] = await lease(running)
    nacked = await running.client.post(
        f"{running.base}/leases/nack", json={"tokens": [first["token"]], "delayMs": 300}
    )
    body = await nacked.json()
    assert body["results"][0]["result"] == "retry_scheduled"
    assert await lease(running) == []  # not before the delay
    started = time.monotonic()
    [second] = await lease(running, waitMs=5000)  # long poll until it is due again
    assert second["id"] == first["id"]
    assert second["attempt"] == 2
    assert second["dueMs"] >= body["results"][0]["atMs"]
    assert time.monotonic() - started < 4.5


async def test_an_expired_lease_is_leased_again_by_a_waiting_poll(start_service: StartService):
    """No producer wakes anyone when a lease runs out: the waiting poll's timer is armed at the
    slot's lease deadline, which its claim reported."""
    running = await start_service()
    await schedule(running, 1)
    [first] = await lease(running, ackTimeoutMs=300)
    started = time.monotonic()
    [second] = await lease(running, waitMs=5000)
    assert (second["id"], second["attempt"]) == (first["id"], 2)
    assert time.monotonic() - started < 4.5


async def test_an_expired_lease_follows_the_topics_retry_policy(start_service: StartService):
    """Regression (issue 29): a pull lease that ran out was leased again at once, whatever the
    topic's backoff; it now waits the policy's delay for the attempt that failed, as a nack
    without delayMs does (here base 600 ms), counted from the lease's deadline."""
    running = await start_service(retry_backoff_base_ms=600)
    await schedule(running, 1)
    [first] = await lease(running, ackTimeoutMs=200)
    deadline_s = time.monotonic() + 0.2
    [second] = await lease(running, waitMs=5000)
    assert (second["id"], second["attempt"]) == (first["id"], 2)
    assert time.monotonic() - deadline_s >= 0.55  # never before the backoff (clock slack)


async def test_an_expired_lease_claimed_late_is_due_its_backoff_after_its_deadline(
    start_service: StartService,
):
    """Regression: the backoff of an expired lease counted from the claim that rolled it
    back, so a claim that came late (no consumer polled while the lease ran out) added the
    whole backoff again. The failed attempt ended at the deadline: the retry is due there plus
    the backoff, and a lease after that time gets it at once."""
    backoff_ms = 500
    running = await start_service(retry_backoff_base_ms=backoff_ms)
    await schedule(running, 1)
    [first] = await lease(running, ackTimeoutMs=100)
    topic, redis_client = running.service.topic, running.service.queues[0].redis
    prepare = slot_keys(topic, topic.slot_of(str(first["id"]))).key(Part.PREPARE)
    deadline_ms = await redis_client.zscore(prepare, str(first["id"]))
    assert deadline_ms is not None
    retry_due_ms = int(deadline_ms) + backoff_ms

    async def retry_due() -> bool:
        seconds, micros = await redis_client.time()
        return seconds * 1000 + micros // 1000 >= retry_due_ms

    await eventually(retry_due, 5, "the retry's due time on the Redis clock")
    second = await lease(running)  # the first claim since the lease ran out: rolls it back
    assert [(m["id"], m["attempt"], m["dueMs"]) for m in second] == [
        (first["id"], 2, retry_due_ms)
    ]


async def test_nack_dead_and_redrive(start_service: StartService):
    running = await start_service()
    await schedule(running, 1)
    [message] = await lease(running)
    nacked = await running.client.post(
        f"{running.base}/leases/nack",
        json={"tokens": [message["token"]], "dead": True, "reason": "poison"},
    )
    assert (await nacked.json())["results"][0]["result"] == "dead"
    page = await (await running.client.get(f"{running.base}/dead?count=10")).json()
    assert [(m["id"], m["deadReason"]) for m in page["messages"]] == [("m0", "poison")]
    assert page["nextCursor"] is None
    redriven = await running.client.post(f"{running.base}/dead/redrive", json={"ids": ["m0"]})
    assert (await redriven.json())["results"] == [{"id": "m0", "result": "redriven"}]
    [again] = await lease(running, waitMs=2000)
    assert again["id"] == "m0"


async def test_a_lease_tells_the_group(start_service: StartService):
    """A lease carries the group the message was scheduled with; an ungrouped one has none."""
    running = await start_service()
    for body in ({"id": "g", "delayMs": 0, "group": "customer:7"}, {"id": "u", "delayMs": 0}):
        assert (await running.client.post(f"{running.base}/messages", json=body)).status == 201
    leased = {m["id"]: m for m in await lease(running, max=10, waitMs=2000)}
    while len(leased) < 2:
        leased.update((m["id"], m) for m in await lease(running, max=10, waitMs=2000))
    assert leased["g"]["group"] == "customer:7"
    assert "group" not in leased["u"]


async def test_redrive_or_purge_of_an_id_not_dead_is_a_404_with_every_result(
    start_service: StartService,
):
    """Regression (issue 29): an unknown id answered 200 wrong_state while `delayq dead`
    exits "not found"; now both say 404, the answer still giving each id's result."""
    running = await start_service()
    await schedule(running, 1)
    [message] = await lease(running)
    await running.client.post(
        f"{running.base}/leases/nack", json={"tokens": [message["token"]], "dead": True}
    )
    for action, done in (("redrive", "redriven"), ("purge", "purged")):
        answer = await running.client.post(
            f"{running.base}/dead/{action}", json={"ids": ["nobody", "m0"]}
        )
        assert answer.status == 404
        assert (await answer.json())["results"] == [
            {"id": "nobody", "result": "wrong_state"},
            {"id": "m0", "result": done},
        ]
        if action == "redrive":  # dead again, for the purge
            [again] = await lease(running, waitMs=2000)
            await running.client.post(
                f"{running.base}/leases/nack", json={"tokens": [again["token"]], "dead": True}
            )


async def test_a_dead_message_with_a_slot_basis_is_redriven_by_the_slot_its_page_lists(
    start_service: StartService,
):
    """The record does not keep the slot basis: routed by its id the message is missed; by
    the slot the dead page reports (what the dashboard and `delayq dead` send) it is found."""
    running = await start_service()
    topic = running.service.topic
    basis = next(
        b for b in (f"customer-{i}" for i in range(64)) if topic.slot_of(b) != topic.slot_of("x")
    )
    message = {"id": "x", "slotBasis": basis, "delayMs": 0}
    assert (await running.client.post(f"{running.base}/messages", json=message)).status == 201
    [leased] = await lease(running)
    await running.client.post(
        f"{running.base}/leases/nack", json={"tokens": [leased["token"]], "dead": True}
    )
    [listed] = (await (await running.client.get(f"{running.base}/dead")).json())["messages"]
    assert listed["slot"] == topic.slot_of(basis)
    by_id = await running.client.post(f"{running.base}/dead/redrive", json={"ids": ["x"]})
    [missed] = (await by_id.json())["results"]
    assert missed["result"] != "redriven"  # looked for in the id's own slot
    by_slot = {"ids": [{"id": "x", "slot": listed["slot"]}]}
    redriven = await running.client.post(f"{running.base}/dead/redrive", json=by_slot)
    assert (await redriven.json())["results"] == [{"id": "x", "result": "redriven"}]
    assert (await (await running.client.get(f"{running.base}/stats")).json())["dead"] == 0
    [again] = await lease(running, waitMs=2000)
    assert again["id"] == "x"


async def test_dead_pages_purge_and_redrive_all(start_service: StartService):
    running = await start_service(max_retries=0)
    await schedule(running, 7)
    tokens = [m["token"] for m in await lease(running, max=7)]
    await running.client.post(f"{running.base}/leases/nack", json={"tokens": tokens})
    seen, cursor = [], ""
    while cursor is not None:
        url = f"{running.base}/dead?count=3" + (f"&cursor={cursor}" if cursor else "")
        page = await (await running.client.get(url)).json()
        seen += [m["id"] for m in page["messages"]]
        cursor = page["nextCursor"]
    assert sorted(seen) == [f"m{i}" for i in range(7)]
    purged = await running.client.post(f"{running.base}/dead/purge", json={"ids": ["m0", "m1"]})
    assert [r["result"] for r in (await purged.json())["results"]] == ["purged", "purged"]
    moved = await running.client.post(f"{running.base}/dead/redrive", json={"all": True})
    assert (await moved.json()) == {"moved": 5}


async def test_extend_keeps_the_lease(start_service: StartService):
    running = await start_service()
    await schedule(running, 1)
    server_now = await running.service.queues[0].redis.time()
    [message] = await lease(running, ackTimeoutMs=200)
    extended = await running.client.post(
        f"{running.base}/leases/extend", json={"tokens": [message["token"]], "ackTimeoutMs": 60_000}
    )
    assert (await extended.json())["results"][0]["result"] == "extended"
    first_deadline_ms = server_now[0] * 1000 + server_now[1] // 1000 + 200

    async def past_first_deadline() -> bool:
        seconds, micros = await running.service.queues[0].redis.time()
        return seconds * 1000 + micros // 1000 > first_deadline_ms

    await eventually(past_first_deadline, 5, "the first lease deadline to pass")
    assert await lease(running) == []
    acked = await running.client.post(
        f"{running.base}/leases/ack", json={"tokens": [message["token"]]}
    )
    assert acked.status == 200


async def test_a_new_owner_fences_old_tokens(start_service: StartService):
    old = await start_service()
    await schedule(old, 1)
    [message] = await lease(old, ackTimeoutMs=60_000)
    await start_service()  # takes over every slot: epochs bump
    answer = await old.client.post(f"{old.base}/leases/ack", json={"tokens": [message["token"]]})
    assert answer.status == 409
    assert (await answer.json())["results"][0]["result"] == "stale_epoch"


async def test_long_poll_wakes_for_a_new_message(start_service: StartService):
    running = await start_service()
    waiting = asyncio.create_task(lease(running, waitMs=10_000))
    await eventually(lambda: running.service.owned_slots != [], 5, "slots owned")
    await asyncio.sleep(0.05)  # let the lease request block first
    await schedule(running, 1)
    leased = await asyncio.wait_for(waiting, 5)
    assert [m["id"] for m in leased] == ["m0"]


async def test_leases_on_a_push_topic_are_refused(start_service: StartService, receiver):
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)
    answer = await running.client.post(f"{running.base}/leases", json={})
    assert answer.status == 404
    assert "pull" in (await answer.json())["error"]


async def test_a_long_poll_sees_slots_taken_over_while_it_waits(
    redis_server: RedisServer, async_redis_client: redis.asyncio.Redis
):
    ownership = GrantedLater()
    service = DelayService(
        ServiceConfig(redis_url=redis_server.url, topic="moved", slot_amount=4), ownership
    )
    await service.start()
    client = TestClient(TestServer(build_app(service)))
    await client.start_server()
    try:
        await AsyncQueue(async_redis_client, service.topic).schedule("m", b"", delay_ms=0)
        waiting = asyncio.create_task(
            client.post("/v1/topics/moved/leases", json={"waitMs": 20_000})
        )
        await asyncio.sleep(0.1)  # the request is waiting with no slot owned
        started = time.monotonic()
        await ownership.grant(frozenset(service.topic.slots))
        answer = await asyncio.wait_for(waiting, 10)
        assert [m["id"] for m in (await answer.json())["leases"]] == ["m"]
        assert time.monotonic() - started < 5  # not at the end of the 20 s poll
    finally:
        await service.stop()
        await client.close()


async def test_a_stale_token_cannot_ack_the_upserted_version(start_service: StartService):
    """Lease v1, upsert v2, lease v2: both leases are attempt 1, yet v1's token must not ack
    (and so delete) v2, which was never processed."""
    running = await start_service()
    put = f"{running.base}/messages"
    assert (await running.client.post(put, json={"id": "u", "delayMs": 0, "payload": "v1"})).ok
    [v1] = await lease(running, max=1)
    replaced = await running.client.post(
        put, json={"id": "u", "delayMs": 0, "payload": "v2", "mode": "upsert"}
    )
    assert replaced.ok, await replaced.text()
    [v2] = await lease(running, max=1)
    assert (v1["payload"], v2["payload"], v1["attempt"], v2["attempt"]) == ("v1", "v2", 1, 1)
    assert v1["token"] != v2["token"]
    stale = await running.client.post(f"{running.base}/leases/ack", json={"tokens": [v1["token"]]})
    assert stale.status == 409
    info = await (await running.client.get(f"{put}/u")).json()
    assert (info["state"], info["payload"]) == ("prepared", "v2")
    fresh = await running.client.post(f"{running.base}/leases/ack", json={"tokens": [v2["token"]]})
    assert fresh.status == 200


async def _claims_run(client: redis.asyncio.Redis) -> int:
    """Script calls Redis has served so far (claims and the prober's few reads)."""
    stats = await client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("fcall", "fcall_ro")
    )


async def test_long_polls_wait_without_polling(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
) -> None:
    """Forty one-second long polls on an empty topic (more than could each hold a Redis
    connection) wait on the brokers' one wake-up wait: at most a claim when each starts and one
    more at its deadline (4 slots: one claim call each), never on a timer in between."""
    running = await start_service()
    before = await _claims_run(async_redis_client)
    polls = [lease(running, max=1, waitMs=1000) for _ in range(40)]
    assert await asyncio.wait_for(asyncio.gather(*polls), 10.0) == [[]] * 40
    assert await _claims_run(async_redis_client) - before <= 40 * 2 * 4 + 20


async def test_a_schedule_wakes_the_long_polls_at_once(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
) -> None:
    """A message scheduled while forty 30-second long polls wait is leased by one of them long
    before their wait ends, with a few claims, not one per waiting poll; stopping the service
    ends the others at once, empty."""
    running = await start_service()
    polls = [asyncio.create_task(lease(running, max=1, waitMs=30_000)) for _ in range(40)]
    leaser = running.service.leaser
    assert leaser is not None
    await eventually(lambda: leaser.waiting == 40, 5.0, "every poll waiting")
    before = await _claims_run(async_redis_client)
    await schedule(running, 1)
    done, waiting = await asyncio.wait(polls, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
    assert [len(task.result()) for task in done] == [1], "no poll was woken with the message"
    assert await _claims_run(async_redis_client) - before <= 5  # the schedule, a claim or two
    await running.service.stop()
    rest = await asyncio.wait_for(asyncio.gather(*waiting), 5.0)
    assert rest == [[]] * 39


@given(total=st.integers(1, 5000), parts=st.integers(1, 300))
def test_shares_add_up_exactly(total, parts):
    shares = _shares(total, parts)
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


async def test_pause_stops_leasing_and_resume_drains_the_backlog(start_service: StartService):
    """POST /pause: due messages are not leased (scheduling goes on), /stats and /metrics say
    paused; POST /resume: they are leased again."""
    running = await start_service()
    client, base = running.client, running.base
    paused = await client.post(f"{base}/pause")
    assert (paused.status, await paused.json()) == (200, {"paused": True})
    await schedule(running, 5)
    assert await lease(running, max=10) == []
    stats = await (await client.get(f"{base}/stats")).json()
    assert (stats["paused"], stats["due"]) == (True, 5)
    metrics = await (await client.get("/metrics")).text()
    assert 'delayq_paused{topic="orders",topic_namespace="shop"} 1.0' in metrics
    resumed = await client.post(f"{base}/resume")
    assert (await resumed.json()) == {"paused": False}
    assert len(await lease(running, max=10)) == 5
    assert (await (await client.get(f"{base}/stats")).json())["paused"] is False


async def test_an_idle_pull_process_reports_a_pause_set_elsewhere(start_service: StartService):
    """Paused by another process (here: the engine API on the broker), an idle pull process
    that serves no lease request still says so in /stats and /metrics."""
    running = await start_service()
    client, base = running.client, running.base
    [queue] = running.service.queues
    await queue.pause()
    assert (await (await client.get(f"{base}/stats")).json())["paused"] is True
    await running.service.refresh_depth()
    metrics = await (await client.get("/metrics")).text()
    assert 'delayq_paused{topic="orders",topic_namespace="shop"} 1.0' in metrics
    await queue.resume()
    assert (await (await client.get(f"{base}/stats")).json())["paused"] is False


async def test_a_header_with_a_lone_surrogate_is_leased_not_a_500(start_service: StartService):
    """Regression: the engine stores headers as JSON, escaping a lone surrogate (a Python
    producer may send one; the HTTP API refuses it), and the lease answer, encoded by orjson,
    failed with a 500 on it: the message and every other of the same answer were leased to
    nobody, again on each attempt until dead. The answer is encoded as it was before orjson."""
    running = await start_service()
    queue = running.service.queues[0]
    await queue.schedule("odd", b"p", delay_ms=0, headers={"h": "\ud800"})
    await schedule(running, 1)
    answer = await running.client.post(f"{running.base}/leases", json={"max": 5})
    assert answer.status == 200, await answer.text()
    leases = (await answer.json())["leases"]
    assert {(m["id"], m["headers"].get("h")) for m in leases} == {("odd", "\ud800"), ("m0", None)}


async def test_a_token_given_twice_in_one_ack_acks_once(start_service: StartService):
    """Regression: ack-7 read every lease of its call before removing any, so a token given
    twice in one request (a consumer resending its `ack` list with the token already in it)
    answered `acked` twice, counted two deliveries acked and journaled two acks for one
    message. The second is `lease_lost`, as in a request of its own."""
    running = await start_service(journal_max_len=100)
    await schedule(running, 1)
    [message] = await lease(running)
    token = message["token"]
    answer = await running.client.post(f"{running.base}/leases", json={"ack": [token, token]})
    assert answer.status == 200
    assert [r["result"] for r in (await answer.json())["acks"]] == ["acked", "lease_lost"]
    assert running.service.metrics.activity().deliveries["acked"] == 1
    slot = running.service.topic.slot_of("m0")
    journal = slot_keys(running.service.topic, slot).key(Part.JOURNAL)
    events = cast(Events, await running.service.queues[0].redis.xrange(journal))
    assert [fields[b"e"] for _, fields in events].count(b"acked") == 1



async def test_a_lease_token_of_another_topic_is_refused_with_403(start_service: StartService):
    """Holding one topic's API token and another topic's lease token is not enough: the token
    is bound to the topic that issued it, refused on ack, nack, extend and a lease's `ack`,
    and the lease it names stays as it was."""
    orders = await start_service()
    invoices = await start_service(topic="invoices")
    base = "/v1/topics/invoices"
    scheduled = await invoices.client.post(f"{base}/messages", json={"id": "m0", "delayMs": 0})
    assert scheduled.status == 201
    (leased,) = (await (await invoices.client.post(f"{base}/leases", json={})).json())["leases"]
    # the same id, slot and epoch in `orders`: unbound, the token would ack that message
    await schedule(orders, 1)
    for path, body in (
        ("/leases/ack", {"tokens": [leased["token"]]}),
        ("/leases/nack", {"tokens": [leased["token"]]}),
        ("/leases/extend", {"tokens": [leased["token"]], "ackTimeoutMs": 1000}),
        ("/leases", {"ack": [leased["token"]]}),
    ):
        answer = await orders.client.post(f"{orders.base}{path}", json=body)
        error = await answer.json()
        assert answer.status == 403, (path, error)
        assert error["field"] in ("tokens[0]", "ack[0]")
        assert "not issued by topic shop/orders" in error["error"]
    got = await invoices.client.get(f"{base}/messages/{leased['id']}")
    assert (await got.json())["state"] == "prepared"
    acked = await invoices.client.post(f"{base}/leases/ack", json={"tokens": [leased["token"]]})
    assert acked.status == 200  # its own topic takes it


def unsigned_token(token: str) -> str:
    """`token` forged without its MAC, as version 2 (unsigned, never released) wrote it."""
    fields = token.split(".")[0]
    raw = base64.urlsafe_b64decode(fields + "=" * (-len(fields) % 4)).decode()
    old = ("2" + raw[1:]).encode()
    return base64.urlsafe_b64encode(old).decode().rstrip("=")


async def test_an_unsigned_token_is_refused_right_after_a_restart(start_service: StartService):
    """Regression: unsigned (version-2) tokens were accepted for one lease length after every
    process start, so after each restart whoever held the API token could ack or nack a lease
    handed to another consumer by guessing its epoch and lease number. No release issued
    them (0.1.0's are version 1): now they are a 403 naming the token, nothing applied."""
    first = await start_service()
    await first.service.stop()
    running = await start_service()  # the restart: before, the window opened here
    await schedule(running, 1)
    [leased] = await lease(running)
    forged = unsigned_token(str(leased["token"]))
    for path, body in (
        ("/leases/ack", {"tokens": [forged]}),
        ("/leases/nack", {"tokens": [forged], "delayMs": 0}),
        ("/leases/extend", {"tokens": [forged], "ackTimeoutMs": 1000}),
        ("/leases", {"ack": [forged]}),
    ):
        answer = await running.client.post(f"{running.base}{path}", json=body)
        error = await answer.json()
        assert answer.status == 403, (path, error)
        assert error["field"] in ("tokens[0]", "ack[0]")
        assert "unsigned" in error["error"]
    got = await running.client.get(f"{running.base}/messages/{leased['id']}")
    assert (await got.json())["state"] == "prepared"  # its holder still has it
    acked = await running.client.post(
        f"{running.base}/leases/ack", json={"tokens": [leased["token"]]}
    )
    assert (await acked.json())["results"][0]["result"] == "acked"


async def test_a_nack_without_delay_follows_the_topics_retry_policy(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
):
    """Regression (issue 29): a nack without delayMs retried at once (atMs ≈ now), whatever
    the topic's backoff. Now it waits base * multiplier^(attempt-1), as the push consumer's
    nack; a given delayMs overrides it."""
    running = await start_service(retry_backoff_base_ms=400, retry_backoff_multiplier=3.0)

    async def nack(token: object, **extra: object) -> int:
        """The retry's due time less the Redis server's now at the nack, in ms."""
        answer = await running.client.post(
            f"{running.base}/leases/nack", json={"tokens": [token], **extra}
        )
        seconds, micros = await async_redis_client.time()
        [result] = (await answer.json())["results"]
        assert result["result"] == "retry_scheduled"
        return int(result["atMs"]) - (seconds * 1000 + micros // 1000)

    await schedule(running, 1)
    [first] = await lease(running)
    assert 300 <= await nack(first["token"]) <= 400  # attempt 1: the base
    [second] = await lease(running, waitMs=5000)
    assert second["attempt"] == 2
    assert 1100 <= await nack(second["token"]) <= 1200  # attempt 2: base * 3
    [third] = await lease(running, waitMs=5000)
    assert await nack(third["token"], delayMs=0) <= 0  # given: it overrides the policy
