"""The pure assignment: balanced, broker-local first, sticky — examples and properties."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from delayq.coordination.assignment import Member, assign, moved, shares

SLOT_AMOUNTS = st.sampled_from([1, 2, 4, 8, 16, 64, 256])
IDS = st.lists(
    st.from_regex(r"[a-z]{1,6}-[0-9]", fullmatch=True), min_size=1, max_size=9, unique=True
)


def sizes(assignment: dict[int, str]) -> Counter[str]:
    return Counter(assignment.values())


def spread(amount: int, members: list[Member]) -> Counter[str]:
    counts = sizes(assign(amount, members, {}))
    return Counter({m.member_id: counts.get(m.member_id, 0) for m in members})


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[Member], dict[int, str]]:
    """Slot count, live members, and an arbitrary current assignment (dead owners included)."""
    amount = draw(SLOT_AMOUNTS)
    ids = draw(IDS)
    members = [Member(member_id) for member_id in ids]
    owners = st.one_of(st.sampled_from(ids), st.sampled_from(["gone-1", "gone-2"]))
    current = draw(st.dictionaries(st.integers(0, amount - 1), owners))
    return amount, members, current


def lower_bound_moves(amount: int, member_ids: list[str], current: dict[int, str]) -> int:
    """Fewest live-owner moves any balanced assignment needs (computed independently)."""
    held = sorted(
        (Counter(o for o in current.values() if o in member_ids).get(m, 0) for m in member_ids),
        reverse=True,
    )
    floor, extra = divmod(amount, len(member_ids))
    allowed = [floor + 1] * extra + [floor] * (len(member_ids) - extra)
    return sum(max(0, h - a) for h, a in zip(held, allowed, strict=True))


def test_no_member_no_assignment() -> None:
    assert assign(16, [], {0: "a"}) == {}


def test_three_equal_members_get_six_five_five() -> None:
    result = assign(16, [Member("a"), Member("b"), Member("c")], {})
    assert sorted(sizes(result).values()) == [5, 5, 6]
    assert set(result) == set(range(16))


def test_broker_local_first_and_back_home_after_rejoin() -> None:
    routing = [slot * 3 // 16 for slot in range(16)]  # brokers 0..2 hold contiguous ranges
    fleet = [Member("a", broker=0), Member("b", broker=1), Member("c", broker=2)]
    first = assign(16, fleet, {}, routing)
    assert all(routing[slot] == ("abc".index(owner)) for slot, owner in first.items())
    # b dies: its five slots spread over a and c, nobody else moves
    survivors = [fleet[0], fleet[2]]
    second = assign(16, survivors, first, routing)
    assert moved(first, second, {"a", "c"}) == set()
    assert sorted(sizes(second).values()) == [8, 8]
    # b's replacement (new id, same broker) gets exactly broker 1's slots back
    third = assign(16, [*survivors, Member("b2", broker=1)], second, routing)
    assert {slot for slot, owner in third.items() if owner == "b2"} == set(range(6, 11))
    assert third == {s: {"a": "a", "b": "b2", "c": "c"}[o] for s, o in first.items()}


def test_capacity_weights_the_share() -> None:
    counts = spread(16, [Member("big", capacity=3), Member("small", capacity=1)])
    assert counts == Counter({"big": 12, "small": 4})


def test_share_remainders_prefer_members_with_local_slots() -> None:
    members = [Member("a"), Member("b")]
    assert shares(3, members, {"b": 2}, {}) == {"a": 1, "b": 2}
    assert shares(3, members, {}, {"b": 2}) == {"a": 1, "b": 2}
    assert shares(3, members, {}, {}) == {"a": 2, "b": 1}


def test_members_sharing_a_broker_split_its_slots() -> None:
    routing = [0] * 8 + [1] * 8
    result = assign(
        16, [Member("x", broker=0), Member("y", broker=0), Member("z", broker=1)], {}, routing
    )
    assert {result[s] for s in range(8)} == {"x", "y"}  # broker 0's slots stay on broker 0
    assert {routing[s] for s, o in result.items() if o == "z"} == {1}
    assert sizes(result) == Counter({"z": 6, "x": 5, "y": 5})


def test_stale_routing_is_ignored() -> None:
    result = assign(4, [Member("a", broker=0), Member("b", broker=1)], {}, [1, 1])
    assert sorted(sizes(result).values()) == [2, 2]


@settings(max_examples=120, deadline=None)
@given(scenarios())
def test_covers_every_slot_with_live_members_balanced(
    scenario: tuple[int, list[Member], dict[int, str]],
) -> None:
    amount, members, current = scenario
    result = assign(amount, members, current)
    assert set(result) == set(range(amount))
    ids = {m.member_id for m in members}
    assert set(result.values()) <= ids
    counts = [sizes(result).get(member_id, 0) for member_id in ids]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=120, deadline=None)
@given(scenarios())
def test_moves_no_more_slots_than_any_balanced_assignment_must(
    scenario: tuple[int, list[Member], dict[int, str]],
) -> None:
    amount, members, current = scenario
    ids = [m.member_id for m in members]
    result = assign(amount, members, current)
    assert len(moved(current, result, set(ids))) == lower_bound_moves(amount, ids, current)


@settings(max_examples=100, deadline=None)
@given(SLOT_AMOUNTS, IDS, st.data())
def test_join_or_leave_moves_at_most_one_share(
    amount: int, ids: list[str], data: st.DataObject
) -> None:
    before_members = [Member(member_id) for member_id in ids]
    before = assign(amount, before_members, {})
    if data.draw(st.booleans()) and len(ids) > 1:
        gone = data.draw(st.sampled_from(ids))
        after_members = [m for m in before_members if m.member_id != gone]
        after = assign(amount, after_members, before)
        assert moved(before, after, set(ids) - {gone}) == set()
    else:
        after_members = [*before_members, Member("new-0")]
        after = assign(amount, after_members, before)
        assert len(moved(before, after, set(ids))) <= -(-amount // len(after_members))


@st.composite
def routed(draw: st.DrawFn) -> tuple[int, list[Member], list[int], dict[int, str]]:
    """One member per broker for some brokers, plus a few brokerless members."""
    amount = draw(SLOT_AMOUNTS)
    brokers = draw(st.integers(1, 5))
    routing = [slot * brokers // amount for slot in range(amount)]
    local = draw(st.sets(st.integers(0, brokers - 1)))
    members = [Member(f"b{b}", broker=b) for b in sorted(local)]
    members += [Member(f"free-{i}") for i in range(draw(st.integers(0 if local else 1, 3)))]
    ids = [m.member_id for m in members]
    current = draw(st.dictionaries(st.integers(0, amount - 1), st.sampled_from([*ids, "gone"])))
    return amount, members, routing, current


@settings(max_examples=120, deadline=None)
@given(routed())
def test_broker_local_whenever_the_share_allows(
    scenario: tuple[int, list[Member], list[int], dict[int, str]],
) -> None:
    amount, members, routing, current = scenario
    result = assign(amount, members, current, routing)
    counts = sizes(result)
    assert (
        max(counts.get(m.member_id, 0) for m in members)
        - min(counts.get(m.member_id, 0) for m in members)
        <= 1
    )
    floor = amount // len(members)
    for member in members:
        if member.broker is None:
            continue
        local = [s for s in range(amount) if routing[s] == member.broker]
        held_local = [s for s in local if result[s] == member.member_id]
        assert len(held_local) >= min(len(local), floor)


@settings(max_examples=120, deadline=None)
@given(routed())
def test_assignment_is_a_fixed_point_and_order_independent(
    scenario: tuple[int, list[Member], list[int], dict[int, str]],
) -> None:
    amount, members, routing, current = scenario
    result = assign(amount, members, current, routing)
    assert assign(amount, members, result, routing) == result
    assert assign(amount, list(reversed(members)), current, routing) == result


@settings(max_examples=100, deadline=None)
@given(SLOT_AMOUNTS, st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_capacity_shares_are_within_one_slot(amount: int, capacities: list[int]) -> None:
    members = [Member(f"m{i}", capacity=c) for i, c in enumerate(capacities)]
    counts = spread(amount, members)
    total = sum(capacities)
    for member in members:
        assert abs(counts[member.member_id] - amount * member.capacity / total) < 1
