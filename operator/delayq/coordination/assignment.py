"""Which live member should own which slot: a pure function of members, routing and the past.

The elected coordinator calls `assign` whenever membership, routing or the assignment itself
changes; every process can recompute it, so the algorithm is deterministic (no randomness, no
dict-order dependence). Three goals, in this order of priority:

1. Balanced: member m gets a share of the slots proportional to its capacity (the floor of
   it, the remainders handed out one by one); with equal capacities sizes differ by at most one.
2. Broker-local: a slot whose broker (per the routing) has a live member goes to that member, up
   to its share — the pod next to the Redis that stores the slot serves it, saving a network hop
   and keeping a broker's outage contained to the slots it stores.
3. Sticky: every other slot stays with its current owner while that owner is alive and under
   its share, so a membership change moves as few slots as possible (each move is a handoff).

Which members receive the "+1" remainders is chosen to keep those goals too: members with more
local slots first, then members already holding more slots, then by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Assignment = dict[int, str]  # slot -> member id


@dataclass(frozen=True)
class Member:
    """A live delay-service process as registered under `members/`."""

    member_id: str
    broker: int | None = None  # index into the routing's brokers; None: not co-located
    capacity: int = 1  # relative weight of its share of the slots

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"member {self.member_id}: capacity must be at least 1")


def shares(
    slot_amount: int,
    members: Sequence[Member],
    local_counts: Mapping[str, int],
    held_counts: Mapping[str, int],
) -> dict[str, int]:
    """Slots per member (its share): the floor of its capacity's fraction, remainders by
    (local, held, id). Not the pending quota (`limits.maxPending`), which bounds messages."""
    total_capacity = sum(member.capacity for member in members)
    result = {m.member_id: slot_amount * m.capacity // total_capacity for m in members}
    left = slot_amount - sum(result.values())

    def priority(member: Member) -> tuple[int, int, int, int, str]:
        fraction = slot_amount * member.capacity % total_capacity
        wants_local = int(local_counts.get(member.member_id, 0) > result[member.member_id])
        return (
            -fraction,
            -wants_local,
            -held_counts.get(member.member_id, 0),
            -member.capacity,
            member.member_id,
        )

    for member in sorted(members, key=priority)[:left]:
        result[member.member_id] += 1
    return result


def assign(
    slot_amount: int,
    members: Sequence[Member],
    current: Mapping[int, str],
    routing: Sequence[int] | None = None,
) -> Assignment:
    """The new slot -> member map covering every slot (empty when there is no member).

    `current` may name members that are gone; `routing[slot]` is the slot's broker index.
    """
    if not members:
        return {}
    if routing is not None and len(routing) != slot_amount:
        routing = None  # a routing for another slot count is stale: ignore locality, not crash
    by_id = {member.member_id: member for member in sorted(members, key=lambda m: m.member_id)}
    local_slots = _local_slots(slot_amount, list(by_id.values()), current, routing)
    held_counts: dict[str, int] = {}
    for slot in range(slot_amount):
        owner = current.get(slot)
        if owner in by_id:
            held_counts[owner] = held_counts.get(owner, 0) + 1
    local_counts = {member_id: len(slots) for member_id, slots in local_slots.items()}
    share = shares(slot_amount, list(by_id.values()), local_counts, held_counts)

    result: Assignment = {}
    counts = dict.fromkeys(by_id, 0)

    def give(slot: int, member_id: str) -> None:
        result[slot] = member_id
        counts[member_id] += 1

    # 1. broker-local, current owner first so locality never causes a needless move
    for member_id, slots in local_slots.items():
        ordered = sorted(slots, key=lambda s: (current.get(s) != member_id, s))
        for slot in ordered:
            if counts[member_id] < share[member_id] and slot not in result:
                give(slot, member_id)
    # 2. sticky: keep the current owner while it is alive and under its share
    for slot in range(slot_amount):
        owner = current.get(slot)
        if slot not in result and owner in by_id and counts[owner] < share[owner]:
            give(slot, owner)
    # 3. the rest to whoever is furthest below its share
    for slot in range(slot_amount):
        if slot not in result:
            give(slot, min(by_id, key=lambda m: (counts[m] - share[m], m)))
    return result


def _local_slots(
    slot_amount: int,
    members: Sequence[Member],
    current: Mapping[int, str],
    routing: Sequence[int] | None,
) -> dict[str, list[int]]:
    """Slots of each member's broker; several members of one broker split them evenly,
    each keeping the ones it holds now."""
    if routing is None:
        return {}
    on_broker: dict[int, list[str]] = {}
    for member in members:
        if member.broker is not None:
            on_broker.setdefault(member.broker, []).append(member.member_id)
    local: dict[str, list[int]] = {}
    for broker, member_ids in on_broker.items():
        slots = [slot for slot in range(slot_amount) if routing[slot] == broker]
        share = -(-len(slots) // len(member_ids))
        split: dict[str, list[int]] = {member_id: [] for member_id in member_ids}
        rest = []
        for slot in slots:
            owner = current.get(slot)
            if owner in split and len(split[owner]) < share:
                split[owner].append(slot)
            else:
                rest.append(slot)
        for slot in rest:
            split[min(member_ids, key=lambda m: (len(split[m]), m))].append(slot)
        local.update(split)
    return local


def moved(before: Mapping[int, str], after: Mapping[int, str], alive: set[str]) -> set[int]:
    """Slots taken away from a member that is still alive (each one is a handoff)."""
    return {slot for slot, owner in before.items() if owner in alive and after.get(slot) != owner}
