"""Read-only views of a whole topic for people: overview, due-time histogram and slot map.

A process knows only the slots it owns; someone asking "why didn't my message fire?" needs the
whole topic. These views read every slot of every broker (a small read-only script, 64 slots a
call, pipelined per broker: a 16,384-slot topic costs one round trip per broker) and the fleet's
ownership from the coordination, and are served by `/overview` and `/slots` (routes_overview),
the dashboard (`/ui`) and the admin commands (`delayq topic stats`, `delayq slots`).

Cost is bounded whatever the number of open dashboards: a view is computed at most once per
`CACHE_S` per process and concurrent requests share the computation in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.exceptions

from delayq.coordination.ownership import FleetReader, FleetView
from delayq.queue.client import AsyncQueue
from delayq.queue.keys import Part, SlotKeys
from delayq.queue.plans import SLOTS_PER_CALL, Plan, ScriptCall  # 16,384 slots: 256 calls
from delayq.queue.scripts import Script
from delayq.queue.topic import Topic
from delayq.service.metrics import FORECAST_WINDOWS, Activity
from delayq.service.service import DelayService

T = TypeVar("T")

CACHE_S = 1.0  # a view is at most this old: N open pages cost one read per second, not N
# The forecast of due load is at most this old: its cost (4 counts per owned slot, 64 slots a
# call) is paid once per this period whatever the number of scrapers
FORECAST_MAX_AGE_S = 5.0
STALLED_AFTER_MS = 10_000  # a due message unclaimed this long: nobody is consuming the slot
# The due-time histogram's windows after now: (name, end in ms after now); "later" is the rest.
DUE_WINDOWS = (("nextMinute", 60_000), ("nextHour", 3_600_000), ("nextDay", 86_400_000))
DUE_WINDOW_ENDS_MS = tuple(end for _, end in DUE_WINDOWS)
MAX_SLOT_PAGE = 1024  # slots per /slots page: bounds the answer and the holder reads
MAX_LISTED = 100  # stalled or unowned slot numbers listed in a summary at most

PIPELINES_PER_BROKER = 4  # sent at once: parsing one overlaps Redis running the next

# Values per slot in a reply of the `overview` function (queue/lua/overview-4.lua), besides
# one per due window.
_FIELDS = 7


@dataclass(slots=True)
class SlotView:
    """One slot as its broker holds it now. `due_in` counts the messages due in each of
    DUE_WINDOWS after `overdue` (due already, not claimed), then `later`; `paused`: its
    broker's delivery is paused (AsyncQueue.pause), so nobody claims it on purpose; `paced`:
    the topic's pace (rate limit, a receiver's hold) held this process's claims back within
    the last second, so due messages wait on purpose too."""

    slot: int
    broker: int
    now_ms: int
    epoch: int | None
    scheduled: int
    overdue: int
    due_in: tuple[int, ...]
    later: int
    prepared: int
    dead: int
    next_due_ms: int | None
    paused: bool = False
    paced: bool = False

    @property
    def oldest_overdue_ms(self) -> int:
        if self.overdue == 0 or self.next_due_ms is None:
            return 0
        return max(0, self.now_ms - self.next_due_ms)

    @property
    def stalled(self) -> bool:
        """Due messages unclaimed for a while although delivery is neither paused nor paced: such
        a slot waits on purpose, and marking it would hide the slots that are really stuck."""
        return not (self.paused or self.paced) and self.oldest_overdue_ms >= STALLED_AFTER_MS


async def read_slots(
    service: DelayService,
    per_call: int = SLOTS_PER_CALL,
    slots: Sequence[int] | None = None,
    window_ends_ms: Sequence[int] = DUE_WINDOW_ENDS_MS,
) -> list[SlotView]:
    """Every slot of the topic (or `slots`), `due_in` counted up to each of `window_ends_ms`
    after now: calls of `per_call` slots each, in PIPELINES_PER_BROKER pipelines per broker
    sent at once (brokers read in parallel; within one broker, Redis runs one pipeline while
    this process parses another). Slots of different hash tags in one call are fine on the
    standalone Redis a broker is; a Redis Cluster refuses them (CROSSSLOT), and then every
    call reads one slot (`TopicViews` remembers that). A slot a doubling switched is read in
    its halves (`Brokers.stored`) and shown as one, under its own number."""
    windows = [str(end - start) for start, end in _window_bounds(window_ends_ms)]
    parts: list[tuple[int, AsyncQueue, dict[int, int], list[list[int]]]] = []
    wanted = service.topic.slots if slots is None else slots
    for broker, queue, named in sorted(service.brokers.stored(wanted), key=lambda g: g[0]):
        stored = sorted(named)
        chunks = [stored[i : i + per_call] for i in range(0, len(stored), per_call)]
        size = -(-len(chunks) // PIPELINES_PER_BROKER)
        parts += [(broker, queue, named, chunks[i : i + size]) for i in range(0, len(chunks), size)]
    answers, paused = await asyncio.gather(
        asyncio.gather(*(_pipelined(queue, chunks, windows) for _, queue, _, chunks in parts)),
        read_paused(service),
    )
    shown: dict[int, SlotView] = {}
    paced = service.pacer.held_back
    for (broker, _, named, chunks), replies in zip(parts, answers, strict=True):
        for view in _views(broker, chunks, replies, broker in paused, paced, len(windows)):
            view.slot = named[view.slot]
            shown[view.slot] = _added(shown.get(view.slot), view)
    return sorted(shown.values(), key=lambda view: view.slot)


def _added(shown: SlotView | None, half: SlotView) -> SlotView:
    """`half` added to what is shown of its slot so far (its other half, or nothing); the
    epoch shown is the lower half's, the first read."""
    if shown is None:
        return half
    shown.now_ms = max(shown.now_ms, half.now_ms)
    shown.scheduled += half.scheduled
    shown.overdue += half.overdue
    shown.due_in = tuple(a + b for a, b in zip(shown.due_in, half.due_in, strict=True))
    shown.later += half.later
    shown.prepared += half.prepared
    shown.dead += half.dead
    due = [t for t in (shown.next_due_ms, half.next_due_ms) if t is not None]
    shown.next_due_ms = min(due, default=None)
    return shown


async def read_paused(service: DelayService) -> frozenset[int]:
    """The brokers whose delivery is paused, read from Redis (every process sees the same;
    a process's own consumers may lag it by a second)."""
    flags = await asyncio.gather(*(queue.is_paused() for queue in service.brokers.queues))
    return frozenset(broker for broker, flag in enumerate(flags) if flag)


def _views(
    broker: int,
    chunks: list[list[int]],
    replies: list[Any],
    paused: bool,
    paced: bool,
    n: int,
) -> list[SlotView]:
    size = _FIELDS + n
    views: list[SlotView] = []
    for chunk, reply in zip(chunks, replies, strict=True):  # Lua numbers arrive as ints
        now = reply[0]
        for index, slot in enumerate(chunk):
            v = reply[1 + index * size : 1 + (index + 1) * size]
            views.append(
                SlotView(
                    slot,
                    broker,
                    now,
                    v[0] if v[0] >= 0 else None,
                    v[1],
                    v[2],
                    tuple(v[3 : 3 + n]),
                    v[3 + n],
                    v[4 + n],
                    v[5 + n],
                    v[6 + n] if v[6 + n] >= 0 else None,
                    paused,
                    paced,
                )
            )
    return views


def _window_bounds(ends_ms: Sequence[int]) -> list[tuple[int, int]]:
    starts = [0, *ends_ms[:-1]]
    return list(zip(starts, ends_ms, strict=True))


def _slot_key_makers(topic: Topic) -> list[tuple[str, str]]:
    """(before, after) the slot number in each key the view reads, taken from `SlotKeys`
    itself (the one place the key schema is spelled out): building 4 x 16,384 names through
    it took a third of a big topic's read."""
    marker = "987654321"
    parts = (Part.STORE, Part.PREPARE, Part.DEAD, Part.EPOCH)
    slot = SlotKeys(topic.namespace, topic.name, int(marker), topic.slot_generation)
    keys = slot.keys(*parts)
    return [(key.split(marker)[0], key.split(marker)[1]) for key in keys]


async def _pipelined(
    queue: AsyncQueue, chunks: Sequence[Sequence[int]], windows: list[str]
) -> list[Any]:
    """One read-only `overview` call per chunk, in one pipeline (the engine client's: the
    library is loaded again when the broker lost it and the user may)."""
    makers = _slot_key_makers(queue.topic)
    calls = [
        ScriptCall(
            Script.OVERVIEW,
            [f"{before}{slot}{after}" for slot in chunk for before, after in makers],
            list(windows),
        )
        for chunk in chunks
    ]
    return await queue.run(Plan(calls, list))


FLEET_TIMEOUT_S = 5.0  # a ZooKeeper that does not answer must not hold a page for ever


class FleetUnavailableError(Exception):
    """The coordination could not be read (ZooKeeper unreachable or slow)."""


async def read_fleet(service: DelayService, holders_of: Sequence[int] = ()) -> FleetView:
    """The fleet's ownership: from ZooKeeper when the service uses it, else this process owns
    what it consumes (embedded ownership: one process, every slot). FleetUnavailableError when
    ZooKeeper does not answer within FLEET_TIMEOUT_S."""
    if isinstance(service.ownership, FleetReader):
        try:
            return await asyncio.wait_for(service.ownership.fleet(holders_of), FLEET_TIMEOUT_S)
        except TimeoutError:
            raise FleetUnavailableError(
                f"ZooKeeper did not answer within {FLEET_TIMEOUT_S:.0f} s"
            ) from None
        except Exception as error:  # kazoo's errors: this layer does not import kazoo
            raise FleetUnavailableError(f"ZooKeeper: {type(error).__name__}: {error}") from None
    member = service.config.member
    owned = frozenset(service.owned_slots)
    return FleetView(
        (member,),
        {slot: member for slot in service.topic.slots},
        owned,
        {slot: member for slot in holders_of if slot in owned},
    )


class Cached(Generic[T]):
    """A value computed at most once per `max_age_s`; callers arriving while it is computed
    wait for that computation instead of starting their own."""

    def __init__(self, compute: Callable[[], Awaitable[T]], max_age_s: float = CACHE_S) -> None:
        self._compute = compute
        self._max_age_s = max_age_s
        self._value: tuple[float, int, T] | None = None
        self._forgets = 0  # counted by forget: a value computed before the last one is stale
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """The next `get` computes afresh: after a change the view must show at once (pause
        and resume), not up to `max_age_s` later — even when a computation that started
        before the change is still running."""
        self._forgets += 1

    async def get(self) -> tuple[T, float]:
        """The value and its age in seconds."""
        async with self._lock:
            now = time.monotonic()
            if (
                self._value is None
                or self._value[1] != self._forgets
                or now - self._value[0] > self._max_age_s
            ):
                forgets = self._forgets
                self._value = (time.monotonic(), forgets, await self._compute())
            taken, _, value = self._value
            return value, time.monotonic() - taken


@dataclass(frozen=True)
class TopicView:
    """Every slot, and the fleet — None when ZooKeeper could not be read (`fleet_error` says
    why): the depths are worth showing exactly when the coordination is in trouble."""

    slots: list[SlotView]
    fleet: FleetView | None
    fleet_error: str | None = None


class TopicViews:
    """The cached views of one service's topic (one per app)."""

    def __init__(self, service: DelayService) -> None:
        self.service = service
        self.per_call = SLOTS_PER_CALL
        self.topic = Cached(self._read)
        self.forecast = Cached(self._forecast, FORECAST_MAX_AGE_S)

    async def _read_slots(
        self, slots: Sequence[int] | None = None, ends: Sequence[int] = DUE_WINDOW_ENDS_MS
    ) -> list[SlotView]:
        try:
            return await read_slots(self.service, self.per_call, slots, ends)
        except redis.exceptions.ResponseError as error:
            if "CROSSSLOT" not in str(error) or self.per_call == 1:
                raise
            self.per_call = 1  # a Redis Cluster: one slot (one hash tag) per call from now on
            return await read_slots(self.service, self.per_call, slots, ends)

    async def _forecast(self) -> dict[str, int]:
        """Messages of the slots this process owns due after now and within each of
        FORECAST_WINDOWS, by its label: the due index counted by the `overview` function,
        so each Redis counts its own slots on its own clock."""
        ends = [end for _, end in FORECAST_WINDOWS]
        views = await self._read_slots(sorted(self.service.owned_slots), ends)
        bands = [sum(view.due_in[i] for view in views) for i in range(len(ends))]
        return dict(
            zip((name for name, _ in FORECAST_WINDOWS), itertools.accumulate(bands), strict=True)
        )

    async def _read(self) -> TopicView:
        slots = await self._read_slots()
        try:
            return TopicView(slots, await read_fleet(self.service))
        except FleetUnavailableError as error:
            return TopicView(slots, None, str(error))


def quantile_ms(bounds_s: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The q-quantile of a cumulative Prometheus histogram, as the upper bound (ms) of the
    bucket it falls in — what `histogram_quantile` would say without interpolation. None when
    nothing was observed; +Inf buckets answer the largest finite bound."""
    if not counts or counts[-1] == 0:
        return None
    rank = q * counts[-1]
    finite = [b for b in bounds_s if b != float("inf")]
    for bound, count in zip(bounds_s, counts, strict=True):
        if count >= rank:
            return (bound if bound != float("inf") else finite[-1]) * 1000
    return finite[-1] * 1000


def activity_json(member: str, activity: Activity) -> dict[str, Any]:
    bounds, counts = activity.lateness_bounds_s, activity.lateness_counts
    return {
        "member": member,
        "deliveries": activity.deliveries,
        "retries": activity.retries,
        "dead": activity.dead,
        "lateness": {
            "boundsMs": [b * 1000 for b in bounds if b != float("inf")],
            "counts": list(counts),
        },
        "latenessP50Ms": quantile_ms(bounds, counts, 0.5),
        "latenessP99Ms": quantile_ms(bounds, counts, 0.99),
    }


def overview_json(service: DelayService, view: TopicView, age_s: float) -> dict[str, Any]:
    """The topic at a glance: what `/overview` answers."""
    slots, fleet = view.slots, view.fleet
    histogram = {"overdue": sum(s.overdue for s in slots)}
    for index, (name, _) in enumerate(DUE_WINDOWS):
        histogram[name] = sum(s.due_in[index] for s in slots)
    histogram["later"] = sum(s.later for s in slots)
    next_due = [s.next_due_ms for s in slots if s.next_due_ms is not None]
    paused = sorted({s.broker for s in slots if s.paused})
    stalled = [s.slot for s in slots if s.stalled]
    fleet_json: dict[str, Any] = {
        "stalledSlots": len(stalled),
        "stalled": stalled[:MAX_LISTED],
        "stalledAfterMs": STALLED_AFTER_MS,
    }
    if fleet is None:
        fleet_json.update(
            members=[], heldSlots=None, unownedSlots=None, unowned=[], error=view.fleet_error
        )
    else:
        unowned = [s.slot for s in slots if s.slot not in fleet.held]
        fleet_json.update(
            members=list(fleet.members),
            heldSlots=len(fleet.held),
            unownedSlots=len(unowned),
            unowned=unowned[:MAX_LISTED],
        )
    return {
        "namespace": service.topic.namespace,
        "topic": service.topic.name,
        "topicType": str(service.topic.topic_type),
        "slotAmount": service.topic.slot_amount,
        "brokers": len(service.brokers.queues),
        "nowMs": max((s.now_ms for s in slots), default=0),
        "ageMs": int(age_s * 1000),
        "depth": {
            "scheduled": sum(s.scheduled for s in slots),
            "due": histogram["overdue"],
            "prepared": sum(s.prepared for s in slots),
            "dead": sum(s.dead for s in slots),
        },
        "nextDueMs": min(next_due, default=None),
        "oldestOverdueMs": max((s.oldest_overdue_ms for s in slots), default=0),
        "paused": bool(paused),
        "pausedBrokers": paused,
        "paced": any(s.paced for s in slots),
        "rateLimitPerSecond": service.pacer.per_second,  # the settings record's, live
        "rateLimitBurst": service.pacer.burst,
        "receiverHoldMs": round(service.pacer.hold_left_ms),
        # the AIMD limit of this process's webhook POSTs, and its ceiling (None: no webhook)
        "webhookConcurrency": service.metrics.webhook_posts_allowed,
        "webhookMaxInFlight": (
            service.config.webhook_max_in_flight
            if service.metrics.webhook_posts_allowed is not None
            else None
        ),
        # spec.objectives, drawn against the measured lateness (0: none)
        "latenessObjectiveMs": service.config.objectives_lateness_p99_ms,
        "objectiveWindowMs": service.config.objectives_window_ms,
        "dueHistogram": histogram,
        "fleet": fleet_json,
        "process": {
            **activity_json(service.config.member, service.metrics.activity()),
            "ownedSlots": len(service.owned_slots),
        },
    }


def slot_json(view: SlotView, fleet: FleetView) -> dict[str, Any]:
    held = view.slot in fleet.held
    return {
        "slot": view.slot,
        "broker": view.broker,
        "owner": fleet.holders.get(view.slot) if held else None,
        "assigned": fleet.assigned.get(view.slot),
        "held": held,
        "epoch": view.epoch,
        "scheduled": view.scheduled,
        "due": view.overdue,
        "prepared": view.prepared,
        "dead": view.dead,
        "nextDueMs": view.next_due_ms,
        "oldestOverdueMs": view.oldest_overdue_ms,
        "stalled": view.stalled,
        "paused": view.paused,
    }


def heat_json(service: DelayService, view: TopicView, age_s: float) -> dict[str, Any]:
    """Every slot at once, a column per value (`/slots/heat`, the dashboard's heat map): 16,384
    slots are a few hundred kB, not 16,384 objects. `owner[i]` indexes `members` (-1: nobody
    holds the slot); it is the member the assignment names for a held slot, since reading each
    slot's holder costs a ZooKeeper read (the `/slots` page reads them for its slots); null
    with `fleetError` when ZooKeeper could not be read."""
    slots, fleet = view.slots, view.fleet
    owner: list[int] | None = None
    members: list[str] = []
    if fleet is not None:
        members = list(fleet.members)
        index = {member: number for number, member in enumerate(members)}
        owner = []
        for slot in slots:
            name = fleet.assigned.get(slot.slot) if slot.slot in fleet.held else None
            if name is not None and name not in index:  # assigned to a member just gone
                index[name] = len(members)
                members.append(name)
            owner.append(-1 if name is None else index[name])
    return {
        "slotAmount": service.topic.slot_amount,
        "ageMs": int(age_s * 1000),
        "stalledAfterMs": STALLED_AFTER_MS,
        "members": members,
        "owner": owner,
        "fleetError": view.fleet_error,
        "scheduled": [s.scheduled for s in slots],
        "due": [s.overdue for s in slots],
        "oldestOverdueMs": [s.oldest_overdue_ms for s in slots],
        "stalled": [s.stalled for s in slots],
        "paused": [s.paused for s in slots],
    }
