"""The consumer loop against a real redis-server: wake-up, never early, retries, flow control."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, cast

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.backoff import Backoff, Jitter
from delayq.queue.client import AsyncQueue
from delayq.queue.consumer import (
    Consumer,
    ConsumerSettings,
    DeadLetterError,
    NoSlotsError,
)
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Message, Outcome, ScheduleRequest, State
from delayq.queue.topic import Topic

from .conftest import TOPIC
from .consumer_support import running, server_ms

HOUR_MS = 3_600_000


async def wait_for_state(queue: AsyncQueue, message_id: str, state: State) -> None:
    async def in_state() -> bool:
        return (await queue.get(message_id)).state is state

    await eventually(in_state, 10, f"{message_id} to be {state}")


async def test_delivers_each_due_message_once_never_early(async_queue: AsyncQueue) -> None:
    seen: dict[str, int] = {}

    async def handler(message: Message) -> None:
        now = await server_ms(async_queue.redis)
        assert now >= message.due_ms, f"{message.id} delivered {message.due_ms - now} ms early"
        seen[message.id] = seen.get(message.id, 0) + 1

    async with running(async_queue, handler):
        for i in range(60):
            await async_queue.schedule(f"m{i}", b"x", delay_ms=(i * 13) % 250)
        await eventually(lambda: len(seen) == 60, 10, "60 deliveries")
    assert set(seen.values()) == {1}
    assert (await async_queue.stats()).prepared == 0


async def test_an_earlier_message_wakes_a_consumer_sleeping_until_later(
    async_queue: AsyncQueue,
) -> None:
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    await async_queue.schedule("later", delay_ms=HOUR_MS)
    async with running(async_queue, handler) as consumer:
        await eventually(
            lambda: all(s.next_ms != 0 for s in consumer._owned),
            5,
            "consumer asleep",
        )
        # the consumer's timer is an hour away: only the wake-up can deliver this in time
        await async_queue.schedule("soon", delay_ms=30)
        await eventually(lambda: seen == ["soon"], 5, "the wake-up delivery")


async def test_a_wake_up_holds_the_earliest_due_its_slot_was_given(
    async_queue: AsyncQueue,
) -> None:
    """A schedule of a slot's new earliest message leaves its due time on the slot's wake list
    for the consumer to time its claim by (lua/includes/wake_at.lua): an earlier one replaces
    it, a later one leaves it, and a wake-up that means now (`1`) is never put off."""
    ids = (f"w{i}" for i in range(1_000) if TOPIC.slot_of(f"w{i}") == 0)
    wake = slot_keys(TOPIC, 0).key(Part.WAKE)
    now_ms = await server_ms(async_queue.redis)

    async def held() -> list[int]:
        return [int(element) for element in await async_queue.redis.lrange(wake, 0, -1)]

    await async_queue.schedule(next(ids), at_ms=now_ms + 60_000)
    assert await held() == [now_ms + 60_000]
    await async_queue.schedule(next(ids), at_ms=now_ms + 30_000)
    assert await held() == [now_ms + 30_000]
    await async_queue.schedule(next(ids), at_ms=now_ms + 45_000)
    assert await held() == [now_ms + 30_000]
    await async_queue.redis.delete(wake)
    await async_queue.redis.rpush(wake, "1")  # a hand-back's, or the previous version's
    await async_queue.schedule(next(ids), at_ms=now_ms + 10_000)
    assert await held() == [1]


async def _one_message_ahead(
    async_queue: AsyncQueue, ahead_ms: int, lead_ms: float | None = None
) -> tuple[list[int], int, int]:
    """A running consumer, every slot idle (its clock's lead set to `lead_ms` if given), is
    sent one message due `ahead_ms` later. Returns the server's ms at each claim it ran from
    then on (its reply's `now_ms`), the message's due time and the server's ms at its
    delivery."""
    claims: list[int] = []
    original_claim_slots = async_queue.claim_slots

    async def counted_claim_slots(*args: object, **kwargs: object):
        results = await original_claim_slots(*args, **kwargs)  # type: ignore[arg-type]
        claims.extend(r.now_ms for r in results if not isinstance(r, Exception))
        return results

    async_queue.claim_slots = counted_claim_slots  # type: ignore[method-assign]
    delivered: list[int] = []

    async def handler(message: Message) -> None:
        delivered.append(await server_ms(async_queue.redis))

    async with running(async_queue, handler) as consumer:
        await eventually(
            lambda: all(s.next_ms is None for s in consumer._owned), 5, "every slot idle"
        )
        if lead_ms is not None:
            consumer._clock._lead_ms = lead_ms
        before = len(claims)
        at_ms = await server_ms(async_queue.redis) + ahead_ms
        await async_queue.schedule("ahead", at_ms=at_ms)
        await eventually(lambda: len(delivered) == 1, 5, "the delivery")
    return claims[before:], at_ms, delivered[0]


async def test_a_message_scheduled_ahead_is_claimed_when_due_not_when_it_wakes_its_slot(
    async_queue: AsyncQueue,
) -> None:
    """The wake-up of a message scheduled into an idle slot times the slot's claim for its
    due time: one claim delivers it, at its due time, where a claim at the wake-up (of
    nothing due) came first."""
    claims, at_ms, delivered_ms = await _one_message_ahead(async_queue, 1_000)
    assert delivered_ms >= at_ms
    # one claim, sent a claim's lead ahead (ServerClock.arrival_ms); rarely a second, when the
    # first ran quicker than any before and found the message not due yet
    assert 1 <= len(claims) <= 2, [ms - at_ms for ms in claims]
    assert min(claims) >= at_ms - 5  # the estimate of the server clock, its lead


async def test_a_claim_that_ran_before_its_due_time_is_not_sent_again_and_again(
    async_queue: AsyncQueue,
) -> None:
    """The consumer aims its claims at the server's clock plus the lead its claims taught it
    (`ServerClock.arrival_ms`). A lead far too large (50 ms) makes a claim run before its
    message is due and come back without it: that claim's own lead is taken at once, so the
    next is aimed at the due time, not sent again and again until it comes; and the message
    is delivered once due, never before."""
    claims, at_ms, delivered_ms = await _one_message_ahead(async_queue, 300, lead_ms=50.0)
    assert delivered_ms >= at_ms
    assert len(claims) <= 3, [ms - at_ms for ms in claims]


async def test_sleeping_until_a_due_time_makes_no_task(async_queue: AsyncQueue) -> None:
    """Each wait for a due time is the loop's own timer: `asyncio.wait_for` made a task per
    sleep and came back three turns of the event loop after the due instant (Python 3.11)."""
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    await async_queue.schedule_many(
        [ScheduleRequest(f"m{i}", b"", delay_ms=100 + 40 * i) for i in range(5)]
    )
    loop = asyncio.get_running_loop()
    waits: list[str] = []
    previous = loop.get_task_factory()

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **options: Any
    ) -> asyncio.Task[Any]:
        name = getattr(coro, "__qualname__", "")
        if name == "Event.wait":
            waits.append(name)
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        async with running(async_queue, handler):
            await eventually(lambda: len(seen) == 5, 10, "5 deliveries, each at its own time")
    finally:
        loop.set_task_factory(previous)
    assert waits == []


async def test_slots_owned_while_the_loop_sleeps_without_a_timer_are_drained(
    async_queue: AsyncQueue,
) -> None:
    await async_queue.schedule_many([ScheduleRequest(f"m{i}", delay_ms=0) for i in range(20)])
    # as after a previous owner: its blocking wait consumed the wake-ups, the backlog remains
    await async_queue.redis.delete(*(slot_keys(TOPIC, s).key(Part.WAKE) for s in TOPIC.slots))
    seen: set[str] = set()

    async def handler(message: Message) -> None:
        seen.add(message.id)

    consumer = Consumer(async_queue, handler, managed=True)  # slots granted later, as by ZK
    task = asyncio.create_task(consumer.run())
    try:
        await asyncio.sleep(0.05)  # let the loop go to sleep with no slot and no timer
        await consumer.own(TOPIC.slots)
        await eventually(lambda: len(seen) == 20, 5, "the backlog of newly owned slots")
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)


async def test_a_slot_owned_while_the_wait_blocks_is_woken_by_its_producer(
    async_queue: AsyncQueue,
) -> None:
    """The blocking wait keeps its keys while the owned slots stay the same; a slot owned
    meanwhile (empty: no timer of its own) joins them, so a producer's wake-up reaches it."""
    first, *others = TOPIC.slots
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    consumer = Consumer(async_queue, handler, managed=True)
    task = asyncio.create_task(consumer.run())
    try:
        await consumer.own([first])
        await asyncio.sleep(0.05)  # the wait blocks on the first slot's wake list
        await consumer.own(others)
        await eventually(lambda: len(consumer._owned) == TOPIC.slot_amount, 5, "owned")
        later = next(f"w{n}" for n in range(100) if TOPIC.slot_of(f"w{n}") != first)
        await async_queue.schedule(later, delay_ms=0)
        await eventually(lambda: seen == [later], 5, "the delivery")
        owned = consumer._owned.get(TOPIC.slot_of(later))
        assert owned is not None
        assert owned.wakes >= 1  # woken, not found by the watchdog
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)


async def test_run_owns_the_slots_it_is_given(async_queue: AsyncQueue) -> None:
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    await async_queue.schedule("now", delay_ms=0)
    consumer = Consumer(async_queue, handler)
    task = asyncio.create_task(consumer.run(slots=TOPIC.slots))
    try:
        await eventually(lambda: seen == ["now"], 5, "a delivery from the slots run() owned")
        assert consumer.owned_slots == list(TOPIC.slots)
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)


async def test_run_with_no_slot_and_no_ownership_source_refuses_loudly(
    async_queue: AsyncQueue,
) -> None:
    consumer = Consumer(async_queue, _ignore)
    with pytest.raises(NoSlotsError, match="managed=True"):
        await asyncio.wait_for(consumer.run(), 5)  # at once, rather than idling for ever
    with pytest.raises(NoSlotsError):
        await asyncio.wait_for(consumer.run(slots=[]), 5)
    assert consumer.owned_slots == []


async def test_idle_slots_cost_one_blocking_call_and_no_claims(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    async def handler(message: Message) -> None:
        pass

    async with running(async_queue, handler) as consumer:
        await eventually(
            lambda: all(s.next_ms is None for s in consumer._owned), 5, "initial claims"
        )
        await eventually(
            lambda: redis_client.info("clients")["blocked_clients"] == 1, 5, "the blocking wait"
        )
        before = redis_client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
        await asyncio.sleep(0.3)  # an observation window, not a wait for an outcome
        after = redis_client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
        assert after == before


async def test_failures_retry_with_exact_backoff_then_poison_goes_dead(
    async_queue: AsyncQueue,
) -> None:
    deliveries: list[tuple[int, int]] = []

    async def handler(message: Message) -> None:
        deliveries.append((message.attempt, await server_ms(async_queue.redis)))
        if message.id == "poison":
            raise DeadLetterError("cannot parse")
        raise RuntimeError("sink down")

    settings = ConsumerSettings(backoff=Backoff(base_ms=80, multiplier=2.0))
    await async_queue.schedule("flaky", delay_ms=0)
    async with running(async_queue, handler, settings):
        await wait_for_state(async_queue, "flaky", State.DEAD)
        info = await async_queue.get("flaky")
        assert "RuntimeError: sink down" in info.dead_reason
        await async_queue.schedule("poison", delay_ms=0)
        await wait_for_state(async_queue, "poison", State.DEAD)
        assert (await async_queue.get("poison")).dead_reason == "DeadLetterError: cannot parse"
    flaky = deliveries[: TOPIC.max_retries + 1]
    assert [attempt for attempt, _ in flaky] == [1, 2, 3]
    # each retry waited at least its backoff (80 ms, then 160 ms) on the server clock
    assert flaky[1][1] - flaky[0][1] >= 80
    assert flaky[2][1] - flaky[1][1] >= 160


async def test_in_flight_is_bounded_and_claims_stop_while_the_sink_is_slow(
    async_queue: AsyncQueue,
) -> None:
    gate = asyncio.Event()
    running_now = 0
    peak = 0
    done: set[str] = set()

    async def handler(message: Message) -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        await gate.wait()
        running_now -= 1
        done.add(message.id)

    await async_queue.schedule_many([ScheduleRequest(f"m{i}", delay_ms=0) for i in range(50)])
    settings = ConsumerSettings(batch_size=4, worker_concurrency=10)
    async with running(async_queue, handler, settings):
        await eventually(lambda: running_now == 10, 5, "the in-flight bound")
        stats = await async_queue.stats()
        assert stats.prepared == 10
        assert stats.scheduled == 40
        gate.set()
        await eventually(lambda: len(done) == 50, 10, "all deliveries")
    assert peak == 10


async def test_release_waits_for_in_flight_acks_of_the_released_slots(
    async_queue: AsyncQueue,
) -> None:
    gate = asyncio.Event()
    started: list[str] = []

    async def handler(message: Message) -> None:
        started.append(message.id)
        await gate.wait()

    await async_queue.schedule("x", delay_ms=0)
    async with running(async_queue, handler) as consumer:
        await eventually(lambda: started == ["x"], 5, "the delivery to start")
        release = asyncio.create_task(consumer.release([TOPIC.slot_of("x")]))
        await asyncio.sleep(0.05)  # an observation window: release must still be waiting
        assert not release.done()
        gate.set()
        await asyncio.wait_for(release, 5)
        # acked under the epoch it was claimed with, before the slot was handed on
        assert (await async_queue.get("x")).state is State.ABSENT


async def test_handlers_that_wait_run_batch_concurrency_at_a_time(
    async_queue: AsyncQueue,
) -> None:
    """Workers are added lazily (one per loop turn while handlers wait): waiting handlers
    still reach exactly `batch_concurrency` at once, never more, and all finish."""
    gate = asyncio.Event()
    active, most, finished = 0, 0, []

    async def handler(message: Message) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await gate.wait()
        active -= 1
        finished.append(message.id)

    ids = [f"m{i}" for i in range(10)]
    await async_queue.schedule_many(
        [ScheduleRequest(i, at_ms=1_000, slot_basis="one") for i in ids]
    )
    async with running(async_queue, handler, ConsumerSettings(batch_concurrency=4)):
        await eventually(lambda: active == 4, 5, "four handlers waiting at once")
        for _ in range(20):  # loop turns in which a fifth worker could start
            await asyncio.sleep(0)
        assert most == 4
        gate.set()
        await eventually(lambda: len(finished) == 10, 5, "every handler to finish")
        deadline = time.monotonic() + 10
        while (await async_queue.stats()).prepared:
            assert time.monotonic() < deadline, "the acks never landed"
            await asyncio.sleep(0.01)
        assert (await async_queue.stats()).scheduled == 0
    assert most == 4
    assert sorted(finished) == sorted(ids)


async def test_one_slow_handler_delays_only_its_own_ack(async_queue: AsyncQueue) -> None:
    gate = asyncio.Event()

    async def handler(message: Message) -> None:
        if message.id == "slow":
            await gate.wait()

    ids = ["slow", "a", "b", "c"]
    await async_queue.schedule_many(
        [ScheduleRequest(i, at_ms=1_000, slot_basis="one") for i in ids]
    )
    async with running(async_queue, handler, ConsumerSettings(batch_concurrency=2)):
        for message_id in ["a", "b", "c"]:
            await wait_for_state(async_queue, message_id, State.ABSENT)
        assert (await async_queue.get("slow", slot_basis="one")).state is State.PREPARED
        gate.set()
        for _ in range(500):
            if (await async_queue.get("slow", slot_basis="one")).state is State.ABSENT:
                break
            await asyncio.sleep(0.01)
        assert (await async_queue.get("slow", slot_basis="one")).state is State.ABSENT


async def test_claims_that_fail_are_retried_and_the_loop_survives(
    redis_server: RedisServer, async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    impatient = AsyncQueue(
        redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=0.05), TOPIC
    )
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    async with running(impatient, handler) as consumer:
        await eventually(lambda: all(s.next_ms != 0 for s in consumer._owned), 5, "idle")
        redis_client.client_pause(400)  # every command blocks: the consumer's claims time out
        await async_queue.schedule("after-the-outage", delay_ms=0)
        await eventually(lambda: seen == ["after-the-outage"], 10, "delivery after the outage")
    await impatient.close()


async def test_stop_during_a_claim_ends_the_loop_at_once(async_queue: AsyncQueue) -> None:
    """A stop that lands while a claim is in flight must not be lost: the loop would otherwise
    sleep until its next timer (here an hour away) before noticing it."""
    await async_queue.schedule("now", delay_ms=0)
    await async_queue.schedule("later", delay_ms=HOUR_MS)
    consumer = Consumer(async_queue, _ignore)
    claim_slots = async_queue.claim_slots

    async def claim_then_stop(*args: object, **kwargs: object) -> object:
        consumer.stop()
        return await claim_slots(*args, **kwargs)  # type: ignore[arg-type]

    async_queue.claim_slots = claim_then_stop  # type: ignore[method-assign, assignment]
    await consumer.own(TOPIC.slots)
    await asyncio.wait_for(consumer.run(), 10)  # before the fix: asleep for an hour
    assert (await async_queue.get("later")).state is State.SCHEDULED


async def _ignore(message: Message) -> None:
    del message


async def test_a_slot_taken_over_elsewhere_is_dropped(async_queue: AsyncQueue) -> None:
    lost: list[int] = []
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    async with running(async_queue, handler, on_slot_lost=lost.append) as consumer:
        slot = TOPIC.slot_of("x")
        await async_queue.take_over(slot)  # another process became the owner
        await async_queue.schedule("x", delay_ms=0)
        await eventually(lambda: lost == [slot], 5, "the slot to be dropped")
        assert slot not in consumer.owned_slots
    assert seen == []
    assert (await async_queue.get("x")).state is State.SCHEDULED


async def test_full_jitter_retries_are_spread_and_honoured_on_server_time(
    async_queue: AsyncQueue, redis_client: redis.Redis
) -> None:
    """Forty messages failing at once with full jitter (1 s ceiling): each retry waits in store
    until failure time + its own random delay, on the Redis server clock, within [0, 1 s]; the
    retries do not come back as one herd. Read from each message's first `nacked` journal
    entry (t = the nack's server time, due = the retry's due time), so a retry drawn near 0 and
    delivered again before the consumer stops does not hide its first wait."""
    topic = async_queue.topic
    ids = [f"j{i}" for i in range(40)]
    await async_queue.schedule_many([ScheduleRequest(i, b"p", delay_ms=0) for i in ids])
    failed: set[str] = set()

    async def handler(message: Message) -> None:
        failed.add(message.id)
        raise RuntimeError("receiver down")

    backoff = Backoff(base_ms=1000, max_ms=1000, jitter=Jitter.FULL)
    consumer = Consumer(async_queue, handler, ConsumerSettings(backoff=backoff))
    running = asyncio.create_task(consumer.run(slots=topic.slots))
    try:
        await eventually(lambda: len(failed) == 40, 5.0, "every first attempt")
        first_nacks: dict[str, tuple[int, int]] = {}

        def every_first_nack() -> bool:
            first_nacks.update(_first_nacks(redis_client, topic))
            return set(first_nacks) == set(ids)

        await eventually(every_first_nack, 5.0, "every first nack journaled")
    finally:
        consumer.stop()
        await running
    waits = [due - at for at, due in first_nacks.values()]
    assert all(0 <= wait <= 1000 for wait in waits), waits
    assert max(waits) - min(waits) > 400, waits  # spread, not a herd


def _first_nacks(admin: redis.Redis, topic: Topic) -> dict[str, tuple[int, int]]:
    """id -> (t, due) of its first `nacked` journal entry, over every slot of `topic` (read by
    an admin client: the engine's ACL user has no XRANGE)."""
    found: dict[str, tuple[int, int]] = {}
    for slot in topic.slots:
        raw = admin.xrange(slot_keys(topic, slot).key(Part.JOURNAL))
        # redis-py types the answer loosely; a client without decode_responses reads bytes
        for _, entry in cast(list[tuple[bytes, dict[bytes, bytes]]], raw):
            if entry[b"e"] == b"nacked":
                found.setdefault(entry[b"id"].decode(), (int(entry[b"t"]), int(entry[b"due"])))
    return found


async def test_a_paused_topic_is_not_claimed_and_resume_drains_the_backlog(
    async_queue: AsyncQueue,
) -> None:
    """Pause on the broker: a consumer started afterwards claims nothing of a due backlog while
    scheduling goes on; resume delivers every message. Checked on Redis: while paused nothing
    is leased (prepare stays empty) and the watchdog does not count the waiting slots as
    stalls."""
    topic = async_queue.topic
    await async_queue.pause()
    await async_queue.schedule_many([ScheduleRequest(f"p{i}", b"p", delay_ms=0) for i in range(30)])
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    consumer = Consumer(async_queue, handler)
    running = asyncio.create_task(consumer.run(slots=topic.slots))
    try:
        await eventually(lambda: consumer.paused, 5.0, "the pause read")
        await async_queue.schedule("later", b"p", delay_ms=0)  # scheduling goes on
        # two upkeep rounds (each reads the flag and would run the watchdog): still nothing
        rounds = [0]

        async def two_rounds_passed() -> bool:
            rounds[0] += 1
            return rounds[0] > 2 and (await async_queue.stats()).prepared == 0

        await eventually(two_rounds_passed, 10.0, "upkeep rounds while paused", interval_s=1.0)
        assert seen == []
        assert consumer.counters.stalled_slots_recovered == 0
        await async_queue.resume()
        await eventually(lambda: len(seen) == 31, 5.0, "the backlog after resume")
        assert not consumer.paused
    finally:
        consumer.stop()
        await running


async def test_a_pause_read_while_waiting_for_room_claims_nothing_more(
    async_queue: AsyncQueue,
) -> None:
    """Regression: a drain waiting for room in flight when the pause was read claimed once more
    as soon as handlers gave room back (it checked the pause only before the wait), so the
    restore's pause (`restore_pause.py`: every consumer has read the flag by `seen_at_s`) did
    not stop it. Now: the two claimed finish, the four others stay due until resume."""
    await async_queue.schedule_many([ScheduleRequest(f"r{i}", b"r", delay_ms=0) for i in range(6)])
    gate = asyncio.Event()
    seen: list[str] = []
    acked: list[Outcome] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)
        await gate.wait()

    settings = ConsumerSettings(batch_size=2, worker_concurrency=2)  # full after one claim
    consumer = Consumer(async_queue, handler, settings, on_acked=acked.extend)
    running = asyncio.create_task(consumer.run(slots=async_queue.topic.slots))
    try:
        await eventually(lambda: len(seen) == 2, 5.0, "two in flight, the drain waiting for room")
        await async_queue.pause()
        await consumer.refresh_paused()  # what the upkeep does within a second
        gate.set()
        await eventually(lambda: len(acked) >= 2, 5.0, "the two in flight acked")
        rounds = [0]

        async def two_rounds_passed() -> bool:
            rounds[0] += 1
            return rounds[0] > 2

        await eventually(two_rounds_passed, 10.0, "upkeep rounds while paused", interval_s=1.0)
        assert len(seen) == 2, f"claimed while paused: {seen[2:]}"
        stats = await async_queue.stats()
        assert (stats.prepared, stats.due) == (0, 4)
        await async_queue.resume()
        await eventually(lambda: len(seen) == 6, 5.0, "the rest after resume")
    finally:
        consumer.stop()
        await running


async def test_concurrent_batches_share_one_ack_call(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """Regression: each claimed batch sent its own acks, so a claim round of many one-message
    batches (a burst) sent as many calls at once, each opening a pooled connection whose
    handshake kept the loop from claiming (the burst's 16-23 ms tail). The acks now share one
    call in flight (`coalesce.Coalescer`): a round of 64 batches opens a connection or two."""
    topic = Topic("burst", namespace="shop", slot_amount=64)

    def connections() -> int:
        return int(redis_client.info("stats")["total_connections_received"])

    client = redis.asyncio.Redis.from_url(redis_server.url)
    queue = AsyncQueue(client, topic)
    try:
        requests = [ScheduleRequest(f"m{i}", b"x", delay_ms=0) for i in range(256)]
        await queue.schedule_many(requests)
        assert len({topic.slot_of(request.id) for request in requests}) == 64
        delivered: set[str] = set()

        async def handler(message: Message) -> None:
            delivered.add(message.id)

        async def all_acked() -> bool:
            return len(delivered) == 256 and (await queue.stats()).prepared == 0

        consumer = Consumer(queue, handler)
        await consumer.own(topic.slots)
        opened = connections()
        task = asyncio.create_task(consumer.run())
        try:
            await eventually(all_acked, 10, "256 deliveries acked")
        finally:
            consumer.stop()
            await asyncio.wait_for(task, 10)
        # the wake-up wait's own connection, the claims' and one for the acks: not one per batch
        assert connections() - opened <= 4
    finally:
        await client.aclose()
