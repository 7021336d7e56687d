"""Unplanned faults: what the fleet went through that the plan did not inject (pure).

On a loaded 2-core machine a serve process can lose its own ZooKeeper session with no fault
injected into it (starved of CPU, or a cascade of the overlapping faults): it logs
`<member>: ZooKeeper session SUSPENDED|LOST: stop claiming`, then `<member>: connected to
ZooKeeper` once it has a session again. And the supervisor restarts a process that exited on its
own. And a process may stop running for seconds with no fault injected (seen while the skewed
c1 and c2 ran under libfaketime): it claims messages and sends them 3 s later, while the others
send theirs at once (`stalls`, seen by the receiver). The takeover rules
(`unconsumed`, `waited_lease`) must not blame the fleet for those, so they become windows the
checker knows. The older rules keep judging the injected faults alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime

from .faults import Window
from .receiver import Arrival

SESSION_LOSS = "session_loss"
SERVE_EXIT = "serve_exit"
STALL = "serve_stall"
STALL_MS = 1000  # a claimed message held this long before its POST: its sender was not running
LOSS_MARK = "stop claiming"  # coordination/zookeeper.py's line on SUSPENDED and LOST
BACK_MARK = "connected to ZooKeeper"
POLL_MS = 200  # the supervisor's poll: an exit happened at most this long before it saw it


def session_losses(
    lines: Iterable[str], member: str, skew_ms: float, session_ms: int, end_ms: float
) -> list[Window]:
    """A process's own session losses from its JSON log: each from its loss line minus the
    session timeout (kazoo reports a silent connection only after 2/3 of it, and a starved
    process later still) until its next `connected` line, or `end_ms`. The log's times are on
    the process's skewed wall clock: `skew_ms` brings them back to the real one."""
    windows: list[Window] = []
    lost_ms: float | None = None
    for line in lines:
        record = _record(line)
        if record is None:
            continue
        at_ms, message = record
        at_ms -= skew_ms
        if LOSS_MARK in message and lost_ms is None:
            lost_ms = at_ms
        elif message.endswith(BACK_MARK) and lost_ms is not None:
            windows.append(Window(SESSION_LOSS, member, lost_ms - session_ms, at_ms))
            lost_ms = None
    if lost_ms is not None:
        windows.append(Window(SESSION_LOSS, member, lost_ms - session_ms, max(end_ms, lost_ms)))
    return windows


def exits(member: str, exits_ms: Iterable[float], restart_after_ms: float) -> list[Window]:
    """Exits the supervisor saw (a process giving up on an outage), until its restart."""
    return [
        Window(SERVE_EXIT, member, at_ms - POLL_MS, at_ms + restart_after_ms + POLL_MS)
        for at_ms in exits_ms
    ]


def stalls(arrivals: Iterable[Arrival], ack_timeout_ms: int) -> list[Window]:
    """Per sender, from each claim to the POST of a message it held over STALL_MS in between
    (the claim is at most its lease deadline - lease: a heartbeat only moves that later, so the
    hold is a lower bound), overlapping spans merged."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for arrival in arrivals:
        if arrival.lease_deadline_ms is None:
            continue
        claimed_ms = arrival.lease_deadline_ms - ack_timeout_ms
        if arrival.at_ms - claimed_ms > STALL_MS:
            spans.setdefault(arrival.member, []).append((claimed_ms, arrival.at_ms))
    windows: list[Window] = []
    for member, found in sorted(spans.items()):
        found.sort()
        start, end = found[0]
        for next_start, next_end in found[1:]:
            if next_start > end:
                windows.append(Window(STALL, member, start, end))
                start = next_start
            end = max(end, next_end)
        windows.append(Window(STALL, member, start, end))
    return windows


def _record(line: str) -> tuple[float, str] | None:
    """(wall ms, message) of one JSON log line; None for anything else (a traceback's lines)."""
    try:
        record = json.loads(line)
        stamp = datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        return stamp.timestamp() * 1000, str(record["msg"])
    except (ValueError, KeyError, TypeError):
        return None
