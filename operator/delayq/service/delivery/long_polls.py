"""Long polls waiting for something due, handed the claim one at a time.

A wake-up (a producer's, a slot taken over, the next due time reached) says that something may
be due, not that every waiting poll has work. Answered by every waiting poll with a claim of
every owned slot, one due time cost polls x slots claims, and the poll that found the message
answered only after the others' claims: lateness p50 ~200 ms with 20 polls and 64 slots on a
loaded 2-core machine (tests/service/test_pull_lateness.py). So a wake-up hands the turn to one
waiting poll (the longest waiting); after its claim the leaser either arms the one timer at the
next time a slot has something to claim or, when something is due still (the claim stopped at
its `max`), hands the turn on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from delayq.queue.precise_timer import PreciseTimer


class LongPolls:
    """The waiting long polls of one process (first come, first woken) and the one timer at the
    next time an owned slot has something to claim."""

    def __init__(self) -> None:
        self._turns: deque[asyncio.Future[bool]] = deque()
        self._timer = PreciseTimer(self.wake_one)  # to 0.1 ms, where asyncio's wake 0-1 ms late

    def __len__(self) -> int:
        return len(self._turns)

    def wake_one(self) -> None:
        """Something may be due: the longest-waiting poll claims it."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():  # not one whose wait ended meanwhile
                turn.set_result(True)
                return

    def wake_all(self) -> None:
        """Every waiting poll answers now (the leaser stops)."""
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(True)

    def arm(self, in_s: float | None) -> None:
        """The next thing to claim is due `in_s` from now (None: nothing until a wake-up): wake
        a poll then. Replaces the previous time, which the caller's newer view supersedes."""
        if in_s is None:
            self._timer.cancel()
        else:
            self._timer.arm(in_s)

    async def wait(self, timeout_s: float) -> None:
        """Until this poll is handed the turn, or `timeout_s` (it claims once more either way).
        The turn is awaited itself, its timeout a loop timer: `asyncio.wait_for` would add a
        callback and two more turns of the event loop between the wake-up and the claim
        (Python 3.11), each running whatever else was ready first."""
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[bool] = loop.create_future()
        self._turns.append(turn)
        timeout = loop.call_later(timeout_s, _time_out, turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled() and turn.result():
                self.wake_one()  # handed the turn, then cancelled (its client left): pass it on
            raise
        finally:
            timeout.cancel()
            turn.cancel()  # a no-op when it was handed the turn or timed out
            with contextlib.suppress(ValueError):  # handed the turn: popped already
                self._turns.remove(turn)

    def close(self) -> None:
        self._timer.close()


def _time_out(turn: asyncio.Future[bool]) -> None:
    """A wait's timeout: it ends without the turn (False), unless it ended already."""
    if not turn.done():
        turn.set_result(False)
