"""The platform's traces of every topic's delay-service pods (chart `topics.tracing`).

`delayq serve` exports spans when the standard `OTEL_*` variables ask for it
(service/tracing.py). On Kubernetes the platform decides where they go: the operator is given an
OTLP/HTTP endpoint, a sampler and the name of a Secret holding the exporter's headers (each
topic's namespace has its own copy, which the kubelet reads: the operator reads no tenant Secret),
and writes them as `OTEL_*` variables into the pods of every topic that has not opted out
(`spec.tracing.enabled: false`). No field of a topic names an endpoint, a header or a sampler, so
a tenant can switch its topic's spans off, never send them, or the platform's collector
credentials, anywhere else. The pods' egress policy opens the endpoint's port (any address: the
collector is named by a host name, like ZooKeeper), the platform's port, never a tenant's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ENDPOINT_ENV = "DELAYQ_TRACING_OTLP_ENDPOINT"
SAMPLER_ENV = "DELAYQ_TRACING_SAMPLER"
SAMPLER_ARG_ENV = "DELAYQ_TRACING_SAMPLER_ARG"
HEADERS_SECRET_ENV = "DELAYQ_TRACING_HEADERS_SECRET"
HEADERS_KEY_ENV = "DELAYQ_TRACING_HEADERS_KEY"
# the OpenTelemetry SDK's built-in samplers (OTEL_TRACES_SAMPLER); "" leaves its default,
# parentbased_always_on
SAMPLERS = (
    "",
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
# a Secret's name (DNS subdomain) and a key of its data
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class PodTracing:
    """Where and how the delay-service pods export spans; an empty endpoint: nowhere (off)."""

    otlp_endpoint: str = ""
    sampler: str = ""
    sampler_arg: str = ""
    headers_secret: str = ""  # in each topic's namespace; empty: no headers
    headers_key: str = "headers"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodTracing:
        """The chart's `topics.tracing` values, checked: a ValueError names the variable."""
        tracing = cls(
            otlp_endpoint=env.get(ENDPOINT_ENV, "").strip(),
            sampler=env.get(SAMPLER_ENV, "").strip(),
            sampler_arg=env.get(SAMPLER_ARG_ENV, "").strip(),
            headers_secret=env.get(HEADERS_SECRET_ENV, "").strip(),
            headers_key=env.get(HEADERS_KEY_ENV, "").strip() or cls.headers_key,
        )
        tracing.check()
        return tracing

    def check(self) -> None:
        if self.otlp_endpoint:
            self.port  # noqa: B018 - raises for an endpoint that is not http(s)://host[:port]
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"{SAMPLER_ENV}={self.sampler!r} must be one of {', '.join(SAMPLERS[1:])}"
            )
        if self.sampler_arg:
            if self.sampler not in RATIO_SAMPLERS:
                raise ValueError(f"{SAMPLER_ARG_ENV} is the ratio of {' or '.join(RATIO_SAMPLERS)}")
            try:
                ratio = float(self.sampler_arg)
            except ValueError:
                ratio = -1.0
            if not 0 <= ratio <= 1:
                raise ValueError(
                    f"{SAMPLER_ARG_ENV}={self.sampler_arg!r} must be a ratio between 0 and 1"
                )
        if self.headers_secret and not SECRET_NAME.match(self.headers_secret):
            raise ValueError(f"{HEADERS_SECRET_ENV}={self.headers_secret!r} is no Secret name")
        if not SECRET_KEY.match(self.headers_key):
            raise ValueError(f"{HEADERS_KEY_ENV}={self.headers_key!r} is no Secret key")

    @property
    def port(self) -> int:
        """The endpoint's TCP port (the scheme's when it names none), for the egress policy."""
        parts = urlsplit(self.otlp_endpoint)
        try:
            port = parts.port
        except ValueError:  # not a number, or out of range
            port = -1
        if (
            port == -1
            or parts.scheme not in DEFAULT_PORTS
            or not parts.hostname
            or parts.username is not None
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                f"{ENDPOINT_ENV}={self.otlp_endpoint!r} must be http(s)://host[:port][/path], "
                "with no credentials (put them in the headers Secret) and no query"
            )
        return port or DEFAULT_PORTS[parts.scheme]

    def pod_env(self, namespace: str, statefulset: str) -> list[dict[str, Any]]:
        """The `OTEL_*` variables of a traced topic's delay-service container (after
        POD_NAME, which the resource attributes refer to); none when tracing is off."""
        if not self.otlp_endpoint:
            return []
        resource = (
            f"k8s.namespace.name={namespace},k8s.statefulset.name={statefulset},"
            "k8s.pod.name=$(POD_NAME)"
        )
        env: list[dict[str, Any]] = [
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": self.otlp_endpoint},
            {"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": "http/protobuf"},
            {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": resource},
        ]
        if self.sampler:
            env.append({"name": "OTEL_TRACES_SAMPLER", "value": self.sampler})
        if self.sampler_arg:
            env.append({"name": "OTEL_TRACES_SAMPLER_ARG", "value": self.sampler_arg})
        if self.headers_secret:
            # optional: a namespace without the platform's copy still delivers (its exports
            # are refused by the collector, which the pod logs), rather than not starting
            selector = {"name": self.headers_secret, "key": self.headers_key, "optional": True}
            env.append(
                {"name": "OTEL_EXPORTER_OTLP_HEADERS", "valueFrom": {"secretKeyRef": selector}}
            )
        return env
