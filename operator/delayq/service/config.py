"""Settings of one `delayq serve` process: a frozen dataclass read from env, then flags (pure).

Every field is declared once; its environment variable (`DELAYQ_<FIELD>`) and its flag
(`--field-name`) are derived from the name, so the chart, the CLI and the tests cannot drift.
Precedence: defaults < the operator's topic file (`--config`) < environment < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import ipaddress
import os
import socket
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq.coordination.acl import ZkIdentity, topic_user
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.tls import ZkTls
from delayq.queue.backoff import Backoff, Jitter
from delayq.queue.consumer import DEFAULT_BATCH_SIZE
from delayq.queue.topic import EndAction, Topic, TopicError, TopicType
from delayq.service.defaults import DEFAULTS
from delayq.service.delivery.signing import Signer, parse_extra_headers
from delayq.service.delivery.targets import TargetPolicy, parse_cidrs, split_cidrs
from delayq.service.shutdown import GRACE_MS
from delayq.service.tokens import LeaseTokens, derived_key

ENV_PREFIX = "DELAYQ_"
#: What redis-py connects to (`stream_url`, from a tenant's Secret on Kubernetes).
STREAM_URL_SCHEMES = ("redis://", "rediss://", "unix://")


class ConfigError(ValueError):
    """A setting is missing or invalid; the text names the flag and the variable."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class ServiceConfig:
    """What one delay-service process serves, where it delivers and how it is reached."""

    redis_url: str = field(
        default="redis://127.0.0.1:6379/0", metadata=_help("Redis of the topic's broker")
    )
    redis_max_connections: int = field(
        default=128, metadata=_help("Redis connections per process at most (then callers wait)")
    )
    broker_urls: str = field(
        default="", metadata=_help("Redis of every broker, comma-separated by broker index")
    )
    namespace: str = field(default="default", metadata=_help("namespace of the topic"))
    topic: str = field(default="demo", metadata=_help("topic name"))
    slot_amount: int = field(
        default=DEFAULTS.slot_amount, metadata=_help("slots of the topic (power of two)")
    )
    topic_type: TopicType = field(
        default=DEFAULTS.topic_type, metadata=_help("delivery: pull, webhook or stream")
    )
    max_retries: int = field(
        default=DEFAULTS.max_retries, metadata=_help("attempts beyond this go to dead")
    )
    ack_timeout_ms: int = field(
        default=DEFAULTS.ack_timeout_ms, metadata=_help("lease length of a delivery")
    )
    max_payload_bytes: int = field(
        default=DEFAULTS.max_payload_bytes, metadata=_help("largest accepted payload")
    )
    journal_max_len: int = field(
        default=DEFAULTS.journal_max_len, metadata=_help("lifecycle journal cap (0: off)")
    )
    outcome_retention_ms: int = field(
        default=DEFAULTS.outcome_retention_ms,
        metadata=_help("how long a finished id is remembered: get, create-only dedup (0: off)"),
    )
    redis_sync_replicas: int = field(
        default=DEFAULTS.redis_sync_replicas,
        metadata=_help("replicas that confirm each acknowledged write before it is answered"),
    )
    redis_sync_timeout_ms: int = field(
        default=DEFAULTS.redis_sync_timeout_ms,
        metadata=_help("how long an acknowledged write waits for those replicas (then 503)"),
    )
    pull_max_lease_batch: int = field(
        default=DEFAULTS.pull_max_lease_batch, metadata=_help("pull: messages per lease at most")
    )
    webhook_url: str = field(
        default="", metadata=_help("webhook topics: URL each due message is POSTed to")
    )
    webhook_secret: str = field(
        default="",
        metadata=_help(
            "webhook topics: Standard Webhooks signing secret whsec_<base64>; during a rotation "
            "the new and the old one, space-separated, both sign (empty: unsigned)"
        ),
    )
    webhook_extra_headers: str = field(
        default="",
        metadata=_help(
            "webhook topics: headers sent with every POST, one `Name: value` per line "
            "(e.g. the receiver's Authorization)"
        ),
    )
    # True, like allow_private_targets: run by hand, a receiver on this machine is often plain
    # http; the operator writes the topic's value (CRD default false) into topic.json
    webhook_allow_insecure_http: bool = field(
        default=True,
        metadata=_help("webhook topics: also POST to an http:// URL (false: https only)"),
    )
    webhook_timeout_ms: int = field(
        default=DEFAULTS.webhook_timeout_ms, metadata=_help("webhook topics: timeout of one POST")
    )
    webhook_max_in_flight: int = field(
        default=DEFAULTS.webhook_max_in_flight,
        metadata=_help("webhook topics: concurrent POSTs at most"),
    )
    webhook_max_batch: int = field(
        default=DEFAULTS.webhook_max_batch,
        metadata=_help(
            "webhook topics: messages per POST at most; above 1 the receiver must answer each "
            "message of a batch (docs/service.md, Batched webhooks)"
        ),
    )
    # True, unlike the CRD's false: run by hand, the process and its URL are the platform's own
    # (often a receiver on this machine); the operator writes the topic's value into topic.json
    webhook_allow_private_targets: bool = field(
        default=True,
        metadata=_help(
            "webhook topics: also POST to loopback, private, link-local (cloud metadata) and "
            "other non-public addresses"
        ),
    )
    webhook_allowed_cidrs: str = field(
        default="",
        metadata=_help(
            "webhook topics: CIDRs POSTed to even when not public, comma-separated "
            "(10.96.0.0/12,fd00::/8)"
        ),
    )
    stream_url: str = field(
        default="",
        metadata=_help(
            "stream topics: Redis URL of the target stream, redis:// or rediss:// with its "
            "credentials (default: broker 0's Redis)"
        ),
    )
    # True, like webhook_allow_private_targets: run by hand, the target is often on this machine;
    # the operator writes the topic's value (CRD default false) into topic.json
    stream_allow_private_targets: bool = field(
        default=True,
        metadata=_help(
            "stream topics with stream_url: also connect to loopback, private, link-local and "
            "other non-public addresses, and to a unix:// socket"
        ),
    )
    stream_allowed_cidrs: str = field(
        default="",
        metadata=_help(
            "stream topics with stream_url: CIDRs connected to even when not public, "
            "comma-separated (10.96.0.0/12,fd00::/8)"
        ),
    )
    stream_key: str = field(
        default="", metadata=_help("stream topics: target stream key (default dq-out:<ns>/<t>)")
    )
    stream_max_len: int = field(
        default=DEFAULTS.stream_max_len,
        metadata=_help("stream topics: approximate MAXLEN of the target (0: none)"),
    )
    api_token: str = field(
        default="", metadata=_help("bearer token of the topic's HTTP API (empty: no auth)")
    )
    api_token_previous: str = field(
        default="",
        metadata=_help(
            "rotation: the former API token, accepted alongside the current one until every "
            "client has the new token (empty: only the current one)"
        ),
    )
    metrics_token: str = field(
        default="",
        metadata=_help("bearer token of /metrics, the API tokens also accepted (empty: open)"),
    )
    read_token: str = field(
        default="",
        metadata=_help(
            "bearer token that opens the topic's read-only routes (GETs, the dashboard's "
            "views) and /metrics but no write (empty: none)"
        ),
    )
    lease_token_key: str = field(
        default="",
        metadata=_help(
            "pull topics: key of the lease tokens' HMAC, the same in every process of the "
            "topic (empty: derived from api_token)"
        ),
    )
    insecure_no_auth: bool = field(
        default=False,
        metadata=_help("serve without an API token on a non-loopback host (the API is open)"),
    )
    host: str = field(default="127.0.0.1", metadata=_help("HTTP listen address"))
    port: int = field(default=8080, metadata=_help("HTTP listen port (0: any free port)"))
    zookeeper_connect: str = field(
        default="", metadata=_help("ZooKeeper hosts (empty: embedded, own every slot)")
    )
    zookeeper_session_timeout_ms: int = field(
        default=DEFAULTS.zookeeper_session_timeout_ms,
        metadata=_help("ZooKeeper session timeout: bounds the failover time"),
    )
    zookeeper_password: str = field(
        default="",
        metadata=_help("the topic's ZooKeeper password, user <namespace>.<topic> (empty: none)"),
    )
    zookeeper_admin_acl: str = field(
        default="",
        metadata=_help(
            "the operator's ZooKeeper ACL id (delayq-operator:<hash>): the nodes this process "
            "creates are then the topic's and the operator's only (empty: open nodes)"
        ),
    )
    zookeeper_tls: bool = field(
        default=False,
        metadata=_help("connect to ZooKeeper with TLS (the ensemble's secureClientPort)"),
    )
    zookeeper_tls_ca_file: str = field(
        default="",
        metadata=_help(
            "PEM CA certificate(s) of the ensemble's certificates (empty: the system's)"
        ),
    )
    zookeeper_tls_cert_file: str = field(
        default="",
        metadata=_help("PEM client certificate, for an ensemble that asks for one (empty: none)"),
    )
    zookeeper_tls_key_file: str = field(
        default="", metadata=_help("PEM key of the client certificate")
    )
    zookeeper_tls_verify_certs: bool = field(
        default=True,
        metadata=_help(
            "check the servers' certificates and host names (false: encrypted, not "
            "authenticated; for trying things out only)"
        ),
    )
    preferred_broker: str = field(
        default="",
        metadata=_help(
            "the broker whose slots this process prefers: its index or a name ending in it "
            "(broker-1; in a pod its name, <topic>-service-1)"
        ),
    )
    member_id: str = field(
        default="", metadata=_help("member name in ZooKeeper (default: host-pid)")
    )
    worker_concurrency: int = field(
        default=DEFAULTS.worker_concurrency,
        metadata=_help("deliveries in flight per process at most"),
    )
    batch_size: int = field(
        default=DEFAULT_BATCH_SIZE, metadata=_help("messages per claim at most")
    )
    retry_backoff_base_ms: int = field(
        default=DEFAULTS.retry_backoff_base_ms, metadata=_help("first retry delay")
    )
    retry_backoff_max_ms: int = field(
        default=DEFAULTS.retry_backoff_max_ms, metadata=_help("longest retry delay")
    )
    retry_backoff_multiplier: float = field(
        default=DEFAULTS.retry_backoff_multiplier,
        metadata=_help("each retry waits this many times the previous one (1..10)"),
    )
    retry_jitter: Jitter = field(
        default=DEFAULTS.retry_jitter,
        metadata=_help("none: wait the exponential delay; full: a random time up to it"),
    )
    retry_for_ms: int = field(
        default=DEFAULTS.retry_for_ms,
        metadata=_help("retries end this long after the first attempt (0: maxRetries only)"),
    )
    retry_exhausted_action: EndAction = field(
        default=DEFAULTS.retry_exhausted_action,
        metadata=_help("dead: keep a message whose retries ended in dead; drop: delete it"),
    )
    expiry_ttl_ms: int = field(
        default=DEFAULTS.expiry_ttl_ms,
        metadata=_help("a message without its own expiry expires this long after its due time"),
    )
    expiry_action: EndAction = field(
        default=DEFAULTS.expiry_action,
        metadata=_help("dead: move a message past its expiry to dead; drop: delete it"),
    )
    limits_max_pending: int = field(
        default=DEFAULTS.limits_max_pending,
        metadata=_help("at most this many messages scheduled or in flight, 0: no limit"),
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata=_help("largest HTTP request body")
    )
    read_timeout_ms: int = field(
        default=10_000,
        metadata=_help(
            "HTTP: a request's headers, and then its body, must arrive within this; "
            "idle keep-alive connections close after it"
        ),
    )
    grace_ms: int = field(
        default=GRACE_MS, metadata=_help("SIGTERM: longest wait for in-flight deliveries")
    )
    log_level: str = field(default="INFO", metadata=_help("logging level"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic_type", TopicType(self.topic_type))
        for name, kind in _CHOICES.items():
            try:
                object.__setattr__(self, name, kind(getattr(self, name)))
            except ValueError:
                choices = " or ".join(choice.value for choice in kind)
                raise ConfigError(f"{_names(name)} must be {choices}") from None
        if not 1.0 <= self.retry_backoff_multiplier <= 10.0:
            raise ConfigError(f"{_names('retry_backoff_multiplier')} must be between 1 and 10")
        if self.retry_backoff_max_ms < self.retry_backoff_base_ms:
            raise ConfigError(
                f"{_names('retry_backoff_max_ms')} must not be shorter than "
                f"{_names('retry_backoff_base_ms')}"
            )
        try:
            self.to_topic()
        except TopicError as error:
            raise ConfigError(str(error)) from error
        if self.topic_type is TopicType.WEBHOOK and not self.webhook_url:
            raise ConfigError(_needs("webhook_url", "a webhook topic"))
        if (
            self.topic_type is TopicType.WEBHOOK
            and not self.webhook_allow_insecure_http
            and not self.webhook_url.startswith("https://")
        ):
            raise ConfigError(
                f"{_names('webhook_url')} must start with https:// unless "
                f"{_names('webhook_allow_insecure_http')} is true"
            )
        for name, parse in (
            ("webhook_secret", Signer),
            ("webhook_extra_headers", parse_extra_headers),
        ):
            try:
                parse(getattr(self, name))
            except ValueError as error:
                raise ConfigError(f"{_names(name)}: {error}") from None
        if self.stream_url and not self.stream_url.startswith(STREAM_URL_SCHEMES):
            # the URL may carry a password: named, never echoed
            raise ConfigError(
                f"{_names('stream_url')} must start with redis://, rediss:// or unix://"
            )
        if self.stream_url.startswith("unix://") and not self.stream_allow_private_targets:
            raise ConfigError(
                f"{_names('stream_url')}: a unix:// socket is a local target: it needs "
                f"{_names('stream_allow_private_targets')}"
            )
        if self.zookeeper_admin_acl and not self.zookeeper_password:
            raise ConfigError(_needs("zookeeper_password", _names("zookeeper_admin_acl")))
        for name in ("zookeeper_tls_ca_file", "zookeeper_tls_cert_file", "zookeeper_tls_key_file"):
            if getattr(self, name) and not self.zookeeper_tls:
                raise ConfigError(_needs("zookeeper_tls", _names(name)))
        if bool(self.zookeeper_tls_cert_file) != bool(self.zookeeper_tls_key_file):
            raise ConfigError(
                f"{_names('zookeeper_tls_cert_file')} and {_names('zookeeper_tls_key_file')} "
                "go together"
            )
        if self.api_token_previous and not self.api_token:  # else the API would be open
            raise ConfigError(_needs("api_token", _names("api_token_previous")))
        if self.read_token and not self.api_token:  # a read-only token of an open API
            raise ConfigError(_needs("api_token", _names("read_token")))
        for name in ("webhook_allowed_cidrs", "stream_allowed_cidrs"):
            try:
                parse_cidrs(split_cidrs(getattr(self, name)))
            except ValueError as error:
                raise ConfigError(f"{_names(name)}: {error}") from None
        for name in (
            "webhook_timeout_ms",
            "webhook_max_in_flight",
            "webhook_max_batch",
            "worker_concurrency",
            "redis_max_connections",
            "batch_size",
            "retry_backoff_base_ms",
            "max_body_bytes",
            "read_timeout_ms",
            "grace_ms",
            "zookeeper_session_timeout_ms",
            "pull_max_lease_batch",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_names(name)} must be at least 1")
        if self.topic_type is TopicType.WEBHOOK and self.webhook_timeout_ms >= self.ack_timeout_ms:
            raise ConfigError(
                f"{_names('webhook_timeout_ms')} must be shorter than {_names('ack_timeout_ms')}: "
                "a lease must outlive the POST it covers, or the message is delivered twice"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"{_names('port')} must be between 0 and 65535")

    @property
    def zookeeper_identity(self) -> ZkIdentity | None:
        """The topic's ZooKeeper login (user `<namespace>.<topic>`), when it has a password."""
        if not self.zookeeper_password:
            return None
        return ZkIdentity(topic_user(self.namespace, self.topic), self.zookeeper_password)

    @property
    def zookeeper_client_tls(self) -> ZkTls | None:
        """How the ZooKeeper clients connect: TLS settings, or None for a plain connection."""
        if not self.zookeeper_tls:
            return None
        return ZkTls(
            self.zookeeper_tls_ca_file,
            self.zookeeper_tls_cert_file,
            self.zookeeper_tls_key_file,
            self.zookeeper_tls_verify_certs,
        )

    @property
    def zookeeper_connection(self) -> ZkConnection | None:
        """How a client that routes reaches the topic's ZooKeeper (None: not configured)."""
        if not self.zookeeper_connect:
            return None
        return ZkConnection(
            self.zookeeper_connect, self.zookeeper_identity, self.zookeeper_client_tls
        )

    def to_topic(self) -> Topic:
        return Topic.from_settings(self, name=self.topic)

    @property
    def broker_redis_urls(self) -> list[str]:
        """Redis URL of each broker by index; a single-broker topic is just `redis_url`."""
        return [url for url in self.broker_urls.split(",") if url] or [self.redis_url]

    @property
    def backoff(self) -> Backoff:
        """The retry policy of failed deliveries."""
        return Backoff(
            self.retry_backoff_base_ms,
            self.retry_backoff_multiplier,
            self.retry_backoff_max_ms,
            self.retry_jitter,
        )

    @property
    def webhook_targets(self) -> TargetPolicy:
        """The addresses the webhook sink may connect to (its SSRF guard)."""
        return TargetPolicy(
            self.webhook_allow_private_targets,
            parse_cidrs(split_cidrs(self.webhook_allowed_cidrs)),
        )

    @property
    def stream_targets(self) -> TargetPolicy:
        """The addresses an external stream target (`stream_url`) may be connected on."""
        return TargetPolicy(
            self.stream_allow_private_targets,
            parse_cidrs(split_cidrs(self.stream_allowed_cidrs)),
            subject="stream",
        )

    def lease_tokens(self) -> LeaseTokens:
        """The topic's lease tokens as issued and checked from now on: unsigned ones of the
        previous version accepted for one lease length (`ack_timeout_ms`), see tokens.py."""
        key = self.lease_token_key.encode() if self.lease_token_key else None
        return LeaseTokens(
            key or derived_key(self.api_token), self.namespace, self.topic, self.ack_timeout_ms
        )

    @property
    def webhook_signer(self) -> Signer:
        """Signs each delivery with every secret of `webhook_secret` (none: unsigned)."""
        return Signer(self.webhook_secret)

    @property
    def webhook_headers(self) -> dict[str, str]:
        """The extra headers of every POST."""
        return parse_extra_headers(self.webhook_extra_headers)

    @property
    def member(self) -> str:
        return self.member_id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def target_stream(self) -> str:
        return self.stream_key or f"dq-out:{self.namespace}/{self.topic}"

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, base: Mapping[str, Any] | None = None
    ) -> ServiceConfig:
        """DELAYQ_* variables over `base` settings (e.g. the operator's topic file)."""
        env = os.environ if env is None else env
        values = dict(base or {})
        values.update(
            {
                f.name: _convert(f.name, env[env_name(f.name)])
                for f in dataclasses.fields(cls)
                if env_name(f.name) in env
            }
        )
        return cls(**values)

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, base: ServiceConfig | None = None
    ) -> ServiceConfig:
        """Flags given on the command line override `base` (by default, the environment)."""
        base = cls.from_env() if base is None else base
        changes = {
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(cls)
            if getattr(args, f.name, None) is not None
        }
        return dataclasses.replace(base, **changes)


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """One flag per setting (only those of `names`, for a command that needs a few, without
    `--config`); unset flags stay None so the environment and defaults apply."""
    if names is None:
        parser.add_argument(
            "--config",
            help="the operator's topic.json: settings below the environment and the flags",
        )
    for f in dataclasses.fields(ServiceConfig):
        if names is not None and f.name not in names:
            continue
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            help=f"{f.metadata['help']} (env {env_name(f.name)}, default {_shown(f.default)})",
            **_value_options(f.name),
        )


def _value_options(name: str) -> dict[str, Any]:
    """A boolean's flag is a switch that may take a value (given alone: true; `--flag false`
    turns off a setting that defaults to true; absent: None, so the environment applies);
    every other flag takes one value of the field's type."""
    kind = _HINTS[name]
    if kind is bool:
        return {"nargs": "?", "const": True, "type": _parse_bool, "metavar": "true|false"}
    choices = list(kind) if isinstance(kind, type) and issubclass(kind, enum.Enum) else None
    return {"type": _parser_of(name), "choices": choices}


def _shown(default: Any) -> str:
    """A default as a user types it: `pull`, not `<TopicType.PULL: 'pull'>`; `''` for empty."""
    if isinstance(default, enum.Enum):
        return str(default.value)
    if isinstance(default, bool):
        return str(default).lower()
    return repr(default)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine can connect. Any other name, and the
    empty host (every interface), counts as reachable from the network."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(config: ServiceConfig) -> None:
    """Refuse to serve the API without a token to anything beyond this machine unless told so:
    an empty token (the default) would otherwise open every topic route to the network.

    Not in `__post_init__`: the environment and the flags are applied one after the other, and
    the token may come only with the flags."""
    if config.api_token or config.insecure_no_auth or is_loopback(config.host):
        return
    raise ConfigError(
        f"{_names('host')} is {config.host!r}, not loopback, and {_names('api_token')} is "
        f"empty: set a token, or pass {flag_name('insecure_no_auth')} "
        f"({env_name('insecure_no_auth')}=true) to serve the API without auth"
    )


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


#: The settings that take one of an enum's values, checked (and converted) on construction.
_CHOICES: dict[str, type[Jitter] | type[EndAction]] = {
    "retry_jitter": Jitter,
    "retry_exhausted_action": EndAction,
    "expiry_action": EndAction,
}


def _names(name: str) -> str:
    return f"{flag_name(name)} ({env_name(name)})"


def _needs(name: str, what: str) -> str:
    return f"{what} needs {_names(name)}"


_HINTS: dict[str, Any] = typing.get_type_hints(ServiceConfig)


def _parser_of(name: str) -> Any:
    kind = _HINTS[name]
    if kind is bool:
        return _parse_bool
    return kind


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parse_bool(raw: str) -> bool:
    """`bool("false")` is True: a variable says true or false in words (or 1/0, yes/no)."""
    try:
        return _BOOLEANS[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"expected one of {', '.join(_BOOLEANS)}") from None


def _convert(name: str, raw: str) -> Any:
    try:
        return _parser_of(name)(raw)
    except ValueError as error:
        raise ConfigError(f"{env_name(name)}={raw!r}: {error}") from error
