"""The lateness objective (`spec.objectives`): the p99 over a window, from bucket deltas (pure).

The delay-service pods export `delayq_delivery_lateness_seconds`, a cumulative histogram per
process. Each health pass reads every ready pod's buckets (objective_scrape.py) and records them
in the topic's `LatenessWindow`, kept in the OperatorContext between passes. The p99 over the
window is the quantile of the sum over pods of each pod's newest buckets minus its reading at
the window's start (its first one, for a pod younger than the window; none after a counter reset:
the process restarted), which is what `histogram_quantile(0.99, rate(...[window]))` says, at
bucket resolution: the measured value is the upper bound of the bucket the p99 falls in, so an
objective between two bounds is held to the upper one.

A pod that does not answer makes `ObjectiveMet` Unknown, never False: its deliveries may be the
late ones or the punctual ones, and a partition must not page anyone about lateness.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from delayq.kube.status import FALSE, OBJECTIVE_MET, TRUE, UNKNOWN, Condition
from delayq.queue.settings import human_duration
from delayq.service.overview import quantile_ms

#: A pod's cumulative lateness buckets: (upper bound in seconds, count), ascending, +Inf last.
Buckets = tuple[tuple[float, int], ...]
QUANTILE = 0.99


class Silence(enum.StrEnum):
    """Why a ready pod told no lateness, as the condition's message says it."""

    UNANSWERED = "no answer"
    REFUSED = "refused the operator's metrics token"  # rotated in the topic's Secret


@dataclass(frozen=True)
class Measurement:
    """The p99 over the window: the upper bound (ms) of its bucket, None without a delivery;
    `beyond`: past the largest finite bound (`p99_ms`), in the +Inf bucket."""

    p99_ms: float | None
    beyond: bool = False


class LatenessWindow:
    """Each service pod's readings of the window (by pod uid: a pod made again starts over)."""

    def __init__(self) -> None:
        self.readings: dict[str, deque[tuple[float, Buckets]]] = {}

    def record(self, now_s: float, window_s: float, pods: Mapping[str, Buckets]) -> None:
        """Add this pass's readings; forget pods no longer read (gone, or silent: their next
        reading starts a new baseline) and readings older than the one at the window's start."""
        self.readings = {uid: self.readings.get(uid, deque()) for uid in pods}
        for uid, buckets in pods.items():
            kept = self.readings[uid]
            kept.append((now_s, buckets))
            while len(kept) > 1 and kept[1][0] <= now_s - window_s:
                kept.popleft()

    def measure(self) -> Measurement | None:
        """The p99 over the window; None until some pod has been read twice."""
        if not any(len(kept) > 1 for kept in self.readings.values()):
            return None
        total: dict[float, int] = {}
        for kept in self.readings.values():
            for bound, count in _delta(kept[0][1], kept[-1][1]):
                total[bound] = total.get(bound, 0) + count
        bounds = sorted(total)
        counts = [total[bound] for bound in bounds]
        beyond = len(counts) > 1 and counts[-2] < QUANTILE * counts[-1]
        return Measurement(quantile_ms(bounds, counts, QUANTILE), beyond)


def _delta(first: Buckets, last: Buckets) -> Buckets:
    """What a pod counted between two readings: `last` whole after a reset (a count fell)."""
    before = dict(first)
    if any(count < before.get(bound, 0) for bound, count in last):
        return last
    return tuple((bound, count - before.get(bound, 0)) for bound, count in last)


def no_objective() -> Condition:
    """ObjectiveMet once the objective is removed (a condition is never dropped from status)."""
    return Condition(
        OBJECTIVE_MET, TRUE, "NoObjective", "No objective is set (objectives.latenessP99 is 0s)."
    )


def objective_condition(
    objective_ms: int,
    window_ms: int,
    measured: Measurement | None,
    silent: Mapping[str, Silence],
    answered: int,
) -> Condition:
    """ObjectiveMet from this pass's measurement; `silent`: the ready service pods that told
    nothing and why, `answered`: how many told."""
    objective = f"the objective p99 <= {human_duration(objective_ms)}"
    window = human_duration(window_ms)
    if not silent and not answered:
        return Condition(
            OBJECTIVE_MET,
            UNKNOWN,
            "MetricsUnavailable",
            f"No delay-service pod is ready to tell its lateness ({objective} over {window}).",
        )
    if silent:
        return Condition(
            OBJECTIVE_MET,
            UNKNOWN,
            "MetricsUnavailable",
            "Delay-service pods "
            + ", ".join(f"{name} ({why})" for name, why in sorted(silent.items()))
            + f" told no lateness on /metrics: the lateness over the last {window} is unknown "
            f"({objective}).",
        )
    if measured is None:
        return Condition(
            OBJECTIVE_MET,
            UNKNOWN,
            "Measuring",
            f"The first reading of the pods' lateness is taken; it is measured from the next "
            f"health pass on ({objective} over {window}).",
        )
    if measured.p99_ms is None:
        return Condition(
            OBJECTIVE_MET, TRUE, "NoDeliveries", f"No delivery in the last {window} ({objective})."
        )
    measured_p99 = human_duration(int(measured.p99_ms))
    if measured.beyond or measured.p99_ms > objective_ms:
        told = f"over {measured_p99}" if measured.beyond else f"up to {measured_p99}"
        return Condition(
            OBJECTIVE_MET,
            FALSE,
            "LatenessAboveObjective",
            f"p99 lateness over the last {window} is {told}, above {objective}.",
        )
    return Condition(
        OBJECTIVE_MET,
        TRUE,
        "LatenessWithinObjective",
        f"p99 lateness over the last {window} is at most {measured_p99}, within {objective}.",
    )
