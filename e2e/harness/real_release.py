"""A release of charts/delayq on the real node (e2e/harness/node.py), from the locally built
images: the values that put the operator, ZooKeeper and the topics' pods on that node, and the
``helm install --wait`` that the real-pod test modules each open with.

Harness, not a test module: test_real_pods.py, test_dr_drill.py, test_hostile_tenant.py and
test_upgrade.py install such a release each, with one set of values.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

from e2e.harness.kube import Kube
from e2e.harness.node import REAL_NODE_LABELS, REAL_NODE_TAINT, RealNode
from e2e.harness.process import REPO

CHART = REPO / "charts" / "delayq"

#: The cluster's Service range (kube-apiserver --service-cluster-ip-range).
SERVICE_CIDR = "10.96.0.0/16"


@dataclass(frozen=True)
class Install:
    """The release: its namespace, the tenant namespace it watches, the images it runs."""

    namespace: str
    tenant: str
    image: str


def _placement_values(prefix: str) -> list[str]:
    selector = ",".join(f"{prefix}.nodeSelector.{key.replace('.', chr(92) + '.')}={value}"
                        for key, value in REAL_NODE_LABELS.items())
    tolerations = json.dumps([REAL_NODE_TAINT])
    return ["--set", selector, "--set-json", f"{prefix}.tolerations={tolerations}"]


def helm_args(real_node: RealNode, tenant: str, image: str) -> list[str]:
    repository, tag = image.rsplit(":", 1)
    return [
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", f"operator.redisImage={real_node.images['redis'].ref}",
        "--set", f"zookeeper.image={real_node.images['zookeeper'].ref}",
        # spec.backup's CronJob (imported into the node only by the test that runs it)
        "--set", f"operator.pipelineImage={real_node.images['pipeline'].ref}",
        "--set", f"operator.watchNamespaces={{{tenant}}}",
        "--set", "operator.failoverGraceSeconds=5", "--set", "operator.healthIntervalSeconds=2",
        # the platform lets tenants reach in-cluster receivers through their Service addresses
        "--set", f"tenantPolicy.allowedCidrs={{{SERVICE_CIDR}}}",
        *_placement_values("operator"), *_placement_values("zookeeper"),
        *_placement_values("topics"),
    ]


def install_release(kube: Kube, real_node: RealNode, release: str, prefix: str) -> Install:
    """``helm install --wait`` of the chart as `release` into a new namespace
    ``<prefix>-system-<hex>``, watching a new tenant namespace ``<prefix>-tenant-<hex>``; prints
    how long the install took (the slowest step of a real-pod module's setup)."""
    namespace = f"{prefix}-system-{secrets.token_hex(3)}"
    tenant = f"{prefix}-tenant-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", tenant)
    image = real_node.images["delayq"].ref
    start = time.monotonic()
    kube.helm("install", release, str(CHART), "--namespace", namespace, "--create-namespace",
              "--wait", "--timeout", "5m", *helm_args(real_node, tenant, image), timeout=360)
    print(f"e2e: helm install of {release} on the real node took {time.monotonic() - start:.1f}s")
    return Install(namespace, tenant, image)
