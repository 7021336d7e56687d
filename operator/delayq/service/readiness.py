"""Readiness with hysteresis (pure): what `/readyz` answers, decided from periodic probes.

A probe that hangs on a stalled Redis must not hang the probe endpoint, and a stall of a second
or two must not flip every pod of a topic to unready at once (Kubernetes would pull the whole
topic out of its Service). So the service probes in the background and `/readyz` answers the
cached verdict: unready only after failures lasting `unready_after_s`, ready again after
`ready_after` probes in a row succeed. The first success after start is enough (nothing to flap
from yet), and a process that is closing or whose delivery loop died is unready at once.
"""

from __future__ import annotations

from dataclasses import dataclass

UNREADY_AFTER_S = 3.0  # failing this long (about three probes) makes the process unready
READY_AFTER = 2  # successes in a row that make an unready process ready again
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0  # a probe taking longer counts as failed (it must never freeze the verdict)


@dataclass
class Readiness:
    """The verdict, fed one probe outcome at a time with the monotonic time it was taken."""

    unready_after_s: float = UNREADY_AFTER_S
    ready_after: int = READY_AFTER
    ready: bool = False
    reason: str = "starting"
    _ever_ready: bool = False
    _failing_since: float | None = None
    _successes: int = 0

    def observe(self, failure: str | None, now_s: float) -> bool:
        """Record one probe (`failure` None = healthy, else what failed); the new verdict."""
        if failure is None:
            self._failing_since = None
            self._successes += 1
            if not self.ready and (not self._ever_ready or self._successes >= self.ready_after):
                self.ready, self._ever_ready, self.reason = True, True, "ready"
            return self.ready
        self._successes = 0
        if self._failing_since is None:
            self._failing_since = now_s
        if not self._ever_ready or now_s - self._failing_since >= self.unready_after_s:
            self.ready, self.reason = False, failure
        return self.ready

    def fail_now(self, reason: str) -> None:
        """Unready at once: the process is closing or cannot deliver at all."""
        self.ready, self.reason, self._successes = False, reason, 0
