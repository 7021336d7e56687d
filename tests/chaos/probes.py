"""Readiness against grants: a process that says ready must consume every slot it was granted.

Every `PERIOD_S` the prober reads the owner nodes from ZooKeeper (the grants), then every
process's /readyz (ready, and how many slots it consumes), then the owner nodes again. A sample
counts only when both reads of ZooKeeper agree, so a handoff between the reads is never taken
for a violation. Violation: ready while granted more slots than consumed. /readyz reports a
count, not the set: a process consuming the wrong slots of the right number would pass (the
hook asked of the service is `ownedSlots` as a list, or `/debug/slots`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from .cluster import Cluster, Member

PERIOD_S = 0.5
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ReadinessViolation:
    at_ms: float
    member: str
    granted: int
    consumed: int


@dataclass
class Prober:
    cluster: Cluster
    samples: int = 0
    violations: list[ReadinessViolation] = field(default_factory=list)

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample(session)
            await asyncio.sleep(PERIOD_S)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        before = await asyncio.to_thread(self.cluster.owners)
        at_ms = time.time() * 1000
        answers = await asyncio.gather(
            *(_readyz(session, member) for member in self.cluster.members)
        )
        after = await asyncio.to_thread(self.cluster.owners)
        if before is None or before != after:
            return
        for member, answer in zip(self.cluster.members, answers, strict=True):
            if answer is None:
                continue
            self.samples += 1
            ready, consumed = answer
            granted = sum(1 for owner in before.values() if owner == member.name)
            if ready and granted > consumed:
                self.violations.append(ReadinessViolation(at_ms, member.name, granted, consumed))


async def _readyz(session: aiohttp.ClientSession, member: Member) -> tuple[bool, int] | None:
    """(ready, consumed slots), or None when the process does not answer (down, frozen)."""
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with session.get(member.url + "/readyz", timeout=timeout) as response:
            body = await response.json()
            return response.status == 200 and bool(body["ready"]), int(body["ownedSlots"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
        return None
