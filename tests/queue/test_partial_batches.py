"""A batch whose later slots' calls are refused (Redis out of memory) after earlier ones stored
their messages: `schedule_many` says exactly which items are stored, in both clients."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.model import PartlyStoredError, ScheduleFailure, ScheduleRequest, State
from delayq.queue.topic import Topic
from tests.redis_memory import FULL, footprint, memory_for

PROBE = Topic("probe", namespace="probe", slot_amount=64)
TOPIC = Topic("orders", namespace="shop", slot_amount=64)
BATCH = [ScheduleRequest(f"m{i}", b"x" * 1024, delay_ms=60_000) for i in range(640)]


def check_report(client: redis.Redis, error: PartlyStoredError) -> None:
    """Stored results are stored, failures are not; both kinds occur, in the batch's order."""
    queue = Queue(client, TOPIC)
    assert [r.id for r in error.results] == [r.id for r in BATCH]
    failures = error.failures
    assert 0 < len(failures) < len(BATCH)
    assert all(isinstance(f.error, redis.exceptions.OutOfMemoryError) for f in failures)
    for result in error.results:
        state = queue.get(result.id).state
        assert state is (State.ABSENT if isinstance(result, ScheduleFailure) else State.SCHEDULED)
    assert queue.stats().scheduled == len(BATCH) - len(failures)


def half_a_batch(client: redis.Redis) -> int:
    return footprint(client, "probe", lambda: Queue(client, PROBE).schedule_many(BATCH)) // 2


def test_sync_schedule_many_reports_which_items_were_stored(redis_client: redis.Redis) -> None:
    queue = Queue(redis_client, TOPIC)
    half = half_a_batch(redis_client)
    with memory_for(redis_client, half), pytest.raises(PartlyStoredError) as caught:
        queue.schedule_many(BATCH)
    check_report(redis_client, caught.value)
    with memory_for(redis_client, FULL), pytest.raises(redis.exceptions.OutOfMemoryError):
        # every call writes, so every call is refused: nothing stored, the error itself
        queue.schedule_many([r._replace(id=f"new-{r.id}") for r in BATCH])
    assert queue.stats().scheduled == len(BATCH) - len(caught.value.failures)
    assert queue.schedule_many([]) == []


async def test_async_schedule_many_reports_which_items_were_stored(
    redis_client: redis.Redis, async_redis_client: redis.asyncio.Redis
) -> None:
    queue = AsyncQueue(async_redis_client, TOPIC)
    half = half_a_batch(redis_client)
    with memory_for(redis_client, half), pytest.raises(PartlyStoredError) as caught:
        await queue.schedule_many(BATCH)
    check_report(redis_client, caught.value)
    failed = {f.id for f in caught.value.failures}
    resent = await queue.schedule_many([r for r in BATCH if r.id in failed])
    assert {r.state for r in resent} == {State.SCHEDULED}
    assert Queue(redis_client, TOPIC).stats().scheduled == len(BATCH)
