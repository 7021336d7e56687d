"""The control plane itself does what the operator relies on.

These tests need no delayq code. They pin down the platform behaviour the operator's design
leans on (scheduling onto nodes, owner-reference garbage collection, namespace finalization),
so that a failure in the operator's e2e tests can be told apart from a broken harness.
"""

from __future__ import annotations

from typing import Any

from e2e.harness.kube import Kube, condition

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": PAUSE_IMAGE}]},
            },
        },
    }


def test_namespace_can_be_created(kube: Kube, namespace: str) -> None:
    """The namespace fixture's namespace exists, is Active and got its default ServiceAccount."""
    ns = kube.get("namespace", namespace)
    assert ns is not None
    assert ns["status"]["phase"] == "Active"
    assert kube.get("serviceaccount", "default", namespace) is not None


def test_deployment_pods_are_scheduled_and_running(kube: Kube, namespace: str) -> None:
    """Deployment -> ReplicaSet -> Pods, scheduled onto nodes and Running (KWOK locally)."""
    kube.apply(_deployment("pause", replicas=2), namespace)

    def running_pods() -> list[dict[str, Any]] | None:
        pods = kube.items("pods", namespace, selector="app=pause")
        running = [p for p in pods if p["status"].get("phase") == "Running"
                   and condition(p, "Ready") == "True"]
        return running if len(running) == 2 else None

    pods = kube.wait(running_pods, timeout_s=120, what="2 Running pods of the Deployment")
    assert all(pod["spec"].get("nodeName") for pod in pods)
    deployment = kube.wait(
        lambda: (d := kube.get("deployment", "pause", namespace))
        and d["status"].get("readyReplicas") == 2 and d,
        timeout_s=60, what="Deployment readyReplicas=2")
    assert condition(deployment, "Available") == "True"


def test_owned_configmap_is_garbage_collected(kube: Kube, namespace: str) -> None:
    """Deleting an owner makes controller-manager's garbage collector delete its dependents.

    The operator never deletes a DelayTopic's children itself; it sets owner references and
    relies on exactly this.
    """
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "owner"}, "data": {}}, namespace)
    owner = kube.get("configmap", "owner", namespace)
    assert owner is not None
    kube.create({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "child", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner["metadata"]["uid"], "controller": True,
            "blockOwnerDeletion": True}]},
        "data": {"k": "v"},
    }, namespace)
    kube.kubectl("delete", "configmap", "owner", "-n", namespace, "--wait=true")
    kube.wait(lambda: kube.get("configmap", "child", namespace) is None, timeout_s=90,
              what="the owned ConfigMap to be garbage-collected")


def test_namespace_deletion_completes(kube: Kube) -> None:
    """A namespace with workloads in it is finalized and disappears (never hangs Terminating)."""
    name = "e2e-ns-deletion"
    kube.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=120)
    kube.kubectl("create", "namespace", name)
    kube.wait(lambda: kube.get("serviceaccount", "default", name), timeout_s=60,
              what="the default ServiceAccount")
    kube.apply(_deployment("pause", replicas=1), name)
    kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}, name)
    kube.wait(lambda: kube.items("pods", name, selector="app=pause"), timeout_s=60,
              what="the Deployment's pod to exist")
    kube.kubectl("delete", "namespace", name, "--wait=false")
    kube.wait(lambda: kube.get("namespace", name) is None, timeout_s=120,
              what=f"namespace {name} to be deleted")
