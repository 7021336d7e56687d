"""The product on real pods: the chart's operator, ZooKeeper and every topic pod run on a real
kubelet from the locally built images, with no test-only address map anywhere in the path.

The real node (e2e/harness/node.py) is tainted; the release puts the operator, ZooKeeper and the
topics' pods on it through the chart's own placement values (``operator``/``zookeeper``/
``topics`` ``nodeSelector`` and ``tolerations``), the way a platform team keeps delayq on a node
pool. The tests of this module share one release and one tenant namespace and run in order:
install, a topic, traffic, faults, upgrade, teardown.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e import workloads
from e2e.harness.kube import Kube, condition
from e2e.harness.node import REAL_NODE, REAL_NODE_LABELS, REAL_NODE_TAINT, RealNode

CHART = Path(__file__).resolve().parent.parent / "charts" / "delayq"
RELEASE = "dq"
FULLNAME = "dq-delayq"

#: The cluster's Service range (kube-apiserver --service-cluster-ip-range).
SERVICE_CIDR = "10.96.0.0/16"

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Install:
    """The release: its namespace, the tenant namespace it watches, the images it runs."""

    namespace: str
    tenant: str
    image: str


def _placement_values(prefix: str) -> list[str]:
    selector = ",".join(f"{prefix}.nodeSelector.{key.replace('.', chr(92) + '.')}={value}"
                        for key, value in REAL_NODE_LABELS.items())
    return ["--set", selector, "--set-json", f"{prefix}.tolerations={json.dumps([REAL_NODE_TAINT])}"]


def _helm_args(real_node: RealNode, tenant: str, image: str) -> list[str]:
    repository, tag = image.rsplit(":", 1)
    return [
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"operator.redisImage={real_node.images['redis'].ref}",
        "--set", f"zookeeper.image={real_node.images['zookeeper'].ref}",
        "--set", f"operator.watchNamespaces={{{tenant}}}",
        "--set", "operator.failoverGraceSeconds=5", "--set", "operator.healthIntervalSeconds=2",
        # the platform lets tenants reach in-cluster receivers through their Service addresses
        "--set", f"tenantPolicy.allowedCidrs={{{SERVICE_CIDR}}}",
        *_placement_values("operator"), *_placement_values("zookeeper"),
        *_placement_values("topics"),
    ]


@pytest.fixture(scope="module")
def install(kube: Kube, real_node: RealNode) -> Iterator[Install]:
    """Scenario 1's ``helm install --wait`` of charts/delayq with the local images."""
    namespace = f"e2e-real-system-{secrets.token_hex(3)}"
    tenant = f"e2e-real-tenant-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", tenant)
    image = real_node.images["delayq"].ref
    start = time.monotonic()
    kube.helm("install", RELEASE, str(CHART), "--namespace", namespace, "--create-namespace",
              "--wait", "--timeout", "5m", *_helm_args(real_node, tenant, image), timeout=360)
    print(f"e2e: helm install on the real node took {time.monotonic() - start:.1f}s")
    yield Install(namespace, tenant, image)
    kube.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m",
              timeout=240)
    for name in (tenant, namespace):
        kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _pods(kube: Kube, namespace: str, selector: str) -> list[dict[str, Any]]:
    return kube.items("pods", namespace, selector)


def _ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready") == "True"


def test_helm_install_runs_the_operator_and_zookeeper_on_the_real_node(
    kube: Kube, install: Install
) -> None:
    """Scenario 1: both operator replicas Running and Ready through their real probes, on the
    real node; exactly one holds the leader Lease; the bundled ZooKeeper runs its real image
    and answers its probe; `helm test` (a pod scraping the operator's metrics) passes."""
    operators = _pods(kube, install.namespace, "app.kubernetes.io/component=operator")
    assert len(operators) == 2
    for pod in operators:
        assert pod["spec"]["nodeName"] == REAL_NODE
        assert _ready(pod), pod["status"]
        assert pod["spec"]["containers"][0]["image"] == install.image
    names = {pod["metadata"]["name"] for pod in operators}
    lease = kube.wait(lambda: (kube.get("lease", "delayq-operator", install.namespace) or {})
                      .get("spec", {}).get("holderIdentity"), timeout_s=60,
                      what="a leader in the Lease")
    assert lease.rsplit("_", 1)[0] in names  # <pod>_<random>: one process of one replica
    (zookeeper,) = _pods(kube, install.namespace, "app.kubernetes.io/component=zookeeper")
    assert zookeeper["spec"]["nodeName"] == REAL_NODE and _ready(zookeeper)
    result = kube.helm("test", RELEASE, "--namespace", install.namespace, "--timeout", "3m",
                       timeout=240)
    assert "Phase:          Succeeded" in result.stdout, result.stdout


def _topic(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "delayq.io/v1alpha1", "kind": "DelayTopic",
            "metadata": {"name": name}, "spec": spec}


def _wait_topic_ready(kube: Kube, namespace: str, name: str, timeout_s: float = 300) -> None:
    start = time.monotonic()
    kube.wait(lambda: condition(kube.get("dt", name, namespace), "Ready") == "True",
              timeout_s=timeout_s, what=f"DelayTopic {name} Ready=True")
    print(f"e2e: topic {name} Ready in {time.monotonic() - start:.1f}s")


@pytest.fixture(scope="module")
def webhook_topic(kube: Kube, install: Install) -> str:
    """Scenario 2: a webhook topic of 2 brokers x (master + 1 replica) with a receiver
    Deployment in the tenant's namespace; Ready=True from the in-cluster operator."""
    kube.apply({"apiVersion": "v1", "kind": "List",
                "items": workloads.receiver(install.tenant, install.image)})
    url = f"http://receiver.{install.tenant}.svc.cluster.local/hook"
    kube.apply(_topic("hooks", slotAmount=16, brokers=2, replicasPerBroker=1,
                      topicType="webhook",
                      delivery={"webhook": {"url": url, "allowInsecureHttp": True,
                                            "allowedCidrs": [SERVICE_CIDR]}}),
               install.tenant)
    _wait_topic_ready(kube, install.tenant, "hooks")
    return "hooks"


def _explain(kube: Kube, namespace: str, pods: list[dict[str, Any]]) -> str:
    """What kubectl says about pods that are not Ready: their events and their logs."""
    parts = []
    for pod in pods:
        if _ready(pod):
            continue
        name = pod["metadata"]["name"]
        parts.append(kube.kubectl("describe", "pod", name, "-n", namespace, check=False).stdout)
        parts.append(kube.kubectl("logs", name, "-n", namespace, "--all-containers",
                                  "--tail=30", check=False).stdout)
    return "\n".join(parts)


def _wait_pods_ready(kube: Kube, namespace: str, selector: str, count: int,
                     timeout_s: float = 180) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        pods = _pods(kube, namespace, selector)
        return pods if len(pods) == count and all(map(_ready, pods)) else None

    try:
        return kube.wait(ready, timeout_s=timeout_s, what=f"{count} pods {selector} Ready")
    except TimeoutError:
        print(_explain(kube, namespace, _pods(kube, namespace, selector)))
        raise


def test_a_webhook_topic_becomes_ready_on_real_pods(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 2: every Redis and delay-service pod runs on the real node and is Ready
    through its real probes (the service's readiness needs its slots owned)."""
    start = time.monotonic()
    pods = _wait_pods_ready(kube, install.tenant, f"delayq.io/topic={webhook_topic}", 2 * 2 + 2)
    print(f"e2e: every topic pod Ready {time.monotonic() - start:.1f}s after Ready=True")
    assert {pod["spec"]["nodeName"] for pod in pods} == {REAL_NODE}


def _received(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    """Every delivery the receiver logged, by id (the first arrival of each)."""
    logs = kube.kubectl("logs", "deployment/receiver", "-n", namespace, "--tail=-1").stdout
    deliveries: dict[str, dict[str, Any]] = {}
    for entry in workloads.json_lines(logs):
        deliveries.setdefault(entry["id"], entry)
    return deliveries


def _produce(kube: Kube, install: Install, topic: str, name: str, count: int,
             start_ms: int = 3000, spread_ms: int = 3000) -> None:
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.producer(
        install.tenant, install.image, topic, name, count, start_ms, spread_ms)})
    try:
        kube.wait(lambda: (kube.get("job", name, install.tenant) or {})
                  .get("status", {}).get("succeeded") == 1, timeout_s=180,
                  what=f"producer job {name} to finish")
    except TimeoutError:
        print(_explain(kube, install.tenant, _pods(kube, install.tenant, f"job-name={name}")))
        raise


def _wait_delivered(kube: Kube, namespace: str, topic: str, ids: list[str],
                    timeout_s: float = 120) -> dict[str, dict[str, Any]]:
    """Every one of ``ids`` at the receiver; on a timeout, the service pods' logs explain."""
    def arrived() -> dict[str, dict[str, Any]] | None:
        deliveries = _received(kube, namespace)
        return deliveries if all(i in deliveries for i in ids) else None

    try:
        return kube.wait(arrived, timeout_s=timeout_s, what=f"{len(ids)} messages delivered")
    except TimeoutError:
        missing = [i for i in ids if i not in _received(kube, namespace)]
        print(f"{len(missing)} missing, e.g. {missing[:5]}")
        for pod in _pods(kube, namespace, f"delayq.io/topic={topic}"):
            name = pod["metadata"]["name"]
            if "-service-" in name:
                print(kube.kubectl("logs", name, "-n", namespace, "--tail=20",
                                   check=False).stdout)
        raise


def _lateness_ms(deliveries: dict[str, dict[str, Any]], ids: list[str]) -> list[float]:
    return sorted(deliveries[i]["atMs"] - deliveries[i]["dueMs"] for i in ids)


def test_messages_from_a_client_pod_are_delivered_on_time_to_the_receiver(
    kube: Kube, install: Install, webhook_topic: str
) -> None:
    """Scenario 3: 300 messages scheduled through the topic's Service from a producer Job
    reach the receiver Deployment, each once at least, none before its due time."""
    _produce(kube, install, webhook_topic, "burst", 300)
    ids = [f"burst-{i}" for i in range(300)]
    deliveries = _wait_delivered(kube, install.tenant, webhook_topic, ids)
    lateness = _lateness_ms(deliveries, ids)
    assert lateness[0] >= 0, f"delivered early by {-lateness[0]:.1f} ms"
    p50, p99 = lateness[len(lateness) // 2], lateness[int(len(lateness) * 0.99)]
    print(f"e2e: real-pod webhook lateness over {len(ids)} messages: p50 {p50:.1f} ms, "
          f"p99 {p99:.1f} ms, max {lateness[-1]:.1f} ms")
