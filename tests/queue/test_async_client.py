"""The asyncio flavour runs the same plans as the blocking one: a full lifecycle through it."""

from __future__ import annotations

import pytest

from delayq.queue.client import AsyncQueue
from delayq.queue.codes import Code, ExpiresBeforeDueError, LeaseLostError, NotFoundError
from delayq.queue.model import ScheduleRequest, State, Target

from .conftest import TOPIC


async def test_async_lifecycle(async_queue: AsyncQueue) -> None:
    created = await async_queue.schedule("a", b"p", delay_ms=3_600_000, headers={"h": "1"})
    assert created.code is Code.CREATED
    results = await async_queue.schedule_many([ScheduleRequest("b", delay_ms=0)])
    with pytest.raises(ExpiresBeforeDueError):  # a refusal is raised, as Queue.schedule does
        await async_queue.schedule("c", at_ms=2**41, expire_at_ms=2**41)
    assert results[0].code is Code.CREATED
    moved = await async_queue.reschedule("a", delay_ms=0)
    assert moved.code is Code.RESCHEDULED
    with pytest.raises(NotFoundError):
        await async_queue.reschedule("zz", delay_ms=0)
    assert [i.state for i in await async_queue.get_many([Target("a"), Target("b")])] == [
        State.SCHEDULED,
        State.SCHEDULED,
    ]

    slot = TOPIC.slot_of("a")
    epoch = await async_queue.take_over(slot)
    [message] = [m for m in (await async_queue.claim(slot, epoch)).messages if m.id == "a"]
    assert message.headers == {"h": "1"}
    assert (await async_queue.extend(message.lease, 60_000)).code is Code.EXTENDED
    assert (await async_queue.nack(message.lease, dead=True, reason="bad")).code is Code.DEAD
    with pytest.raises(LeaseLostError):
        await async_queue.ack(message.lease)
    page = await async_queue.dead_page(slot)
    assert [m.id for m in page.messages] == ["a"]
    assert await async_queue.redrive_all() == 1
    assert (await async_queue.redrive(slot, ["a"]))[0].code is Code.WRONG_STATE
    [again] = [m for m in (await async_queue.claim(slot, epoch)).messages if m.id == "a"]
    assert (await async_queue.ack(again.lease)).code is Code.ACKED
    assert (await async_queue.ack_many([again.lease]))[0].code is Code.LEASE_LOST

    assert (await async_queue.cancel("b")).code is Code.CANCELLED
    assert (await async_queue.cancel_many([Target("b")]))[0].code is Code.NOT_FOUND
    assert await async_queue.purge_all() == 0
    assert (await async_queue.purge(slot, ["a"]))[0].code is Code.WRONG_STATE
    stats = await async_queue.stats()
    assert (stats.scheduled, stats.prepared, stats.dead) == (0, 0, 0)
