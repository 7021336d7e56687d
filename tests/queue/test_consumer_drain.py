"""The consumer's drain of a herd against a real redis-server: bounded batches, rounds that
reach every due slot, slots come due during a drain."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
import redis.asyncio

from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.consumer import Consumer, ConsumerSettings
from delayq.queue.model import Message, ScheduleRequest, SlotClaim
from delayq.queue.topic import Topic

from .conftest import TOPIC
from .consumer_support import running, server_ms


@pytest.mark.slow
async def test_herd_of_100k_due_at_one_instant_drains_in_bounded_batches(
    async_queue: AsyncQueue,
) -> None:
    total = 100_000
    at_ms = await server_ms(async_queue.redis) + 300
    for start in range(0, total, 10_000):
        await async_queue.schedule_many(
            [ScheduleRequest(f"h{i}", b"x" * 32, at_ms=at_ms) for i in range(start, start + 10_000)]
        )
    claim_sizes: list[int] = []
    original_claim_slots = async_queue.claim_slots

    async def recording_claim_slots(*args: object, **kwargs: object):
        results = await original_claim_slots(*args, **kwargs)  # type: ignore[arg-type]
        claim_sizes.extend(len(r.messages) for r in results if not isinstance(r, Exception))
        return results

    async_queue.claim_slots = recording_claim_slots  # type: ignore[method-assign]
    seen: set[str] = set()
    in_flight = 0
    peak = 0

    async def handler(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        assert message.due_ms == at_ms
        seen.add(message.id)
        in_flight -= 1

    settings = ConsumerSettings(batch_size=500, worker_concurrency=2000)
    async with running(async_queue, handler, settings):
        await eventually(lambda: len(seen) == total, 120, "the herd to drain")
    assert max(claim_sizes) <= 500
    assert peak <= 2000
    stats = await async_queue.stats()
    assert (stats.scheduled, stats.prepared, stats.dead) == (0, 0, 0)


async def test_a_slot_woken_many_times_takes_one_claim_of_a_round(
    async_queue: AsyncQueue,
) -> None:
    """A producer storing a herd in several calls wakes the slots once per call, and each
    wake-up puts the slot's timer on the heap again, at the herd's instant: when it comes,
    each due slot takes one claim of the round, so every slot gets its share of the room (a
    slot with more timers than the others was claimed once per timer, taking their room)."""
    slots = TOPIC.slot_amount
    at_ms = await server_ms(async_queue.redis) + 3_000
    claims = 0
    original_claim_slots = async_queue.claim_slots

    async def counting_claim_slots(*args: object, **kwargs: object):
        nonlocal claims
        claims += 1
        return await original_claim_slots(*args, **kwargs)  # type: ignore[arg-type]

    async_queue.claim_slots = counting_claim_slots  # type: ignore[method-assign]
    gate = asyncio.Event()
    started: list[Message] = []

    async def handler(message: Message) -> None:
        started.append(message)
        await gate.wait()

    # room for one worthwhile claim (a quarter batch, 2) per slot, and no more
    settings = ConsumerSettings(batch_size=8, worker_concurrency=2 * slots)
    async with running(async_queue, handler, settings) as consumer:
        try:
            for call in range(6):
                before = sum(state.wakes for state in consumer._owned)
                await async_queue.schedule_many(
                    [ScheduleRequest(f"h{call}-{i}", at_ms=at_ms) for i in range(40)]
                )
                await eventually(
                    lambda: sum(state.wakes for state in consumer._owned) > before,  # noqa: B023
                    5,
                    "the wake-ups",
                )
            assert await server_ms(async_queue.redis) < at_ms, "the herd took too long to store"
            await eventually(lambda: len(started) == 2 * slots, 10, "the first round")
            assert sorted(message.slot for message in started) == sorted(2 * list(range(slots)))
        finally:
            gate.set()


async def test_a_slot_due_while_another_slots_herd_drains_is_claimed_in_that_drain(
    async_queue: AsyncQueue,
) -> None:
    """A herd in one slot keeps its drain going round after round (its claims come back
    full); a message of another slot that comes due meanwhile joins the drain's next round
    rather than wait for the whole herd."""
    herd = [f"h{i}" for i in range(20_000) if TOPIC.slot_of(f"h{i}") == 0][:3_000]
    late_id = next(f"x{i}" for i in range(1_000) if TOPIC.slot_of(f"x{i}") == 1)
    now_ms = await server_ms(async_queue.redis)
    await async_queue.schedule_many([ScheduleRequest(i, at_ms=now_ms) for i in herd])
    delivered: list[str] = []

    async def handler(message: Message) -> None:
        await asyncio.sleep(0.01)  # a receiver taking 10 ms: 40 at once, the herd takes 0.75 s
        delivered.append(message.id)

    settings = ConsumerSettings(batch_size=40, worker_concurrency=40, batch_concurrency=40)
    async with running(async_queue, handler, settings):
        await eventually(lambda: len(delivered) >= 100, 10, "the herd draining")
        due_ms = await server_ms(async_queue.redis) + 100
        await async_queue.schedule_many([ScheduleRequest(late_id, at_ms=due_ms)])
        await eventually(lambda: late_id in delivered, 30, "the message of the other slot")
    assert delivered.index(late_id) < len(herd) // 2, "it waited for the herd"


async def test_a_herds_first_round_claims_every_due_slot(
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """A herd due in more slots than quarter batches fit in the room: its first round shares
    the room among every due slot (a slot left out waits for rounds of the others' claims,
    every message of it, whatever its group, behind them; a quarter batch a slot reached 8 of
    16 slots at the defaults)."""
    topic = Topic("herd16", namespace="shop", slot_amount=16)
    queue = AsyncQueue(async_redis_client, topic)
    ids = [f"h{i}" for i in range(2_000)]
    per_slot = {slot: [i for i in ids if topic.slot_of(i) == slot][:8] for slot in topic.slots}
    now_ms = await server_ms(queue.redis)
    await queue.schedule_many(
        [ScheduleRequest(i, at_ms=now_ms) for slot_ids in per_slot.values() for i in slot_ids]
    )
    gate = asyncio.Event()
    started: list[Message] = []

    async def handler(message: Message) -> None:
        started.append(message)
        await gate.wait()

    # room 32: a quarter batch (4) fits in 8 slots, a sixteenth (1) in all 16
    consumer = Consumer(queue, handler, ConsumerSettings(batch_size=16, worker_concurrency=32))
    await consumer.own(topic.slots)
    task = asyncio.create_task(consumer.run())
    try:
        await eventually(lambda: len(started) == 32, 10, "the first round")
        assert sorted({message.slot for message in started}) == list(topic.slots)
    finally:
        gate.set()
        consumer.stop()
        await asyncio.wait_for(task, 10)


async def test_a_round_reaches_as_many_due_slots_as_a_sixteenth_batch_each_fits(
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """Regression (issue 30, the burst at 1,024 slots): when more slots were due than a
    sixteenth batch each fitted in the room, a round fell back to quarter batches, 8 slots a
    round trip at the defaults, so a burst over many slots that fell a few ms behind (a hundred
    slots due, a message or two each) caught up 8 messages a round trip. Such a round now
    claims as many slots as a sixteenth batch each fits, the others next round."""
    topic = Topic("wide64", namespace="shop", slot_amount=64)
    queue = AsyncQueue(async_redis_client, topic)
    ids = {topic.slot_of(f"m{i}"): f"m{i}" for i in range(2_000)}
    assert len(ids) == 64
    now_ms = await server_ms(queue.redis)
    await queue.schedule_many([ScheduleRequest(i, at_ms=now_ms) for i in ids.values()])
    calls: list[int] = []
    original_claim_slots = queue.claim_slots

    async def counting_claim_slots(*args: object, **kwargs: object):
        calls.append(len(cast(list[SlotClaim], args[0])))
        return await original_claim_slots(*args, **kwargs)  # type: ignore[arg-type]

    queue.claim_slots = counting_claim_slots  # type: ignore[method-assign]
    delivered: set[str] = set()

    async def handler(message: Message) -> None:
        delivered.add(message.id)

    # room 64: a sixteenth batch (4) in each of 16 slots, a quarter batch (16) in 4
    consumer = Consumer(queue, handler, ConsumerSettings(batch_size=64, worker_concurrency=64))
    await consumer.own(topic.slots)  # every slot due at once, as a slot's timer or wake-up does
    task = asyncio.create_task(consumer.run())
    try:
        await eventually(lambda: len(delivered) == 64, 10, "every slot's message")
        assert calls[0] == 16, calls
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)


async def test_slots_come_due_again_during_a_drain_share_its_next_round(
    async_redis_client: redis.asyncio.Redis,
) -> None:
    """Regression (issue 30, the burst at 1,024 slots): a drain that goes on (a herd in one
    slot, a burst whose slots keep coming due) treated every slot it had claimed once as a
    backlog, so when those slots came due again, one or two messages each, a round reached only
    quarter batches of them (at most 4 of 8 here, 8 at the defaults) and the rest waited round
    trip after round trip. Only a slot whose claim came back full is a backlog: the others, come due
    again, are claimed in one round, sharing the room."""
    topic = Topic("again16", namespace="shop", slot_amount=16)
    queue = AsyncQueue(async_redis_client, topic)
    ids = [f"m{i}" for i in range(4_000)]
    herd_slot = topic.slot_of(ids[0])
    herd = [i for i in ids if topic.slot_of(i) == herd_slot][:70]
    others = {topic.slot_of(i): i for i in ids if topic.slot_of(i) != herd_slot}
    others = dict(list(others.items())[:8])
    now_ms = await server_ms(queue.redis)
    again_ms = now_ms + 1_500  # the other slots' messages: due while the herd still drains
    await queue.schedule_many(
        [ScheduleRequest(i, at_ms=now_ms) for i in herd]
        + [ScheduleRequest(i, at_ms=again_ms) for i in others.values()]
    )
    calls: list[set[int]] = []
    original_claim_slots = queue.claim_slots

    async def recording_claim_slots(*args: object, **kwargs: object):
        calls.append({claim.slot for claim in cast(list[SlotClaim], args[0])})
        return await original_claim_slots(*args, **kwargs)  # type: ignore[arg-type]

    queue.claim_slots = recording_claim_slots  # type: ignore[method-assign]
    gate = asyncio.Event()
    started: list[Message] = []

    async def handler(message: Message) -> None:
        started.append(message)
        if message.slot == herd_slot:
            await gate.wait()

    # room 64: a sixteenth batch (4) in each of 16 slots, a quarter batch (16) in 4; the
    # herd's last claim leaves room for a sixteenth batch in each of the 8 slots, not for a
    # quarter batch
    consumer = Consumer(queue, handler, ConsumerSettings(batch_size=64, worker_concurrency=64))
    await consumer.own(topic.slots)
    task = asyncio.create_task(consumer.run())
    try:
        # the first round claimed every slot (the others had nothing due yet), then the herd's
        # slot alone, until its handlers filled the room: the drain waits for room
        await eventually(lambda: len(started) == 64, 10, "the herd filling the room")
        assert calls[0] == set(topic.slots)

        async def past_again() -> bool:
            return await server_ms(queue.redis) > again_ms + 50

        await eventually(past_again, 10, "the other slots' due instant")
        first = len(calls)
        gate.set()
        await eventually(lambda: len(started) == len(herd) + len(others), 10, "all delivered")
        rounds = [slots for slots in calls[first:] if slots & set(others)]
        assert len(rounds) == 1, rounds
    finally:
        gate.set()
        consumer.stop()
        await asyncio.wait_for(task, 10)
