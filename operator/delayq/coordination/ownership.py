"""The contract between slot coordination and the delay service.

The service never decides on its own which slots it consumes: an `Ownership` tells it, through
`on_change`, the complete set of slots it may consume now. Handoff order is the safety rule:
a slot is removed from a process's set (and the callback has returned, i.e. the process stopped
claiming it) before the coordination releases it to another process; the new owner then bumps
the slot's fencing epoch (`Consumer.own` → fence-10.lua), so even a process that missed the news
(partition, paused VM) can move nothing in that slot any more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

OnChange = Callable[[frozenset[int]], Awaitable[None]]
#: The states of a coordination session, as `SessionHolder.session_state` names them (kazoo's
#: CONNECTED, SUSPENDED and LOST, lower-cased; `lost` also before the first connection).
SESSION_STATES = ("connected", "suspended", "lost")


class Ownership(Protocol):
    """Source of truth for the slots this process may consume."""

    async def start(self, on_change: OnChange) -> None:
        """Join, and call `on_change` with the owned set now and whenever it changes."""

    async def stop(self) -> None:
        """Give every slot up (calling `on_change(frozenset())` first) and leave."""

    @property
    def ready(self) -> bool:
        """True while this process holds its assignment (readiness probe)."""

    @property
    def owned(self) -> frozenset[int]:
        """The set last handed to `on_change`: what the service should be consuming."""

    async def holds(self, slot: int) -> bool:
        """Whether the coordination itself (not a cached view) says this process owns the
        slot now: asked before taking a slot back after a fencing conflict."""


@dataclass(frozen=True)
class FleetView:
    """Who holds which slot across the whole fleet, as the coordination sees it now (read-only:
    the dashboard's slot map and `delayq slots`). A process only knows its own slots; an
    operator asking "why is this slot not delivering?" needs everyone's.

    `assigned` maps each slot to the member the coordinator gave it, `held` is the set of slots
    whose owner node exists (someone may consume them now: a slot outside it is unowned), and
    `holders` names the holding member of the slots it was asked for (reading a holder costs
    one request per slot, so only a page of slots is read; the two differ from `assigned` while
    a handoff is under way)."""

    members: tuple[str, ...]
    assigned: Mapping[int, str] = field(default_factory=dict)
    held: frozenset[int] = frozenset()
    holders: Mapping[int, str] = field(default_factory=dict)


@runtime_checkable
class FleetReader(Protocol):
    """An ownership that can read every member's slots, not just its own (ZooKeeper)."""

    async def fleet(self, holders_of: Iterable[int] = ()) -> FleetView:
        """The fleet now, with the holder of each slot of `holders_of`."""


@runtime_checkable
class SessionHolder(Protocol):
    """An ownership that holds a coordination session (ZooKeeper) whose state is worth
    exporting: while it is not `connected` the process claims nothing."""

    @property
    def session_state(self) -> str:
        """One of SESSION_STATES."""


class EmbeddedOwnership:
    """No ZooKeeper: this single process owns every slot (the local quick start and tests)."""

    def __init__(self, slot_amount: int) -> None:
        self._slots = frozenset(range(slot_amount))
        self._on_change: OnChange | None = None

    async def start(self, on_change: OnChange) -> None:
        self._on_change = on_change
        await on_change(self._slots)

    async def stop(self) -> None:
        if self._on_change is not None:
            await self._on_change(frozenset())
            self._on_change = None

    @property
    def ready(self) -> bool:
        return self._on_change is not None

    @property
    def owned(self) -> frozenset[int]:
        return self._slots if self._on_change is not None else frozenset()

    async def holds(self, slot: int) -> bool:
        return slot in self.owned
