"""Settings of one `delayq serve` process: a frozen dataclass read from env, then flags (pure).

Every field is declared once; its environment variable (`DELAYQ_<FIELD>`) and its flag
(`--field-name`) are derived from the name (`env_name`, `flag_name`), so the chart, the CLI and
the tests cannot drift. A topic setting's default, help and bounds, and the rules between
settings, are its row of the settings table (`delayq.queue.settings`).
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
from delayq.queue.keys import ENGINE_KEY_MESSAGE, is_engine_key
from delayq.queue.pacing import MAX_HELD_MS
from delayq.queue.settings import SETTINGS, Kind, broken_rule, by_name

# re-exported: the names of a setting's variable and flag, for the layers that set them
from delayq.queue.settings import env_name as env_name
from delayq.queue.settings import flag_name as flag_name
from delayq.queue.topic import EndAction, Topic, TopicError, TopicType
from delayq.service.delivery.signing import Signer, parse_extra_headers
from delayq.service.delivery.targets import TargetPolicy, parse_cidrs, split_cidrs
from delayq.service.shutdown import GRACE_MS
from delayq.service.tokens import LeaseTokens, derived_key

#: What redis-py connects to (`stream_url`, from a tenant's Secret on Kubernetes).
STREAM_URL_SCHEMES = ("redis://", "rediss://", "unix://")


class ConfigError(ValueError):
    """A setting is missing or invalid; the text names the flag and the variable."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def _setting(name: str) -> Any:
    """The field of a topic setting: its default (a hand-run serve's) and help from the
    settings table."""
    row = by_name(name)
    return field(default=row.default_for_serve, metadata=_help(row.help))


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
    slot_amount: int = _setting("slot_amount")
    topic_type: TopicType = _setting("topic_type")
    max_retries: int = _setting("max_retries")
    ack_timeout_ms: int = _setting("ack_timeout_ms")
    max_payload_bytes: int = _setting("max_payload_bytes")
    journal_max_len: int = _setting("journal_max_len")
    outcome_retention_ms: int = _setting("outcome_retention_ms")
    redis_sync_replicas: int = _setting("redis_sync_replicas")
    redis_sync_timeout_ms: int = _setting("redis_sync_timeout_ms")
    redis_record_buckets: bool = _setting("redis_record_buckets")
    redis_store_buckets: bool = _setting("redis_store_buckets")
    redis_store_buckets_after_ms: int = _setting("redis_store_buckets_after_ms")
    pull_max_lease_batch: int = _setting("pull_max_lease_batch")
    rate_limit_per_second: float = _setting("rate_limit_per_second")
    rate_limit_burst: int = _setting("rate_limit_burst")
    max_in_flight_per_group: int = _setting("max_in_flight_per_group")
    objectives_lateness_p99_ms: int = _setting("objectives_lateness_p99_ms")
    objectives_window_ms: int = _setting("objectives_window_ms")
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
    webhook_allow_insecure_http: bool = _setting(
        "webhook_allow_insecure_http"
    )  # true run by hand: docs/service.md
    webhook_timeout_ms: int = _setting("webhook_timeout_ms")
    webhook_max_in_flight: int = _setting("webhook_max_in_flight")
    webhook_max_batch: int = _setting("webhook_max_batch")
    webhook_max_held_ms: int = field(
        default=MAX_HELD_MS,
        metadata=_help(
            "webhook topics: ms past its due a message may be held back by receivers' "
            "Retry-After without spending an attempt; after that each hold is a failed attempt"
        ),
    )
    webhook_allow_private_targets: bool = _setting(
        "webhook_allow_private_targets"
    )  # true run by hand: docs/service.md
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
    stream_allow_private_targets: bool = _setting(
        "stream_allow_private_targets"
    )  # true run by hand: docs/service.md
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
    stream_max_len: int = _setting("stream_max_len")
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
    operator_metrics_token: str = field(
        default="",
        metadata=_help(
            "a second bearer token of /metrics and nothing else: the operator's, which it "
            "reads the lateness with for the topic's objectives (empty: none)"
        ),
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
    wait_for_brokers: bool = field(
        default=False,
        metadata=_help(
            "a broker or ZooKeeper unreachable at start: answer /healthz and wait for it "
            "(unready) instead of exiting 1 (the operator's pods)"
        ),
    )
    host: str = field(default="127.0.0.1", metadata=_help("HTTP listen address"))
    port: int = field(default=8080, metadata=_help("HTTP listen port (0: any free port)"))
    zookeeper_connect: str = field(
        default="", metadata=_help("ZooKeeper hosts (empty: embedded, own every slot)")
    )
    zookeeper_session_timeout_ms: int = _setting("zookeeper_session_timeout_ms")
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
    worker_concurrency: int = _setting("worker_concurrency")
    batch_size: int = field(
        default=DEFAULT_BATCH_SIZE, metadata=_help("messages per claim at most")
    )
    retry_backoff_base_ms: int = _setting("retry_backoff_base_ms")
    retry_backoff_max_ms: int = _setting("retry_backoff_max_ms")
    retry_backoff_multiplier: float = _setting("retry_backoff_multiplier")
    retry_jitter: Jitter = _setting("retry_jitter")
    retry_for_ms: int = _setting("retry_for_ms")
    retry_exhausted_action: EndAction = _setting("retry_exhausted_action")
    expiry_ttl_ms: int = _setting("expiry_ttl_ms")
    expiry_action: EndAction = _setting("expiry_action")
    limits_max_pending: int = _setting("limits_max_pending")
    max_body_bytes: int = _setting("max_body_bytes")
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
        for name, kind in _CHOICES.items():
            try:
                object.__setattr__(self, name, kind(getattr(self, name)))
            except ValueError:
                choices = " or ".join(choice.value for choice in kind)
                raise ConfigError(f"{_names(name)} must be {choices}") from None
        for row in _BOUNDED:
            if row.out_of_range(getattr(self, row.name)):
                raise ConfigError(
                    f"{_names(row.name)} must be {row.between()} (got {getattr(self, row.name)!r})"
                )
        broken = broken_rule({name: getattr(self, name) for name in _TABLE_NAMES})
        if broken is not None:
            given = ", ".join(
                f"{name}={getattr(self, name)}" for name in broken.names if name != "topic_type"
            )
            raise ConfigError(f"{_names(broken.names[0])}: {broken.message} ({given})")
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
        if is_engine_key(self.stream_key):
            raise ConfigError(f"{_names('stream_key')} {ENGINE_KEY_MESSAGE}")
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
            "redis_max_connections",
            "batch_size",
            "read_timeout_ms",
            "grace_ms",
            "webhook_max_held_ms",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_names(name)} must be at least 1")
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
        """The topic's lease tokens as issued and checked (signed only, see tokens.py)."""
        key = self.lease_token_key.encode() if self.lease_token_key else None
        return LeaseTokens(key or derived_key(self.api_token), self.namespace, self.topic)

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


#: The settings of the table `delayq serve` takes, and those of them with bounds.
_TABLE_NAMES = tuple(row.name for row in SETTINGS if row.serve)
_BOUNDED = tuple(
    row for row in SETTINGS if row.serve and row.kind in (Kind.INTEGER, Kind.DURATION, Kind.NUMBER)
)

#: The settings that take one of an enum's values, checked (and converted) on construction.
_CHOICES: dict[str, type[enum.Enum]] = {
    row.name: type(row.default)
    for row in SETTINGS
    if row.serve and isinstance(row.default, enum.Enum)
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
