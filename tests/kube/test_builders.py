"""Every manifest the operator renders: names, labels, owner refs, probes, security, disruption
budgets and stop grace. The brokers: test_builders_redis.py; the service pods' configuration:
test_builders_service.py; the network policies: test_builders_network.py."""

from __future__ import annotations

from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import build_all
from tests.kube.manifests import CREDS, CTX, by_kind_name, pod_specs, rendered, spec_of


def test_inventory_per_broker_and_per_topic() -> None:
    names = set(by_kind_name(rendered()))
    expected = {
        ("Secret", "orders-credentials"),
        ("ConfigMap", "orders-config"),
        ("NetworkPolicy", "orders-redis"),
        ("NetworkPolicy", "orders-service"),
        ("Service", "orders-service-headless"),
        ("Service", "orders-api"),
        ("StatefulSet", "orders-service"),
        ("PodDisruptionBudget", "orders-service"),
    }
    for broker in (0, 1):
        expected |= {
            ("Service", f"orders-redis-{broker}-headless"),
            ("Service", f"orders-redis-{broker}"),
            ("StatefulSet", f"orders-redis-{broker}"),
            ("PodDisruptionBudget", f"orders-redis-{broker}"),
        }
    assert names == expected


def test_service_monitor_only_when_requested() -> None:
    assert ("ServiceMonitor", "orders-api") not in by_kind_name(rendered(monitor=False))
    monitor = by_kind_name(rendered(monitor=True))["ServiceMonitor", "orders-api"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    # the token the pods require on /metrics, from the Secret in the monitor's namespace
    assert endpoint["bearerTokenSecret"] == {"name": "orders-credentials", "key": "metrics-token"}
    secret = by_kind_name(rendered())["Secret", "orders-credentials"]
    assert monitor["metadata"]["namespace"] == secret["metadata"]["namespace"]
    api = by_kind_name(rendered())["Service", "orders-api"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= api["metadata"]["labels"].items()
    headless = by_kind_name(rendered())["Service", "orders-service-headless"]
    assert not selector.items() <= headless["metadata"]["labels"].items()  # scraped once


def test_every_child_is_owned_labelled_and_namespaced() -> None:
    for manifest in rendered(monitor=True):
        meta = manifest["metadata"]
        assert meta["namespace"] == "shop"
        (owner,) = meta["ownerReferences"]
        assert owner["uid"] == "uid-1"
        assert owner["kind"] == "DelayTopic"
        assert owner["controller"] is True
        assert owner["blockOwnerDeletion"] is True
        assert meta["labels"][naming.LABEL_TOPIC] == "orders"
        assert meta["labels"][naming.LABEL_MANAGED_BY] == naming.MANAGED_BY
        assert meta["labels"]["team"] == "a"  # the owner's labels propagate (kopf.adopt)


def test_selectors_match_pod_templates() -> None:
    for manifest in rendered():
        if manifest["kind"] == "StatefulSet":
            selector = manifest["spec"]["selector"]["matchLabels"]
            labels = manifest["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items()


def test_pods_run_non_root_with_read_only_root_and_no_capabilities() -> None:
    for pod in pod_specs(rendered()):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_pods_have_probes_and_resources() -> None:
    for pod in pod_specs(rendered()):
        for container in pod["containers"]:
            assert container["readinessProbe"]
            assert container["livenessProbe"]
            assert container["resources"]["requests"]
            assert container["resources"]["limits"]["memory"]


def test_user_resources_win_over_defaults() -> None:
    spec = spec_of(
        worker={"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}},
        redis={"resources": {"requests": {"memory": "4Gi"}}},
    )
    items = by_kind_name(rendered(spec))
    service = items["StatefulSet", "orders-service"]["spec"]["template"]["spec"]["containers"][0]
    assert service["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}
    redis = items["StatefulSet", "orders-redis-0"]["spec"]["template"]["spec"]["containers"][0]
    assert redis["resources"]["requests"] == {"memory": "4Gi"}
    assert redis["resources"]["limits"] == {"memory": "512Mi"}


def test_disruption_budgets_allow_one_pod_at_a_time() -> None:
    for manifest in rendered():
        if manifest["kind"] == "PodDisruptionBudget":
            assert manifest["spec"]["maxUnavailable"] == 1


def test_build_all_is_pure_and_unowned() -> None:
    spec = spec_of()
    first = build_all(spec, CTX, CREDS, 16, False)
    assert first == build_all(spec, CTX, CREDS, 16, False)
    assert all("ownerReferences" not in m["metadata"] for m in first)


@pytest.mark.parametrize(
    ("fields", "waits_s"),
    [
        # a pull topic: the engine's 10 s handoff drain, the 20 s grace, 10 s for ZooKeeper
        ({}, 10 + 20 + 10),
        # a webhook POST may take its whole timeout, and its ack follows it
        (
            {
                "topicType": "webhook",
                "ackTimeout": "2m",
                "delivery": {"webhook": {"url": "https://x.example/h", "timeout": "60s"}},
            },
            60 + 2 + 20 + 10,
        ),
    ],
)
def test_a_service_pod_is_not_killed_before_its_stop_can_end(
    fields: dict[str, Any], waits_s: int
) -> None:
    """SIGKILL in the middle of a handoff redelivers every message whose POST was in flight:
    the pod's grace period covers every wait of the service's stop (a fixed 30 s did not)."""
    sts = by_kind_name(rendered(spec_of(**fields)))["StatefulSet", "orders-service"]
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > waits_s
