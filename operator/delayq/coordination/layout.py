"""The ZooKeeper tree of one topic (docs/contracts.md §2) and the JSON stored in its nodes (pure).

```
/delayq/<namespace>/<topic>/
    members/<member-id>   ephemeral  {"broker": "broker-1", "capacity": 1, "host": "pod-1",
                                      "library": "delayq_<hash>"}
    assignment            persistent {"version": 1, "generation": 7, "members": [ids],
                                      "slots": [index into members, or -1, per slot]}
    owners/<slot>         ephemeral  member id; whoever holds it may consume the slot
    handoffs/<slot>       ephemeral  member id of the slot's new assignee, ready to take it
    routing               persistent slot -> broker, written by the operator (routing.py)
    migrations/<slot>     persistent a slot move under way and its step (migration.py)
    movers/<slot>         ephemeral  the lock of whoever moves or rolls back the slot now
    split                 persistent a doubling of the slot amount under way (splitting.py)
    movers/split          ephemeral  the lock of whoever doubles (or rolls back) now
```

The operator (`delayq.kube.zk`) writes `routing`, counts `owners/` and removes whole trees; the
services (`delayq.coordination.zookeeper`) use the rest. Both take every path from `TopicPaths`.

The assignment stores member ids once and one small integer per slot, so even 16384 slots stay
far below ZooKeeper's 1 MB node limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from delayq.coordination.assignment import Assignment, Member
from delayq.coordination.routing import Routing
from delayq.queue.functions import LIBRARY_NAME

ROOT = "/delayq"
ASSIGNMENT_FORMAT_VERSION = 1
_TRAILING_NUMBER = re.compile(r"(\d+)$")


def namespace_root(namespace: str) -> str:
    """The parent of every topic tree of a namespace."""
    return f"{ROOT}/{namespace}"


@dataclass(frozen=True)
class TopicPaths:
    """Absolute node paths of one topic: the only place the tree's layout is spelled out."""

    namespace: str
    topic: str

    @property
    def root(self) -> str:
        return f"{namespace_root(self.namespace)}/{self.topic}"

    @property
    def members(self) -> str:
        return f"{self.root}/members"

    def member(self, member_id: str) -> str:
        return f"{self.members}/{member_id}"

    @property
    def assignment(self) -> str:
        return f"{self.root}/assignment"

    @property
    def owners(self) -> str:
        return f"{self.root}/owners"

    def owner(self, slot: int) -> str:
        return f"{self.owners}/{slot}"

    @property
    def handoffs(self) -> str:
        return f"{self.root}/handoffs"

    def handoff(self, slot: int) -> str:
        return f"{self.handoffs}/{slot}"

    @property
    def routing(self) -> str:
        return f"{self.root}/routing"

    @property
    def migrations(self) -> str:
        return f"{self.root}/migrations"

    def migration(self, slot: int) -> str:
        return f"{self.migrations}/{slot}"

    @property
    def movers(self) -> str:
        return f"{self.root}/movers"

    def mover(self, slot: int) -> str:
        return f"{self.movers}/{slot}"

    @property
    def split(self) -> str:
        return f"{self.root}/split"

    @property
    def splitter(self) -> str:
        """The doubling's lock, beside the slots' (not a number: `SlotMover.locked` skips it)."""
        return f"{self.movers}/split"


def broker_index(broker: str) -> int | None:
    """The routing index of a broker name: its trailing number ("broker-2", "orders-redis-2",
    "2" -> 2), the StatefulSet ordinal the operator routes by; None when it has none."""
    match = _TRAILING_NUMBER.search(broker)
    return int(match.group(1)) if match else None


def encode_member(broker: str, capacity: int, host: str, library: str) -> bytes:
    """A member's node: where it runs, and the engine's functions library it calls (the
    operator deletes no library a live member names: kube/libraries.py)."""
    document = {"broker": broker, "capacity": capacity, "host": host, "library": library}
    return json.dumps(document).encode()


def member_library(payload: bytes) -> str:
    """The functions library a member's node names; "" when it names none (a member of a
    version before the field, or foreign data: its library is unknown). A name that is not a
    library's (`functions.LIBRARY_NAME`) is foreign data too: the node is the topic's pods'
    to write, and the operator logs the names it reads (a megabyte, or forged log lines)."""
    try:
        document = json.loads(payload)
    except ValueError:
        return ""
    library = document.get("library") if isinstance(document, dict) else None
    return library if isinstance(library, str) and LIBRARY_NAME.fullmatch(library) else ""


def decode_member(member_id: str, payload: bytes, ephemeral_owner: int) -> Member | None:
    """A member from its node, or None when no live member wrote it.

    Only an ephemeral node (`ephemeral_owner`, the stat's session id, non-zero) holding a JSON
    object is a member: a member registers exactly so (`encode_member`). Anything else under
    `members/` — a persistent node an admin client created there (a chroot pointed into the
    tree makes the operator create `members/delayq`), or foreign data — would otherwise receive
    slots nobody consumes, and its writer, not the topic, decides when it goes away. Fields a
    member left out or spelled oddly take their defaults (brokerless, capacity 1): a member
    that registered is alive and must not be starved or crash the leader.
    """
    if not ephemeral_owner:
        return None
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    try:
        capacity = max(1, int(document.get("capacity", 1)))
    except (ValueError, TypeError, OverflowError):  # "x", null, NaN, Infinity (1e400)
        capacity = 1
    return Member(member_id, broker_index(str(document.get("broker") or "")), capacity)


@dataclass(frozen=True)
class AssignmentDocument:
    """The assignment node's content; `revision` counts the coordinator's writes (the node's
    "generation" field, a wire name kept; not the key generation) and `members` lists every
    member it was computed for (a member with no slot is still listed, which is how it knows
    it has been considered and is ready)."""

    revision: int
    slots: Assignment
    members: frozenset[str] = frozenset()

    def encode(self, slot_amount: int) -> bytes:
        member_ids = sorted(self.members | set(self.slots.values()))
        index = {member_id: i for i, member_id in enumerate(member_ids)}
        document = {
            "version": ASSIGNMENT_FORMAT_VERSION,
            "generation": self.revision,
            "members": member_ids,
            "slots": [index.get(self.slots.get(slot, ""), -1) for slot in range(slot_amount)],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> AssignmentDocument:
        """Parse; an empty or foreign document reads as "nothing assigned yet"."""
        try:
            document = json.loads(payload) if payload else {}
        except ValueError:
            return cls(0, {})
        if not isinstance(document, dict) or document.get("version") != ASSIGNMENT_FORMAT_VERSION:
            return cls(0, {})
        try:
            member_ids = [str(member_id) for member_id in document["members"]]
            slots = {
                slot: member_ids[i]
                for slot, i in enumerate(document["slots"])
                if 0 <= i < len(member_ids)
            }
            return cls(int(document["generation"]), slots, frozenset(member_ids))
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: Infinity
            return cls(0, {})  # damaged: the coordinator rewrites it


def decode_routing(payload: bytes, slot_amount: int, generation: int = 0) -> Routing | None:
    """The operator's routing node for a reader of `slot_amount` slots at key generation
    `generation`: the routing when it is for those, or for a newer generation (the slots
    doubled since: the reader must follow it, `Routing.generation`); None when unreadable or
    for another slot amount at the same or an older generation (locality is an optimisation:
    a bad routing must never stop the fleet)."""
    try:
        routing = Routing.from_json(payload)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if routing.generation > generation:
        return routing
    same = (routing.slot_amount, routing.generation) == (slot_amount, generation)
    return routing if same else None


def slots_of(assignment: Mapping[int, str], member_id: str) -> frozenset[int]:
    return frozenset(slot for slot, owner in assignment.items() if owner == member_id)
