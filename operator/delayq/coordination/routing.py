"""Slot -> broker routing (docs/contracts.md §2 `routing`): pure and sticky.

A slot's messages live on the Redis of the broker it is routed to, so routing a slot elsewhere
without moving its data would hide those messages. Hence: publishing the routing never changes
an existing slot's entry; new brokers take slots only by moves (`migration.py` copies a slot's
data, then switches its routing; `plan_moves` says which, and the operator runs them when
brokers grow); the first routing spreads slots in contiguous, near-equal ranges (broker b
serves a slot range, which keeps the ZooKeeper node small and humans able to read it).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

ROUTING_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Routing:
    """`broker_of_slot[slot]` is the index of the broker that stores slot `slot`; `generation`
    the slots' key generation (`Topic.slot_generation`), bumped by every doubling of the slot
    amount (`splitting.py`). `doubled_slots`: while a doubling is switched slot by slot, the
    slots already split: slot s's messages are then in slots s and s + N of twice the slot
    amount at generation + 1, on the broker of s (`routed_queue.py` writes there)."""

    slot_amount: int
    broker_count: int
    broker_of_slot: tuple[int, ...]
    generation: int = 0
    doubled_slots: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if len(self.broker_of_slot) != self.slot_amount:
            raise ValueError(
                f"routing has {len(self.broker_of_slot)} entries for {self.slot_amount} slots"
            )
        if any(not 0 <= broker < self.broker_count for broker in self.broker_of_slot):
            raise ValueError(f"routing names a broker outside 0..{self.broker_count - 1}")
        if any(not 0 <= slot < self.slot_amount for slot in self.doubled_slots):
            raise ValueError(f"routing doubles a slot outside 0..{self.slot_amount - 1}")

    def slots_per_broker(self) -> dict[int, int]:
        counts = Counter(self.broker_of_slot)
        return {broker: counts.get(broker, 0) for broker in range(self.broker_count)}

    def slots_of(self, broker: int) -> list[int]:
        return [slot for slot, owner in enumerate(self.broker_of_slot) if owner == broker]

    def to_json(self) -> bytes:
        """The ZooKeeper payload: version, counts, and the slot -> broker array; `generation`
        only once a doubling set it (format version 1 still: a reader that does not know it
        ignores a routing of another slot amount, which a generation always comes with)."""
        document: dict[str, object] = {
            "version": ROUTING_FORMAT_VERSION,
            "slotAmount": self.slot_amount,
            "brokers": self.broker_count,
            "slots": list(self.broker_of_slot),
        }
        if self.generation:
            document["generation"] = self.generation
        if self.doubled_slots:  # a reader that does not know it is refused by their freeze
            document["doubledSlots"] = sorted(self.doubled_slots)
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, payload: bytes) -> Routing:
        """Raises ValueError (KeyError, TypeError, AttributeError) for a document that is not a
        routing: the node is writable by the topic's own login, whose holder may write anything
        (Infinity, which Python's JSON reads and int() cannot take, is a ValueError too)."""
        document = json.loads(payload)
        if document.get("version") != ROUTING_FORMAT_VERSION:
            raise ValueError(f"unknown routing format version {document.get('version')!r}")
        try:
            generation = int(document.get("generation", 0))
            doubled = frozenset(int(slot) for slot in document.get("doubledSlots", ()))
        except OverflowError as error:
            raise ValueError(f"routing holds a number past any slot: {error}") from None
        slots = tuple(document["slots"])
        return cls(document["slotAmount"], document["brokers"], slots, generation, doubled)


def halves(slot: int, slot_amount: int) -> list[int]:
    """The slots a doubling of `slot_amount` slots splits old slot `slot` into: s and s + N of
    twice the amount, at the next key generation, on the broker of s (`splitting.py`). Where a
    reader of a whole slot finds its messages once the doubling listed it in `doubled_slots`."""
    return [slot, slot + slot_amount]


class RoutingConflict(ValueError):
    """The desired topology cannot keep every existing slot where its messages are."""


def initial_routing(slot_amount: int, broker_count: int) -> Routing:
    """Contiguous ranges: slot s -> floor(s * brokers / slots); sizes differ by at most one."""
    if broker_count < 1 or slot_amount < broker_count:
        raise RoutingConflict(f"cannot spread {slot_amount} slots over {broker_count} brokers")
    brokers = tuple(slot * broker_count // slot_amount for slot in range(slot_amount))
    return Routing(slot_amount, broker_count, brokers)


def plan_routing(slot_amount: int, broker_count: int, current: Routing | None) -> Routing:
    """The routing to publish: the current one extended to more brokers, never moved.

    `slot_amount` only shapes a first routing: once one exists, its slot amount is the one the
    topic serves, and only a split changes it (`spec.slotAmount` growth is the operator's
    resharding, which doubles the slots, then balances them). Raises RoutingConflict when
    brokers that still hold slots would disappear.
    """
    if current is None:
        return initial_routing(slot_amount, broker_count)
    used = {broker for broker in current.broker_of_slot}
    if max(used) >= broker_count:
        raise RoutingConflict(
            f"broker {max(used)} still holds slots; brokers cannot shrink to {broker_count}"
        )
    return replace(current, broker_count=broker_count)


def by_broker(routing: Sequence[int], slots: Iterable[int]) -> dict[int, list[int]]:
    """broker index -> the positions (in `slots`' order) of the slots it stores: how a batch is
    split into one call per broker, its answers put back in order by position."""
    grouped: dict[int, list[int]] = defaultdict(list)
    for position, slot in enumerate(slots):
        grouped[routing[slot]].append(position)
    return grouped


@dataclass(frozen=True)
class Move:
    """One planned slot move: `slot` goes from broker `source` to broker `target`."""

    slot: int
    source: int
    target: int


def plan_moves(current: Routing, broker_count: int) -> list[Move]:
    """The fewest slot moves that balance `current` over brokers 0..broker_count-1.

    Balanced: every broker ends with floor or ceil of slots / brokers (so counts differ by at
    most one). Minimal: the brokers holding the most slots keep the ceil shares, so the moves
    are exactly the slots above each broker's share, and each slot moves at most once; a broker
    at or under its share keeps every slot it has. A broker at or beyond `broker_count` has a
    share of 0 (all of its slots move). Surplus slots leave from the end of their broker's list
    and fill the brokers under their share in index order, so ranges stay contiguous where they were
    (1 -> 2 brokers of 16 slots moves 8-15 to broker 1, where the first routing puts them).
    Moving a slot copies its messages (`migration.py`), which is why the plan never moves one
    that balance does not need. The operator plans again on every pass from the routing: a plan
    interrupted after any move is continued (the rest of the same moves), not redone.
    """
    if broker_count < 1 or current.slot_amount < broker_count:
        raise RoutingConflict(
            f"cannot spread {current.slot_amount} slots over {broker_count} brokers"
        )
    counts = Counter(current.broker_of_slot)
    low, extra = divmod(current.slot_amount, broker_count)
    # the `extra` ceil shares go to the fullest brokers: they have the fewest slots to shed
    fullest = sorted(range(broker_count), key=lambda broker: (-counts[broker], broker))
    share = {broker: low + (rank < extra) for rank, broker in enumerate(fullest)}
    surplus: list[tuple[int, int]] = []  # (slot, source)
    for broker in sorted(counts):
        slots = current.slots_of(broker)
        keep = share.get(broker, 0)
        surplus += [(slot, broker) for slot in slots[keep:]]
    room = {broker: share[broker] - counts[broker] for broker in range(broker_count)}
    targets = [broker for broker in range(broker_count) for _ in range(max(room[broker], 0))]
    return [
        Move(slot, source, target)
        for (slot, source), target in zip(sorted(surplus), targets, strict=True)
    ]
