"""Multi-slot operations run as one pipeline of bare EVALSHAs: no SCRIPT EXISTS round trip,
and a script cache emptied under them (a restart, a failover to a fresh replica) is refilled
without running any call twice."""

from __future__ import annotations

import redis
import redis.asyncio

from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.codes import StaleEpochError
from delayq.queue.model import ClaimBatch, ScheduleRequest, SlotClaim, State

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
    claims = [SlotClaim(slot, queue.take_over(slot), 5) for slot in TOPIC.slots]
    for _ in range(3):
        queue.claim_slots(claims)
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


def test_a_multi_slot_claim_takes_each_slot_its_own_count(queue: Queue) -> None:
    queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=0) for i in IDS])
    per_slot = {slot: sum(1 for i in IDS if TOPIC.slot_of(i) == slot) for slot in TOPIC.slots}
    a, b, c = [slot for slot in TOPIC.slots if per_slot[slot] >= 2][:3]
    epoch_a, epoch_b = queue.take_over(a), queue.take_over(b)
    fenced = queue.take_over(c) - 1  # a newer owner: its error in place, the others unharmed
    claims = [SlotClaim(a, epoch_a, 2), SlotClaim(b, epoch_b, 1), SlotClaim(c, fenced, 2)]
    first, second, third = queue.claim_slots(claims)
    assert isinstance(first, ClaimBatch)
    assert (first.slot, len(first.messages)) == (a, 2)
    assert isinstance(second, ClaimBatch)
    assert (second.slot, len(second.messages)) == (b, 1)
    assert isinstance(third, StaleEpochError)
