"""Topic settings and slot routing: pure, shared by every client so routing never diverges.

slot = CRC32(slot basis, default the message id) & (slotAmount - 1), as in the TOC design (seed
004); the power-of-two slot count turns the modulo into a mask and lets the count double later.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from dataclasses import dataclass
from typing import Any

from delayq.queue.settings import (
    MAX_DELAY_MS,
    MAX_SLOT_AMOUNT,
    SETTINGS,
    Consumer,
    EndAction,
    Kind,
    TopicType,
    default,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_DELAY_MS",
    "MAX_ID_BYTES",
    "MAX_SLOT_AMOUNT",
    "MAX_SLOT_GENERATION",
    "ROUTING_FIELDS",
    "EndAction",
    "Topic",
    "TopicError",
    "TopicType",
    "is_power_of_two",
    "slot_of",
]

#: A doubling bumps the generation once, and 1 -> MAX_SLOT_AMOUNT takes 14 doublings.
MAX_SLOT_GENERATION = 64
MAX_ID_BYTES = 256
DEFAULT_MAX_PAYLOAD_BYTES: int = default("max_payload_bytes")
NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: The rows of the settings table the engine obeys, bounds checked on construction (the
#: slot amount is checked on its own: a power of two).
_BOUNDED = tuple(
    row
    for row in SETTINGS
    if row.consumer is Consumer.TOPIC
    and row.kind in (Kind.INTEGER, Kind.DURATION, Kind.NUMBER)
    and row.name != "slot_amount"
)

#: Topic fields the routing node decides (a doubling), never read from settings.
ROUTING_FIELDS = frozenset({"slot_generation"})


class TopicError(ValueError):
    """A topic setting is invalid; the message names the setting and the allowed range."""


@dataclass(frozen=True)
class Topic:
    """One delay topic: a namespace-scoped name, a power-of-two slot count and delivery rules.

    Every field but the name, the namespace and `slot_generation` is a row of the settings
    table (`delayq.queue.settings`), which holds its default, bounds and meaning."""

    name: str
    namespace: str = "default"
    slot_amount: int = default("slot_amount")
    topic_type: TopicType = default("topic_type")
    max_retries: int = default("max_retries")
    ack_timeout_ms: int = default("ack_timeout_ms")
    max_payload_bytes: int = default("max_payload_bytes")
    # 0 = lifecycle journal off; else approximate per-slot stream cap
    journal_max_len: int = default("journal_max_len")
    # replicas that must confirm an acknowledged write before it is answered (0: asynchronous
    # replication), and how long to wait for them (then ReplicationTimeoutError)
    redis_sync_replicas: int = default("redis_sync_replicas")
    redis_sync_timeout_ms: int = default("redis_sync_timeout_ms")
    redis_record_buckets: bool = default("redis_record_buckets")
    redis_store_buckets: bool = default("redis_store_buckets")
    redis_store_buckets_after_ms: int = default("redis_store_buckets_after_ms")
    # how long a finished (acked, cancelled, purged) id is remembered: `get` answers its outcome
    # and create-only scheduling answers ALREADY_DONE instead of scheduling it again (0: off)
    outcome_retention_ms: int = default("outcome_retention_ms")
    # retries end this long after the first attempt even below max_retries (0: no window), and
    # what then happens to the message (also after max_retries)
    retry_for_ms: int = default("retry_for_ms")
    retry_exhausted_action: EndAction = default("retry_exhausted_action")
    # a message without its own expiry expires this long after its due time (0: never), and
    # what happens to one past its expiry (it is never delivered after it)
    expiry_ttl_ms: int = default("expiry_ttl_ms")
    expiry_action: EndAction = default("expiry_action")
    # at most this many messages scheduled or in flight (0: no limit), enforced per slot at its
    # share, ceil(limits_max_pending / slot_amount), atomically in the schedule script
    limits_max_pending: int = default("limits_max_pending")
    # messages claimed per second at most, every client together, and the bucket's size (0: no
    # limit; burst 0: a tenth of a second's): the pace a `pacing.Pacer` draws from
    rate_limit_per_second: float = default("rate_limit_per_second")
    rate_limit_burst: int = default("rate_limit_burst")
    # a fair group's messages leased at once at most (0: no limit), enforced per slot at its
    # share, ceil(max_in_flight_per_group / slot_amount), atomically in the claim script
    max_in_flight_per_group: int = default("max_in_flight_per_group")
    # the key generation of the slots (docs/coordination.md "Doubling the slots"): a doubling
    # of slot_amount moves a topic's slots to new key names (`queue/keys.py`), so a writer
    # whose slot amount is stale writes into frozen keys and is refused, never into a slot of
    # the new amount. Decided by the routing node, not a setting (0: no doubling yet).
    slot_generation: int = 0

    def __post_init__(self) -> None:
        for field_name, value in (("name", self.name), ("namespace", self.namespace)):
            if not NAME_PATTERN.match(value):
                raise TopicError(
                    f"topic {field_name} {value!r} must be a DNS label: lowercase letters, digits "
                    "and '-', 1..63 characters, starting and ending with a letter or digit"
                )
        if not is_power_of_two(self.slot_amount) or not 1 <= self.slot_amount <= MAX_SLOT_AMOUNT:
            raise TopicError(
                f"slotAmount {self.slot_amount} must be a power of two between 1 and "
                f"{MAX_SLOT_AMOUNT}"
            )
        object.__setattr__(self, "topic_type", TopicType(self.topic_type))
        object.__setattr__(self, "retry_exhausted_action", EndAction(self.retry_exhausted_action))
        object.__setattr__(self, "expiry_action", EndAction(self.expiry_action))
        for row in _BOUNDED:
            label = f"{row.path} (ms)" if row.kind is Kind.DURATION else row.path
            value = getattr(self, row.name)
            if row.kind is Kind.NUMBER:
                if row.out_of_range(value):
                    raise TopicError(f"{label} {value!r} must be a number {row.between()}")
            else:
                _check_range(label, value, int(row.low), int(row.high))
        _check_range("slot generation", self.slot_generation, 0, MAX_SLOT_GENERATION)

    @classmethod
    def from_settings(cls, settings: object, **given: Any) -> Topic:
        """The Topic of an object holding every Topic field under the same name (delayq
        serve's ServiceConfig, the operator's TopicSpec), `given` fields taken as given: a new
        Topic field reaches every layer through this one place. `slot_generation` is the
        routing's, not a setting: it stays 0 unless given."""
        names = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in given and f.name not in ROUTING_FIELDS
        ]
        return cls(**given, **{name: getattr(settings, name) for name in names})

    def lease_ms(self, asked_ms: int | None) -> int:
        """The lease a claim gets: the length asked for, else the topic's ackTimeout (the one
        place that falls back to it: clients, consumers and the pull API all ask here)."""
        return asked_ms or self.ack_timeout_ms

    @property
    def max_pending_per_slot(self) -> int:
        """Each slot's share of limits_max_pending (0: no limit)."""
        return -(-self.limits_max_pending // self.slot_amount)

    @property
    def max_in_flight_per_group_per_slot(self) -> int:
        """Each slot's share of max_in_flight_per_group (0: no limit)."""
        return -(-self.max_in_flight_per_group // self.slot_amount)

    @property
    def slots(self) -> range:
        return range(self.slot_amount)

    def slot_of(self, slot_basis: str | bytes) -> int:
        return slot_of(slot_basis, self.slot_amount)


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def slot_of(slot_basis: str | bytes, slot_amount: int) -> int:
    """CRC32 (IEEE, as zlib and Java's java.util.zip.CRC32) of the UTF-8 basis, masked."""
    data = slot_basis.encode() if isinstance(slot_basis, str) else slot_basis
    return zlib.crc32(data) & (slot_amount - 1)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TopicError(f"{name} {value!r} must be an integer between {low} and {high}")
