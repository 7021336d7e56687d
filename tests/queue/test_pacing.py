"""The topic's pace on a real redis-server, as the topic's restricted user: the rate limit's
token bucket (pace-1) and a receiver's hold (hold-1), both on the Redis server's clock."""

from __future__ import annotations

import asyncio

import redis

from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.keys import pace_key
from delayq.queue.pacing import MAX_HOLD_MS, Pacer, burst_of

from .conftest import TOPIC


async def test_the_bucket_grants_its_burst_then_its_rate(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    assert await async_queue.pace(100.0, 10, 50, 5) == (10, 0)  # a new bucket starts full
    granted, wait_ms = await async_queue.pace(100.0, 10, 50, 5)
    assert granted == 0
    assert 1 <= wait_ms <= 50
    await asyncio.sleep(wait_ms / 1000 + 0.01)
    granted, _ = await async_queue.pace(100.0, 10, 50, 5)
    assert 5 <= granted <= 10  # refilled at the rate, never above the burst
    assert 0 < redis_client.pttl(pace_key(TOPIC)) <= 1000 + 100  # gone once full again


async def test_tokens_a_claim_did_not_use_are_given_back(async_queue: AsyncQueue) -> None:
    assert (await async_queue.pace(1.0, 10, 10, 1))[0] == 10
    assert (await async_queue.pace(1.0, 10, 10, 1, returned=7))[0] == 7


async def test_a_hold_grants_nothing_until_it_ends_and_is_bounded(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    now_ms = int(redis_client.time()[0]) * 1000
    until_ms = await async_queue.hold(300, MAX_HOLD_MS)
    assert now_ms <= until_ms <= now_ms + 2000
    granted, wait_ms = await async_queue.pace(0.0, 1, 10, 1)  # no rate limit: the hold still
    assert granted == 0
    assert 200 <= wait_ms <= 300
    assert await async_queue.hold(100, MAX_HOLD_MS) == until_ms  # a longer hold stays
    capped = await async_queue.hold(10**9, 1000)
    assert capped - until_ms <= 1000  # never beyond max_ms from now
    await eventually(
        lambda: _granted(async_queue), 3, "the hold ends, within its bound", interval_s=0.05
    )


async def _granted(queue: AsyncQueue) -> bool:
    return await queue.pace(0.0, 1, 10, 1) == (10, 0)


async def test_a_pacer_holds_its_own_process_at_once(async_queue: AsyncQueue) -> None:
    pacer = Pacer(async_queue, 0.0)
    assert await pacer.take(8) == (8, 0.0)
    await pacer.hold(10**9)  # bounded by MAX_HOLD_MS
    granted, wait_ms = await pacer.take(8)
    assert granted == 0
    assert 0 < wait_ms <= MAX_HOLD_MS
    assert pacer.holds == 1
    assert burst_of(500, 0) == 50
    assert burst_of(3, 0) == 1
