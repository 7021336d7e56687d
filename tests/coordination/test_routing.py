"""Slot -> broker routing (pure): contiguous first routing, sticky growth, JSON round trip."""

from __future__ import annotations

import pytest

from delayq.coordination.routing import Routing, RoutingConflict, initial_routing, plan_routing


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


def test_routing_refuses_resharding_and_losing_brokers() -> None:
    current = initial_routing(8, 2)
    with pytest.raises(RoutingConflict, match="needs resharding"):
        plan_routing(16, 2, current)
    with pytest.raises(RoutingConflict, match="still holds slots"):
        plan_routing(8, 1, current)


def test_routing_json_round_trip() -> None:
    routing = initial_routing(4, 2)
    assert Routing.from_json(routing.to_json()) == routing
    with pytest.raises(ValueError, match="format version"):
        Routing.from_json(b'{"version": 9}')
