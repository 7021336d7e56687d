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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import groupby
from typing import Any

from delayq.coordination.routing import Routing

RECORD_FIELD = "routing"  # the status field
_RUN = re.compile(r"^(\d+)(?:-(\d+))?:(\d+)$")


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
    return {
        "generation": routing.generation,
        "slotAmount": routing.slot_amount,
        "brokers": routing.broker_count,
        "slots": ",".join(runs),
    }


def recorded_routing(status: Mapping[str, Any]) -> Routing | None:
    """The routing `status` keeps a copy of; None when it keeps none (a topic not yet
    provisioned, or last written by an operator before this copy existed). Raises
    RoutingRecordInvalid when the copy is not an exact slot -> broker array."""
    record = status.get(RECORD_FIELD)
    if record is None:
        return None
    try:
        brokers: list[int] = []
        for run in str(record["slots"]).split(","):
            match = _RUN.match(run)
            if match is None:
                raise ValueError(f"run {run!r} is not first-last:broker")
            first, last, broker = match.group(1), match.group(2) or match.group(1), match.group(3)
            if int(first) != len(brokers) or int(last) < int(first):
                raise ValueError(f"run {run!r} does not start at slot {len(brokers)}")
            brokers += [int(broker)] * (int(last) - int(first) + 1)
        return Routing(
            int(record["slotAmount"]),
            int(record["brokers"]),
            tuple(brokers),
            int(record["generation"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise RoutingRecordInvalid(f"status.{RECORD_FIELD} is unreadable: {error}") from None
