"""`status.routing` (kube/routing_record.py): the copy reads back into exactly the routing it
was made of, is short for the shapes routings take, fits the CRD's schema, and a copy that is
not an exact slot -> broker array is refused rather than guessed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from delayq.coordination.routing import Move, Routing, initial_routing, plan_moves
from delayq.kube.routing_record import RoutingRecordInvalid, recorded_routing, routing_record
from tests.kube.test_crd_schema import root_schema


def after(routing: Routing, moves: list[Move]) -> Routing:
    slots = list(routing.broker_of_slot)
    for move in moves:
        slots[move.slot] = move.target
    return Routing(routing.slot_amount, routing.broker_count, tuple(slots), routing.generation)


def doubled(routing: Routing) -> Routing:
    slots = routing.broker_of_slot * 2  # s and s + N on the broker of s (splitting.py)
    return Routing(2 * routing.slot_amount, routing.broker_count, slots, routing.generation + 1)


ONE_TO_TWO = after(Routing(16, 2, (0,) * 16), plan_moves(Routing(16, 2, (0,) * 16), 2))
ROUTINGS = {
    "first": initial_routing(16, 3),
    "moved": after(initial_routing(16, 2), [Move(3, 0, 1), Move(12, 1, 0)]),
    "grown": ONE_TO_TWO,
    "doubled": doubled(ONE_TO_TWO),
    "doubled twice, grown to 3": after(
        replace(doubled(doubled(ONE_TO_TWO)), broker_count=3),
        plan_moves(doubled(doubled(ONE_TO_TWO)), 3),
    ),
    "one slot": Routing(1, 1, (0,)),
    "alternating": Routing(8, 2, (0, 1) * 4, 5),
    # a doubling's freeze under way: batches of old slots switched to their halves
    "doubling": replace(ONE_TO_TWO, doubled_slots=frozenset({0, 1, 2, 3, 8, 9, 10, 11, 15})),
    "doubling, one slot switched": replace(initial_routing(4, 1), doubled_slots=frozenset({2})),
}


@pytest.mark.parametrize("routing", ROUTINGS.values(), ids=list(ROUTINGS))
def test_the_copy_reads_back_into_the_same_routing(routing: Routing) -> None:
    record = routing_record(routing)
    assert recorded_routing({"routing": record}) == routing
    stored = {name: value for name, value in record.items() if value is not None}  # merged
    assert recorded_routing({"routing": stored}) == routing
    status_schema = root_schema()["properties"]["status"]["properties"]["routing"]
    jsonschema.validate(stored, status_schema)


def test_the_copy_is_a_few_runs_long() -> None:
    assert routing_record(ONE_TO_TWO) == {
        "generation": 0,
        "slotAmount": 16,
        "brokers": 2,
        "slots": "0-7:0,8-15:1",
        "doubledSlots": None,  # the merge patch deletes a list left by a doubling
    }
    assert routing_record(doubled(ONE_TO_TWO))["slots"] == "0-7:0,8-15:1,16-23:0,24-31:1"
    assert routing_record(ROUTINGS["moved"])["slots"] == "0-2:0,3:1,4-7:0,8-11:1,12:0,13-15:1"


def test_a_doubling_under_way_keeps_its_switched_slots_as_runs() -> None:
    """Restored without them, the switched slots' writers would go back to the frozen old
    slots, and the doubling's rerun would catch them up over their halves' writes."""
    assert routing_record(ROUTINGS["doubling"])["doubledSlots"] == "0-3,8-11,15"


def test_no_copy_is_none() -> None:
    assert recorded_routing({}) is None
    assert recorded_routing({"appliedSlotAmount": 8}) is None


ONE_RUN = {"generation": 0, "slotAmount": 2, "brokers": 1, "slots": "0-1:0"}
BAD: dict[str, dict[str, Any]] = {
    "a gap": {"generation": 0, "slotAmount": 4, "brokers": 2, "slots": "0:0,2-3:1"},
    "an overlap": {"generation": 0, "slotAmount": 4, "brokers": 2, "slots": "0-2:0,2-3:1"},
    "short": {"generation": 0, "slotAmount": 4, "brokers": 2, "slots": "0-2:0"},
    "backwards": {"generation": 0, "slotAmount": 4, "brokers": 2, "slots": "0:0,3-1:1"},
    "unknown broker": {"generation": 0, "slotAmount": 2, "brokers": 2, "slots": "0:0,1:2"},
    "not runs": {"generation": 0, "slotAmount": 2, "brokers": 2, "slots": "[0, 1]"},
    "no generation": {"slotAmount": 2, "brokers": 1, "slots": "0-1:0"},
    "not an object": "0-1:0",  # type: ignore[dict-item]
    "a doubled slot outside": {**ONE_RUN, "doubledSlots": "2"},
    "doubled slots backwards": {**ONE_RUN, "doubledSlots": "1-0"},
    "doubled slots twice": {**ONE_RUN, "doubledSlots": "0-1,1"},
    "doubled slots not runs": {**ONE_RUN, "doubledSlots": "[0]"},
    # expanded before any check of the amount: each was a list of 10^11 slots in the operator
    "a run past every slot": {**ONE_RUN, "slots": "0-99999999999:0"},
    "doubled slots past every slot": {**ONE_RUN, "doubledSlots": "0-99999999999"},
}


@pytest.mark.parametrize("record", BAD.values(), ids=list(BAD))
def test_a_copy_that_is_not_an_exact_array_is_refused(record: dict[str, Any]) -> None:
    with pytest.raises(RoutingRecordInvalid, match=r"status\.routing is unreadable"):
        recorded_routing({"routing": record})
