"""The default of every DelayTopic setting, defined once (pure).

The CRD's `default:` values, the operator's spec parser (`delayq.kube.spec`), `delayq serve`'s
settings and flags (`delayq.service.config`) and the docs all take their defaults from
`DEFAULTS`; `tests/kube/test_crd_schema.py` checks every `default:` in the CRD against it.

A setting's name is the snake_case of its path under the DelayTopic's `spec`, without the
`delivery.` section (`delivery.webhook.maxInFlight` -> `webhook_max_in_flight`); a duration
ends in `_ms` and holds milliseconds (the CRD writes it as a duration string such as `10s`).
The same name is the `delayq serve` setting, its flag and its `topic.json` key.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from delayq.queue.backoff import Jitter
from delayq.queue.consumer import DEFAULT_WORKER_CONCURRENCY
from delayq.queue.topic import (
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RETRIES,
    EndAction,
    TopicType,
)


def _crd(path: str) -> dict[str, str]:
    return {"crd": path}


@dataclass(frozen=True)
class TopicDefaults:
    """One field per setting: its default, and (metadata `crd`) its path in the CRD's spec."""

    slot_amount: int = field(default=16, metadata=_crd("slotAmount"))
    topic_type: TopicType = field(default=TopicType.PULL, metadata=_crd("topicType"))
    brokers: int = field(default=1, metadata=_crd("brokers"))
    replicas_per_broker: int = field(default=1, metadata=_crd("replicasPerBroker"))
    max_retries: int = field(default=DEFAULT_MAX_RETRIES, metadata=_crd("maxRetries"))
    ack_timeout_ms: int = field(default=DEFAULT_ACK_TIMEOUT_MS, metadata=_crd("ackTimeout"))
    max_payload_bytes: int = field(
        default=DEFAULT_MAX_PAYLOAD_BYTES, metadata=_crd("maxPayloadBytes")
    )
    journal_max_len: int = field(default=0, metadata=_crd("journalMaxLen"))
    # finished ids remembered for deduplication and `get` (0: off; memory in docs/service.md)
    outcome_retention_ms: int = field(default=0, metadata=_crd("outcomeRetention"))
    # the service's hard cap per lease request (delivery.pull.MAX_LEASE_BATCH) is 1000 too
    pull_max_lease_batch: int = field(default=1000, metadata=_crd("delivery.pull.maxLeaseBatch"))
    webhook_timeout_ms: int = field(default=10_000, metadata=_crd("delivery.webhook.timeout"))
    webhook_max_in_flight: int = field(default=64, metadata=_crd("delivery.webhook.maxInFlight"))
    # 1: one message per POST, what every receiver understands; more only for receivers that
    # answer each message of a batch (delivery/webhook.py)
    webhook_max_batch: int = field(default=1, metadata=_crd("delivery.webhook.maxBatch"))
    # a tenant's webhook reaches only public addresses unless its topic says otherwise (the SSRF
    # guard, delivery/targets.py); `delayq serve` run by hand defaults to true (config.py)
    webhook_allow_private_targets: bool = field(
        default=False, metadata=_crd("delivery.webhook.allowPrivateTargets")
    )
    # https only unless the topic says otherwise; `delayq serve` run by hand defaults to true
    webhook_allow_insecure_http: bool = field(
        default=False, metadata=_crd("delivery.webhook.allowInsecureHttp")
    )
    stream_max_len: int = field(default=0, metadata=_crd("delivery.stream.maxLen"))
    # an external stream target (delivery.stream.urlSecretRef) is reached on public addresses
    # only unless the topic says otherwise, as a webhook (the pods' egress policy)
    stream_allow_private_targets: bool = field(
        default=False, metadata=_crd("delivery.stream.allowPrivateTargets")
    )
    zookeeper_session_timeout_ms: int = field(
        default=10_000, metadata=_crd("zookeeper.sessionTimeout")
    )
    persistence_size: str = field(default="1Gi", metadata=_crd("persistence.size"))
    deletion_policy: str = field(default="Retain", metadata=_crd("deletionPolicy"))
    # leased at once per process; queued ones keep their leases (the consumer's heartbeat), and
    # the documented service figures were measured with this many
    worker_concurrency: int = field(
        default=DEFAULT_WORKER_CONCURRENCY, metadata=_crd("worker.concurrency")
    )
    redis_min_replicas_to_write: int = field(default=0, metadata=_crd("redis.minReplicasToWrite"))
    redis_min_replicas_max_lag_seconds: int = field(
        default=10, metadata=_crd("redis.minReplicasMaxLagSeconds")
    )
    redis_append_fsync: str = field(default="everysec", metadata=_crd("redis.appendFsync"))
    # the retry policy of failed deliveries (queue/backoff.py): base * multiplier^(attempt-1),
    # capped, then jittered; maxRetries bounds the attempts
    retry_backoff_base_ms: int = field(default=1000, metadata=_crd("retry.backoffBase"))
    retry_backoff_max_ms: int = field(default=3_600_000, metadata=_crd("retry.backoffMax"))
    retry_backoff_multiplier: float = field(default=2.0, metadata=_crd("retry.backoffMultiplier"))
    retry_jitter: Jitter = field(default=Jitter.NONE, metadata=_crd("retry.jitter"))
    # retries also end this long after the first attempt (0: only maxRetries ends them), and
    # what becomes of a message whose retries ended
    retry_for_ms: int = field(default=0, metadata=_crd("retry.for"))
    retry_exhausted_action: EndAction = field(
        default=EndAction.DEAD, metadata=_crd("retry.exhaustedAction")
    )
    # a message without its own expiry is not delivered later than this after its due time (0:
    # never expires), and what becomes of one past its expiry
    expiry_ttl_ms: int = field(default=0, metadata=_crd("expiry.ttl"))
    expiry_action: EndAction = field(default=EndAction.DEAD, metadata=_crd("expiry.action"))
    # a quota on the messages scheduled or in flight (0: none; each slot holds its share)
    limits_max_pending: int = field(default=0, metadata=_crd("limits.maxPending"))
    # replicas that confirm every acknowledged write before it is answered (0: asynchronous)
    redis_sync_replicas: int = field(default=0, metadata=_crd("redis.syncReplicas"))
    redis_sync_timeout_ms: int = field(default=1000, metadata=_crd("redis.syncTimeout"))
    # slots the operator moves at once onto added brokers (kube/resharding.py): each move
    # refuses writes into its slot while it copies, so few at a time keep the pause local
    resharding_max_concurrent_moves: int = field(
        default=2, metadata=_crd("resharding.maxConcurrentMoves")
    )


DEFAULTS = TopicDefaults()


def crd_path(name: str) -> str:
    """The setting's path under the CRD's `spec` (e.g. `delivery.webhook.timeout`)."""
    return str(_FIELDS[name].metadata["crd"])


def crd_default(name: str) -> int | float | str:
    """The default as the CRD writes it: durations as a string (`10s`), enums by value."""
    value = getattr(DEFAULTS, name)
    if name.endswith("_ms"):
        return human_duration(int(value))
    if isinstance(value, enum.Enum):
        return str(value.value)
    return value  # type: ignore[no-any-return]


def human_duration(value_ms: int) -> str:
    """The shortest whole-unit duration string: 30000 -> `30s`, 90000 -> `90s`, 1500 -> `1500ms`,
    0 -> `0s`."""
    if value_ms == 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if value_ms % size == 0:
            return f"{value_ms // size}{unit}"
    return f"{value_ms}ms"


_FIELDS = {f.name: f for f in dataclasses.fields(TopicDefaults)}
