"""When a recurring schedule fires: cron in an IANA time zone, or every N ms (pure).

The cron maths stays in Python (cronsim, which follows Debian cron across DST changes: a
local time the spring-forward gap skips fires at the first instant after the gap, a local time
the fall-back fold repeats fires once, on its first pass, while a wildcard hour or minute fires
on both passes, as the wall clock really shows it twice); the Lua scripts only ever see the
instants computed here, as Unix epoch milliseconds.

Catch-up (what a series does after downtime) is decided from three instants: the occurrence
that was delivered or is waiting (`current_due_ms`), its successor and the server's now.
An occurrence is *missed* when its successor is already due when it is claimed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from delayq.queue.codes import InvalidMessageError

MAX_CATCH_UP = 1000  # the most missed occurrences `all` delivers after one downtime
MIN_EVERY_MS = 1
MAX_INSTANT_MS = 2**52  # as a message's at_ms
# a cron expression that matches nothing within this many years is refused (`0 0 30 2 *`)
_CRON_HORIZON_S = 5 * 366 * 86400
# a cron search that runs off the calendar (past year 9999, or no match at all): no occurrence
_BEYOND_CALENDAR = (StopIteration, CronSimError, OverflowError, ValueError, OSError)


class CatchUp(enum.StrEnum):
    """What a series delivers of the occurrences it missed while nobody claimed its slot."""

    ONCE = "once"  # the first missed occurrence, then on from the first one after now
    ALL = "all"  # every missed occurrence, at most `catch_up_max` (the latest ones)
    SKIP = "skip"  # none of them: on from the first occurrence after now


@dataclass(frozen=True)
class Recurrence:
    """Exactly one of `cron` (5 fields, or 6 with seconds first, in `time_zone`) or `every_ms`
    (instants `start_ms + k * every_ms`). Occurrences lie in [start_ms, end_ms]."""

    cron: str | None = None
    time_zone: str = "UTC"
    every_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidMessageError("give exactly one of cron or every_ms")
        for name in ("start_ms", "end_ms"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_INSTANT_MS):
                raise InvalidMessageError(
                    f"{name} {value!r} must be an integer 0..{MAX_INSTANT_MS}"
                )
        if self.start_ms is not None and self.end_ms is not None and self.end_ms < self.start_ms:
            raise InvalidMessageError(f"end_ms {self.end_ms} is before start_ms {self.start_ms}")
        if self.every_ms is not None:
            if not _is_int(self.every_ms) or not MIN_EVERY_MS <= self.every_ms <= MAX_INSTANT_MS:
                bounds = f"{MIN_EVERY_MS}..{MAX_INSTANT_MS}"
                raise InvalidMessageError(f"every_ms {self.every_ms!r} must be an integer {bounds}")
            return
        try:
            zone = ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):  # OSError: a directory
            raise InvalidMessageError(
                f"time_zone {self.time_zone!r} is not an IANA time zone (e.g. Europe/Berlin)"
            ) from None
        try:
            CronSim(str(self.cron), datetime.now(zone))
        except CronSimError as error:
            raise InvalidMessageError(f"cron {self.cron!r}: {error}") from None

    def anchored(self, now_ms: int) -> Recurrence:
        """An every-N series without `start_ms` starts one period after it is defined: its
        instants must not move when it is read again later, so the anchor is stored."""
        if self.every_ms is None or self.start_ms is not None:
            return self
        return Recurrence(
            every_ms=self.every_ms, start_ms=now_ms + self.every_ms, end_ms=self.end_ms
        )

    def next_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after `after_ms`, or None when the series has ended."""
        start = self.start_ms if self.start_ms is not None else 0
        due: int | None
        if self.every_ms is not None:
            if after_ms < start:
                due = start
            else:
                due = start + ((after_ms - start) // self.every_ms + 1) * self.every_ms
        else:
            due = self._cron_after(max(after_ms, start - 1))
        if due is None or (self.end_ms is not None and due > self.end_ms):
            return None
        return due

    def last_at_or_before(self, at_ms: int, count: int) -> int | None:
        """The earliest of the `count` latest occurrences at or before `at_ms` (None: fewer
        than `count` of them since `start_ms`)."""
        start = self.start_ms if self.start_ms is not None else 0
        if at_ms < start:
            return None
        if self.every_ms is not None:
            due = start + ((at_ms - start) // self.every_ms - (count - 1)) * self.every_ms
            return due if due >= start else None
        zone = ZoneInfo(self.time_zone)
        due_ms = None
        try:
            # cronsim's reverse iteration is strictly before its instant: one second later
            at = datetime.fromtimestamp(at_ms // 1000 + 1, zone)
            it = CronSim(str(self.cron), at, reverse=True)
            for _ in range(count):
                due_ms = int(next(it).timestamp()) * 1000
                if due_ms < start:
                    return None
        except _BEYOND_CALENDAR:
            return None
        return due_ms

    def _cron_after(self, after_ms: int) -> int | None:
        zone = ZoneInfo(self.time_zone)
        try:
            after = datetime.fromtimestamp(after_ms // 1000, zone)  # cron has whole seconds
            due = next(CronSim(str(self.cron), after))
        except _BEYOND_CALENDAR:
            return None
        if due.timestamp() - after.timestamp() > _CRON_HORIZON_S:
            return None
        return int(due.astimezone(UTC).timestamp()) * 1000


def following_due_ms(
    recurrence: Recurrence,
    current_due_ms: int,
    now_ms: int,
    catch_up: CatchUp,
    catch_up_max: int,
    waiting: bool,
) -> int | None:
    """The occurrence to precompute after `current_due_ms` (None: the series ends there).

    `waiting`: the current occurrence waits in the slot's store, never claimed. Then the claim
    that takes it decides what a missed successor means (the claim sees whether the successor
    is due), so the true successor is returned. When the current occurrence was already claimed
    (or skipped) and the successor is overdue, this is a catch-up: `once` and `skip` resume at
    the first occurrence after now; `all` delivers missed ones, at most `catch_up_max` of the
    latest.
    """
    following = recurrence.next_after(current_due_ms)
    if following is None or following > now_ms:
        return following
    if catch_up is CatchUp.ALL:
        bound = recurrence.last_at_or_before(now_ms, catch_up_max)
        return following if bound is None else max(following, bound)
    if waiting:
        return following
    return recurrence.next_after(now_ms)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
