"""`topic.json`: the operator's description of one topic for `delayq serve --config` (pure).

`TopicFile` is the whole contract: the operator's builder (`delayq.kube.builders.service`)
constructs one and writes `to_json()` into the topic's ConfigMap; `delayq serve --config` reads
it back with `from_json()`. The JSON object is flat: one key per field, and one per topic
setting of `settings` (the settings table's rows `delayq serve` takes), each named like the
`delayq serve` setting, flag and environment variable of the same name (see
docs/architecture.md, "One name per setting"). Reading is strict: an unknown, missing or
mistyped key is a one-line `ConfigError` naming the key, never a silent default.

Secrets are not in the file: the pod's environment carries `DELAYQ_REDIS_PASSWORD`,
`DELAYQ_API_TOKEN` and `DELAYQ_ZOOKEEPER_PASSWORD` (a webhook topic's also
`DELAYQ_WEBHOOK_SECRET` and `DELAYQ_WEBHOOK_EXTRA_HEADERS`, from the tenant's Secrets), and
`POD_NAME` (`<topic>-service-<i>`)
names the member and, by its ordinal, the broker it prefers.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from delayq.queue import acl
from delayq.queue.settings import SETTINGS, Kind, Setting
from delayq.service.config import ConfigError, ServiceConfig


def _python_type(row: Setting) -> Any:
    """The type a setting has in the file: an int for a duration (milliseconds)."""
    if row.kind in (Kind.DURATION, Kind.INTEGER):
        return int
    return type(row.default)


#: The table's settings `delayq serve` takes, which the file carries, by their type.
SERVE_SETTINGS: dict[str, Any] = {row.name: _python_type(row) for row in SETTINGS if row.serve}


@dataclass(frozen=True)
class TopicFile:
    """Everything `delayq serve` needs from the operator about one topic (no secrets)."""

    namespace: str
    topic: str
    brokers: int
    # the topic's settings that `delayq serve` takes: one key per row of the settings table
    # whose `serve` is true (delayq.queue.settings), by its Python name, typed by its kind
    settings: Mapping[str, Any]
    webhook_url: str
    webhook_allowed_cidrs: str  # comma-separated, as the setting
    stream_key: str
    stream_allowed_cidrs: str
    zookeeper_connect: str
    zookeeper_admin_acl: str  # the operator's ACL id; the password comes from the environment
    # TLS to the ensemble: the CA file is the ConfigMap's copy of the operator's CA (mounted
    # next to this file); the pods present no client certificate
    zookeeper_tls: bool
    zookeeper_tls_ca_file: str
    zookeeper_tls_verify_certs: bool
    # broker b's master is `redis_master_host_template.format(broker=b)`, b = 0..brokers-1
    redis_master_host_template: str
    redis_port: int
    http_port: int

    def __post_init__(self) -> None:
        if set(self.settings) != set(SERVE_SETTINGS):
            missing = sorted(set(SERVE_SETTINGS) - set(self.settings))
            unknown = sorted(set(self.settings) - set(SERVE_SETTINGS))
            raise ConfigError(f"topic file: settings missing {missing}, unknown {unknown}")

    def setting(self, name: str) -> Any:
        """One of the topic's settings (KeyError: not a setting serve takes)."""
        return self.settings[name]

    def to_json(self) -> str:
        """The ConfigMap's `topic.json`: stable (sorted keys), so its hash rolls pods only on a
        real change."""
        document = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        document.update(document.pop("settings"))
        for name, value in document.items():
            if isinstance(value, enum.Enum):
                document[name] = value.value
        return json.dumps(document, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TopicFile:
        """Parse strictly; a ConfigError names the first unknown, missing or bad key."""
        try:
            document = json.loads(text)
        except ValueError as error:
            raise ConfigError(f"topic file: not JSON: {error}") from None
        if not isinstance(document, dict):
            raise ConfigError("topic file: must be a JSON object")
        known = [*_FIELD_TYPES, *SERVE_SETTINGS]
        for key in document:
            if key not in known:
                raise ConfigError(f"topic file: unknown key {key!r}")
        values: dict[str, Any] = {}
        for name in known:
            if name not in document:
                raise ConfigError(f"topic file: missing key {name!r}")
            kind = _FIELD_TYPES.get(name) or SERVE_SETTINGS[name]
            values[name] = _typed(name, kind, document[name])
        settings = {name: values.pop(name) for name in SERVE_SETTINGS}
        return cls(settings=settings, **values)

    def service_settings(self, env: Mapping[str, str]) -> dict[str, Any]:
        """ServiceConfig keyword arguments: this file plus the pod's environment."""
        urls = self.broker_urls(env.get("DELAYQ_REDIS_PASSWORD", ""))
        settings: dict[str, Any] = dict(self.settings)
        settings.update(
            (name, getattr(self, name)) for name in _FIELD_TYPES if name in _SERVICE_SETTINGS
        )
        settings.update(
            port=self.http_port,
            host="0.0.0.0",  # in a pod: reachable by probes, the Service and Prometheus
            redis_url=urls[0],
            broker_urls=",".join(urls),
        )
        if env.get("POD_NAME"):
            settings["member_id"] = env["POD_NAME"]
            settings["preferred_broker"] = env["POD_NAME"]  # its ordinal is the preferred broker
        return settings

    def broker_urls(self, password: str) -> list[str]:
        """One Redis URL per broker index, from the master host template, logged in as the
        topic's restricted Redis user (delayq.queue.acl)."""
        auth = f"{acl.SERVICE_USER}:{quote(password, safe='')}@" if password else ""
        template = self.redis_master_host_template
        return [
            f"redis://{auth}{template.format(broker=b)}:{self.redis_port}/0"
            for b in range(self.brokers)
        ]


#: The fields of the file besides the settings, by type.
_FIELD_TYPES: dict[str, Any] = {
    name: kind for name, kind in typing.get_type_hints(TopicFile).items() if name != "settings"
}
# fields that are `delayq serve` settings of the same name (the others locate brokers and port)
_SERVICE_SETTINGS = frozenset(f.name for f in dataclasses.fields(ServiceConfig))


def _typed(name: str, kind: Any, value: object) -> Any:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(str(value))
        except ValueError:
            choices = ", ".join(t.value for t in kind)
            raise ConfigError(f"topic file: key {name!r} must be one of {choices}") from None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"topic file: key {name!r} must be a number, got {value!r}")
        return float(value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"topic file: key {name!r} must be true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"topic file: key {name!r} must be an integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"topic file: key {name!r} must be a string, got {value!r}")
    return value


def read_topic_file(path: str | Path, env: Mapping[str, str]) -> dict[str, Any]:
    """`delayq serve --config PATH`: ServiceConfig keyword arguments from the file and env."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"--config {path}: {error}") from error
    try:
        return TopicFile.from_json(text).service_settings(env)
    except ConfigError as error:
        raise ConfigError(f"--config {path}: {error}") from None
