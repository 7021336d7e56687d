"""Lingering leases and acks carried on leases, against a real `delayq serve` process: the
documented consumer's one request per batch (lease with the previous batch's `ack`).

Ordering and containment only: how late a lingering lease answers is measured by
bench/bench_service.py (`--modes pull`), never asserted here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from delayq.local.processes import ServeProcess
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import ScheduleRequest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def _url(process: ServeProcess, path: str = "") -> str:
    return f"{process.url}/v1/topics/{process.config.topic}{path}"


async def _lease(
    session: aiohttp.ClientSession, process: ServeProcess, **body: Any
) -> dict[str, Any]:
    async with session.post(_url(process, "/leases"), json=body) as answer:
        assert answer.status == 200, await answer.text()
        result: dict[str, Any] = await answer.json()
        return result


async def _server_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds * 1000 + micros // 1000)


async def test_a_lingering_lease_answers_with_a_message_once_it_is_due(
    pull_process: ServeProcess,
    session: aiohttp.ClientSession,
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """Asked before the message is due, the lease waits and answers with it, not before its
    due time (on the Redis clock)."""
    queue = AsyncQueue(async_redis_client, pull_process.config.to_topic())
    [scheduled] = await queue.schedule_many([ScheduleRequest("soon", b"x", delay_ms=300)])
    asked_ms = await _server_ms(async_redis_client)
    answer = await _lease(session, pull_process, max=10, waitMs=20_000)
    answered_ms = await _server_ms(async_redis_client)
    [message] = answer["leases"]
    assert message["id"] == "soon"
    assert asked_ms < message["dueMs"] == scheduled.due_ms <= answered_ms
    assert "acks" not in answer


async def test_a_lingering_lease_answers_empty_once_its_wait_is_over(
    pull_process: ServeProcess, session: aiohttp.ClientSession
) -> None:
    started = time.monotonic()
    assert (await _lease(session, pull_process, max=10, waitMs=300))["leases"] == []
    assert time.monotonic() - started >= 0.3  # it waited, rather than answering at once


async def test_a_consumer_acking_on_its_next_lease_acks_everything_once(
    pull_process: ServeProcess,
    session: aiohttp.ClientSession,
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """The documented loop: each lease carries the previous answer's tokens in `ack`. Every
    message is leased once and acked by exactly the lease after it; nothing is left."""
    queue = AsyncQueue(async_redis_client, pull_process.config.to_topic())
    ids = {f"m{i}" for i in range(50)}
    await queue.schedule_many([ScheduleRequest(i, b"", delay_ms=0) for i in sorted(ids)])
    leased: list[str] = []
    tokens: list[str] = []
    while len(leased) < len(ids):
        answer = await _lease(session, pull_process, max=7, waitMs=5000, ack=tokens)
        assert [(r["token"], r["result"]) for r in answer["acks"]] == [
            (token, "acked") for token in tokens
        ]
        leased += [m["id"] for m in answer["leases"]]
        tokens = [m["token"] for m in answer["leases"]]
    last = await _lease(session, pull_process, max=7, ack=tokens)
    assert (last["leases"], [r["result"] for r in last["acks"]]) == ([], ["acked"] * len(tokens))
    assert sorted(leased) == sorted(ids)
    stats = await queue.stats()
    assert (stats.scheduled, stats.prepared, stats.dead) == (0, 0, 0)


async def test_a_lease_waiting_while_the_process_stops_is_answered(
    pull_process: ServeProcess,
    session: aiohttp.ClientSession,
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """SIGTERM while a 30 s lease waits: it is answered at once, 200 with its acks and no
    leases, and the process exits 0 without a traceback."""
    queue = AsyncQueue(async_redis_client, pull_process.config.to_topic())
    await queue.schedule_many([ScheduleRequest("only", b"", delay_ms=0)])
    [leased] = (await _lease(session, pull_process, waitMs=5000))["leases"]
    waiting = asyncio.create_task(
        _lease(session, pull_process, max=10, waitMs=30_000, ack=[leased["token"]])
    )

    async def acked() -> bool:  # the acks come first, then the wait
        async with session.get(_url(pull_process, "/messages/only")) as answer:
            return answer.status == 404

    await eventually(acked, 10, "the lease's ack applied")
    pull_process.terminate()
    answer = await asyncio.wait_for(waiting, 20)
    assert answer["leases"] == []
    assert [(r["id"], r["result"]) for r in answer["acks"]] == [("only", "acked")]
    assert await asyncio.to_thread(pull_process.wait, 30) == 0
    assert "Traceback" not in pull_process.log_path.read_text()


async def test_a_long_poll_whose_client_left_leases_nothing_to_it(
    pull_process: ServeProcess,
    session: aiohttp.ClientSession,
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """Regression: `delayq serve` does not cancel a handler whose client went away (a
    consumer's own timeout, a restart, a proxy's idle cut), so the long poll waited on and,
    woken by the next due message, leased it into the closed connection: nobody had it until
    its lease ran out (ackTimeout, 30 s by default). It gives what it claimed back (no
    attempt counted), and the next lease has it at once."""
    topic = pull_process.config.to_topic()
    async with aiohttp.ClientSession() as gone:  # a consumer of its own, which times out
        with pytest.raises(TimeoutError):
            await gone.post(
                _url(pull_process, "/leases"),
                json={"waitMs": 20_000},
                timeout=aiohttp.ClientTimeout(total=0.5),
            )
    await AsyncQueue(async_redis_client, topic).schedule_many(
        [ScheduleRequest("m", b"", delay_ms=0)]
    )
    drawn = slot_keys(topic, topic.slot_of("m")).key(Part.LEASES)
    # the abandoned poll, the only one waiting, is woken and claims it
    await eventually(lambda: async_redis_client.get(drawn), 10, "the abandoned poll's claim")
    [message] = (await _lease(session, pull_process, max=10, waitMs=5000))["leases"]
    assert (message["id"], message["attempt"]) == ("m", 1)
