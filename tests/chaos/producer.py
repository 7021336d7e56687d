"""Schedules messages through the serve processes' HTTP batch API, due times spread over a run.

Batches go round-robin to the three processes whatever the faults do to them; a batch whose
request fails or times out is not counted (none of its ids is "accepted"), and a message counts
only when its result says it was created, with the due time the API returned (Redis's clock).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .cluster import TOPIC, Member

REQUEST_TIMEOUT_S = 2.0


@dataclass
class Producer:
    members: list[Member]
    rate_per_s: float
    max_delay_ms: int
    rng: random.Random
    accepted: dict[str, int] = field(default_factory=dict)  # id -> due ms (Redis clock)
    refused: dict[str, int] = field(default_factory=dict)  # why -> messages
    _number: int = 0

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """Schedule at `rate_per_s` in 100 ms ticks until `stop`; requests run concurrently."""
        tick_s = 0.1
        started = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        tick = 0
        while not stop.is_set():
            target = int((time.monotonic() - started) * self.rate_per_s)
            batch = [self._message() for _ in range(target - self._number)]
            if batch:
                member = self.members[tick % len(self.members)]
                task = asyncio.create_task(self._post(session, member, batch))
                pending.add(task)
                task.add_done_callback(pending.discard)
            tick += 1
            await asyncio.sleep(tick_s)
        await asyncio.gather(*pending)

    def _message(self) -> dict[str, Any]:
        self._number += 1
        return {
            "id": f"m{self._number:07d}",
            "delayMs": self.rng.randint(0, self.max_delay_ms),
            "payload": "x" * 32,
        }

    async def _post(
        self, session: aiohttp.ClientSession, member: Member, batch: list[dict[str, Any]]
    ) -> None:
        url = f"{member.url}/v1/topics/{TOPIC}/messages/batch"
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with session.post(url, json={"messages": batch}, timeout=timeout) as response:
                if response.status != 200:
                    self._refuse(f"HTTP {response.status}", len(batch))
                    return
                results = (await response.json())["results"]
        except (aiohttp.ClientError, TimeoutError) as error:
            self._refuse(type(error).__name__, len(batch))
            return
        for result in results:
            if result["result"] == "created":
                self.accepted[result["id"]] = int(result["dueMs"])
            else:
                self._refuse(result["result"], 1)

    def _refuse(self, why: str, count: int) -> None:
        self.refused[why] = self.refused.get(why, 0) + count
