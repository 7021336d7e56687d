"""DelayTopics as the API server shows them: the manifest, the children the operator makes for
one, its reconciled status, its Secret's values and the Events `kubectl describe` lists.

Shared by every test that lets an operator provision a topic (a local process on KWOK, or the
chart's own on the real node), so "reconciled" and "Running" mean the same thing in each.
"""

from __future__ import annotations

import base64
from typing import Any

from e2e.harness.kube import Kube, condition
from e2e.harness.operator import LocalOperator

TOPIC_LABEL = "delayq.io/topic"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Every kind the operator creates for a topic (ServiceMonitor only with Prometheus Operator).
CHILD_KINDS = ("statefulsets", "services", "configmaps", "secrets", "poddisruptionbudgets",
               "networkpolicies")


def delay_topic(name: str, **spec: Any) -> dict[str, Any]:
    """A DelayTopic manifest (its namespace is the one it is applied to)."""
    return {"apiVersion": "delayq.io/v1alpha1", "kind": "DelayTopic",
            "metadata": {"name": name}, "spec": spec}


def topic_children(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every object of the child kinds labelled with the topic."""
    found: list[dict[str, Any]] = []
    for kind in CHILD_KINDS:
        found += kube.items(kind, namespace, selector=f"{TOPIC_LABEL}={name}")
    return found


def reconciled(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The topic once status.observedGeneration has caught up and Provisioned is True."""
    obj = kube.get("dt", name, namespace)
    if not obj or obj.get("status", {}).get("observedGeneration") != \
            obj["metadata"]["generation"]:
        return None
    return obj if condition(obj, "Provisioned") == "True" else None


def wait_reconciled(kube: Kube, op: LocalOperator, namespace: str, name: str,
                    timeout: float = 180) -> dict[str, Any]:
    """The reconciled topic; on a timeout the operator's log tail and the topic explain why."""
    try:
        return kube.wait(lambda: reconciled(kube, namespace, name), timeout_s=timeout,
                         what=f"DelayTopic {name} reconciled (observedGeneration, Provisioned)")
    except Exception:
        print(f"--- operator log tail:\n{op.tail()}\n--- topic: {kube.get('dt', name, namespace)}")
        raise


def redis_statefulsets(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    """The topic's Redis StatefulSets, one per broker."""
    return kube.items("statefulsets", namespace,
                      selector=f"{TOPIC_LABEL}={name},{COMPONENT_LABEL}=redis")


def all_pods_running(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]] | None:
    """Pods of every StatefulSet of the topic, once each set has all its replicas Running."""
    sets = kube.items("statefulsets", namespace, selector=f"{TOPIC_LABEL}={name}")
    expected = sum(s["spec"]["replicas"] for s in sets)
    pods = kube.items("pods", namespace, selector=f"{TOPIC_LABEL}={name}")
    running = [p for p in pods if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    ready_sets = all(s["status"].get("readyReplicas", 0) == s["spec"]["replicas"]
                     and s["status"].get("updatedReplicas", 0) == s["spec"]["replicas"]
                     for s in sets)
    return running if sets and ready_sets and len(running) == expected else None


def ready_condition(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The topic's Ready condition ({} while it has none)."""
    obj = kube.get("dt", name, namespace) or {}
    return next((c for c in obj.get("status", {}).get("conditions", [])
                 if c.get("type") == "Ready"), {})


def described_with(kube: Kube, namespace: str, name: str, reasons: tuple[str, ...]) -> str | None:
    """`kubectl describe dt` once its Events section lists every one of `reasons`."""
    text = kube.kubectl("describe", "dt", name, "-n", namespace).stdout
    events = text.partition("\nEvents:")[2]
    return text if all(reason in events for reason in reasons) else None


def topic_secret(kube: Kube, namespace: str, name: str, key: str) -> str:
    """One value of the Secret the operator created for the topic."""
    secret = kube.get("secret", f"{name}-credentials", namespace)
    assert secret is not None
    return base64.b64decode(secret["data"][key]).decode()


def topic_credentials(kube: Kube, namespace: str, name: str) -> tuple[str, str]:
    """(Redis password, API token) from the Secret the operator created for the topic."""
    return (topic_secret(kube, namespace, name, "redis-password"),
            topic_secret(kube, namespace, name, "api-token"))
