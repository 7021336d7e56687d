"""Granted slots this process could not take over yet, each on its own retry timer (pure).

An ownership pass never fails as a whole because of one slot: a slot whose take-over fails (its
broker refuses it as moving, or does not answer) is recorded here and retried on its own, with a
backoff of RETRY_FIRST_S doubling to RETRY_MAX_S, while every other slot is consumed at once.
Readiness and `/readyz` report them with the reason; a slot frozen by a move or a doubling
(`moving`) does not make the process unready (no process could consume it, the move or the
doubling must end first), any other reason does (docs/service.md, "Slots that cannot be taken
over").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from delayq.queue.codes import SlotMovingError

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0  # a broker back, or a move ended, is noticed this soon at the latest


class Why(enum.StrEnum):
    """Why a granted slot is not consumed (the metric's `reason` label)."""

    MOVING = "moving"  # frozen by a slot move or a doubling (SLOT_MOVING): ended first
    ERROR = "error"  # its broker failed the take-over (down, timing out, refusing)


@dataclass
class Unconsumed:
    """One granted slot not taken over: why, since when, and when to try again (monotonic s)."""

    why: Why
    error: str
    since_s: float
    retry_at_s: float
    delay_s: float = RETRY_FIRST_S


class UnconsumedSlots:
    """The granted slots whose take-over failed, by slot."""

    def __init__(self) -> None:
        self.slots: dict[int, Unconsumed] = {}

    def failed(self, errors: dict[int, Exception], now_s: float) -> None:
        """Record failed take-overs; a slot failing again backs off (doubling, bounded)."""
        for slot, error in errors.items():
            why = Why.MOVING if isinstance(error, SlotMovingError) else Why.ERROR
            known = self.slots.get(slot)
            if known is None:
                self.slots[slot] = Unconsumed(why, str(error), now_s, now_s + RETRY_FIRST_S)
                continue
            if known.why is not why:
                known.why, known.since_s = why, now_s
            known.error = str(error)
            known.delay_s = min(known.delay_s * 2, RETRY_MAX_S)
            known.retry_at_s = now_s + known.delay_s

    def forget(self, slots: Iterable[int]) -> None:
        """The slots are consumed now, or no longer granted."""
        for slot in slots:
            self.slots.pop(slot, None)

    def due(self, now_s: float) -> frozenset[int]:
        return frozenset(s for s, u in self.slots.items() if u.retry_at_s <= now_s)

    def next_retry_s(self) -> float | None:
        return min((u.retry_at_s for u in self.slots.values()), default=None)

    def moving_since(self, slot_since_s: float) -> frozenset[int]:
        """The slots refused as moving since `slot_since_s` or earlier."""
        return frozenset(
            s for s, u in self.slots.items() if u.why is Why.MOVING and u.since_s <= slot_since_s
        )

    def count(self, why: Why) -> int:
        return sum(1 for u in self.slots.values() if u.why is why)

    def report(self, prefix: str = "") -> dict[str, str]:
        """slot -> reason, for `/readyz`; each slot number after `prefix` (a doubling's halves
        are `g<generation>/<slot>`: their numbers are the next generation's)."""
        return {f"{prefix}{s}": f"{u.why}: {u.error}" for s, u in sorted(self.slots.items())}
