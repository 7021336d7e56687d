"""A batch whose later calls are refused (Redis out of memory) after earlier ones stored their
messages (a call holds up to MAX_MESSAGES_PER_CALL messages of the broker's slots):
`schedule_many` says exactly which items are stored, in both clients; a full broker is a
BrokerFullError (still a redis-py OutOfMemoryError) wherever it shows."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from delayq.queue import BrokerFullError
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.codes import as_typed_error
from delayq.queue.model import PartlyStoredError, ScheduleFailure, ScheduleRequest, State
from delayq.queue.plans import MAX_MESSAGES_PER_CALL
from delayq.queue.topic import Topic
from tests.redis_memory import FULL, footprint, memory_for

PROBE = Topic("probe", namespace="probe", slot_amount=64)
TOPIC = Topic("orders", namespace="shop", slot_amount=64)
#: three calls: a limit of half the batch takes the first two and refuses the third
BATCH = [
    ScheduleRequest(f"m{i}", b"x" * 1024, delay_ms=60_000) for i in range(3 * MAX_MESSAGES_PER_CALL)
]


def check_report(client: redis.Redis, error: PartlyStoredError) -> None:
    """Stored results are stored, failures are not; both kinds occur, in the batch's order."""
    queue = Queue(client, TOPIC)
    assert [r.id for r in error.results] == [r.id for r in BATCH]
    failures = error.failures
    assert 0 < len(failures) < len(BATCH)
    assert all(isinstance(f.error, BrokerFullError) for f in failures)
    assert all(isinstance(f.error, redis.exceptions.OutOfMemoryError) for f in failures)
    assert "maxmemory" in str(error)
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
    with memory_for(redis_client, FULL), pytest.raises(BrokerFullError, match="maxmemory"):
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


def test_a_full_broker_refuses_with_broker_full_in_both_clients(
    redis_client: redis.Redis, async_redis_client: redis.asyncio.Redis
) -> None:
    """One message (one script call) and a multi-slot batch (a pipeline) on a full Redis:
    BrokerFullError carrying Redis's words and its original error; nothing stored."""
    queue = Queue(redis_client, TOPIC)
    batch = BATCH[:100]
    with memory_for(redis_client, FULL):
        with pytest.raises(BrokerFullError, match="maxmemory") as one:
            queue.schedule("one", b"x", delay_ms=1000)
        assert isinstance(one.value.__cause__, redis.exceptions.OutOfMemoryError)
        with pytest.raises(BrokerFullError):
            queue.schedule_many(batch)
    assert queue.stats().scheduled == 0


async def test_a_full_broker_refuses_with_broker_full_in_the_async_client(
    redis_client: redis.Redis, async_redis_client: redis.asyncio.Redis
) -> None:
    queue = AsyncQueue(async_redis_client, TOPIC)
    with memory_for(redis_client, FULL):
        with pytest.raises(BrokerFullError, match="maxmemory"):
            await queue.schedule("one", b"x", delay_ms=1000)
        with pytest.raises(BrokerFullError):
            await queue.schedule_many(BATCH[:100])
    assert Queue(redis_client, TOPIC).stats().scheduled == 0


def test_broker_full_is_recognised_by_the_words_of_redis() -> None:
    """redis-py maps "OOM ..." to OutOfMemoryError; servers that wrap a script's refusal in
    "ERR Error running script" give a plain ResponseError with the same words."""
    wrapped = redis.exceptions.ResponseError(
        "Error running script (call to f_0): @user_script:12: -OOM command not allowed "
        "when used memory > 'maxmemory'."
    )
    oom = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    for error in (wrapped, oom):
        typed = as_typed_error(error)
        assert isinstance(typed, BrokerFullError)
        assert typed.__cause__ is error
        assert str(typed) == str(error)
        assert as_typed_error(typed) is typed
    other = redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write.")
    assert as_typed_error(other) is other
    assert as_typed_error(ValueError("x")).__class__ is ValueError
