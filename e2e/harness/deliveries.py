"""The counting checker of the upgrade and recovery tests: what a receiver logged (one JSON
line per delivery: ``id``, ``dueMs``, ``atMs``, ``attempt``) against the ids a producer stored.

Lost: stored, never delivered. Early: delivered before its due time. A duplicate is explained
when each later delivery of the id carries a higher attempt than the one before it (the topic
counted a redelivery: a lease that ran out, a pod that stopped while its POST was in flight); a
repeat of the same attempt is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending, non-empty list."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


@dataclass
class Count:
    """What the receiver saw of the stored ids."""

    stored: int
    lost: list[str] = field(default_factory=list)
    early: list[tuple[str, float]] = field(default_factory=list)  # (id, ms before due)
    #: id -> attempts of every delivery, in arrival order (only ids delivered more than once)
    duplicates: dict[str, list[int]] = field(default_factory=dict)
    #: lateness (ms) of each stored id's first delivery, by id
    lateness_ms: dict[str, float] = field(default_factory=dict)
    due_ms: dict[str, int] = field(default_factory=dict)

    @property
    def unexplained(self) -> list[str]:
        """Duplicates whose attempts do not rise."""
        return [i for i, attempts in self.duplicates.items()
                if any(b <= a for a, b in pairwise(attempts))]

    def lateness_between(self, start_ms: float, end_ms: float) -> list[float]:
        """Ascending lateness (ms) of the messages due in [start_ms, end_ms]."""
        return sorted(late for i, late in self.lateness_ms.items()
                      if start_ms <= self.due_ms[i] <= end_ms)

    def summary(self, lateness: list[float]) -> str:
        """One line: the counts and lateness p50/p99/max of ``lateness``."""
        over_10_s = sum(late > 10_000 for late in lateness)
        figures = (f"p50 {percentile(lateness, 0.5):.0f} ms, p99 {percentile(lateness, 0.99):.0f}"
                   f" ms, max {lateness[-1]:.0f} ms, {over_10_s} over 10 s" if lateness
                   else "none due")
        return (f"{len(self.lost)} lost, {len(self.early)} early, "
                f"{len(self.duplicates)} delivered more than once ({len(self.unexplained)} "
                f"unexplained); lateness over {len(lateness)}: {figures}")


def count(stored_ids: Iterable[str], deliveries: Iterable[dict[str, Any]]) -> Count:
    """Every delivery of ``deliveries`` (in arrival order) against ``stored_ids``."""
    stored = set(stored_ids)
    result = Count(len(stored))
    attempts: dict[str, list[int]] = {}
    for entry in deliveries:
        message_id = entry["id"]
        attempts.setdefault(message_id, []).append(int(entry["attempt"]))
        late = float(entry["atMs"]) - float(entry["dueMs"])
        if late < 0:
            result.early.append((message_id, -late))
        if message_id not in result.lateness_ms:
            result.lateness_ms[message_id] = late
            result.due_ms[message_id] = int(entry["dueMs"])
    result.lost = sorted(stored - attempts.keys())
    result.duplicates = {i: a for i, a in attempts.items() if len(a) > 1}
    return result
