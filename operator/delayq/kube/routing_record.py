"""`status.routing`: the operator's copy of a topic's published routing, pure.

The routing node in ZooKeeper is the only record of which broker holds each slot's messages
once a slot moved or the slots doubled (docs/contracts.md §2). A ZooKeeper that lost its data
(an ensemble rebuilt on empty disks, a connect string naming a fresh ensemble) would make the
operator publish the first routing again, routing slots to brokers that do not hold them and
pods to a key generation that holds nothing. So every pass that publishes or reads the routing
keeps a copy in the DelayTopic's status, and a missing node is published again from it
(handlers/restore.py; docs/operator.md, "When ZooKeeper loses its data").

The copy keeps the node's field names (`slotAmount`, `brokers`, `generation`, `slots`) but
writes `slots`, the slot -> broker array, as runs: `first-last:broker` (`slot:broker` for a
run of one) joined by commas, in slot order. A topic's slots sit in contiguous ranges (the
first routing, the moves that balance it, a doubling putting s + N beside s), so the copy
stays a few runs long (`0-7:0,8-15:1`) where the array would be one line per slot in
`kubectl get -o yaml`.

While a doubling switches its old slots one by one, the copy keeps the routing's
`doubledSlots` too, as slot runs (`0-3,8-11`; absent when none): a routing restored from a copy
without them would send the switched slots' writers back to the frozen old slots, and the
doubling's rerun would catch them up again over what was written into their halves since.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import groupby
from typing import Any

from delayq.coordination.routing import Routing
from delayq.queue.settings import MAX_SLOT_AMOUNT

RECORD_FIELD = "routing"  # the status field
_RUN = re.compile(r"^(\d+)(?:-(\d+))?:(\d+)$")
_SLOTS = re.compile(r"^(\d+)(?:-(\d+))?$")


class RoutingRecordInvalid(ValueError):
    """`status.routing` cannot be read back into a routing (edited by hand, or truncated)."""


def routing_record(routing: Routing) -> dict[str, Any]:
    """The status copy of `routing`."""
    runs = []
    slot = 0
    for broker, group in groupby(routing.broker_of_slot):
        last = slot + len(list(group)) - 1
        runs.append(f"{slot}:{broker}" if last == slot else f"{slot}-{last}:{broker}")
        slot = last + 1
    record: dict[str, Any] = {
        "generation": routing.generation,
        "slotAmount": routing.slot_amount,
        "brokers": routing.broker_count,
        "slots": ",".join(runs),
    }
    # None deletes it: the status is written by merge patch, which keeps a field it is not
    # given (a doubling's list would outlive it, read as slots of the next one)
    switched = sorted(routing.doubled_slots)
    record["doubledSlots"] = _slot_runs(switched) if switched else None
    return record


def _slot_runs(slots: list[int]) -> str:
    """Ascending `slots` as runs of consecutive numbers: `first-last` (`slot` alone)."""
    runs = []
    for _, group in groupby(enumerate(slots), key=lambda pair: pair[1] - pair[0]):
        run = [slot for _, slot in group]
        runs.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(runs)


def _read_slot_runs(text: str) -> frozenset[int]:
    """The slots of `_slot_runs`' text, each run ascending and after the previous one."""
    slots: list[int] = []
    for run in text.split(","):
        match = _SLOTS.match(run)
        if match is None:
            raise ValueError(f"doubledSlots run {run!r} is not first-last")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        _within_slots(run, last)
        if last < first or (slots and first <= slots[-1]):
            raise ValueError(f"doubledSlots run {run!r} is not after the previous one, ascending")
        slots += range(first, last + 1)
    return frozenset(slots)


def _within_slots(run: str, last: int) -> None:
    """Refuse a run past the most slots a topic has before it is expanded: the status is
    anyone's who may patch it, and `0-4000000000:0` was a 32 GB list in the operator."""
    if last >= MAX_SLOT_AMOUNT:
        raise ValueError(f"run {run!r} goes past slot {MAX_SLOT_AMOUNT - 1}")


def recorded_routing(status: Mapping[str, Any]) -> Routing | None:
    """The routing `status` keeps a copy of; None when it keeps none (a topic not yet
    provisioned, or last written by an operator before this copy existed). Raises
    RoutingRecordInvalid when the copy is not an exact slot -> broker array."""
    record = status.get(RECORD_FIELD)
    if record is None:
        return None
    try:
        switched = record.get("doubledSlots")
        brokers: list[int] = []
        for run in str(record["slots"]).split(","):
            match = _RUN.match(run)
            if match is None:
                raise ValueError(f"run {run!r} is not first-last:broker")
            first, last, broker = match.group(1), match.group(2) or match.group(1), match.group(3)
            if int(first) != len(brokers) or int(last) < int(first):
                raise ValueError(f"run {run!r} does not start at slot {len(brokers)}")
            _within_slots(run, int(last))
            brokers += [int(broker)] * (int(last) - int(first) + 1)
        return Routing(
            int(record["slotAmount"]),
            int(record["brokers"]),
            tuple(brokers),
            int(record["generation"]),
            frozenset() if switched is None else _read_slot_runs(str(switched)),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # not even a mapping
        raise RoutingRecordInvalid(f"status.{RECORD_FIELD} is unreadable: {error}") from None
