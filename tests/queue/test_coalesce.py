"""`Coalescer`: one call in flight, carrying every submission made while the previous was out."""

from __future__ import annotations

import asyncio

import pytest

from delayq.queue.coalesce import Coalescer


class Calls:
    """A `send` whose calls block until released, recording what each carried."""

    def __init__(self) -> None:
        self.carried: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def send(self, items: list[int]) -> list[str]:
        self.carried.append(items)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [f"r{item}" for item in items]


async def test_submissions_during_a_call_share_the_next_one() -> None:
    calls = Calls()
    coalescer = Coalescer(calls.send)
    first = asyncio.create_task(coalescer.submit([1]))
    await asyncio.sleep(0)  # the first call is out
    later = [asyncio.create_task(coalescer.submit(items)) for items in ([2, 3], [], [4])]
    await asyncio.sleep(0)
    assert calls.carried == [[1]]  # one call in flight at a time
    calls.release.set()
    assert await first == ["r1"]
    assert [await task for task in later] == [["r2", "r3"], [], ["r4"]]
    assert calls.carried == [[1], [2, 3, 4]]


async def test_a_failed_call_fails_each_of_its_submitters_and_not_the_next() -> None:
    calls = Calls()
    coalescer = Coalescer(calls.send)
    calls.fail = ConnectionError("gone")
    calls.release.set()
    failed = [asyncio.create_task(coalescer.submit([i])) for i in (1, 2)]
    for task in failed:
        with pytest.raises(ConnectionError):
            await task
    calls.fail = None
    assert await coalescer.submit([3]) == ["r3"]


async def test_a_cancelled_submitter_leaves_the_others_answered() -> None:
    calls = Calls()
    coalescer = Coalescer(calls.send)
    first = asyncio.create_task(coalescer.submit([1]))
    await asyncio.sleep(0)
    gone = asyncio.create_task(coalescer.submit([2]))
    kept = asyncio.create_task(coalescer.submit([3]))
    await asyncio.sleep(0)
    gone.cancel()
    calls.release.set()
    assert await first == ["r1"]
    assert await kept == ["r3"]  # its results, not the cancelled one's
    assert calls.carried == [[1], [2, 3]]  # a decided ack is still sent
