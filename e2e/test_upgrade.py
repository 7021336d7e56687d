"""The upgrade from the previous release on real pods (issue 32): its chart and image (built by
e2e/images.sh from the commit releases.yaml records) run a webhook topic with messages pending;
a producer keeps scheduling while the user follows CHANGELOG "Upgrading" to the working tree's
chart and image; a counting checker then finds every stored message delivered, none early, each
duplicate a counted redelivery, and reports the lateness of what fell due during the roll.

0.1.0's chart has no placement values for ZooKeeper and its CRD none for the topic's pods, so for
this module the real node is the only schedulable node: its taint is lifted and the KWOK nodes
are cordoned, and both are put back afterwards. A previous release with the platform's tenant
policy (0.2.0 on) is installed with the working tree's e2e values and its webhook topic admitted
by them from the start (`_has_tenant_policy`); the upgrade's steps are the same.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import workloads
from e2e.harness import deliveries
from e2e.harness.kube import Kube, condition
from e2e.harness.node import REAL_NODE, REAL_NODE_TAINT, RealNode
from e2e.harness.real_release import CHART, SERVICE_CIDR, helm_args
from e2e.harness.releases import Release, extract_chart, previous_release
from e2e.harness.topics import all_pods_running, delay_topic
from e2e.test_real_pods import (
    _explain,
    _pods,
    _ready,
    _wait_pods_ready,
    _wait_topic_ready,
)

RELEASE = "up"
FULLNAME = "up-delayq"
TOPIC = "hooks"

#: Pending across the upgrade: due 60..240 s after they are stored.
PENDING = 400
PENDING_START_MS, PENDING_SPREAD_MS = 60_000, 180_000
#: Produced through the upgrade: 20 messages a second for 4 minutes, each due 5..20 s later.
STEADY, STEADY_PER_SECOND = 4_800, 20

pytestmark = pytest.mark.timeout(1500)


@dataclass(frozen=True)
class Previous:
    """The previous release installed: its namespaces, its version and images."""

    namespace: str
    tenant: str
    release: Release
    image: str


@pytest.fixture(scope="module")
def only_the_real_node(kube: Kube, real_node: RealNode) -> Iterator[None]:
    """The real node untainted and every other node cordoned, for this module only."""
    others = [node["metadata"]["name"] for node in kube.items("nodes")
              if node["metadata"]["name"] != REAL_NODE]
    taint = f"{REAL_NODE_TAINT['key']}={REAL_NODE_TAINT['value']}:{REAL_NODE_TAINT['effect']}"
    for node in others:
        kube.kubectl("cordon", node)
    kube.kubectl("taint", "node", REAL_NODE, f"{REAL_NODE_TAINT['key']}-")
    try:
        yield
    finally:
        kube.kubectl("taint", "node", REAL_NODE, taint, "--overwrite")
        for node in others:
            kube.kubectl("uncordon", node)


@pytest.fixture(scope="module")
def previous(kube: Kube, real_node: RealNode, only_the_real_node: None,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Previous]:
    """``helm install`` of the previous release's chart with its image, and a webhook topic of
    2 brokers x (master + 1 replica) it provisions, delivering to a receiver Deployment."""
    release = previous_release()
    image = real_node.images["delayq-previous"]
    start = time.monotonic()
    real_node.ctr("images", "import", str(image.archive))
    print(f"e2e: {release.version}'s image imported in {time.monotonic() - start:.1f}s")
    chart = extract_chart(release, tmp_path_factory.mktemp("previous-chart"))
    namespace = f"e2e-up-system-{secrets.token_hex(3)}"
    tenant = f"e2e-up-tenant-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", tenant)
    # the cluster as the previous release left it: its CRD, not the one earlier e2e modules
    # applied (helm never replaces a CRD that exists, and the current one refuses the previous
    # release's topics, e.g. an http webhook without allowInsecureHttp)
    for crd in sorted((chart / "crds").glob("*.yaml")):
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    start = time.monotonic()
    kube.helm("install", RELEASE, str(chart), "--namespace", namespace, "--create-namespace",
              "--wait", "--timeout", "5m", *_previous_values(chart, real_node, tenant, image.ref),
              timeout=360)
    print(f"e2e: helm install of {release.version} took {time.monotonic() - start:.1f}s")
    try:
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.receiver(
            tenant, real_node.images["delayq"].ref, secret)})
        url = f"http://receiver.{tenant}.svc.cluster.local/hook"
        webhook: dict[str, Any] = {"url": url}
        if _has_tenant_policy(chart):
            webhook |= {"allowInsecureHttp": True, "allowedCidrs": [SERVICE_CIDR]}
        kube.apply(delay_topic(TOPIC, slotAmount=16, brokers=2, replicasPerBroker=1,
                               topicType="webhook", delivery={"webhook": webhook}), tenant)
        try:
            _wait_topic_ready(kube, tenant, TOPIC)
        except TimeoutError:
            _print_why_not_ready(kube, tenant)
            raise
        _wait_pods_ready(kube, tenant, f"delayq.io/topic={TOPIC}", 2 * 2 + 2)
        _wait_pods_ready(kube, tenant, "app=receiver", 1)
        yield Previous(namespace, tenant, release, image.ref)
    finally:
        kube.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "3m",
                  timeout=240, check=False)
        for name in (tenant, namespace):
            kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _has_tenant_policy(chart: Path) -> bool:
    """Whether the previous release's chart has the platform's tenant policy (0.2.0 on), and so
    takes the working tree's e2e values and refuses an http webhook without allowInsecureHttp."""
    return "tenantPolicy" in yaml.safe_load((chart / "values.yaml").read_text())


def _previous_values(chart: Path, real_node: RealNode, tenant: str, image: str) -> list[str]:
    """The previous release's `helm install` values: the working tree's e2e values where its
    chart has them, else 0.1.0's few (images, the watched tenant, fast failover and health)."""
    if _has_tenant_policy(chart):
        return helm_args(real_node, tenant, image)
    repository, tag = image.rsplit(":", 1)
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", f"operator.redisImage={real_node.images['redis'].ref}",
            "--set", f"zookeeper.image={real_node.images['zookeeper'].ref}",
            "--set", f"operator.watchNamespaces={{{tenant}}}",
            "--set", "operator.failoverGraceSeconds=5", "--set", "operator.healthIntervalSeconds=2"]


def _print_why_not_ready(kube: Kube, tenant: str) -> None:
    """What a previous release's topic that never became Ready was waiting for: its pods,
    claims, the volumes left in the pool and the namespace's warning events."""
    for args in (("get", "pods,pvc", "-n", tenant, "-o", "wide"), ("get", "pv"),
                 ("get", "events", "-n", tenant, "--field-selector", "type=Warning")):
        result = kube.kubectl(*args, check=False)
        print(f"e2e: kubectl {' '.join(args)}:\n{result.stdout[-4000:]}{result.stderr[-1000:]}")


def _start_producer(kube: Kube, tenant: str, image: str, name: str, count: int, start_ms: int,
                    spread_ms: int, per_second: float = 0) -> None:
    kube.apply({"apiVersion": "v1", "kind": "List", "items": workloads.producer(
        tenant, image, TOPIC, name, count, start_ms, spread_ms, per_second=per_second,
        batch=20 if per_second else 200, deadline_s=900)})


def _producer_done(kube: Kube, tenant: str, name: str, timeout_s: float) -> dict[str, Any]:
    """Waits for the producer Job; its last line (``stored``, ``resent``)."""
    try:
        kube.wait(lambda: (kube.get("job", name, tenant) or {})
                  .get("status", {}).get("succeeded") == 1, timeout_s=timeout_s,
                  what=f"producer job {name} to finish")
    except TimeoutError:
        print(_explain(kube, tenant, _pods(kube, tenant, f"job-name={name}")))
        raise
    logs = kube.kubectl("logs", f"job/{name}", "-n", tenant, "--tail=-1").stdout
    lines = workloads.json_lines(logs)
    retries = [line["retry"] for line in lines if "retry" in line]
    if retries:
        print(f"e2e: producer {name} retried {len(retries)} batches, e.g. {retries[:3]}")
    done: dict[str, Any] = lines[-1]
    return done


def _all_deliveries(kube: Kube, tenant: str) -> list[dict[str, Any]]:
    logs = kube.kubectl("logs", "deployment/receiver", "-n", tenant, "--tail=-1",
                        timeout=120).stdout
    return [entry for entry in workloads.json_lines(logs) if "id" in entry]


def _rolled(kube: Kube, tenant: str, image: str) -> bool:
    """Every pod of the topic on its StatefulSet's current template, Ready, the delay-service
    pods on ``image``, and the topic Ready."""
    pods = all_pods_running(kube, tenant, TOPIC)
    if not pods or condition(kube.get("dt", TOPIC, tenant), "Ready") != "True":
        return False
    services = [p for p in pods if p["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "delay-service"]
    return bool(services) and all(_ready(p) for p in pods) and all(
        p["spec"]["containers"][0]["image"] == image for p in services)


def test_upgrade_from_the_previous_release_under_load_loses_nothing(
    kube: Kube, real_node: RealNode, previous: Previous
) -> None:
    """CHANGELOG "Upgrading from 0.1.0" step by step while messages wait and a producer keeps
    scheduling: the new CRD first, the webhook's `allowInsecureHttp` and `allowedCidrs` (with
    the chart's `tenantPolicy.allowedCidrs`), `helm upgrade` with
    `operator.legacySecretRead=true`, the operator restarted once the bundled ZooKeeper rolled.
    Every stored message is delivered, none early, each duplicate a counted redelivery."""
    tenant, image = previous.tenant, real_node.images["delayq"].ref
    _start_producer(kube, tenant, image, "pending", PENDING, PENDING_START_MS, PENDING_SPREAD_MS)
    assert _producer_done(kube, tenant, "pending", 180)["stored"] == PENDING
    _start_producer(kube, tenant, image, "steady", STEADY, 5_000, 15_000,
                    per_second=STEADY_PER_SECOND)
    kube.wait(lambda: any(e["id"].startswith("steady-") for e in _all_deliveries(kube, tenant)),
              timeout_s=120, what=f"{previous.release.version} delivering the steady producer")

    roll_start_ms = time.time() * 1000
    start = time.monotonic()
    crds = sorted((CHART / "crds").glob("*.yaml"))
    for crd in crds:
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    webhook = {"allowInsecureHttp": True, "allowedCidrs": [SERVICE_CIDR]}
    kube.kubectl("patch", "dt", TOPIC, "-n", tenant, "--type", "merge", "-p",
                 json.dumps({"spec": {"delivery": {"webhook": webhook}}}))
    kube.helm("upgrade", RELEASE, str(CHART), "--namespace", previous.namespace,
              *helm_args(real_node, tenant, image), "--set", "operator.legacySecretRead=true",
              "--wait", "--timeout", "8m", timeout=540)
    helm_s = time.monotonic() - start
    kube.kubectl("rollout", "restart", f"deployment/{FULLNAME}-operator", "-n",
                 previous.namespace)
    kube.kubectl("rollout", "status", f"deployment/{FULLNAME}-operator", "-n",
                 previous.namespace, "--timeout=180s", timeout=200)
    try:
        kube.wait(lambda: _rolled(kube, tenant, image), timeout_s=600,
                  what="the topic's pods rolled to the working tree's image, topic Ready")
    except TimeoutError:
        print(_explain(kube, tenant, _pods(kube, tenant, f"delayq.io/topic={TOPIC}")))
        print(kube.kubectl("get", "dt", TOPIC, "-n", tenant, "-o", "yaml", check=False).stdout)
        print(kube.kubectl("logs", f"deployment/{FULLNAME}-operator", "-n", previous.namespace,
                           "--tail=60", check=False).stdout)
        raise
    roll_end_ms = time.time() * 1000
    print(f"e2e: {previous.release.version} -> working tree: helm upgrade --wait "
          f"{helm_s:.1f}s, every topic pod rolled and Ready {time.monotonic() - start:.1f}s "
          f"after the first step")

    steady = _producer_done(kube, tenant, "steady", 600)
    print(f"e2e: steady producer: {steady}")
    assert steady["stored"] == STEADY
    stored = [f"pending-{i}" for i in range(PENDING)] + [f"steady-{i}" for i in range(STEADY)]

    def all_delivered() -> deliveries.Count | None:
        found = deliveries.count(stored, _all_deliveries(kube, tenant))
        return found if not found.lost else None

    try:
        result = kube.wait(all_delivered, timeout_s=360, what=f"{len(stored)} delivered")
    except TimeoutError:
        missing = deliveries.count(stored, _all_deliveries(kube, tenant)).lost
        print(f"{len(missing)} lost, e.g. {missing[:10]}")
        raise
    everything = sorted(result.lateness_ms.values())
    during = result.lateness_between(roll_start_ms, roll_end_ms)
    print(f"e2e: upgrade checker, all: {result.summary(everything)}")
    print(f"e2e: upgrade checker, due during the roll: {result.summary(during)}")
    if result.duplicates:
        print(f"e2e: duplicates (attempts in arrival order), e.g. "
              f"{dict(list(result.duplicates.items())[:5])}")
    assert not result.early, result.early[:5]
    assert not result.unexplained, {i: result.duplicates[i] for i in result.unexplained[:5]}
