"""Readiness against grants: a process that says ready must consume every slot it was granted.

Every `PERIOD_S` the prober reads the owner nodes from ZooKeeper (the grants), then every
process's /readyz (ready, and the slot numbers it consumes: `consumedSlots`), then the owner nodes
again. A sample counts only when both reads of ZooKeeper agree, so a handoff between the reads is
never taken for a violation. Violation: ready while a slot ZooKeeper grants it is not consumed,
unless the process reports that slot frozen by a move or a doubling (`unconsumedSlots`, reason
`moving`: by design not a reason to be unready, docs/coordination.md).
Every agreed sample is kept too (`SlotSample`, with the routing's slot amount, read between the
two and unchanged after them): the checker finds in them when a slot was taken over and how long
it went unconsumed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

import aiohttp

from delayq.service.unconsumed import Why

from .cluster import Cluster, Member

PERIOD_S = 0.5
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ReadinessViolation:
    at_ms: float
    member: str
    granted: int
    consumed: int
    missing: tuple[int, ...]  # granted slots it did not consume


@dataclass(frozen=True)
class SlotSample:
    """One sample both ZooKeeper reads agreed on: who is granted each slot, and the slots each
    process said it consumes (None: it did not answer in time — down, frozen or too slow)."""

    at_ms: float  # taken after the first read and before /readyz: a lower bound of both
    granted: dict[int, str]
    consumed: dict[str, tuple[int, ...] | None]
    slot_amount: int | None = None  # the routing's then (a doubling doubles it); None: unread

    def consumer(self, slot: int) -> str | None:
        """The process consuming `slot` (granted it and consuming it), "" when nobody does,
        None when unknown (its grantee did not answer)."""
        owner = self.granted.get(slot)
        if owner is None:
            return ""
        consumed = self.consumed.get(owner)
        if consumed is None:
            return None
        return owner if slot in consumed else ""


@dataclass
class Prober:
    cluster: Cluster
    samples: int = 0
    violations: list[ReadinessViolation] = field(default_factory=list)
    slot_samples: list[SlotSample] = field(default_factory=list)

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample(session)
            await asyncio.sleep(PERIOD_S)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        before = await asyncio.to_thread(self.cluster.owners)
        amount = await asyncio.to_thread(self.cluster.slot_amount)
        at_ms = time.time() * 1000
        answers = await asyncio.gather(
            *(_readyz(session, member) for member in self.cluster.members)
        )
        after = await asyncio.to_thread(self.cluster.owners)
        doubled = amount != await asyncio.to_thread(self.cluster.slot_amount)
        if before is None or before != after or doubled:
            return
        by_member: dict[str, tuple[int, ...] | None] = {}
        for member, answer in zip(self.cluster.members, answers, strict=True):
            by_member[member.name] = None if answer is None else tuple(sorted(answer.consumed))
            if answer is None:
                continue
            self.samples += 1
            granted = {slot for slot, owner in before.items() if owner == member.name}
            missing = not_consumed(granted, answer)
            if answer.ready and missing:
                consumed = len(answer.consumed)
                self.violations.append(
                    ReadinessViolation(at_ms, member.name, len(granted), consumed, missing)
                )
        self.slot_samples.append(SlotSample(at_ms, before, by_member, amount))


@dataclass(frozen=True)
class ReadyAnswer:
    """What a process's /readyz said."""

    ready: bool
    consumed: frozenset[int]  # `consumedSlots`
    frozen: frozenset[int]  # granted old slots it reports frozen by a move or doubling


def not_consumed(granted: set[int], answer: ReadyAnswer) -> tuple[int, ...]:
    """The granted slots a process that says ready should consume and does not. A slot it
    reports frozen by a move or a doubling is not one: no process could consume it (the service
    ends a stopped move itself), so by design it is no reason to be unready; `stalled` judges
    its messages."""
    return tuple(sorted(granted - answer.consumed - answer.frozen))


async def _readyz(session: aiohttp.ClientSession, member: Member) -> ReadyAnswer | None:
    """What /readyz said, or None when the process does not answer (down, frozen)."""
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with session.get(member.url + "/readyz", timeout=timeout) as response:
            body = await response.json()
            unconsumed: dict[str, str] = body["unconsumedSlots"]
            return ReadyAnswer(
                ready=response.status == 200 and bool(body["ready"]),
                consumed=frozenset(int(slot) for slot in body["consumedSlots"]),
                frozen=frozenset(
                    int(slot)
                    for slot, why in unconsumed.items()
                    if slot.isdigit() and why.startswith(f"{Why.MOVING}:")
                ),
            )
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, AttributeError):
        return None


async def clock_skew_s(session: aiohttp.ClientSession, member: Member) -> float:
    """How far the process's wall clock is off the real one, read from its HTTP `Date` header
    (whole seconds: good to about 1 s), so a run whose skew did not take effect fails at once."""
    async with session.get(member.url + "/healthz") as response:
        their_s = parsedate_to_datetime(response.headers["Date"]).timestamp()
    return their_s - time.time()


async def fleet_ready(cluster: Cluster, session: aiohttp.ClientSession) -> bool:
    """Every process ready and every slot (of the routing's amount) owned in ZooKeeper by one
    of them."""
    answers = [await _readyz(session, member) for member in cluster.members]
    if not all(answer is not None and answer.ready for answer in answers):
        return False
    owners = await asyncio.to_thread(cluster.owners)
    amount = await asyncio.to_thread(cluster.slot_amount)
    names = {m.name for m in cluster.members}
    return owners is not None and len(owners) == amount and set(owners.values()) <= names
