"""Multi-slot operations run as one pipeline of bare EVALSHAs: no SCRIPT EXISTS round trip,
and a script cache emptied under them (a restart, a failover to a fresh replica) is refilled
without running any call twice."""

from __future__ import annotations

import redis
import redis.asyncio

from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.model import ScheduleRequest, State

from .conftest import TOPIC

IDS = [f"p{i}" for i in range(40)]  # spread over all of TOPIC's slots


def exists_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_script|exists", {})
    return int(stats.get("calls", 0))


def test_a_flushed_script_cache_is_reloaded_and_each_call_runs_once(
    queue: Queue, redis_client: redis.Redis
) -> None:
    assert len({TOPIC.slot_of(i) for i in IDS}) == TOPIC.slot_amount
    queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=60_000) for i in IDS[:20]])
    redis_client.script_flush()
    results = queue.schedule_many([ScheduleRequest(i, b"y", delay_ms=60_000) for i in IDS])
    assert [r.code.name for r in results] == ["EXISTS"] * 20 + ["CREATED"] * 20
    assert queue.get(IDS[0]).payload == b"x"  # the first schedule kept, not overwritten
    assert queue.stats().scheduled == 40


def test_pipelines_never_ask_script_exists(queue: Queue, redis_client: redis.Redis) -> None:
    queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=0) for i in IDS])
    before = exists_calls(redis_client)
    epochs = [(slot, queue.take_over(slot)) for slot in TOPIC.slots]
    for _ in range(3):
        queue.claim_slots(epochs, 5)
    assert exists_calls(redis_client) == before


async def test_the_async_client_reloads_too(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    redis_client.script_flush()
    results = await async_queue.schedule_many(
        [ScheduleRequest(i, b"z", delay_ms=60_000) for i in IDS]
    )
    assert {r.code.name for r in results} == {"CREATED"}
    assert (await async_queue.get(IDS[-1])).state is State.SCHEDULED
