"""The operator provisions a topic on a real control plane (issue 5, points 3, 4, 6 and 7).

The operator runs as a local process (the ``operator`` fixture) with the chart's ServiceAccount
token, so it has exactly the RBAC the chart grants; a local ZooKeeper plays the ensemble. KWOK
makes the pods it creates Running; the Redis inside them does not exist, so these tests stop
short of ``Ready=True`` (that needs the data plane reachable: test_failover.py). The tests run
in order on one namespace: a topic is provisioned, changed, then another provisioned across
operator kills and deleted.
"""

from __future__ import annotations

from typing import Any

from delayq.local.waiting import wait_until
from e2e.harness.kube import Kube, condition
from e2e.harness.operator import LocalOperator
from e2e.harness.process import INTERVAL_S, NOT_YET
from e2e.harness.topics import (
    COMPONENT_LABEL,
    TOPIC_LABEL,
    all_pods_running,
    delay_topic,
    described_with,
    redis_statefulsets,
    topic_children,
    wait_reconciled,
)


def test_topic_is_provisioned_with_owned_children(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 3: every child is created, owned by the topic, and its pods run; status follows."""
    kube.apply(delay_topic("orders", slotAmount=16, brokers=2, replicasPerBroker=1), topics_ns)
    topic = wait_reconciled(kube, operator, topics_ns, "orders")
    uid = topic["metadata"]["uid"]
    assert not topic["metadata"].get("finalizers"), "a finalizer would need a running operator"
    assert topic["status"]["observedGeneration"] == topic["metadata"]["generation"]
    assert condition(topic, "Ready") is not None
    # The API server accepted the operator's Event: `kubectl describe dt` shows it.
    wait_until(lambda: described_with(kube, topics_ns, "orders", ("ResourcesApplied",)),
               timeout_s=30, what="the ResourcesApplied Event in kubectl describe",
               interval_s=INTERVAL_S, not_yet=NOT_YET)

    children = topic_children(kube, topics_ns, "orders")
    kinds = {c["kind"] for c in children}
    assert {"StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds
    for child in children:
        owners = [o for o in child["metadata"].get("ownerReferences", [])
                  if o.get("controller")]
        assert [(o["kind"], o["uid"]) for o in owners] == [("DelayTopic", uid)], \
            f"{child['kind']}/{child['metadata']['name']} is not controlled by the topic"
    assert len(redis_statefulsets(kube, topics_ns, "orders")) == 2

    pods = kube.wait(lambda: all_pods_running(kube, topics_ns, "orders"), timeout_s=180,
                     what="every pod of the topic Running (KWOK)")
    assert all(p["spec"].get("nodeName") for p in pods)
    claims = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=orders")
    assert claims
    assert all(c["status"]["phase"] == "Bound" for c in claims)


def test_scaling_and_worker_change_roll_out(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 4: more brokers and a worker setting change roll out; status follows generation."""
    before = wait_reconciled(kube, operator, topics_ns, "orders")
    service_sets = kube.items("statefulsets", topics_ns,
                              selector=f"{TOPIC_LABEL}=orders,{COMPONENT_LABEL}=delay-service")
    assert len(service_sets) == 1
    service_generation = service_sets[0]["metadata"]["generation"]

    kube.apply(delay_topic("orders", slotAmount=16, brokers=3, replicasPerBroker=1,
                           worker={"concurrency": 4}), topics_ns)
    after = wait_reconciled(kube, operator, topics_ns, "orders")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert len(redis_statefulsets(kube, topics_ns, "orders")) == 3

    def rolled() -> dict[str, Any] | None:
        sets = kube.items("statefulsets", topics_ns,
                          selector=f"{TOPIC_LABEL}=orders,{COMPONENT_LABEL}=delay-service")
        sts = sets[0]
        status = sts["status"]
        done = (sts["metadata"]["generation"] > service_generation
                and status.get("observedGeneration") == sts["metadata"]["generation"]
                and status.get("updateRevision") == status.get("currentRevision")
                and status.get("updatedReplicas") == sts["spec"]["replicas"])
        return sts if done else None

    kube.wait(rolled, timeout_s=180, what="the delay-service StatefulSet to roll out")
    kube.wait(lambda: all_pods_running(kube, topics_ns, "orders"), timeout_s=180,
              what="every pod Running after the change")


def test_operator_restart_mid_reconcile_converges_without_duplicates(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 7: a SIGKILLed operator, restarted, converges; nothing is duplicated or rotated."""
    operator.kill()
    kube.apply(delay_topic("restart", slotAmount=16, brokers=3, replicasPerBroker=1), topics_ns)
    operator.start()
    # Kill it again as soon as it has started creating children: mid-reconcile.
    kube.wait(lambda: topic_children(kube, topics_ns, "restart"), timeout_s=60,
              what="the first child of the topic")
    operator.kill()
    secret_before = kube.get("secret", "restart-credentials", topics_ns)
    operator.start()
    topic = wait_reconciled(kube, operator, topics_ns, "restart")

    children = topic_children(kube, topics_ns, "restart")
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(names) == len(set(names))
    assert len(redis_statefulsets(kube, topics_ns, "restart")) == 3
    condition_types = [c["type"] for c in topic["status"]["conditions"]]
    assert len(condition_types) == len(set(condition_types))
    if secret_before is not None:
        secret_after = kube.get("secret", "restart-credentials", topics_ns)
        assert secret_after is not None
        assert secret_after["data"] == secret_before["data"], "credentials were rotated"
        assert secret_after["metadata"]["uid"] == secret_before["metadata"]["uid"]


def test_deleting_the_topic_removes_children(
    kube: Kube, operator: LocalOperator, topics_ns: str
) -> None:
    """Point 6: the topic goes at once (no finalizer); controller-manager collects the children.

    With the default deletionPolicy Retain the Redis volume claims stay behind on purpose.
    """
    wait_reconciled(kube, operator, topics_ns, "restart")
    claims_before = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=restart")
    kube.kubectl("delete", "dt", "restart", "-n", topics_ns, "--wait=false")
    kube.wait(lambda: kube.get("dt", "restart", topics_ns) is None, timeout_s=120,
              what="the DelayTopic to be gone")
    kube.wait(lambda: not topic_children(kube, topics_ns, "restart"), timeout_s=120,
              what="the children to be garbage-collected")
    kube.wait(lambda: not kube.items("pods", topics_ns, selector=f"{TOPIC_LABEL}=restart"),
              timeout_s=120, what="the pods to be gone")
    claims_after = kube.items("pvc", topics_ns, selector=f"{TOPIC_LABEL}=restart")
    assert {c["metadata"]["name"] for c in claims_after} == \
        {c["metadata"]["name"] for c in claims_before}
