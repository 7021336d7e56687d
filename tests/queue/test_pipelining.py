"""Multi-slot operations run as one pipeline of FCALLs, and a functions library lost under
them (a restart without persistence, FUNCTION FLUSH) is loaded again by a client that may,
without running any call twice; a restricted client runs nothing until the admin has."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.queue import functions
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.codes import StaleEpochError
from delayq.queue.functions import FunctionsMissingError
from delayq.queue.model import ClaimBatch, ScheduleRequest, SlotClaim, State

from .conftest import TOPIC

IDS = [f"p{i}" for i in range(40)]  # spread over all of TOPIC's slots


def test_a_flushed_library_is_reloaded_and_each_call_runs_once(redis_client: redis.Redis) -> None:
    queue = Queue(redis_client, TOPIC)  # the admin: it may load the library
    assert len({TOPIC.slot_of(i) for i in IDS}) == TOPIC.slot_amount
    queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=60_000) for i in IDS[:20]])
    redis_client.function_flush()
    results = queue.schedule_many([ScheduleRequest(i, b"y", delay_ms=60_000) for i in IDS])
    assert [r.code.name for r in results] == ["EXISTS"] * 20 + ["CREATED"] * 20
    assert queue.get(IDS[0]).payload == b"x"  # the first schedule kept, not overwritten
    redis_client.function_flush()
    assert queue.stats().scheduled == 40  # a single call reloads too


def test_a_restricted_client_runs_nothing_until_the_library_is_back(
    queue: Queue, redis_client: redis.Redis
) -> None:
    redis_client.function_flush()
    with pytest.raises(FunctionsMissingError, match=functions.library().name):
        queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=60_000) for i in IDS])
    with pytest.raises(FunctionsMissingError):
        queue.schedule("one", b"x", delay_ms=60_000)
    assert redis_client.dbsize() == 0
    assert functions.load(redis_client)  # the operator's part
    assert queue.schedule("one", b"x", delay_ms=60_000).code.name == "CREATED"


def test_a_claim_of_several_slots_is_one_fcall_per_broker(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """claimmany-1 up to MAX_MESSAGES_PER_CALL messages a call; one slot stays claim-13."""
    queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=0) for i in IDS])
    claims = [SlotClaim(slot, queue.take_over(slot), 5) for slot in TOPIC.slots]
    redis_client.config_resetstat()
    for _ in range(3):
        queue.claim_slots(claims)
    queue.claim_slots([SlotClaim(slot, epoch, 400) for slot, epoch, _ in claims])  # two calls
    queue.claim_slots(claims[:1])
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] == 3 + 2 + 1
    assert not {"cmdstat_evalsha", "cmdstat_function|load"} & set(stats)


async def test_the_async_client_reloads_too(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    await client.function_flush()
    async_queue = AsyncQueue(client, TOPIC)
    try:
        results = await async_queue.schedule_many(
            [ScheduleRequest(i, b"z", delay_ms=60_000) for i in IDS]
        )
        assert {r.code.name for r in results} == {"CREATED"}
        await client.function_flush()
        assert (await async_queue.get(IDS[-1])).state is State.SCHEDULED
    finally:
        await async_queue.close()


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
