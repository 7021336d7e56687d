"""A topic's manifests as the operator renders them, for the tests of its builders: the build
context, credentials and owner of a test topic (`CTX`, `CREDS`, `OWNER`), a spec from CRD fields
(`spec_of`), its rendering (`rendered`) and lookups into it.

A module of its own, not a test file: the builders' tests (test_builders*.py) and the tests of
features that render manifests (placement, stream targets, ...) share it.
"""

from __future__ import annotations

from typing import Any

from delayq.kube.builders.bundle import render
from delayq.kube.builders.common import BuildContext, Credentials
from delayq.kube.spec import TopicSpec, parse_spec

CTX = BuildContext(image="delayq:test", redis_image="redis:test", operator_namespace="ops")
CREDS = Credentials(
    redis_password="pw",
    api_token="tok",
    zookeeper_password="zk",
    redis_admin_password="admin",
    read_token="viewer",
    metrics_token="scraper",
    lease_token_key="leasekey",
    operator_metrics_token="operator-scraper",
)
OWNER = {
    "apiVersion": "delayq.io/v1alpha1",
    "kind": "DelayTopic",
    "metadata": {"name": "orders", "namespace": "shop", "uid": "uid-1", "labels": {"team": "a"}},
}


def spec_of(**fields: Any) -> TopicSpec:
    return parse_spec("orders", "shop", fields)


def rendered(spec: TopicSpec | None = None, monitor: bool = False) -> list[dict[str, Any]]:
    spec = spec or spec_of(brokers=2, replicasPerBroker=2)
    return render(OWNER, spec, CTX, CREDS, spec.slot_amount, monitor)


def by_kind_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def pod_specs(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["spec"]["template"]["spec"] for m in manifests if m["kind"] == "StatefulSet"]


WEBHOOK = {"url": "https://hooks.example/h"}


def service_policy(spec: TopicSpec) -> dict[str, Any]:
    policy: dict[str, Any] = by_kind_name(rendered(spec))["NetworkPolicy", "orders-service"]
    return policy


def egress_of(spec: TopicSpec) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = service_policy(spec)["spec"]["egress"]
    return rules
