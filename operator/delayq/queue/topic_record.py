"""The topic's settings record: the settings the transitions enforce, published by the topic's
owner into every slot and read there by the scripts, so that no client applies other limits
than the topic's (BullMQ keeps a queue's settings in a meta key its scripts read, likewise).

Without it every script call took its limits from the caller's own `Topic`: the pipeline, a
producer with a stale or hand-made `Topic`, skipped the quota and the default expiry or kept an
old retention. Each call still carries the caller's values (the `*_plans.py` modules); a field
of the slot's record wins over them (`lua/includes/topic_settings.lua`), and they stay the
fallback while a slot has no record (a broker the operator has not reached yet, an operator of
the previous version), which is also what the previous version's functions use during a
rolling upgrade.

One record per slot (`SlotKeys.settings`), not one per topic: a script touches the keys of one
hash tag only, so a topic can move onto a Redis Cluster unchanged. The owner writes the record
of every slot of the topic's key generation on every broker (392 bytes each by MEMORY USAGE,
400 kB per broker at 1,024 slots), so a slot move finds it on its target and nothing copies it.
Only the owner may write: the operator (its admin user) on Kubernetes, `delayq serve` on a Redis
of its own; the topic's users may read it (`acl.py`). A record names its owner and a version
(`lua/publish-1.lua`): a publisher with older settings of the same owner never replaces a newer
record.

Recorded: the `Topic` fields a script enforces, each under its own name (`RECORDED_FIELDS`);
the rate limit's are read by pace-1 from slot 0's record, on the topic's first broker.
Not recorded, since no script decides by them: `ack_timeout_ms` (the default lease: every claim
and extend names its own, a pull consumer's `leaseMs` within its bounds), `max_payload_bytes`
(checked by the client before it sends), `redis_sync_replicas` and `redis_sync_timeout_ms` (a
client's WAIT), and what the keys themselves are (`name`, `namespace`, `slot_amount`,
`topic_type`, `slot_generation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from delayq.queue import functions
from delayq.queue.keys import slot_keys
from delayq.queue.plans import Arg, Plan, ScriptCall
from delayq.queue.record_buckets import RECORD_BUCKETS_FIELD
from delayq.queue.schedule_plans import Steps
from delayq.queue.scripts import Script
from delayq.queue.settings import SETTINGS, Change, Consumer
from delayq.queue.store_buckets import STORE_BUCKETS_FIELD
from delayq.queue.topic import Topic

#: The Topic fields the scripts read from the record, each under its own name: the engine's
#: settings the table (queue/settings.py) says change live.
#: `limits_max_pending` and `max_in_flight_per_group` hold the slot's share
#: (`Topic.max_pending_per_slot`, `Topic.max_in_flight_per_group_per_slot`): a record belongs
#: to the keys of one key generation, whose slot amount is the topic's.
RECORDED_FIELDS = tuple(
    row.name for row in SETTINGS if row.consumer is Consumer.TOPIC and row.change is Change.LIVE
)

#: The owner `delayq serve` publishes as, on a Redis of its own (the operator: the topic's uid).
SERVE_OWNER = "delayq-serve"


#: The fields that tell the scripts where a slot keeps its records and its waiting messages
#: (`record_buckets.py`, `store_buckets.py`): each given only while the topic has it on, and
#: kept by publish-1 as `False` once a record held it.
LAYOUT_FIELDS = (RECORD_BUCKETS_FIELD, STORE_BUCKETS_FIELD)


def recorded_values(topic: Topic) -> dict[str, str]:
    """The record of `topic` as the scripts read it: field -> value (an integer or an
    `EndAction`'s value, as text), without a LAYOUT_FIELDS field while it is off (publish-1
    keeps it as `False` where a record had it)."""
    values = {name: str(getattr(topic, name)) for name in RECORDED_FIELDS}
    values["limits_max_pending"] = str(topic.max_pending_per_slot)
    values["max_in_flight_per_group"] = str(topic.max_in_flight_per_group_per_slot)
    for field in LAYOUT_FIELDS:
        if not getattr(topic, field):
            del values[field]
    return values


def holds(record: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    """Whether a slot's record is the `expected` one, as publish-1 would keep it: with a
    LAYOUT_FIELDS field `False` where `expected` lacks it and the record had it."""
    kept = {f for f in LAYOUT_FIELDS if f not in expected and record.get(f) == "False"}
    return {k: v for k, v in record.items() if k not in kept} == expected


def as_published(topic: Topic, libraries: Mapping[str, set[str]]) -> Topic:
    """`topic` as its record may say it, given the delayq libraries on the broker
    (`functions.listed`): recordBuckets stays off while one of them would not read a record in
    a bucket (`functions.reads_record_buckets`; an older version's, until the operator deletes
    it an hour after its last pod is gone). Turned off, the slots write their records to `msg`
    again, and records move out of the buckets as they are written. storeBuckets likewise
    (`functions.reads_store_buckets`), for the waiting messages and `store`."""
    if topic.redis_record_buckets and not functions.reads_record_buckets(libraries):
        topic = replace(topic, redis_record_buckets=False)
    if topic.redis_store_buckets and not functions.reads_store_buckets(libraries):
        topic = replace(topic, redis_store_buckets=False)
    return topic


def lists_libraries(topic: Topic) -> bool:
    """Whether publishing `topic`'s record needs the broker's libraries listed
    (`as_published`): only while a bucket layout is on."""
    return topic.redis_record_buckets or topic.redis_store_buckets


def publish(
    topic: Topic, owner: str, version: int, slots: Iterable[int] | None = None
) -> Steps[list[int]]:
    """Write the record of `topic` into the given slots (default: every slot) of one broker
    where it differs: the records are read first (settings-1, read-only), then written
    (publish-1) into the slots whose record is not this one, so that publishing unchanged
    settings again writes nothing. The result is, per slot, the version its record holds
    after (a newer one of the same owner is kept)."""
    wanted = list(topic.slots if slots is None else slots)
    values = recorded_values(topic)
    expected = {"owner": owner, "version": str(version), **values}
    records: list[dict[str, str]] = yield Plan(
        _calls(Script.SETTINGS, topic, wanted, []), lambda replies: [_fields(r) for r in replies]
    )
    held = {
        slot: version for slot, rec in zip(wanted, records, strict=True) if holds(rec, expected)
    }
    outdated = [slot for slot in wanted if slot not in held]
    if outdated:
        args: list[Arg] = [owner, version, *(item for pair in values.items() for item in pair)]
        written: list[int] = yield Plan(
            _calls(Script.PUBLISH, topic, outdated, args), lambda replies: [int(r) for r in replies]
        )
        held.update(zip(outdated, written, strict=True))
    return [held[slot] for slot in wanted]


def _calls(script: Script, topic: Topic, slots: list[int], args: list[Arg]) -> list[ScriptCall]:
    return [ScriptCall(script, [slot_keys(topic, slot).settings], args) for slot in slots]


def _fields(reply: list[bytes]) -> dict[str, str]:
    """A flat HGETALL reply as text. Bytes that are no text read as U+FFFD, so such a record
    differs from the one wanted and is written again: whoever has the broker's admin login
    (the topic's Secret holds it) may have written anything there."""
    return {
        field.decode(errors="replace"): value.decode(errors="replace")
        for field, value in zip(reply[0::2], reply[1::2], strict=True)
    }
