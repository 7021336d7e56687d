"""The topic's pace on a real redis-server, as the topic's restricted user: the rate limit's
token bucket (pace-1) and a receiver's hold (hold-1), both on the Redis server's clock."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue, Queue
from delayq.queue.consumer import Consumer
from delayq.queue.keys import pace_key
from delayq.queue.model import Message, ScheduleRequest
from delayq.queue.pacing import MAX_HOLD_MS, Pacer
from delayq.queue.topic_record import SERVE_OWNER

from .conftest import TOPIC


async def test_the_bucket_grants_its_burst_then_its_rate(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    assert await async_queue.pace(100.0, 10, 50, 5) == (10, 0, 100.0, 10, False)  # new: full
    granted, wait_ms, *_ = await async_queue.pace(100.0, 10, 50, 5)
    assert granted == 0
    assert 1 <= wait_ms <= 50
    await asyncio.sleep(wait_ms / 1000 + 0.01)
    granted, *_ = await async_queue.pace(100.0, 10, 50, 5)
    assert 5 <= granted <= 10  # refilled at the rate, never above the burst
    assert 0 < redis_client.pttl(pace_key(TOPIC)) <= 1000 + 100  # gone once full again


async def test_tokens_a_claim_did_not_use_are_given_back(async_queue: AsyncQueue) -> None:
    assert (await async_queue.pace(1.0, 10, 10, 1))[0] == 10
    assert (await async_queue.pace(1.0, 10, 10, 1, returned=7))[0] == 7


async def test_tokens_given_back_late_are_not_a_second_burst(async_queue: AsyncQueue) -> None:
    """Regression: a pod woken before a herd was due drew the whole bucket, claimed nothing and
    gave the tokens back with its next draw, by then after another pod had drawn the bucket the
    refill filled again: at the herd every pod's return was a burst of its own (three pods at
    200/s, burst 50: 347 POSTs in one second, tests/chaos/test_pace.py). Tokens given back are
    credited only as far as the refill since their draw could not have replaced them."""
    idle, busy = Pacer(async_queue, 100.0, 10), Pacer(async_queue, 100.0, 10)
    assert (await idle.take(10))[0] == 10  # a new bucket is full
    idle.unused(10)  # its claim found nothing due
    await asyncio.sleep(0.2)  # the refill (20 tokens at 100/s) fills the bucket again
    assert (await busy.take(10))[0] == 10
    granted, _ = await idle.take(10)
    assert granted == 0  # not the 10 it drew 0.2 s ago: the refill replaced them
    prompt = Pacer(async_queue, 100.0, 10)
    await asyncio.sleep(0.12)
    assert (await prompt.take(10))[0] == 10
    prompt.unused(10)  # given back at once: kept (less the refill meanwhile, a token or so)
    assert (await prompt.take(10))[0] >= 5  # most of them (a loaded host: tens of ms)


async def test_a_pace_lost_with_the_brokers_data_costs_one_burst_and_no_known_hold(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    """What a broker restarted without its data (no AOF, or `appendfsync everysec` losing its
    last second) does to the pace: the bucket is new, so full: one burst above the limit at
    most, never more; a hold Redis forgot still holds every process that knew it, and only a
    process that never did may POST (its receiver's next 429 holds the topic again)."""
    told, learner = Pacer(async_queue, 100.0, 10), Pacer(async_queue, 100.0, 10)
    assert (await told.take(10))[0] == 10
    await told.hold(2000)
    assert (await learner.take(10))[0] == 0  # learns the hold from Redis
    redis_client.delete(pace_key(TOPIC))  # bucket and hold gone with the data
    assert (await told.take(10))[0] == 0
    assert (await learner.take(10))[0] == 0
    newcomer = Pacer(async_queue, 100.0, 10)
    assert (await newcomer.take(100))[0] == 10  # a new bucket: its burst
    assert (await newcomer.take(100))[0] == 0  # then the rate, not another burst


async def test_a_hold_grants_nothing_until_it_ends_and_is_bounded(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    now_ms = int(redis_client.time()[0]) * 1000
    until_ms = await async_queue.hold(300, MAX_HOLD_MS)
    assert now_ms <= until_ms <= now_ms + 2000
    granted, wait_ms, *_ = await async_queue.pace(0.0, 1, 10, 1)  # no rate limit: the hold still
    assert granted == 0
    assert 200 <= wait_ms <= 300
    assert await async_queue.hold(100, MAX_HOLD_MS) == until_ms  # a longer hold stays
    capped = await async_queue.hold(10**9, 1000)
    assert capped - until_ms <= 1000  # never beyond max_ms from now
    await eventually(
        lambda: _granted(async_queue), 3, "the hold ends, within its bound", interval_s=0.05
    )


async def _granted(queue: AsyncQueue) -> bool:
    return await queue.pace(0.0, 1, 10, 1) == (10, 0, 0.0, 0, False)


async def test_a_pacer_tells_a_hold_another_process_set(async_queue: AsyncQueue) -> None:
    """`held` asks Redis (at most every UNPACED_CHECK_S): a pod that did not get the 429 stops
    handing over what it claimed as soon as it knows."""
    other, pacer = Pacer(async_queue, 0.0), Pacer(async_queue, 0.0)
    assert not await pacer.held()
    await other.hold(2000)
    await eventually(pacer.held, 1, "the other process's hold known", interval_s=0.05)


async def test_a_hold_after_a_redis_restart_reaches_every_process(
    durable_redis: RedisServer,
) -> None:
    """Regression (tests/chaos/test_pace.py): after the first broker restarted, a process's
    first hold took a pooled connection the server had closed and failed, so only that process
    was held and the others went on POSTing into the receiver's Retry-After. The hold is sent
    once more on a fresh connection (a second one changes nothing: the longer hold stays)."""
    client = redis.asyncio.Redis(connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
        durable_redis.url, max_connections=4, timeout=None))  # fmt: skip
    pacer = Pacer(AsyncQueue(client, TOPIC), 100.0, 10)
    try:
        assert (await pacer.take(10))[0] == 10  # a pooled connection
        durable_redis.crash()
        await asyncio.to_thread(durable_redis.start)
        await pacer.hold(2000)
        other = Pacer(AsyncQueue.from_url(durable_redis.url, TOPIC), 100.0, 10)
        assert await other.held()
        await other.queue.redis.aclose()
    finally:
        await client.aclose()


async def test_a_pacer_holds_its_own_process_at_once(async_queue: AsyncQueue) -> None:
    pacer = Pacer(async_queue, 0.0)
    assert await pacer.take(8) == (8, 0.0)
    await pacer.hold(10**9)  # bounded by MAX_HOLD_MS
    granted, wait_ms = await pacer.take(8)
    assert granted == 0
    assert 0 < wait_ms <= MAX_HOLD_MS
    assert pacer.holds == 1


async def test_a_burst_of_0_is_a_tenth_of_a_seconds_tokens(async_queue: AsyncQueue) -> None:
    assert (await async_queue.pace(500.0, 0, 1, 1)).burst == 50
    assert (await async_queue.pace(3.0, 0, 1, 1)).burst == 1


async def test_a_paced_consumer_drains_at_the_rate_and_sees_no_stall(
    async_queue: AsyncQueue,
) -> None:
    """150 due messages through a Consumer drawing from a 60/s bucket of 15: they take about
    2.25 s, every slot stays overdue on purpose meanwhile, and the stall watchdog (once a
    second) must not take that for a lost wake-up."""
    delivered: list[float] = []

    async def handler(_message: Message) -> None:
        delivered.append(time.monotonic())

    await async_queue.schedule_many([ScheduleRequest(f"r{i}", delay_ms=0) for i in range(150)])
    consumer = Consumer(async_queue, handler, pacer=Pacer(async_queue, 60.0, 15))
    started_s = time.monotonic()
    run = asyncio.create_task(consumer.run(slots=TOPIC.slots))
    try:
        await eventually(lambda: len(delivered) >= 150, 10, "every message")
    finally:
        consumer.stop()
        await run
    elapsed_s = delivered[-1] - started_s
    assert (150 - 15) / 60 * 0.9 <= elapsed_s <= (150 - 15) / 60 * 1.2, elapsed_s
    assert consumer.counters.stalled_slots_recovered == 0


async def test_an_unreachable_first_broker_stops_a_limit_not_the_unlimited() -> None:
    """Without a rate limit only a receiver's hold is asked about: the first broker being down
    must not stop the other brokers' claims; with a limit, nothing is claimed unmetered."""
    down = redis.asyncio.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    try:
        queue = AsyncQueue(down, TOPIC)
        assert await Pacer(queue, 0.0).take(8) == (8, 0.0)
        with pytest.raises(redis.ConnectionError):
            await Pacer(queue, 100.0).take(8)
    finally:
        await down.aclose()


async def test_a_bucket_smaller_than_a_slice_still_grants(async_queue: AsyncQueue) -> None:
    """A burst below a slice of the rate (5 at 500/s, a slice 25): a draw asks for what the
    bucket can hold, else it would wait for 25 tokens a bucket of 5 never holds."""
    assert (await async_queue.pace(500.0, 5, 50, 25))[:2] == (5, 0)
    granted, wait_ms, *_ = await async_queue.pace(500.0, 5, 50, 25)
    # the bucket refilled meanwhile (10 ms on a loaded host), or the answer is the wait for the
    # 5 tokens it can hold (at 500/s), not for 25 it never holds
    assert granted > 0 or wait_ms <= 10 + 1


async def test_the_published_limit_wins_and_applies_at_the_next_draw(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    """The limit is the topic's settings record's, read at every draw: a process started
    without one is limited as soon as its owner publishes one, and unlimited once it is
    removed, without a new Pacer (no restart)."""
    pacer = Pacer(async_queue, 0.0)
    assert await pacer.take(100) == (100, 0.0)

    def publish(version: int, per_second: float, burst: int) -> None:
        topic = dataclasses.replace(
            TOPIC, rate_limit_per_second=per_second, rate_limit_burst=burst
        )
        Queue(redis_client, topic).publish_settings(SERVE_OWNER, version)

    async def limited() -> bool:
        return (await pacer.take(100))[0] < 100

    publish(1, 20.0, 5)
    await eventually(limited, 2, "the published limit", interval_s=0.05)
    assert (pacer.per_second, pacer.burst) == (20.0, 5)
    assert (await pacer.take(100))[0] <= 5
    publish(2, 0.0, 0)
    await eventually(lambda: _unlimited(pacer), 2, "the limit removed", interval_s=0.05)


async def _unlimited(pacer: Pacer) -> bool:
    return await pacer.take(100) == (100, 0.0) and not pacer.limited


async def test_a_burst_below_a_slice_of_the_rate_still_delivers(async_queue: AsyncQueue) -> None:
    """Regression: a draw waited for a twentieth of a second's tokens at least (5 at 100/s),
    while the bucket never holds more than its burst (4): a topic of rateLimit 100/s with a
    burst of 4, which the CRD accepts, was granted nothing, ever, and delivered nothing."""
    pacer = Pacer(async_queue, 100.0, 4)
    granted = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and granted < 20:
        got, wait_ms = await pacer.take(500)
        granted += got
        await asyncio.sleep(max(wait_ms, 5) / 1000)
    assert granted >= 20  # about 100/s


@pytest.mark.parametrize("per_second", [1e-14, 1e-20, 1e-300])
async def test_a_rate_too_small_for_the_settings_still_draws(
    async_queue: AsyncQueue, redis_client: redis.Redis, per_second: float
) -> None:
    """A rate below the settings' floor (a record written by hand, an older operator's):
    pace-1 still answers, its waits and expiry whole milliseconds (PEXPIRE refused the
    exponent form '1e+17', and every draw of the topic failed)."""
    assert (await async_queue.pace(per_second, 1, 1, 1))[0] == 1
    granted, wait_ms, *_ = await async_queue.pace(per_second, 1, 1, 1)
    assert granted == 0
    assert 10**12 < wait_ms <= 10**15
    assert redis_client.pttl(pace_key(TOPIC)) > 10**12
