"""Slot -> broker routing (pure): contiguous first routing, sticky growth, JSON round trip,
and the moves that balance a routing over more brokers (parametrized and property-based)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.coordination.routing import (
    Move,
    Routing,
    RoutingConflict,
    initial_routing,
    plan_moves,
    plan_routing,
)


def test_initial_routing_is_contiguous_and_balanced() -> None:
    routing = initial_routing(16, 3)
    assert routing.broker_of_slot == (0,) * 6 + (1,) * 5 + (2,) * 5
    assert routing.slots_per_broker() == {0: 6, 1: 5, 2: 5}
    assert initial_routing(1, 1).broker_of_slot == (0,)
    with pytest.raises(RoutingConflict):
        initial_routing(2, 4)


def test_routing_is_sticky_when_brokers_grow() -> None:
    current = initial_routing(8, 2)
    grown = plan_routing(8, 4, current)
    assert grown.broker_of_slot == current.broker_of_slot  # no slot moves without its messages
    assert grown.slots_per_broker() == {0: 4, 1: 4, 2: 0, 3: 0}


def test_routing_keeps_its_slot_amount_and_refuses_losing_brokers() -> None:
    """A larger spec amount waits for the split (the only writer of a new amount)."""
    current = initial_routing(8, 2)
    assert plan_routing(16, 2, current) == current
    with pytest.raises(RoutingConflict, match="still holds slots"):
        plan_routing(8, 1, current)


def test_routing_json_round_trip() -> None:
    routing = initial_routing(4, 2)
    assert Routing.from_json(routing.to_json()) == routing
    with pytest.raises(ValueError, match="format version"):
        Routing.from_json(b'{"version": 9}')


@pytest.mark.parametrize(
    ("slots", "brokers", "grown", "moved"),
    [
        (16, 1, 2, {8: 1, 9: 1, 10: 1, 11: 1, 12: 1, 13: 1, 14: 1, 15: 1}),
        (16, 2, 4, {4: 2, 5: 2, 6: 2, 7: 2, 12: 3, 13: 3, 14: 3, 15: 3}),
        (16, 3, 4, {4: 3, 5: 3, 10: 3, 15: 3}),
        (4, 4, 4, {}),
        (4, 1, 3, {2: 1, 3: 2}),
    ],
)
def test_plan_moves_the_fewest_slots_to_the_new_brokers(
    slots: int, brokers: int, grown: int, moved: dict[int, int]
) -> None:
    current = initial_routing(slots, brokers)
    moves = plan_moves(current, grown)
    assert {move.slot: move.target for move in moves} == moved
    assert all(move.source == current.broker_of_slot[move.slot] for move in moves)


def test_plan_moves_refuses_more_brokers_than_slots() -> None:
    with pytest.raises(RoutingConflict, match="cannot spread 4 slots over 8 brokers"):
        plan_moves(initial_routing(4, 1), 8)


def applied(routing: Routing, moves: list[Move], broker_count: int) -> Routing:
    brokers = list(routing.broker_of_slot)
    for move in moves:
        brokers[move.slot] = move.target
    return Routing(routing.slot_amount, max(broker_count, routing.broker_count), tuple(brokers))


@st.composite
def routings(draw: st.DrawFn) -> tuple[Routing, int]:
    """Any routing (balanced or not, every broker or a few used) and a broker count."""
    slot_amount = 2 ** draw(st.integers(0, 6))
    broker_count = draw(st.integers(1, min(slot_amount, 12)))
    slots = draw(
        st.lists(st.integers(0, broker_count - 1), min_size=slot_amount, max_size=slot_amount)
    )
    grown = draw(st.integers(1, slot_amount))
    return Routing(slot_amount, broker_count, tuple(slots)), grown


@given(routings())
def test_plan_moves_balances_with_the_fewest_moves_each_slot_once(
    case: tuple[Routing, int],
) -> None:
    current, broker_count = case
    moves = plan_moves(current, broker_count)
    assert len({move.slot for move in moves}) == len(moves)  # each slot at most once
    assert all(move.source != move.target < broker_count for move in moves)
    after = applied(current, moves, broker_count)
    counts = [len(after.slots_of(broker)) for broker in range(broker_count)]
    assert sum(counts) == current.slot_amount  # nothing left on a broker beyond the count
    assert max(counts) - min(counts) <= 1
    # the fewest: a balanced routing keeps at most floor or ceil slots on each broker, and
    # giving the ceils to the fullest brokers leaves the fewest above their share (plus every slot
    # of a broker beyond the count)
    held = sorted((len(current.slots_of(broker)) for broker in range(broker_count)), reverse=True)
    low, extra = divmod(current.slot_amount, broker_count)
    floor = sum(max(0, count - low - (rank < extra)) for rank, count in enumerate(held))
    beyond = sum(
        len(current.slots_of(broker)) for broker in range(broker_count, current.broker_count)
    )
    assert len(moves) == floor + beyond
    assert plan_moves(after, broker_count) == []


@given(routings(), st.data())
def test_plan_moves_interrupted_anywhere_continues_with_the_same_moves(
    case: tuple[Routing, int], data: st.DataObject
) -> None:
    """The operator plans again on every pass: what is left is never more, and no slot
    moves twice."""
    current, broker_count = case
    planned = plan_moves(current, broker_count)
    done = data.draw(st.integers(0, len(planned)))
    remaining = plan_moves(applied(current, planned[:done], broker_count), broker_count)
    assert len(remaining) == len(planned) - done
    assert not {move.slot for move in remaining} & {move.slot for move in planned[:done]}
