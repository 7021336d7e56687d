"""The ZooKeeper paths and node documents (pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.coordination.assignment import Member
from delayq.coordination.layout import (
    ROOT,
    AssignmentDocument,
    TopicPaths,
    broker_index,
    decode_member,
    decode_routing,
    encode_member,
    member_library,
    namespace_root,
    slots_of,
)
from delayq.coordination.routing import Routing, initial_routing


def test_paths_follow_the_design() -> None:
    paths = TopicPaths("shop", "orders")
    assert paths.member("pod-1") == "/delayq/shop/orders/members/pod-1"
    assert paths.assignment == "/delayq/shop/orders/assignment"
    assert paths.owner(7) == "/delayq/shop/orders/owners/7"
    assert paths.routing == "/delayq/shop/orders/routing"
    assert paths.root == f"{namespace_root('shop')}/orders" == f"{ROOT}/shop/orders"


@pytest.mark.parametrize(
    ("name", "index"),
    [("broker-2", 2), ("orders-redis-12", 12), ("3", 3), ("", None), ("primary", None)],
)
def test_broker_index_is_the_trailing_number(name: str, index: int | None) -> None:
    assert broker_index(name) == index


def test_member_round_trip_and_foreign_nodes() -> None:
    session = 0x1234
    payload = encode_member("broker-1", 3, "pod", "delayq_1")
    assert decode_member("m", payload, session) == Member("m", 1, 3)
    assert decode_member("m", b'{"capacity": 0}', session) == Member("m", None, 1)
    assert decode_member("m", b'{"capacity": "x"}', session) == Member("m")
    # JSON as Python reads it: Infinity is a float int() cannot take (OverflowError crashed
    # every pod's read of the membership and the operator's health pass of the topic)
    for capacity in (b"Infinity", b"-Infinity", b"NaN", b"1e400"):
        assert decode_member("m", b'{"capacity": %s}' % capacity, session) == Member("m")
    # no live member wrote these: never counted (a member always writes a JSON object)
    assert decode_member("m", payload, 0) is None  # persistent
    assert decode_member("m", b"", session) is None
    assert decode_member("m", b"not json", session) is None
    assert decode_member("m", b"[1, 2]", session) is None


def test_a_member_names_the_library_it_calls() -> None:
    assert member_library(encode_member("broker-1", 3, "pod", "delayq_ab12")) == "delayq_ab12"
    # a member of an older version names none: its library is unknown, not "no library"
    for payload in (b'{"broker": "broker-0", "capacity": 1}', b'{"library": 7}', b"x", b"[]"):
        assert member_library(payload) == ""
    # nor one whose name is no library's: the operator logs the names members call
    forged = ["delayq_ab12\nINFO deleted library", "x" * 1_000_000, "delayq_", "delayq_AB12"]
    for name in forged:
        assert member_library(encode_member("broker-1", 1, "pod", name)) == ""


@given(
    st.integers(1, 64).flatmap(
        lambda amount: st.tuples(
            st.just(amount),
            st.dictionaries(
                st.integers(0, amount - 1), st.sampled_from(["a", "b", "c-1"]), max_size=amount
            ),
        )
    ),
    st.frozensets(st.sampled_from(["a", "idle"])),
)
def test_assignment_document_round_trip(
    case: tuple[int, dict[int, str]], extra_members: frozenset[str]
) -> None:
    amount, slots = case
    members = frozenset(slots.values()) | extra_members
    document = AssignmentDocument(4, slots, members)
    assert AssignmentDocument.decode(document.encode(amount)) == document


def test_assignment_document_is_compact_and_tolerates_foreign_content() -> None:
    document = AssignmentDocument(1, dict.fromkeys(range(16384), "pod-with-a-long-name-0"))
    assert len(document.encode(16384)) < 40_000
    assert AssignmentDocument.decode(b"") == AssignmentDocument(0, {})
    assert AssignmentDocument.decode(b"{") == AssignmentDocument(0, {})
    assert AssignmentDocument.decode(json.dumps({"version": 99}).encode()).slots == {}
    damaged = {"version": 1, "generation": 2, "members": ["a"], "slots": None}
    assert AssignmentDocument.decode(json.dumps(damaged).encode()) == AssignmentDocument(0, {})


def test_routing_for_another_slot_count_is_ignored_unless_of_a_newer_generation() -> None:
    payload = initial_routing(16, 2).to_json()
    assert decode_routing(payload, 16) == initial_routing(16, 2)
    assert decode_routing(payload, 32) is None
    assert decode_routing(payload, 16, generation=1) is None  # older than the reader's
    assert decode_routing(b"garbage", 16) is None
    # the topic's own login writes these nodes too: Infinity (as Python's JSON reads it) is damage,
    # not an OverflowError out of every pod's view and the operator's pass
    for field in ('"generation": Infinity', '"doubledSlots": [1e400]'):
        damaged = payload.replace(b'"version"', b"%s, \"version\"" % field.encode())
        assert decode_routing(damaged, 16) is None, damaged
    damaged = b'{"version": 1, "generation": -Infinity, "members": ["a"], "slots": [0]}'
    assert AssignmentDocument.decode(damaged) == AssignmentDocument(0, {})
    assert decode_routing(b"[1]", 16) is None
    doubled = Routing(32, 2, (0,) * 8 + (1,) * 8 + (0,) * 8 + (1,) * 8, generation=1)
    assert decode_routing(doubled.to_json(), 16) == doubled  # the slots doubled: follow
    assert decode_routing(doubled.to_json(), 32, generation=1) == doubled
    assert decode_routing(doubled.to_json(), 64, generation=1) is None


def test_the_routing_generation_is_written_only_once_set() -> None:
    assert "generation" not in json.loads(initial_routing(4, 1).to_json())
    doubled = Routing(8, 1, (0,) * 8, generation=1)
    assert json.loads(doubled.to_json())["generation"] == 1
    assert json.loads(doubled.to_json())["version"] == 1
    assert Routing.from_json(doubled.to_json()) == doubled


def test_slots_of() -> None:
    assert slots_of({0: "a", 1: "b", 2: "a"}, "a") == frozenset({0, 2})
