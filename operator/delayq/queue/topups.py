"""The owner's half of recurring schedules: top up what its claims report owed.

A claim that materialises a schedule's next occurrence leaves the schedule owing a top-up (its
next-but-one due, computed in Python: `Queue.top_up_schedules`), and every claim reply counts
the slot's owed top-ups (`ClaimBatch.topups_owed`). So whoever claims a slot (the push
`Consumer`, pull delivery) heals a top-up lost to a crash on its very first claim of the slot,
and one that failed (Redis unreachable) on the next claim or `retry_failed` (the consumer's
watchdog, once a second). Top-ups run in the background, at most one per slot at a time, never
on the claim path; running one twice is harmless (topup-7 compares and sets).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis

from delayq.queue.client import AsyncQueue
from delayq.queue.model import ClaimBatch

log = logging.getLogger(__name__)


class TopUps:
    def __init__(
        self, queue: AsyncQueue, on_topped_up: Callable[[int], None] | None = None
    ) -> None:
        self.queue = queue
        self.on_topped_up = on_topped_up  # gets how many schedules each pass topped up
        self._running: dict[int, asyncio.Task[None]] = {}
        self._failed: set[int] = set()

    def note(self, batch: ClaimBatch) -> None:
        """Start topping up the batch's slot when its claim reports top-ups owed."""
        if batch.topups_owed:
            self.request(batch.slot)

    def request(self, slot: int) -> None:
        if slot in self._running:
            return
        task = asyncio.create_task(self._top_up(slot))
        self._running[slot] = task
        task.add_done_callback(lambda _: self._running.pop(slot, None))

    def retry_failed(self) -> None:
        for slot in list(self._failed):
            self.request(slot)

    async def close(self) -> None:
        """Let running top-ups finish (each is a couple of short round trips)."""
        if self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _top_up(self, slot: int) -> None:
        try:
            topped_up = await self.queue.top_up_schedules(slot)
            if self.on_topped_up is not None:
                self.on_topped_up(topped_up)
            self._failed.discard(slot)
        except redis.RedisError as error:
            log.warning("top-up of slot %d's schedules failed (%s); retrying", slot, error)
            self._failed.add(slot)
