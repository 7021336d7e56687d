"""The Redis key schema (docs/contracts.md §1): every key of a slot shares one hash tag.

`dq:{<ns>/<topic>/<slot>}:<part>` keeps a slot's keys on one Redis Cluster node, so each Lua
transition touches exactly one node and a topic can move onto a cluster unchanged. After the
topic's slots doubled g times (`Topic.slot_generation`, docs/coordination.md "Doubling the
slots") the tag is `{<ns>/<topic>/g<g>/<slot>}`: the same slot number under the new slot amount
holds other ids, so it gets other keys, and the old ones stay frozen for stale writers.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from delayq.queue.topic import Topic

#: The prefix of the slots' settings records (`SlotKeys.settings`).
SETTINGS_PREFIX = "dq-settings"
#: The start of every key the engine owns: the slots' and the topic's keys (`dq:{...}`) and
#: the settings records. A key a tenant names (a stream topic's target stream, which the service
#: user's ACL grants and its consumers create) must start with none of them: it could write the
#: read-only settings record or put a stream where a script expects another type.
ENGINE_KEY_PREFIXES = ("dq:", f"{SETTINGS_PREFIX}:")
#: Why a tenant's key is refused (after the field's name).
ENGINE_KEY_MESSAGE = (
    f"must not start with {' or '.join(ENGINE_KEY_PREFIXES)} (the delay queue's own keys)"
)


def is_engine_key(key: str) -> bool:
    """Whether `key` lies in the engine's key space (`ENGINE_KEY_PREFIXES`)."""
    return key.startswith(ENGINE_KEY_PREFIXES)


class Part(enum.StrEnum):
    """The per-slot keys and what each holds."""

    STORE = "store"  # ZSET id -> due ms (scheduled messages)
    # once present, the slot's waiting messages are kept in the buckets `<store key>:<b>`, b < n,
    # with `heads` indexing each one's earliest due, and `store` holds only those written
    # before (lua/includes/store_buckets.lua, queue/store_buckets.py)
    STORE_BUCKETS = "storebuckets"  # HASH n -> bucket count, count -> entries in the buckets
    HEADS = "heads"  # ZSET store bucket -> the earliest due in it (non-empty buckets only)
    PREPARE = "prepare"  # ZSET id -> lease deadline ms (claimed, not yet acked)
    DEAD = "dead"  # ZSET id -> time of death ms
    MSG = "msg"  # HASH id -> packed record (attempts, due, headers, payload)
    # once present, the slot's records are kept in the buckets `<msg key>:<b>`, b < n, and `msg`
    # holds only those written before (lua/includes/record_buckets.lua, queue/record_buckets.py)
    BUCKETS = "buckets"  # HASH n -> bucket count, count -> records in the buckets
    REASON = "reason"  # HASH id -> why a dead message died (only dead ids)
    EPOCH = "epoch"  # STRING fencing epoch of the slot's current owner
    WAKE = "wake"  # LIST, at most one element: "the head of store moved earlier"
    JOURNAL = "journal"  # STREAM lifecycle events (optional, bounded)
    LEASES = "leases"  # STRING the last lease number drawn by a claim (never repeats)
    # a finished id remembered for the topic's outcome retention (acked, cancelled, purged)
    OUTCOME = "outcome"  # HASH id -> "<state>:<finished ms>:<attempts>"
    FINISHED = "finished"  # ZSET id -> finished ms (the order outcomes are forgotten in)
    SCHEDULES = "schedules"  # HASH schedule id -> packed recurring schedule (queue/schedules.py)
    TOPUP = "topup"  # ZSET schedule id -> ms since it owes a top-up (its next due precomputed)
    # the custom slot basis of a message scheduled with one (only those ids): a doubling places
    # the message by it (queue/slot_split.py); kept while the record is, dead ones included
    BASIS = "basis"  # HASH id -> slot basis
    # the waiting messages of priority above 0 (only while the slot holds one): a claim takes
    # those already due first, highest priority first (lua/includes/due_by_priority.lua);
    # named by the scripts from the store key (lua/includes/priority_key.lua)
    PRIORITY = "priority"  # ZSET id -> priority * 2^42 + due ms
    # fair groups (only while the slot holds a grouped message): a claim serves the due groups
    # in turn and at most maxInFlightPerGroup leases each (lua/includes/due_by_group.lua);
    # named by the scripts from any key of the slot (lua/includes/group_keys.lua)
    GROUP_WAIT = "groupwait"  # ZSET, scores 0: "<group>\0<due ms, 16 digits>\0<id>" waiting
    GROUPS = "groups"  # ZSET group -> when its turn comes (+inf: at its in-flight bound)
    GROUP_LEASES = "groupleases"  # ZSET, scores 0: "<group>\0<id>" leased
    # while a doubling copies the slot before freezing it (queue/slot_split.py): every message
    # ('m<id>') and schedule ('s<id>') a script changed since, '' while tracking is on
    CHANGES = "changes"  # SET
    RECOPY = "recopy"  # SET the changes the doubling took to copy again, until it did


@dataclass(frozen=True)
class SlotKeys:
    """All key names of one slot of one topic."""

    namespace: str
    topic: str
    slot: int
    generation: int = 0

    @property
    def tag(self) -> str:
        if self.generation == 0:  # the names of every topic before its first doubling
            return f"{{{self.namespace}/{self.topic}/{self.slot}}}"
        return f"{{{self.namespace}/{self.topic}/g{self.generation}/{self.slot}}}"

    def key(self, part: Part) -> str:
        return f"dq:{self.tag}:{part.value}"

    def keys(self, *parts: Part) -> list[str]:
        return [self.key(part) for part in parts]

    @property
    def settings(self) -> str:
        """The slot's copy of the topic's settings record (`queue/topic_record.py`): the
        slot's hash tag, so the scripts read it on the slot's node, but not a `Part` and not
        under `dq:`. It is the topic owner's, written on every broker: the topic's users may
        read it and not write it (their write pattern, `dq:{...`, does not match it), and a
        slot move, doubling or deletion, which go over the parts, never touches it."""
        return f"{SETTINGS_PREFIX}:{self.tag}"


def slot_keys(topic: Topic, slot: int) -> SlotKeys:
    _check_slot(topic, slot)
    return SlotKeys(topic.namespace, topic.name, slot, topic.slot_generation)


def store_key(topic: Topic, slot: int) -> str:
    """The slot's `store` key, which alone names the slot in a call over several slots
    (schedulemany-1, claimmany-1, ackmany-1: the scripts name its other parts after it). Made
    once per slot: a consumer's wake-up over 1,024 due slots names each of them, and building
    their key names through `SlotKeys` was most of its plan's Python."""
    _check_slot(topic, slot)
    return _store_key(topic.namespace, topic.name, topic.slot_generation, slot)


@functools.lru_cache(maxsize=16_384)
def _store_key(namespace: str, topic: str, generation: int, slot: int) -> str:
    return SlotKeys(namespace, topic, slot, generation).key(Part.STORE)


def _check_slot(topic: Topic, slot: int) -> None:
    if not 0 <= slot < topic.slot_amount:
        raise ValueError(f"slot {slot} is outside 0..{topic.slot_amount - 1} of topic {topic.name}")


def control_key(topic: Topic, consumer: str) -> str:
    """A consumer's own wake-up list, outside every slot: pushed to interrupt its blocking wait
    when its set of slots changes or it stops (same topic tag as the slots' keys)."""
    return f"dq:{{{topic.namespace}/{topic.name}}}:wake-control:{consumer}"


def paused_key(topic: Topic) -> str:
    """Present while the topic's delivery is paused on this broker: its consumers stop claiming
    (scheduling goes on). Outside every slot, with the topic tag."""
    return f"dq:{{{topic.namespace}/{topic.name}}}:paused"


def pace_key(topic: Topic) -> str:
    """The topic's pace on its first broker (`queue/pacing.py`): the rate limit's token bucket
    and a receiver's hold. Outside every slot, with the topic tag."""
    return f"dq:{{{topic.namespace}/{topic.name}}}:pace"


def parse_wake_key(key: str) -> int:
    """The slot number of a `wake` key, as returned by a blocking pop (any generation: the
    slot number is the tag's last field)."""
    tag = key[key.index("{") + 1 : key.index("}")]
    return int(tag.rsplit("/", 1)[1])
