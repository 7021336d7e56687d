"""The delivery pause `delayq pipeline restore --replay` holds over its whole run.

Why: the restore writes every message of the backup first and the journal replay changes them
afterwards (cancels what finished after the snapshot, moves what was rescheduled). A topic
delivering meanwhile delivers what is overdue by then: again if it was delivered after the
snapshot, even if it was cancelled, and at its old due if it was rescheduled (the replay then
finds nothing to move). So the restore pauses the topic's delivery on every broker itself
(`Queue.pause_as`, the flag marked as the restore's), waits until every consumer has read the
flag before its first write, and resumes at the end only the brokers it paused: a topic paused
before (the API, the operator's `spec.delivery.paused`) stays paused.

A restore that fails after it began writing leaves its pause: resuming then would deliver what
the replay has not yet cancelled or moved. So does a killed one. Running the restore again
finishes it (create-only, the replay idempotent) and, the flag being the restore's, resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from delayq.pipeline.io_redis import RedisTarget
from delayq.queue.consumer import WATCHDOG_S
from delayq.service.delivery.pull import PAUSE_CHECK_S

#: The pause flag's value while a restore holds it (`pause` writes "1").
HOLDER = "restore"
#: How long after the flag is set every consumer has read it: a push consumer reads it in the
#: first upkeep round once WATCHDOG_S passed since its last read (rounds at most WATCHDOG_S
#: apart), the pull delivery when its last read is PAUSE_CHECK_S old; plus a second of margin
#: for a slow round trip. Spark's start usually takes longer: the wait costs nothing then.
PAUSE_SEEN_S = max(2 * WATCHDOG_S, PAUSE_CHECK_S) + 1.0


@dataclass
class RestorePause:
    """Which brokers of the topic the restore paused (or took over from a killed restore) and
    which were paused by someone else before it, in broker index order."""

    paused: list[int]
    kept: list[int]
    seen_at_s: float  # monotonic: every consumer has read the flag by then
    writing: bool = False  # the restore may have written: a failure keeps the pause from here on
    lifted: list[int] = field(default_factory=list)  # resumed by someone else during the restore
    resumed: list[int] = field(default_factory=list)

    def before_writing(self) -> None:
        """Wait until every consumer has read the pause, then count as writing."""
        time.sleep(max(0.0, self.seen_at_s - time.monotonic()))
        self.writing = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "kept": self.kept,
            "resumed": self.resumed,
            "lifted": self.lifted,
        }

    def line(self) -> str:
        text = (
            f"pause: delivery paused for the restore on broker(s) {_names(self.paused)}, "
            f"resumed on {_names(self.resumed)}; paused before, left paused: {_names(self.kept)}"
        )
        if self.lifted:
            text += (
                f"; WARNING: resumed by someone else during the restore on {_names(self.lifted)}"
                " (what was overdue may have been delivered before the replay)"
            )
        return text


def _names(brokers: list[int]) -> str:
    return ", ".join(map(str, brokers)) or "none"


@contextmanager
def paused_delivery(target: RedisTarget, report: Callable[[str], None]) -> Iterator[RestorePause]:
    """Pause the target's delivery for the block; resume what it paused when the block ends,
    or fails before `before_writing`. A failure after it keeps the pause and says so through
    `report` (one line on stderr) before the error's own line."""
    with target.connect() as routed:
        held = [queue.pause_as(HOLDER) for queue in routed.queues]
    brokers = range(len(held))
    pause = RestorePause(
        paused=[b for b in brokers if held[b]],
        kept=[b for b in brokers if not held[b]],
        seen_at_s=time.monotonic() + PAUSE_SEEN_S,
    )
    try:
        yield pause
    except BaseException:
        if pause.writing and pause.paused:
            report(
                f"delivery stays paused on broker(s) {_names(pause.paused)}: the restore "
                "stopped after it began writing; run it again to finish (it stores nothing "
                "twice) and resume"
            )
            raise
        _resume(target, pause)
        raise
    _resume(target, pause)


def _resume(target: RedisTarget, pause: RestorePause) -> None:
    with target.connect() as routed:
        for broker in pause.paused:
            queue = routed.queues[broker]
            if queue.resume_as(HOLDER):
                pause.resumed.append(broker)
            elif not queue.is_paused():
                pause.lifted.append(broker)
