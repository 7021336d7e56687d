"""Schedules messages through the serve processes' HTTP batch API, due times spread over a run,
and cancels a few of them.

Batches go round-robin to the three processes whatever the faults do to them; a batch whose
request fails or times out is not counted (none of its ids is "accepted"), and a message counts
only when its result says it was created, with the due time the API returned (Redis's clock).
A created message due at least CANCEL_LEAD_MS later is cancelled with probability
CANCEL_FRACTION (DELETE, through the next process): answered `cancelled`, it moves from
`accepted` to `cancelled` (never to be delivered); answered 404 it stays accepted (a message not
due yet must exist: the rule `lost` judges it); any other answer or none leaves it unknown
(`cancel_unknown`: dropped from both, the cancel may or may not have happened).
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
CANCEL_FRACTION = 0.05
CANCEL_LEAD_MS = 3000  # cancelled only this long before its due time at least


@dataclass
class Producer:
    members: list[Member]
    rate_per_s: float
    max_delay_ms: int
    rng: random.Random
    accepted: dict[str, int] = field(default_factory=dict)  # id -> due ms (Redis clock)
    refused: dict[str, int] = field(default_factory=dict)  # why -> messages
    cancelled: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (ack ms, due)
    cancel_unknown: dict[str, int] = field(default_factory=dict)  # why -> cancels
    _number: int = 0
    _cancels: set[asyncio.Task[None]] = field(default_factory=set)

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
        await asyncio.gather(*self._cancels)

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
                lead_ms = int(result["dueMs"]) - time.time() * 1000
                if lead_ms >= CANCEL_LEAD_MS and self.rng.random() < CANCEL_FRACTION:
                    task = asyncio.create_task(self._cancel(session, result["id"]))
                    self._cancels.add(task)
                    task.add_done_callback(self._cancels.discard)
            else:
                self._refuse(result["result"], 1)

    async def _cancel(self, session: aiohttp.ClientSession, message_id: str) -> None:
        member = self.members[self._number % len(self.members)]
        url = f"{member.url}/v1/topics/{TOPIC}/messages/{message_id}"
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with session.delete(url, timeout=timeout) as response:
                answer = (await response.json()).get("result") if response.status == 200 else None
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            answer, status = None, 0
            why = type(error).__name__
        else:
            why = f"HTTP {status}"
        if answer == "cancelled":
            self.cancelled[message_id] = (time.time() * 1000, self.accepted.pop(message_id))
        elif status != 404:
            self.accepted.pop(message_id, None)
            self.cancel_unknown[why] = self.cancel_unknown.get(why, 0) + 1

    def _refuse(self, why: str, count: int) -> None:
        self.refused[why] = self.refused.get(why, 0) + count
