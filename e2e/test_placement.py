"""Placement by the real kube-scheduler: a Redis pod of broker i next to delay-service pod i.

Issue 4 asks for one delay-service pod per broker, "scheduled next to its broker (affinity)
and spread across nodes". Unit tests check the affinity terms and the apply order; only a real
scheduler shows that together they place pods as intended. The local operator provisions a
topic on the KWOK nodes; the test then reads where the scheduler bound each pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.kube import Kube, condition
from e2e.harness.operator import LocalOperator
from e2e.harness.process import REPO

CRD_FILE = REPO / "crds" / "delaytopics.delayq.io.yaml"
TOPIC = "placed"
BROKERS = 3
REPLICAS_PER_BROKER = 1
MIN_NODES = 3


@pytest.fixture(scope="module")
def crd(kube: Kube) -> None:
    """The DelayTopic CRD applied and served (idempotent with the other modules' fixtures)."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube.wait(lambda: condition(kube.get("crd", "delaytopics.delayq.io"), "Established") == "True",
              timeout_s=60, what="the DelayTopic CRD to be Established")
    kube.wait(lambda: kube.kubectl("get", "dt", "-A", check=False).returncode == 0,
              timeout_s=60, what="kubectl to resolve the short name dt")


@pytest.fixture
def nodes(kube: Kube, local_cluster: bool) -> list[str]:
    """The Ready nodes; the test needs one per broker to tell pairing from coincidence."""
    if not local_cluster:
        pytest.skip("needs the local KWOK cluster: the operator runs as a local process")
    ready = [n["metadata"]["name"] for n in kube.items("nodes")
             if condition(n, "Ready") == "True"]
    if len(ready) < MIN_NODES:
        pytest.skip(f"needs at least {MIN_NODES} Ready nodes (E2E_FAKE_NODES), found {len(ready)}")
    return ready


@pytest.fixture
def operator(
    kube: Kube, crd: None, zookeeper: ZooKeeperServer, namespace: str, nodes: list[str],
    tmp_path: Path,
) -> Iterator[LocalOperator]:
    """``delayq operator --standalone -n <namespace>``; its topics are deleted before it stops.

    It runs with the admin kubeconfig: this test is about scheduling, the chart's RBAC is
    proven by test_provisioning.py.
    """
    op = LocalOperator(
        repo=REPO, kubeconfig=kube.kubeconfig, namespaces=[namespace],
        log_path=tmp_path / "operator.log",
        # its copies of the topics' credentials go to its own namespace, which must exist
        env_overrides={"DELAYQ_ZOOKEEPER": zookeeper.hosts, "POD_NAMESPACE": namespace},
    )
    with op.running(kube, namespace):
        yield op


def _placed_pods(kube: Kube, namespace: str) -> dict[str, str] | None:
    """Pod name -> node of every pod of the topic, once all of them are bound to a node."""
    expected = BROKERS * (2 + REPLICAS_PER_BROKER)  # per broker: a service pod, Redis pods
    pods = kube.items("pods", namespace, selector=f"delayq.io/topic={TOPIC}")
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}
    return placed if len(placed) == expected and all(placed.values()) else None


def _pretty(placed: dict[str, Any]) -> str:
    return "\n".join(f"  {pod:<24} {node}" for pod, node in sorted(placed.items()))


def test_each_broker_has_a_redis_pod_with_its_service_pod_and_one_elsewhere(
    kube: Kube, operator: LocalOperator, namespace: str
) -> None:
    """One of broker i's Redis pods lands on service pod i's node and the other elsewhere.
    Which one is the scheduler's: both pods of a broker share one template (the same
    preference for the service pod, the same spread from each other) and are created in
    parallel, so the replica (pod 1) took the service pod's node in one run of 2026-11-30
    (pod 0 then sat on another node). The election, not the scheduler, makes the co-located pod
    the first master (kube/failover.py; its KWOK pods run no Redis, so tests/kube/
    test_handlers.py shows that part with real servers)."""
    kube.apply({"apiVersion": "delayq.io/v1alpha1", "kind": "DelayTopic",
                "metadata": {"name": TOPIC},
                "spec": {"slotAmount": 16, "brokers": BROKERS,
                         "replicasPerBroker": REPLICAS_PER_BROKER}}, namespace)
    try:
        placed = kube.wait(lambda: _placed_pods(kube, namespace), timeout_s=180,
                           what=f"all {BROKERS * (2 + REPLICAS_PER_BROKER)} pods scheduled")
    except Exception:
        print(f"--- operator log tail:\n{operator.tail()}")
        raise
    print(f"placement of topic {TOPIC}:\n{_pretty(placed)}")

    service_nodes = {placed[f"{TOPIC}-service-{i}"] for i in range(BROKERS)}
    assert len(service_nodes) == BROKERS, f"service pods not spread:\n{_pretty(placed)}"
    for broker in range(BROKERS):
        service_node = placed[f"{TOPIC}-service-{broker}"]
        redis_nodes = [placed[f"{TOPIC}-redis-{broker}-{pod}"]
                       for pod in range(1 + REPLICAS_PER_BROKER)]
        assert redis_nodes.count(service_node) == 1, (
            f"broker {broker}: not one Redis pod next to its service pod:\n{_pretty(placed)}")
        assert len(set(redis_nodes)) == len(redis_nodes), (
            f"broker {broker}'s Redis pods share a node:\n{_pretty(placed)}")
