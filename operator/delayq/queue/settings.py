"""The table of a topic's settings: every DelayTopic setting, defined once (pure).

One row per setting: its CRD path under `spec`, type, unit, default, bounds, help, the layer
that obeys it and how a change on a running topic applies. Everything else is derived from the
rows, so adding a setting is one row, a typed field in each record that carries it (mypy needs
them; tests/test_settings.py names a missing one) and its behaviour (CONTRIBUTING.md):

- the Python name (`name`): the snake_case of the path without the `delivery.` section, `_ms`
  for a duration held in milliseconds (`delivery.webhook.timeout` -> `webhook_timeout_ms`). It
  is the `TopicSpec`, `TopicFile`, `ServiceConfig` and `Topic` field, the `topic.json` key, the
  `delayq serve` flag (`--webhook-timeout-ms`) and variable (`DELAYQ_WEBHOOK_TIMEOUT_MS`);
- the bounds the engine's `Topic`, the operator's spec parser (`delayq.kube.spec`) and `delayq
  serve` (`delayq.service.config`) check, and the cross-field `RULES`, each written once;
- the CRD's schema of those fields (`delayq.kube.crd_schema`, checked in and tested) and the
  settings table of docs/service.md.

The CRD writes a duration as a string such as `30s` (`DURATION_PATTERN`), the rest as JSON
numbers, booleans and strings; that external format is the CRD's, unchanged.

In the lowest layer (`delayq.queue`) so that every layer can read it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delayq.queue.backoff import Jitter


class TopicType(enum.StrEnum):
    """How due messages leave the queue."""

    PULL = "pull"
    WEBHOOK = "webhook"
    STREAM = "stream"


class EndAction(enum.StrEnum):
    """What happens to a message that will not be delivered: its retries are exhausted
    (maxRetries, retry.for) or it expired."""

    DEAD = "dead"  # kept in the slot's dead set with its reason: inspect, redrive or purge
    DROP = "drop"  # deleted (remembered as 'dropped' / 'expired' with outcome retention)


MAX_SLOT_AMOUNT = 16384
MAX_DELAY_MS = 20 * 366 * 24 * 3600 * 1000  # twenty years: beyond the ten the contract promises
MAX_SYNC_REPLICAS = 16
MAX_OUTCOME_RETENTION_MS = 30 * 24 * 3600 * 1000
MAX_PENDING = 10_000_000_000
MAX_BROKERS = 64
MAX_REPLICAS_PER_BROKER = 5
MAX_CONCURRENT_MOVES = 16
MAX_MIN_REPLICAS_MAX_LAG_S = 3600
MAX_RETRY_BACKOFF_MS = 7 * 24 * 3600 * 1000  # a week between two attempts at most
MiB = 1024 * 1024
#: A Go-style duration as the CRD writes it: "500ms", "30s", "1m30s".
DURATION_PATTERN = "^([0-9]{1,8}(ms|s|m|h))+$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"


class Kind(enum.StrEnum):
    """How a setting is written in the CRD (and typed in Python)."""

    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    DURATION = "duration"  # a string such as 30s in the CRD, int milliseconds in Python
    CHOICE = "choice"  # one of `choices`, a string
    QUANTITY = "quantity"  # a Kubernetes quantity such as 1Gi, kept as written


class Change(enum.StrEnum):
    """How a change of a setting on a running topic takes effect."""

    # applied without restarting a pod; an engine setting (`Consumer.TOPIC`) that changes live
    # travels in the topic's settings record, which the scripts read (queue/topic_record.py)
    LIVE = "live"
    ROLL = "roll"  # the operator rolls the pods that read it (a new topic.json or pod env)
    GROW = "grow"  # grows live (the operator moves or doubles slots), never shrinks
    NEVER = "never"  # immutable: a new topic is needed


class Consumer(enum.StrEnum):
    """The layer that obeys a setting."""

    TOPIC = "topic"  # the engine's `Topic` (every client, the scripts' arguments)
    SERVICE = "service"  # `delayq serve` (the delay-service pods), not the engine
    OPERATOR = "operator"  # the operator's resources (Redis pods, volumes, resharding)


@dataclass(frozen=True)
class Setting:
    """One row of the table."""

    path: str  # under the DelayTopic's spec, as the CRD spells it (`delivery.webhook.timeout`)
    kind: Kind
    default: Any  # in Python's terms: milliseconds for a duration, the enum member of a choice
    help: str  # one line: `delayq serve --help` and docs/service.md
    description: str  # the CRD's description
    consumer: Consumer
    change: Change  # how a change on a running topic takes effect
    low: float = 0
    high: float = 0
    unit: str = ""  # of an INTEGER or NUMBER; a DURATION is in ms
    choices: tuple[str, ...] = ()  # a CHOICE's values, as the CRD writes them
    # `delayq serve` run by hand defaults differently (None: as `default`; docs/service.md)
    serve_default: Any = None
    # the range rule's message ends with this (`, e.g. 30s`): what the value bounds
    bound_hint: str = ""
    # more of the CRD's schema: format, rules beyond the bounds (immutability, growth)
    crd: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The Python name: `delivery.webhook.maxInFlight` -> `webhook_max_in_flight`."""
        path = self.path.removeprefix("delivery.")
        snake = re.sub(r"([A-Z])", r"_\1", path.replace(".", "_")).lower()
        return snake + "_ms" if self.kind is Kind.DURATION else snake

    @property
    def key(self) -> str:
        """The last part of the path: the key in its section of the spec."""
        return self.path.rsplit(".", 1)[-1]

    @property
    def section(self) -> tuple[str, ...]:
        """The sections of the spec that hold it: `("delivery", "webhook")`."""
        return tuple(self.path.split(".")[:-1])

    @property
    def unit_shown(self) -> str:
        return "ms" if self.kind is Kind.DURATION else self.unit

    @property
    def serve(self) -> bool:
        """A `delayq serve` setting (flag, variable, `topic.json` key) of the same name."""
        return self.consumer is not Consumer.OPERATOR

    @property
    def default_for_serve(self) -> Any:
        return self.default if self.serve_default is None else self.serve_default

    @property
    def env(self) -> str:
        """`delayq serve`'s variable (of a `serve` row): `DELAYQ_ACK_TIMEOUT_MS`."""
        return env_name(self.name)

    @property
    def flag(self) -> str:
        """`delayq serve`'s flag (of a `serve` row): `--ack-timeout-ms`."""
        return flag_name(self.name)

    def crd_default(self) -> Any:
        """The default as the CRD writes it: a duration as a string (`10s`), a choice by value,
        a whole number without its `.0`."""
        if self.kind is Kind.DURATION:
            return human_duration(int(self.default))
        if isinstance(self.default, enum.Enum):
            return str(self.default.value)
        if isinstance(self.default, float) and self.default.is_integer():
            return int(self.default)
        return self.default

    def between(self) -> str:
        """`between 0 and 10000000000` (milliseconds for a duration), for a message."""
        return f"between {_number(self.low)} and {_number(self.high)}"

    def bounds_shown(self) -> str:
        if self.kind is Kind.DURATION:
            return f"{human_duration(int(self.low))}..{human_duration(int(self.high))}"
        if self.kind in (Kind.INTEGER, Kind.NUMBER):
            return f"{_number(self.low)}..{_number(self.high)}"
        if self.choices:
            return ", ".join(self.choices)
        return ""

    def out_of_range(self, value: object) -> bool:
        """A number outside [low, high], or not a number of the row's kind at all."""
        if self.kind is Kind.NUMBER:
            return (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (self.low <= value <= self.high)
            )
        return (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not self.low <= value <= self.high
        )


@dataclass(frozen=True)
class Rule:
    """A rule between settings, checked by the CRD (`cel`, on the object at `at`), the spec
    parser and `delayq serve` (`holds`, on the settings by name) with the same message."""

    names: tuple[str, ...]  # the settings it reads, the offending one first
    at: str  # the section of the spec whose CEL rule it is ("": spec itself)
    cel: str
    message: str
    holds: Callable[[Mapping[str, Any]], bool]
    message_expression: str = ""

    @property
    def field_path(self) -> str:
        """The offending field, relative to `at`, as a CEL rule's fieldPath."""
        path = by_name(self.names[0]).path
        return "." + path.removeprefix(self.at + ".") if self.at else "." + path


def env_name(name: str) -> str:
    """The `delayq serve` variable of a setting: `DELAYQ_` and its name in upper case."""
    return "DELAYQ_" + name.upper()


def flag_name(name: str) -> str:
    """The `delayq serve` flag of a setting: `--` and its name, `_` written `-`."""
    return "--" + name.replace("_", "-")


def human_duration(value_ms: int) -> str:
    """The shortest whole-unit duration string: 30000 -> `30s`, 90000 -> `90s`, 1500 -> `1500ms`,
    0 -> `0s`."""
    if value_ms == 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if value_ms % size == 0:
            return f"{value_ms // size}{unit}"
    return f"{value_ms}ms"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _rule(cel: str, message: str, message_expression: str = "") -> dict[str, str]:
    rule = {"rule": cel, "message": message}
    if message_expression:
        rule["messageExpression"] = message_expression
    return rule


_SLOT_RULES = [
    _rule(
        "self in [" + ", ".join(str(1 << n) for n in range(15)) + "]",
        "slotAmount must be a power of two between 1 and 16384 (1, 2, 4, 8, ... 16384)",
        "'slotAmount must be a power of two between 1 and 16384 (1, 2, 4, 8, ... 16384) "
        "(slotAmount=%d)'.format([self])",
    ),
    _rule(
        "self >= oldSelf",
        "slotAmount may grow but never shrink: the removed slots would still hold messages",
        "'slotAmount may grow but never shrink: the removed slots would still hold messages "
        "(stored %d, requested %d)'.format([oldSelf, self])",
    ),
]
_BROKER_RULES = [
    _rule(
        "self >= oldSelf",
        "brokers may grow but never shrink: each broker holds the messages of its slots",
        "'brokers may grow but never shrink: each broker holds the messages of its slots "
        "(stored %d, requested %d)'.format([oldSelf, self])",
    )
]
_TYPE_RULES = [
    _rule(
        "self == oldSelf",
        "topicType is immutable: create a new DelayTopic to deliver a different way",
    )
]

T, S, OP = Consumer.TOPIC, Consumer.SERVICE, Consumer.OPERATOR

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "slotAmount", Kind.INTEGER, 16, "slots of the topic (power of two)",
        "Number of slots (a power of two, 1..16384). It may grow, never shrink; the operator "
        "then doubles the slots live, splitting each slot s into s and s + N (see resharding).",
        T, change=Change.GROW, low=1, high=MAX_SLOT_AMOUNT, unit="slots",
        crd={"x-kubernetes-validations": _SLOT_RULES},
    ),
    Setting(
        "topicType", Kind.CHOICE, TopicType.PULL, "delivery: pull, webhook or stream",
        "How due messages leave the queue. Immutable.",
        T, change=Change.NEVER, choices=tuple(TopicType),
        crd={"x-kubernetes-validations": _TYPE_RULES},
    ),
    Setting(
        "brokers", Kind.INTEGER, 1, "Redis brokers of the topic, each a master plus replicas",
        "Number of Redis brokers (each a master plus replicas). It may grow but never shrink; "
        "added brokers take their share of the slots (see resharding).",
        OP, change=Change.GROW, low=1, high=MAX_BROKERS, unit="brokers",
        crd={"x-kubernetes-validations": _BROKER_RULES},
    ),
    Setting(
        "replicasPerBroker", Kind.INTEGER, 1, "Redis replicas per broker master",
        "Redis replicas per broker master; failover needs at least one.",
        OP, change=Change.LIVE, low=0, high=MAX_REPLICAS_PER_BROKER, unit="replicas",
    ),
    Setting(
        "maxRetries", Kind.INTEGER, 16,
        "retries after the first delivery: at most 1 + max_retries deliveries",
        "Retries after the first delivery: a message is delivered at most 1 + maxRetries times, "
        "then its retries end (dead or drop, retry.exhaustedAction); 0 = no retry. BullMQ "
        "attempts and SQS maxReceiveCount are maxRetries + 1.",
        T, change=Change.LIVE, low=0, high=1000, unit="retries",
    ),
    Setting(
        "ackTimeout", Kind.DURATION, 30_000, "lease length of a delivery",
        "Lease of a delivered message before it is retried, e.g. 500ms, 30s, 5m (1ms..24h).",
        T, change=Change.ROLL, low=1, high=24 * 3600 * 1000, bound_hint=", e.g. 30s",
    ),
    Setting(
        "maxPayloadBytes", Kind.INTEGER, MiB, "largest accepted payload",
        "Largest accepted message body in bytes (up to 64 MiB).",
        T, change=Change.ROLL, low=1, high=64 * MiB, unit="bytes",
    ),
    Setting(
        "maxBodyBytes", Kind.INTEGER, 8 * MiB, "largest HTTP request body",
        "Largest HTTP request body the topic's API accepts, in bytes (1 KiB..256 MiB; larger "
        "is answered 413): a batch of messages, or one message whose payload travels base64 "
        "in JSON at about 4/3 of its size. Raise it with maxPayloadBytes above 6 MiB.",
        S, change=Change.ROLL, low=1024, high=256 * MiB, unit="bytes",
    ),
    Setting(
        "journalMaxLen", Kind.INTEGER, 0, "lifecycle journal cap per slot (0: off)",
        "Approximate per-slot cap of the lifecycle journal stream; 0 turns the journal off.",
        T, change=Change.LIVE, low=0, high=100_000_000, unit="entries",
    ),
    Setting(
        "outcomeRetention", Kind.DURATION, 0,
        "how long a finished id is remembered: get, create-only dedup (0: off)",
        "How long a finished (acked, cancelled, purged, dropped or expired) message id is "
        "remembered, e.g. 1h "
        "(0s..720h, 0s = off): GET answers its outcome and create-only scheduling of that id "
        "answers already_done instead of delivering it again.",
        T, change=Change.LIVE, low=0, high=MAX_OUTCOME_RETENTION_MS, bound_hint=", e.g. 1h",
    ),
    Setting(
        "retry.backoffBase", Kind.DURATION, 1000, "first retry delay",
        "Delay before the first retry, e.g. 1s (1ms..168h).",
        S, change=Change.ROLL, low=1, high=MAX_RETRY_BACKOFF_MS,
    ),
    Setting(
        "retry.backoffMax", Kind.DURATION, 3_600_000, "longest retry delay",
        "Longest delay between two attempts, e.g. 1h (1ms..168h).",
        S, change=Change.ROLL, low=1, high=MAX_RETRY_BACKOFF_MS,
    ),
    Setting(
        "retry.backoffMultiplier", Kind.NUMBER, 2.0,
        "each retry waits this many times the previous one (1..10)",
        "Each retry waits this many times the previous one (1 = a fixed delay).",
        S, change=Change.ROLL, low=1, high=10, unit="times",
    ),
    Setting(
        "retry.jitter", Kind.CHOICE, Jitter.NONE,
        "none: wait the exponential delay; full: a random time up to it",
        "none waits the delay exactly; full waits a uniformly random time between 0 and it, so "
        "receivers that failed together are not retried together.",
        S, change=Change.ROLL, choices=tuple(Jitter),
    ),
    Setting(
        "retry.for", Kind.DURATION, 0,
        "retries end this long after the first attempt (0: maxRetries only)",
        "Retries also end once the next attempt would fall this long after the first attempt, "
        "e.g. 2h (0s = only maxRetries ends them).",
        T, change=Change.LIVE, low=0, high=MAX_DELAY_MS,
    ),
    Setting(
        "retry.exhaustedAction", Kind.CHOICE, EndAction.DEAD,
        "dead: keep a message whose retries ended in dead; drop: delete it",
        "What becomes of a message whose retries ended (maxRetries or retry.for): dead keeps it "
        "in the dead letters (inspect, redrive, purge); drop deletes it (remembered as dropped "
        "with outcomeRetention).",
        T, change=Change.LIVE, choices=tuple(EndAction),
    ),
    Setting(
        "resharding.maxConcurrentMoves", Kind.INTEGER, 2,
        "slots of the topic the operator moves at once onto added brokers",
        "Slots of this topic a health pass moves at the same time (1..16); every topic's moves "
        "share one pool of min(32, CPUs + 4) threads, each topic at most its share at once (half "
        "alone). Each moving slot refuses writes (retried "
        "by the clients and the HTTP API) for as long as its copy takes, 0.5 to 1.5 s per "
        "100,000 pending messages on 2 vCPUs.",
        OP, change=Change.LIVE, low=1, high=MAX_CONCURRENT_MOVES, unit="slots",
    ),
    Setting(
        "limits.maxPending", Kind.INTEGER, 0,
        "at most this many messages scheduled or in flight, 0: no limit",
        "A cap on messages scheduled or in flight (0 = no limit), held per slot: each slot takes "
        "its share, ceil(maxPending / slotAmount), so with random ids the first refusal comes "
        "before the cap (100 on 16 slots: after about 63) and up to shares x slots may be "
        "stored. A new message beyond its slot's share is refused with 429 and Retry-After; "
        "replacing a live one is not.",
        T, change=Change.LIVE, low=0, high=MAX_PENDING, unit="messages", crd={"format": "int64"},
    ),
    Setting(
        "expiry.ttl", Kind.DURATION, 0,
        "a message without its own expiry expires this long after its due time",
        "A message without its own expiry expires this long after its due time, e.g. 10m "
        "(0s = never).",
        T, change=Change.LIVE, low=0, high=MAX_DELAY_MS,
    ),
    Setting(
        "expiry.action", Kind.CHOICE, EndAction.DEAD,
        "dead: move a message past its expiry to dead; drop: delete it",
        "What becomes of a message past its expiry: dead (reason expired) or drop (deleted; "
        "remembered as expired with outcomeRetention).",
        T, change=Change.LIVE, choices=tuple(EndAction),
    ),
    Setting(
        "delivery.rateLimit.perSecond", Kind.NUMBER, 0.0,
        "messages delivered per second at most, all pods together (0: no limit)",
        "Messages delivered (claimed for a webhook or stream, leased by pull consumers) per "
        "second at most, by every pod of every broker together (0 = no limit, else at least "
        "0.001: one message per 1000 s). Enforced in "
        "Redis: a herd of due messages drains at this rate, in due order; a message waiting for "
        "its turn stays scheduled and spends no attempt. A change applies within a health pass, "
        "without restarting the pods.",
        T, change=Change.LIVE, low=0, high=1_000_000, unit="messages/s",
    ),
    Setting(
        "delivery.rateLimit.burst", Kind.INTEGER, 0,
        "messages delivered at once above the rate after a quiet time (0: a tenth of a second's)",
        "Messages that may go at once after a quiet time, above rateLimit.perSecond (the token "
        "bucket's size; 0 = a tenth of a second's worth, at least 1). A change applies within a "
        "health pass, without restarting the pods.",
        T, change=Change.LIVE, low=0, high=1_000_000, unit="messages",
    ),
    Setting(
        "delivery.maxInFlightPerGroup", Kind.INTEGER, 0,
        "messages of one fair group leased at once at most, held per slot (0: no limit)",
        "A cap on the messages of one group (a message's `group`, e.g. a customer id) leased "
        "and not yet acked (0 = no limit), held per slot: each slot takes its share, "
        "ceil(maxInFlightPerGroup / slotAmount), so a group's leases stay at most shares x "
        "slots. Among due messages the groups are claimed in turn either way; a group at its "
        "cap waits while the others go. A change applies within a health pass, without "
        "restarting the pods.",
        T, change=Change.LIVE, low=0, high=MAX_PENDING, unit="messages", crd={"format": "int64"},
    ),
    Setting(
        "delivery.pull.maxLeaseBatch", Kind.INTEGER, 1000, "pull: messages per lease at most",
        "Most messages one lease call may take (the service caps a call at 1000).",
        S, change=Change.ROLL, low=1, high=10_000, unit="messages",
    ),
    Setting(
        "delivery.webhook.allowInsecureHttp", Kind.BOOLEAN, False,
        "webhook topics: also POST to an http:// URL (false: https only)",
        "Also accept an http:// url. Off, only https:// is accepted, since over plain http the "
        "payloads, the extra headers (an Authorization) and the signatures can be read and "
        "replayed on the way; for an in-cluster receiver without TLS.",
        S, change=Change.ROLL, serve_default=True,
    ),
    Setting(
        "delivery.webhook.timeout", Kind.DURATION, 10_000, "webhook topics: timeout of one POST",
        "How long one POST may take before it counts as failed and is retried, e.g. 10s "
        "(10ms..5m).",
        S, change=Change.ROLL, low=10, high=300_000,
    ),
    Setting(
        "delivery.webhook.maxInFlight", Kind.INTEGER, 64,
        "webhook topics: concurrent POSTs at most",
        "Concurrent POSTs per delay-service pod (back-pressure).",
        S, change=Change.ROLL, low=1, high=10_000, unit="POSTs",
    ),
    Setting(
        "delivery.webhook.maxBatch", Kind.INTEGER, 1,
        "webhook topics: messages per POST at most; above 1 the receiver must answer each "
        "message of a batch (docs/service.md, Batched webhooks)",
        "Messages per POST at most. 1 (the default) sends each message alone. Above 1, the "
        'messages waiting while every POST slot is busy go out together as {"messages": [...]}, '
        'and the receiver must answer each one with {"results": [{"id": ..., "status": 200}, '
        "...]}: a 2xx status acks that message, anything else or no answer retries it.",
        S, change=Change.ROLL, low=1, high=1000, unit="messages",
    ),
    Setting(
        "delivery.webhook.allowPrivateTargets", Kind.BOOLEAN, False,
        "webhook topics: also POST to loopback, private, link-local (cloud metadata) and "
        "other non-public addresses",
        "Also POST to loopback, private (RFC 1918, fc00::/7, 100.64.0.0/10), link-local (incl. "
        "the cloud metadata address 169.254.169.254) and other non-public addresses. Off, such "
        "an address is refused after DNS resolution and the delivery retried; prefer "
        "allowedCidrs.",
        S, change=Change.ROLL, serve_default=True,
    ),
    Setting(
        "delivery.stream.allowPrivateTargets", Kind.BOOLEAN, False,
        "stream topics with stream_url: also connect to loopback, private, link-local and "
        "other non-public addresses, and to a unix:// socket",
        "With urlSecretRef, let the pods' egress and their SSRF guard reach every address, the "
        "private, loopback and link-local ones included, and a unix:// socket (capped by the "
        "platform's tenantPolicy); prefer allowedCidrs.",
        S, change=Change.ROLL, serve_default=True,
    ),
    Setting(
        "delivery.stream.maxLen", Kind.INTEGER, 0,
        "stream topics: approximate MAXLEN of the target (0: none)",
        "Approximate cap of the output stream; 0 means unbounded.",
        S, change=Change.ROLL, low=0, high=1_000_000_000, unit="entries",
    ),
    Setting(
        "zookeeper.sessionTimeout", Kind.DURATION, 10_000,
        "ZooKeeper session timeout: bounds the failover time",
        "ZooKeeper session timeout of the delay-service pods, e.g. 10s (2s..60s); bounds how "
        "fast slots fail over.",
        S, change=Change.ROLL, low=2000, high=60_000,
        bound_hint=": it bounds how fast slots fail over",
    ),
    Setting(
        "persistence.size", Kind.QUANTITY, "1Gi", "volume size per Redis pod",
        "Volume size per Redis pod, a Kubernetes quantity such as 1Gi.",
        OP, change=Change.ROLL, crd={"maxLength": 32, "pattern": QUANTITY_PATTERN},
    ),
    Setting(
        "deletionPolicy", Kind.CHOICE, "Retain",
        "whether the Redis volumes (the messages) are kept or deleted with the topic",
        "Whether the Redis volumes (the messages) are kept or deleted with the topic.",
        OP, change=Change.LIVE, choices=("Retain", "Delete"),
    ),
    Setting(
        "worker.concurrency", Kind.INTEGER, 1000,
        "deliveries in flight per process at most",
        "Messages a delay-service pod holds leased at once (claimed, not yet acked; their "
        "leases are kept alive while they wait). Webhook POSTs run at most "
        "delivery.webhook.maxInFlight of them at a time.",
        S, change=Change.ROLL, low=1, high=1024, unit="messages",
    ),
    Setting(
        "redis.minReplicasToWrite", Kind.INTEGER, 0,
        "a master refuses writes unless this many replicas are in sync",
        "A master refuses writes (NOREPLICAS, HTTP 503) unless this many replicas acknowledged "
        "replication within minReplicasMaxLagSeconds; bounds what a failover can lose. 0 "
        "(default) never refuses. At most replicasPerBroker; keep it below replicasPerBroker so "
        "writes go on while one replica is down.",
        OP, change=Change.ROLL, low=0, high=MAX_REPLICAS_PER_BROKER, unit="replicas",
    ),
    Setting(
        "redis.minReplicasMaxLagSeconds", Kind.INTEGER, 10,
        "how recent a replica's acknowledgement must be to count for minReplicasToWrite",
        "How recent (seconds) a replica's last acknowledgement must be to count for "
        "minReplicasToWrite.",
        OP, change=Change.ROLL, low=1, high=MAX_MIN_REPLICAS_MAX_LAG_S, unit="s",
    ),
    Setting(
        "redis.syncReplicas", Kind.INTEGER, 0,
        "replicas that confirm each acknowledged write before it is answered",
        "Synchronous replication. Every write delayq acknowledges (schedule, reschedule, "
        "cancel, ack, nack, redrive, purge) waits until this many replicas confirmed it (Redis "
        "WAIT), so a master failover cannot lose it; not confirmed within syncTimeout, the call "
        "answers HTTP 503 (retryable; the write may have happened on the master, and retrying "
        "it is safe). 0 (default) keeps asynchronous replication. At most replicasPerBroker.",
        T, change=Change.ROLL, low=0, high=MAX_SYNC_REPLICAS, unit="replicas",
    ),
    Setting(
        "redis.syncTimeout", Kind.DURATION, 1000,
        "how long an acknowledged write waits for those replicas (then 503)",
        "How long an acknowledged write waits for syncReplicas, e.g. 1s (10ms..60s).",
        T, change=Change.ROLL, low=10, high=60_000,
    ),
    Setting(
        "redis.recordBuckets", Kind.BOOLEAN, False,
        "keep the messages' records in small buckets: less broker memory, more broker CPU",
        "Whether the slots keep the messages' records in buckets of about 48 that Redis packs "
        "as listpacks (about 50 B less per pending message for payloads under about 50 bytes) "
        "instead of one hash a slot, at the cost of more broker CPU per message (see "
        "docs/benchmarks.md). Records move as they are written, either way; the topic's owner "
        "turns it on only once every delayq version writing to the broker reads buckets.",
        T, change=Change.LIVE,
    ),
    Setting(
        "redis.storeBuckets", Kind.BOOLEAN, False,
        "keep the waiting messages' due index in small buckets: less broker memory, more CPU",
        "Whether the slots keep their waiting messages' due times in buckets of about 48 that "
        "Redis packs as listpacks, with an index of each bucket's earliest due, instead of one "
        "sorted set a slot (about 80 B less per pending message once a slot holds more than "
        "128), at the cost of more broker CPU per scheduled and claimed message (see "
        "docs/benchmarks.md). Messages move as they are written, either way; the topic's owner "
        "turns it on only once every delayq version writing to the broker reads store buckets.",
        T, change=Change.LIVE,
    ),
    Setting(
        "redis.storeBucketsAfter", Kind.DURATION, 10_000,
        "with storeBuckets, messages due sooner than this after their write stay out of buckets",
        "With storeBuckets on: a message due within this long of being written (scheduled, "
        "retried or given back) stays in its slot's one sorted set instead of a bucket, so a "
        "claim of messages due soon looks in no bucket however deep the backlog; one due later "
        "goes into a bucket and is claimed from it when it comes due, e.g. 10s (0s..24h, 0s = "
        "every waiting message in a bucket). Each message kept out of the buckets costs about "
        "84 B more of broker memory: at 2,000 messages a second and 10s, about 1.7 MB.",
        T, change=Change.LIVE, low=0, high=24 * 3600 * 1000, bound_hint=", e.g. 10s",
    ),
    Setting(
        "redis.appendFsync", Kind.CHOICE, "everysec", "when the append-only file reaches the disk",
        "When the append-only file reaches the disk. everysec (default) can lose the last "
        "second of acknowledged writes if a master's node crashes; always syncs every write "
        "before it is acknowledged (nothing acknowledged is lost; each write waits for the "
        "disk).",
        OP, change=Change.ROLL, choices=("everysec", "always"),
    ),
    Setting(
        "objectives.latenessP99", Kind.DURATION, 0,
        "objective: p99 delivery lateness at most this over objectives.window (0: none)",
        "Lateness objective, e.g. 1s (0s = none; up to 60s, the lateness histogram's largest "
        "bucket): the 99th percentile of delivery "
        "lateness (delivery start minus due time) over objectives.window should stay at or "
        "below it. The operator measures it from the delay-service pods' metrics on every "
        "health pass and reports it as the ObjectiveMet condition (and an Event when it "
        "flips); the chart's DelayqDeliveryLate alert fires on it, and the dashboard draws it "
        "against the measured lateness.",
        S, change=Change.ROLL, low=0, high=60_000, bound_hint=", e.g. 1s",
    ),
    Setting(
        "objectives.window", Kind.DURATION, 300_000,
        "the time over which objectives.latenessP99 is measured",
        "The time over which objectives.latenessP99 is measured, e.g. 5m (1m..1h).",
        S, change=Change.ROLL, low=60_000, high=3_600_000,
    ),
    Setting(
        "tracing.enabled", Kind.BOOLEAN, True,
        "export the delay-service pods' spans where the platform sends traces",
        "Whether the topic's delay-service pods export OpenTelemetry spans, where the platform "
        "has turned tracing on (the chart's topics.tracing.otlpEndpoint); false opts the topic "
        "out. Where the spans go, how they are sampled and authenticated is the platform's: no "
        "field of the topic names it.",
        OP, change=Change.ROLL,
    ),
    Setting(
        "backup.keep", Kind.INTEGER, 7,
        "scheduled backups kept on backup.volumeClaim; older complete ones are deleted",
        "How many scheduled backups are kept on backup.volumeClaim (1..365): after each "
        "backup that completes, the oldest complete ones beyond this many are deleted, and so "
        "are unfinished ones older than the newest complete one.",
        OP, change=Change.LIVE, low=1, high=365, unit="backups",
    ),
)  # fmt: skip


def _webhook_timeout_holds(v: Mapping[str, Any]) -> bool:
    return bool(
        v["topic_type"] != TopicType.WEBHOOK or v["webhook_timeout_ms"] < v["ack_timeout_ms"]
    )


_SHORTER = (
    "delivery.webhook.timeout must be shorter than ackTimeout: a lease must outlive the POST "
    "it covers, or the message is delivered twice"
)
_MIN_REPLICAS = (
    "redis.minReplicasToWrite must not exceed replicasPerBroker: a master cannot have more "
    "replicas in sync than its broker has, so it would refuse every write"
)
_SYNC_REPLICAS = (
    "redis.syncReplicas must not exceed replicasPerBroker: a write cannot be confirmed by more "
    "replicas than its broker has, so every write would time out"
)
_BROKERS = "brokers must not exceed slotAmount: every broker needs at least one slot"
#: The slowest rate limit (messages/s): one message per 1000 s, slower is no pace a delivery
#: can be held to; it keeps pace-1's waits and expiry (a bucket of 1e6 refills in 1e12 ms)
#: whole numbers far inside what Redis and Lua's doubles hold.
MIN_RATE_PER_SECOND = 0.001
_SLOWEST_RATE = (
    f"delivery.rateLimit.perSecond must be 0 (no limit) or at least {MIN_RATE_PER_SECOND} "
    f"(one message per {round(1 / MIN_RATE_PER_SECOND)} s)"
)

RULES: tuple[Rule, ...] = (
    Rule(
        ("webhook_timeout_ms", "ack_timeout_ms", "topic_type"),
        "",
        "self.topicType != 'webhook' || !has(self.delivery) || !has(self.delivery.webhook) || "
        "!has(self.delivery.webhook.timeout) || !has(self.ackTimeout) || "
        "duration(self.delivery.webhook.timeout) < duration(self.ackTimeout)",
        _SHORTER,
        _webhook_timeout_holds,
        f"'{_SHORTER} (timeout=%s, ackTimeout=%s)'.format([self.delivery.webhook.timeout, "
        "self.ackTimeout])",
    ),
    Rule(
        ("brokers", "slot_amount"),
        "",
        "self.brokers <= self.slotAmount",
        _BROKERS,
        lambda v: bool(v["brokers"] <= v["slot_amount"]),
        f"'{_BROKERS} (brokers=%d, slotAmount=%d)'.format([self.brokers, self.slotAmount])",
    ),
    Rule(
        ("redis_min_replicas_to_write", "replicas_per_broker"),
        "",
        "!has(self.redis) || !has(self.redis.minReplicasToWrite) || "
        "self.redis.minReplicasToWrite <= self.replicasPerBroker",
        _MIN_REPLICAS,
        lambda v: bool(v["redis_min_replicas_to_write"] <= v["replicas_per_broker"]),
        f"'{_MIN_REPLICAS} (minReplicasToWrite=%d, replicasPerBroker=%d)'.format("
        "[self.redis.minReplicasToWrite, self.replicasPerBroker])",
    ),
    Rule(
        ("redis_sync_replicas", "replicas_per_broker"),
        "",
        "!has(self.redis) || !has(self.redis.syncReplicas) || "
        "self.redis.syncReplicas <= self.replicasPerBroker",
        _SYNC_REPLICAS,
        lambda v: bool(v["redis_sync_replicas"] <= v["replicas_per_broker"]),
        f"'{_SYNC_REPLICAS} (syncReplicas=%d, replicasPerBroker=%d)'.format("
        "[self.redis.syncReplicas, self.replicasPerBroker])",
    ),
    Rule(
        ("rate_limit_per_second",),
        "delivery.rateLimit",
        f"!has(self.perSecond) || self.perSecond == 0.0 || self.perSecond >= {MIN_RATE_PER_SECOND}",
        _SLOWEST_RATE,
        lambda v: not 0 < v["rate_limit_per_second"] < MIN_RATE_PER_SECOND,
    ),
    Rule(
        ("retry_backoff_max_ms", "retry_backoff_base_ms"),
        "retry",
        "duration(self.backoffMax) >= duration(self.backoffBase)",
        "retry.backoffMax must not be shorter than retry.backoffBase",
        lambda v: bool(v["retry_backoff_max_ms"] >= v["retry_backoff_base_ms"]),
    ),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


def by_name(name: str) -> Setting:
    """The row of the Python name `name` (KeyError: no such setting)."""
    return _BY_NAME[name]


def default(name: str) -> Any:
    """The default of the setting `name`, in Python's terms (milliseconds for a duration)."""
    return _BY_NAME[name].default


def broken_rule(values: Mapping[str, Any]) -> Rule | None:
    """The first rule that `values` (settings by name) break, among the rules whose every
    setting is in `values`."""
    for rule in RULES:
        if all(name in values for name in rule.names) and not rule.holds(values):
            return rule
    return None


def shown(name: str, value: Any) -> str:
    """A value as the CRD writes it: `10s`, `pull`, `16`."""
    if by_name(name).kind is Kind.DURATION:
        return human_duration(int(value))
    return str(value.value if isinstance(value, enum.Enum) else value)
