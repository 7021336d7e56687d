"""Parse a DelayTopic spec into a typed, defaulted `TopicSpec`.

The CRD schema (with CEL) rejects bad specs at `kubectl apply`; this parser repeats every
non-transition rule so that a spec which slipped past (an API server without CEL, a CRD applied
late, hand-edited storage) becomes a clear `Ready=False` condition instead of broken resources.
The settings' defaults, bounds and cross-field rules come from the settings table
(`delayq.queue.settings`, which the CRD's schema of them is generated from), so objects from
servers that do not default (kmock) behave the same as objects from a real API server.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from delayq.kube.quantity import parse_quantity
from delayq.queue.backoff import Jitter
from delayq.queue.codes import InvalidMessageError
from delayq.queue.keys import ENGINE_KEY_MESSAGE, ENGINE_KEY_PREFIXES, is_engine_key
from delayq.queue.recurrence import Recurrence
from delayq.queue.settings import (
    DURATION_PATTERN,
    SETTINGS,
    Consumer,
    Kind,
    Setting,
    broken_rule,
    by_name,
    default,
    human_duration,
    shown,
)
from delayq.queue.topic import (
    MAX_SLOT_AMOUNT,
    EndAction,
    Topic,
    TopicError,
    TopicType,
    is_power_of_two,
)
from delayq.service.delivery.targets import parse_cidrs
from delayq.service.redaction import redact_url

DURATION_MATCH = re.compile(DURATION_PATTERN)
#: The engine's settings of `spec.delivery`: `Delivery` holds them, not `TopicSpec`.
DELIVERY_TOPIC_FIELDS = tuple(
    row.name
    for row in SETTINGS
    if row.consumer is Consumer.TOPIC and row.path.startswith("delivery.")
)

DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")
DURATION_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
# hosts only: a topic's tree is placed by the platform (kube/ensembles.py), never by a chroot
ZK_CONNECT_PATTERN = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}(,[A-Za-z0-9.\-]+:[0-9]{1,5})*$")
#: Longest topic name whose derived names all stay valid: the StatefulSet <name>-redis-63 must
#: fit 52 characters (its controller-revision-hash label appends 11) and the Service
#: <name>-redis-63-headless 63. tests/kube/test_crd_schema.py derives it from the builders; the
#: CRD's root CEL rule carries the same number and message.
MAX_TOPIC_NAME_LENGTH = 43
#: delivery.webhook.allowedCidrs: the CRD's maxItems (a topic names networks, not hosts).
MAX_ALLOWED_CIDRS = 32
#: networkPolicy.allowFrom: the CRD's maxItems (peers are selectors, a handful per topic).
MAX_ALLOW_FROM = 32
#: A Kubernetes object name (PersistentVolumeClaim): a DNS-1123 subdomain.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: spec.backup.schedule: the CRD's maxLength.
MAX_BACKUP_SCHEDULE_LENGTH = 100
#: The macros Kubernetes' CronJob takes, as the five fields they stand for.
CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@hourly": "0 * * * *",
}
CRON_FIVE_FIELDS = re.compile(r"[0-9A-Za-z*/,\-]+( [0-9A-Za-z*/,\-]+){4}")
CRON_WORD = re.compile(r"[A-Za-z]+")
CRON_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
CRON_NAMES = frozenset((*CRON_MONTHS, "SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
#: ZooKeeper's client port, which kazoo assumes for a host written without one.
ZOOKEEPER_DEFAULT_PORT = 2181
LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: The CRD's CEL rules on each networkPolicy.allowFrom entry, repeated by the parser (which
#: prefixes the entry, as the API server does); Kubernetes refuses both shapes in a policy.
ALLOW_FROM_EMPTY_PEER_MESSAGE = (
    "an allowFrom peer needs namespaceSelector, podSelector or ipBlock: an empty one is refused "
    "by Kubernetes (use namespaceSelector: {} for every namespace)"
)
ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE = (
    "an allowFrom peer with ipBlock cannot also have namespaceSelector or podSelector: "
    "Kubernetes refuses the combination, write them as separate peers"
)
#: Services need DNS-1035 labels (a letter first, no dots); a DelayTopic name only has to be a
#: DNS-1123 subdomain, so the CRD narrows it.
TOPIC_NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_TOO_LONG_MESSAGE = (
    f"metadata.name must be at most {MAX_TOPIC_NAME_LENGTH} characters: the operator derives "
    "names such as <name>-redis-63-headless from it, which Kubernetes limits to 63 characters "
    "(52 for a StatefulSet)"
)
NAME_NOT_DNS_1035_MESSAGE = (
    "metadata.name must be a DNS label that Services accept (RFC 1035): lowercase letters, "
    "digits and hyphens, starting with a letter and ending with a letter or digit, no dots"
)
WEBHOOK_HTTPS_MESSAGE = (
    "delivery.webhook.url must start with https:// unless delivery.webhook.allowInsecureHttp is "
    "true: over http the payloads, the extra headers and the signatures travel in clear text"
)
#: The CRD's CEL rules on delivery.webhook, repeated by the parser: the url is written into the
#: topic's ConfigMap, so a credential in it would be readable by whoever reads ConfigMaps.
WEBHOOK_URL_SOURCE_MESSAGE = (
    "a webhook topic needs exactly one of spec.delivery.webhook.url and urlSecretRef: the "
    "address due messages are POSTed to"
)
#: A URL with a user part (`//user:pass@host`) or a query (`?token=...`): the CEL rule's regex.
WEBHOOK_URL_SECRET_PATTERN = "^([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@|[^?#]*[?])"
WEBHOOK_URL_SECRET_MESSAGE = (
    "delivery.webhook.url must not carry credentials (user:password@) or a query: send them "
    "as a header from a Secret (delivery.webhook.extraHeadersSecretRef), or name a Secret "
    "holding the whole URL with delivery.webhook.urlSecretRef"
)
#: The CRD's CEL rule on delivery.stream, repeated by the parser: the topic's own broker is
#: reached inside the topic (its Redis policy), so only an external target names addresses.
STREAM_TARGETS_WITHOUT_URL_MESSAGE = (
    "delivery.stream.allowPrivateTargets and allowedCidrs admit the addresses of an external "
    "target: set delivery.stream.urlSecretRef, or remove them to write to the topic's own broker"
)
#: The CRD's CEL rules on a secret reference's name and key (Kubernetes' own formats).
SECRET_NAME_PATTERN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
SECRET_NAME_MESSAGE = (
    "a Secret name must be a DNS subdomain: lowercase letters, digits, '-' and '.', starting and "
    "ending with a letter or digit"
)
SECRET_KEY_PATTERN = re.compile(r"^[-._a-zA-Z0-9]+$")
SECRET_KEY_MESSAGE = "a Secret key must consist of letters, digits, '-', '_' or '.'"
MAX_SECRET_REF_LENGTH = 253


class SpecError(ValueError):
    """The spec can never work as written; the message names the field and the fix."""


@dataclass(frozen=True)
class Resources:
    """Container requests/limits exactly as the user wrote them (quantities stay strings)."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)

    def as_manifest(self) -> dict[str, dict[str, str]]:
        return {"requests": dict(self.requests), "limits": dict(self.limits)}


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the topic's namespace, created by the tenant. The operator never
    reads it: the kubelet puts the value into the delay-service pods' environment."""

    name: str
    key: str


@dataclass(frozen=True)
class BackupSchedule:
    """spec.backup: when the operator's CronJob backs the topic up, and onto which of the
    tenant's PersistentVolumeClaims (in the topic's namespace) it writes."""

    schedule: str  # five cron fields or a macro (@daily), in UTC
    volume_claim: str


@dataclass(frozen=True)
class Delivery:
    """Delivery settings of the topic's type; the unused fields keep their defaults."""

    webhook_url: str = ""
    webhook_timeout_ms: int = default("webhook_timeout_ms")
    webhook_max_in_flight: int = default("webhook_max_in_flight")
    webhook_max_batch: int = default("webhook_max_batch")
    webhook_allow_private_targets: bool = default("webhook_allow_private_targets")
    webhook_allowed_cidrs: tuple[str, ...] = ()
    webhook_allow_insecure_http: bool = default("webhook_allow_insecure_http")
    # the URL instead of webhook_url (`--webhook-url`), the Standard Webhooks secrets
    # (`--webhook-secret`) and the extra headers (`--webhook-extra-headers`), each from a key
    # of the tenant's Secret; None: not from a Secret (the URL) or not sent
    webhook_url_secret_ref: SecretKeyRef | None = None
    webhook_signing_secret_ref: SecretKeyRef | None = None
    webhook_extra_headers_secret_ref: SecretKeyRef | None = None
    pull_max_lease_batch: int = default("pull_max_lease_batch")
    rate_limit_per_second: float = default("rate_limit_per_second")
    rate_limit_burst: int = default("rate_limit_burst")
    max_in_flight_per_group: int = default("max_in_flight_per_group")
    stream_key: str = ""
    stream_max_len: int = default("stream_max_len")
    # the external target's Redis URL (`delayq serve --stream-url`, credentials included) from
    # a key of the tenant's Secret, and which non-public addresses the pods may reach it on;
    # None: the topic's own broker 0, read through the operator's reader user
    stream_url_secret_ref: SecretKeyRef | None = None
    stream_allow_private_targets: bool = default("stream_allow_private_targets")
    stream_allowed_cidrs: tuple[str, ...] = ()
    # spec.delivery.paused: True pauses every broker's delivery, False resumes it; None (unset)
    # leaves pausing to the API and the dashboard (`POST .../pause`)
    paused: bool | None = None


@dataclass(frozen=True)
class TopicSpec:
    """Everything the operator needs from one DelayTopic, validated and defaulted."""

    name: str
    namespace: str
    slot_amount: int = default("slot_amount")
    topic_type: TopicType = default("topic_type")
    brokers: int = default("brokers")
    replicas_per_broker: int = default("replicas_per_broker")
    max_retries: int = default("max_retries")
    ack_timeout_ms: int = default("ack_timeout_ms")
    max_payload_bytes: int = default("max_payload_bytes")
    max_body_bytes: int = default("max_body_bytes")
    journal_max_len: int = default("journal_max_len")
    outcome_retention_ms: int = default("outcome_retention_ms")
    delivery: Delivery = field(default_factory=Delivery)
    zookeeper_connect: str = ""
    zookeeper_session_timeout_ms: int = default("zookeeper_session_timeout_ms")
    persistence_size: str = default("persistence_size")
    persistence_storage_class: str = ""
    deletion_policy: str = default("deletion_policy")
    worker_concurrency: int = default("worker_concurrency")
    worker_resources: Resources = field(default_factory=Resources)
    redis_resources: Resources = field(default_factory=Resources)
    # Redis min-replicas-to-write / min-replicas-max-lag on every broker pod: 0 keeps plain
    # asynchronous replication (writes never refused, a failover can lose the last ones).
    redis_min_replicas_to_write: int = default("redis_min_replicas_to_write")
    redis_min_replicas_max_lag_seconds: int = default("redis_min_replicas_max_lag_seconds")
    redis_append_fsync: str = default("redis_append_fsync")  # or "always"
    # replicas that confirm an acknowledged write (WAIT) before delayq answers it, and how long
    # it waits for them (then HTTP 503, retryable): 0 keeps asynchronous replication
    redis_sync_replicas: int = default("redis_sync_replicas")
    # spec.retry: the retry policy of failed deliveries (delayq.queue.backoff.Backoff)
    retry_backoff_base_ms: int = default("retry_backoff_base_ms")
    retry_backoff_max_ms: int = default("retry_backoff_max_ms")
    retry_backoff_multiplier: float = default("retry_backoff_multiplier")
    retry_jitter: Jitter = default("retry_jitter")
    retry_for_ms: int = default("retry_for_ms")
    retry_exhausted_action: EndAction = default("retry_exhausted_action")
    # spec.expiry: the default expiry of messages, and what becomes of one past it
    expiry_ttl_ms: int = default("expiry_ttl_ms")
    expiry_action: EndAction = default("expiry_action")
    # spec.limits.maxPending: messages scheduled or in flight at most (0: no limit)
    limits_max_pending: int = default("limits_max_pending")
    redis_sync_timeout_ms: int = default("redis_sync_timeout_ms")
    redis_record_buckets: bool = default("redis_record_buckets")
    redis_store_buckets: bool = default("redis_store_buckets")
    redis_store_buckets_after_ms: int = default("redis_store_buckets_after_ms")
    # spec.networkPolicy.allowFrom: NetworkPolicyPeers admitted to the service pods' API port
    # besides the topic's namespace and the operator, checked and copied as plain dicts
    network_policy_allow_from: tuple[dict[str, Any], ...] = ()
    # spec.resharding.maxConcurrentMoves: slots of the topic a pass moves at once (one batch)
    resharding_max_concurrent_moves: int = default("resharding_max_concurrent_moves")
    # spec.objectives: the p99 lateness objective (0: none) and the window it is measured over
    objectives_lateness_p99_ms: int = default("objectives_lateness_p99_ms")
    objectives_window_ms: int = default("objectives_window_ms")
    # spec.tracing.enabled: export spans where the platform traces (its endpoint, never ours)
    tracing_enabled: bool = default("tracing_enabled")
    # spec.backup: the operator's scheduled backups (None: none) and how many are kept
    backup: BackupSchedule | None = None
    backup_keep: int = default("backup_keep")

    def setting(self, name: str) -> Any:
        """The value of the settings table's row `name` (its delivery ones are in `delivery`)."""
        where = self.delivery if by_name(name).path.startswith("delivery.") else self
        return getattr(where, name)

    @property
    def topic(self) -> Topic:
        """The engine's view of this topic (same validation the clients use)."""
        return Topic.from_settings(
            self, **{name: getattr(self.delivery, name) for name in DELIVERY_TOPIC_FIELDS}
        )

    @property
    def redis_pods_per_broker(self) -> int:
        return 1 + self.replicas_per_broker


def parse_duration_ms(value: object, field_name: str, low_ms: int, high_ms: int) -> int:
    """A Go-style duration ("500ms", "1m30s") in milliseconds, within [low_ms, high_ms]."""
    if not isinstance(value, str) or not DURATION_MATCH.match(value):
        raise SpecError(f"{field_name} {value!r} must be a duration such as 500ms, 30s, 5m or 1h")
    total = sum(int(n) * DURATION_UNIT_MS[unit] for n, unit in DURATION_PART.findall(value))
    if not low_ms <= total <= high_ms:
        raise SpecError(
            f"{field_name} must be between {human_duration(low_ms)} and {human_duration(high_ms)} "
            f"(got {value!r})"
        )
    return total


def parse_spec(name: str, namespace: str, spec: Mapping[str, Any]) -> TopicSpec:
    """Validate and default one DelayTopic spec; raise SpecError naming the first bad field."""
    _check_name(name)
    values = {row.name: _setting(spec, row) for row in SETTINGS}
    slot_amount = values["slot_amount"]
    if not is_power_of_two(slot_amount):
        raise SpecError(
            f"slotAmount must be a power of two between 1 and {MAX_SLOT_AMOUNT}, got {slot_amount}"
        )
    broken = broken_rule(values)
    if broken is not None:
        given = ", ".join(
            f"{by_name(n).key}={shown(n, values[n])}" for n in broken.names if n != "topic_type"
        )
        raise SpecError(f"{broken.message} ({given})")
    zookeeper = _section(spec, "zookeeper")
    connect = zookeeper.get("connect", "")
    if connect and (not isinstance(connect, str) or not ZK_CONNECT_PATTERN.match(connect)):
        raise SpecError(
            f"zookeeper.connect {connect!r} must look like host:port[,host:port] (no /path: "
            "the platform places the topic's tree)"
        )
    for port in zookeeper_ports(connect) if connect else ():
        if not 1 <= port <= 65535:
            raise SpecError(f"zookeeper.connect port {port} must be between 1 and 65535")
    worker = _section(spec, "worker")
    redis = _section(spec, "redis")
    top = {n: v for n, v in values.items() if not by_name(n).path.startswith("delivery.")}
    parsed = TopicSpec(
        name=name,
        namespace=namespace,
        delivery=_delivery(values, _section(spec, "delivery")),
        zookeeper_connect=str(connect),
        persistence_storage_class=str(_section(spec, "persistence").get("storageClass", "")),
        worker_resources=_resources(worker, "worker"),
        redis_resources=_resources(redis, "redis"),
        network_policy_allow_from=_allow_from(_section(spec, "networkPolicy")),
        backup=_backup(_section(spec, "backup")),
        **top,
    )
    try:
        parsed.topic  # noqa: B018 - the engine's own checks (name is a DNS label, ...)
    except TopicError as error:
        raise SpecError(str(error)) from None
    return parsed


def _setting(spec: Mapping[str, Any], row: Setting) -> Any:
    """The setting of `row` read from its section of the spec, defaulted as the CRD defaults
    it, checked against the table's bounds, named by its whole path."""
    section = spec
    for part in row.section:
        section = _section(section, part)
    value = section.get(row.key, row.crd_default())
    path = row.path
    if row.kind is Kind.DURATION:
        return parse_duration_ms(value, path, int(row.low), int(row.high))
    if row.kind is Kind.BOOLEAN:
        if not isinstance(value, bool):
            raise SpecError(f"{path} must be true or false, got {value!r}")
        return value
    if row.kind is Kind.CHOICE:
        if value not in row.choices:
            choices = (
                " or ".join(row.choices)
                if len(row.choices) == 2
                else "one of " + ", ".join(row.choices)
            )
            raise SpecError(f"{path} {value!r} must be {choices}")
        kind = type(row.default)
        return kind(value) if isinstance(row.default, enum.Enum) else str(value)
    if row.kind is Kind.QUANTITY:
        return str(value)
    if row.out_of_range(value):
        what = "a number" if row.kind is Kind.NUMBER else "an integer"
        raise SpecError(f"{path} must be {what} {row.between()}, got {value!r}")
    return float(value) if row.kind is Kind.NUMBER else value


def zookeeper_ports(connect: str) -> tuple[int, ...]:
    """The client ports of a connection string `host[:port],...[/chroot]`, sorted, each once;
    ZOOKEEPER_DEFAULT_PORT where a host names none (the operator's default is not checked
    against ZK_CONNECT_PATTERN, and kazoo accepts a bare host)."""
    ports = set()
    for host in connect.split("/", 1)[0].split(","):
        _, colon, port = host.rpartition(":")
        ports.add(int(port) if colon and port.isdigit() else ZOOKEEPER_DEFAULT_PORT)
    return tuple(sorted(ports))


def _check_name(name: str) -> None:
    """The CRD's root rules on metadata.name, with the same messages (values appended)."""
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise SpecError(f"{NAME_TOO_LONG_MESSAGE} (length={len(name)})")
    if not TOPIC_NAME_PATTERN.match(name):
        raise SpecError(f"{NAME_NOT_DNS_1035_MESSAGE} (name={name})")


def _backup(section: Mapping[str, Any]) -> BackupSchedule | None:
    """spec.backup: both schedule and volumeClaim, or neither (no scheduled backups)."""
    schedule, claim = section.get("schedule"), section.get("volumeClaim")
    if schedule is None and claim is None:
        return None
    if schedule is None or claim is None:
        missing = "schedule" if schedule is None else "volumeClaim"
        raise SpecError(f"backup.{missing} is required with the other backup settings")
    if not isinstance(claim, str) or len(claim) > 253 or not DNS_SUBDOMAIN.match(claim):
        raise SpecError(
            f"backup.volumeClaim {claim!r} must be the name of a PersistentVolumeClaim in the "
            "topic's namespace (a DNS subdomain, at most 253 characters)"
        )
    return BackupSchedule(check_backup_schedule(schedule), claim)


def check_backup_schedule(value: object) -> str:
    """A CronJob schedule both Kubernetes (standard cron: five fields, names of months and
    days, the @daily macros) and cronsim read alike; no time zone prefix (UTC) and nothing
    that fires never."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_BACKUP_SCHEDULE_LENGTH
        or not (
            value in CRON_MACROS
            or (
                CRON_FIVE_FIELDS.fullmatch(value)
                and all(name.upper() in CRON_NAMES for name in CRON_WORD.findall(value))
            )
        )
    ):
        raise SpecError(
            f"backup.schedule {value!r} must be five cron fields (minute hour day month "
            "weekday, in UTC) or one of " + ", ".join(CRON_MACROS)
        )
    try:
        cron = CRON_MACROS.get(value, value)
        fires = Recurrence(cron=cron).next_after(int(time.time() * 1000)) is not None
    except InvalidMessageError as error:
        raise SpecError(f"backup.schedule {value!r}: {error}") from None
    if not fires:
        raise SpecError(f"backup.schedule {value!r} fires never within five years")
    return value


def _delivery(values: Mapping[str, Any], section: Mapping[str, Any]) -> Delivery:
    """spec.delivery: the table's settings of it from `values`, the rest read here."""
    topic_type = values["topic_type"]
    for other in ("pull", "webhook", "stream"):
        if other in section and other != topic_type.value:
            raise SpecError(
                f"spec.delivery.{other} is only used by topicType {other}: remove it or set "
                f"topicType: {other}"
            )
    webhook = _section(section, "webhook")
    webhook_url_ref = _secret_key_ref(webhook, "webhook", "urlSecretRef")
    if topic_type is TopicType.WEBHOOK and bool(webhook.get("url")) == bool(webhook_url_ref):
        raise SpecError(WEBHOOK_URL_SOURCE_MESSAGE)
    url = str(webhook.get("url", ""))
    if url and not re.match(r"^https?://\S+$", url):
        shown = redact_url(url)
        raise SpecError(f"delivery.webhook.url {shown} must start with http:// or https://")
    if re.match(WEBHOOK_URL_SECRET_PATTERN, url):
        raise SpecError(WEBHOOK_URL_SECRET_MESSAGE)
    if url and not url.startswith("https://") and not values["webhook_allow_insecure_http"]:
        raise SpecError(f"{WEBHOOK_HTTPS_MESSAGE} (url={redact_url(url)})")
    stream = _section(section, "stream")
    url_secret_ref = _secret_key_ref(stream, "stream", "urlSecretRef")
    stream_cidrs = _allowed_cidrs(stream, "stream")
    if url_secret_ref is None and (values["stream_allow_private_targets"] or stream_cidrs):
        raise SpecError(STREAM_TARGETS_WITHOUT_URL_MESSAGE)
    return Delivery(
        webhook_url=url,
        webhook_allowed_cidrs=_allowed_cidrs(webhook, "webhook"),
        webhook_url_secret_ref=webhook_url_ref,
        webhook_signing_secret_ref=_secret_key_ref(webhook, "webhook", "signingSecretRef"),
        webhook_extra_headers_secret_ref=_secret_key_ref(
            webhook, "webhook", "extraHeadersSecretRef"
        ),
        stream_key=_stream_key(stream),
        stream_url_secret_ref=url_secret_ref,
        stream_allowed_cidrs=stream_cidrs,
        paused=None
        if section.get("paused") is None
        else _bool(section, "paused", False, "delivery."),
        **{n: v for n, v in values.items() if by_name(n).path.startswith("delivery.")},
    )


#: What a stream key must not hold: it is written into the broker's Redis ACL rules (a key
#: pattern, space separated in redis.conf), where whitespace, quotes or a backslash break the
#: config line (the broker would not start) and glob characters would grant more keys.
STREAM_KEY_FORBIDDEN = re.compile(r"""[\s"'\\*?\[\]]""")
STREAM_KEY_MESSAGE = (
    "delivery.stream.streamKey must not contain whitespace, quotes, backslashes or the glob "
    "characters * ? [ ] (it becomes a Redis ACL key pattern)"
)
#: The CRD's rule and message on a stream key inside the engine's key space (`is_engine_key`).
STREAM_KEY_ENGINE_MESSAGE = f"delivery.stream.streamKey {ENGINE_KEY_MESSAGE}"
STREAM_KEY_ENGINE_RULE = " && ".join(f"!self.startsWith('{p}')" for p in ENGINE_KEY_PREFIXES)


def _stream_key(stream: Mapping[str, Any]) -> str:
    key = str(stream.get("streamKey", ""))
    if STREAM_KEY_FORBIDDEN.search(key):
        raise SpecError(f"{STREAM_KEY_MESSAGE} (streamKey={key!r})")
    if is_engine_key(key):
        raise SpecError(f"{STREAM_KEY_ENGINE_MESSAGE} (streamKey={key!r})")
    return key


def _secret_key_ref(
    section: Mapping[str, Any], section_name: str, field_name: str
) -> SecretKeyRef | None:
    """`{name, key}` of the tenant's Secret, both in Kubernetes' formats (the CRD's rules)."""
    if field_name not in section:
        return None
    where = f"delivery.{section_name}.{field_name}"
    ref = section[field_name]
    if not isinstance(ref, Mapping):
        raise SpecError(f"{where} must be an object such as {{name: my-secret, key: my-key}}")
    checks = (
        ("name", SECRET_NAME_PATTERN, SECRET_NAME_MESSAGE),
        ("key", SECRET_KEY_PATTERN, SECRET_KEY_MESSAGE),
    )
    values: dict[str, str] = {}
    for part, pattern, message in checks:
        value = ref.get(part)
        if not isinstance(value, str) or not value:
            raise SpecError(f"{where}.{part} is required: the {part} of the tenant's Secret")
        if len(value) > MAX_SECRET_REF_LENGTH or not pattern.match(value):
            raise SpecError(f"{where}.{part}: {message} ({part}={value!r})")
        values[part] = value
    return SecretKeyRef(**values)


def _allowed_cidrs(section: Mapping[str, Any], section_name: str) -> tuple[str, ...]:
    """A target's CIDR allow-list (webhook or external stream), each entry checked (the
    CRD's pattern is only a shape)."""
    field_name = f"delivery.{section_name}.allowedCidrs"
    values = section.get("allowedCidrs") or []
    if not isinstance(values, list) or len(values) > MAX_ALLOWED_CIDRS:
        raise SpecError(f"{field_name} must be a list of at most {MAX_ALLOWED_CIDRS} CIDRs")
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise SpecError(f"{field_name}[{index}] must be a string such as 10.0.0.0/8")
        try:
            parse_cidrs([value])
        except ValueError as error:
            raise SpecError(f"{field_name}[{index}]: {error}") from None
    return tuple(values)


def _allow_from(section: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """networkPolicy.allowFrom: each entry a NetworkPolicyPeer, shape checked here (the API
    server checks label syntax when the policy is applied), copied as plain JSON values."""
    field_name = "networkPolicy.allowFrom"
    values = section.get("allowFrom") or []
    if not isinstance(values, list) or len(values) > MAX_ALLOW_FROM:
        raise SpecError(
            f"{field_name} must be a list of at most {MAX_ALLOW_FROM} NetworkPolicy peers"
        )
    peers: list[dict[str, Any]] = []
    for index, value in enumerate(values):
        where = f"{field_name}[{index}]"
        if not isinstance(value, Mapping):
            raise SpecError(f"{where} must be an object such as {{namespaceSelector: {{...}}}}")
        unknown = sorted(set(value) - {"namespaceSelector", "podSelector", "ipBlock"})
        if unknown:
            raise SpecError(
                f"{where}: unknown field {unknown[0]!r} "
                "(a peer has namespaceSelector, podSelector and/or ipBlock)"
            )
        if not value:
            raise SpecError(f"{where}: {ALLOW_FROM_EMPTY_PEER_MESSAGE}")
        if "ipBlock" in value and len(value) > 1:
            raise SpecError(f"{where}: {ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE}")
        peer: dict[str, Any] = {}
        for key in ("namespaceSelector", "podSelector"):
            if key in value:
                peer[key] = _label_selector(value[key], f"{where}.{key}")
        if "ipBlock" in value:
            peer["ipBlock"] = _ip_block(value["ipBlock"], f"{where}.ipBlock")
        peers.append(peer)
    return tuple(peers)


def _label_selector(value: object, where: str) -> dict[str, Any]:
    """A Kubernetes LabelSelector: matchLabels and/or matchExpressions; {} selects all."""
    if not isinstance(value, Mapping):
        raise SpecError(f"{where} must be a label selector such as {{matchLabels: {{a: b}}}}")
    unknown = sorted(set(value) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise SpecError(
            f"{where}: unknown field {unknown[0]!r} (matchLabels and/or matchExpressions)"
        )
    selector: dict[str, Any] = {}
    if "matchLabels" in value:
        labels = value["matchLabels"]
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise SpecError(f"{where}.matchLabels must map label names to string values")
        selector["matchLabels"] = dict(labels)
    if "matchExpressions" in value:
        expressions = value["matchExpressions"]
        if not isinstance(expressions, list):
            raise SpecError(f"{where}.matchExpressions must be a list")
        selector["matchExpressions"] = [
            _label_requirement(item, f"{where}.matchExpressions[{n}]")
            for n, item in enumerate(expressions)
        ]
    return selector


def _label_requirement(value: object, where: str) -> dict[str, Any]:
    """{key, operator, values}: values for In/NotIn only, as the API server requires."""
    if not isinstance(value, Mapping) or not isinstance(value.get("key"), str):
        raise SpecError(f"{where} must be an object with a key, an operator and values")
    operator = value.get("operator")
    if operator not in LABEL_SELECTOR_OPERATORS:
        raise SpecError(
            f"{where}.operator {operator!r} must be one of {', '.join(LABEL_SELECTOR_OPERATORS)}"
        )
    values = value.get("values") or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SpecError(f"{where}.values must be a list of strings")
    if (operator in ("In", "NotIn")) != bool(values):
        raise SpecError(f"{where}.values must be non-empty for In and NotIn and empty otherwise")
    requirement: dict[str, Any] = {"key": value["key"], "operator": operator}
    if values:
        requirement["values"] = list(values)
    return requirement


def _ip_block(value: object, where: str) -> dict[str, Any]:
    """{cidr, except}: every except range inside cidr, as the API server requires."""
    if not isinstance(value, Mapping) or not isinstance(value.get("cidr"), str):
        raise SpecError(f"{where} must be an object with a cidr such as 203.0.113.0/24")
    try:
        (network,) = parse_cidrs([value["cidr"]])
    except ValueError as error:
        raise SpecError(f"{where}.cidr: {error}") from None
    excepted = value.get("except") or []
    if not isinstance(excepted, list) or not all(isinstance(v, str) for v in excepted):
        raise SpecError(f"{where}.except must be a list of CIDRs")
    # normalized (host bits cleared), as the policy builder does with allowedCidrs: the API
    # server rejects an ipBlock whose cidr or except has host bits set
    block: dict[str, Any] = {"cidr": str(network)}
    normalized: list[str] = []
    for n, text in enumerate(excepted):
        try:
            (inner,) = parse_cidrs([text])
        except ValueError as error:
            raise SpecError(f"{where}.except[{n}]: {error}") from None
        inside = inner.version == network.version and inner.subnet_of(network)  # type: ignore[arg-type]
        if not inside or inner == network:
            raise SpecError(f"{where}.except[{n}] {text!r} must lie strictly inside {network}")
        normalized.append(str(inner))
    if normalized:
        block["except"] = normalized
    return block


def _resources(section: Mapping[str, Any], owner: str) -> Resources:
    raw = _section(section, "resources")
    parts: dict[str, dict[str, str]] = {}
    for key in ("requests", "limits"):
        values = raw.get(key) or {}
        if not isinstance(values, Mapping):
            raise SpecError(f"{owner}.resources.{key} must be a map such as {{cpu: 100m}}")
        parts[key] = {str(k): str(v) for k, v in values.items()}
        for name, text in parts[key].items():
            try:  # the CRD's pattern; the builders compute with these (redis_maxmemory)
                parse_quantity(text)
            except ValueError as error:
                raise SpecError(f"{owner}.resources.{key}.{name}: {error}") from None
    return Resources(requests=parts["requests"], limits=parts["limits"])


def _section(spec: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{key} must be an object")
    return value


def _bool(spec: Mapping[str, Any], key: str, default: bool, prefix: str = "") -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{prefix}{key} must be true or false, got {value!r}")
    return value
