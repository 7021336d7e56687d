"""`LongPolls`: waiting long polls handed the turn one at a time (pure asyncio, no Redis).

What the pull leaser relies on: a wake-up ends exactly one wait (the longest waiting), a wait
ends by itself at its timeout without taking a turn from the others, and a poll handed the
turn whose client then left passes it on, where one that timed out passes nothing."""

from __future__ import annotations

import asyncio

from delayq.service.delivery.long_polls import LongPolls

DEADLINE_S = 5.0


async def _waiting(polls: LongPolls, count: int, timeout_s: float) -> list[asyncio.Task[None]]:
    """`count` more polls waiting, in that order."""
    before, tasks = len(polls), []
    for _ in range(count):
        tasks.append(asyncio.create_task(polls.wait(timeout_s)))
        await asyncio.sleep(0)  # each in the queue before the next
    assert len(polls) == before + count
    return tasks


async def test_a_wake_up_ends_the_longest_waiting_poll_only() -> None:
    polls = LongPolls()
    first, second = await _waiting(polls, 2, 60)
    polls.wake_one()
    await asyncio.wait_for(first, DEADLINE_S)
    assert not second.done()
    assert len(polls) == 1
    polls.wake_all()
    await asyncio.wait_for(second, DEADLINE_S)
    assert len(polls) == 0
    polls.close()


async def test_a_wait_ends_at_its_timeout_and_takes_no_turn() -> None:
    polls = LongPolls()
    [short] = await _waiting(polls, 1, 0.01)
    [long] = await _waiting(polls, 1, 60)
    await asyncio.wait_for(short, DEADLINE_S)
    assert len(polls) == 1
    polls.wake_one()  # the turn goes to the one still waiting
    await asyncio.wait_for(long, DEADLINE_S)
    polls.close()


async def test_a_poll_handed_the_turn_then_cancelled_passes_it_on() -> None:
    """Its client left between the wake-up and its claim: the next poll claims instead."""
    polls = LongPolls()
    first, second = await _waiting(polls, 2, 60)
    polls.wake_one()
    first.cancel()  # before it ran again: handed the turn, then cancelled
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    await asyncio.wait_for(second, DEADLINE_S)
    polls.close()


async def test_a_poll_cancelled_after_its_timeout_passes_nothing_on() -> None:
    polls = LongPolls()
    [timed_out] = await _waiting(polls, 1, 0.01)
    [other] = await _waiting(polls, 1, 60)
    await asyncio.sleep(0.05)  # its timeout fired: its wait ended, not resumed yet maybe
    timed_out.cancel()
    await asyncio.gather(timed_out, return_exceptions=True)
    await asyncio.sleep(0.01)
    assert not other.done()
    other.cancel()
    await asyncio.gather(other, return_exceptions=True)
    polls.close()
