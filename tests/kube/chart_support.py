"""What the chart tests share: helm (built into a per-user cache by scripts/install-helm.sh when
missing, never skipped), the value sets, rendering and the operator's environment."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq.kube.builders.common import Credentials
from tests.tool_support import installed

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "delayq"
pytestmark = pytest.mark.timeout(900)  # the first run may build helm from source

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
DIGEST = "sha256:" + "0123456789abcdef" * 4
CREDENTIALS = Credentials(
    "pw", "tok", "zk", "admin", "viewer", "metrics", "lease", "op-metrics", "reader"
)
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "image-digests": [
        *["--set", f"image.digest={DIGEST}", "--set", f"operator.redisImageDigest={DIGEST}"],
        *["--set", f"operator.pipelineImageDigest={DIGEST}"],
        *["--set", f"zookeeper.imageDigest={DIGEST}", "--set", "zookeeper.replicas=3"],
    ],
    "single-replica-external-zk": [
        "--set",
        "operator.replicas=1",
        "--set",
        "zookeeper.enabled=false",
        "--set-string",
        r"zookeeper.address=zk-0.zk:2181\,zk-1.zk:2181/delayq",  # helm --set escapes commas
    ],
    "namespaced": ["--set", "operator.watchNamespaces={shop,billing}"],
    "workload-namespaces": ["--set", "operator.workloadNamespaces={shop,billing}"],
    "cluster-wide-workloads": ["--set", "operator.clusterWideWorkloads=true"],
    "legacy-secret-read": ["--set", "operator.legacySecretRead=true"],
    "zookeeper-tls": [
        "--set",
        "zookeeper.enabled=false",
        "--set",
        "zookeeper.address=zk-0.zk:2281/delayq",
        "--set",
        "zookeeper.tls.enabled=true",
        "--set",
        "zookeeper.tls.caConfigMap=zk-ca",
        "--set",
        "zookeeper.tls.caKey=bundle.pem",
        "--set",
        "zookeeper.tls.clientCertSecret=zk-client",
    ],
    "zookeeper-ensemble": ["--set", "zookeeper.replicas=3"],
    "zookeeper-allowed-ensembles": [
        "--set-json",
        'zookeeper.allowedEnsembles=["zk-a-0.zk-a:2181,zk-a-1.zk-a:2181/delayq","zk-b:2281"]',
    ],
    "zookeeper-without-acl": ["--set", "zookeeper.acl.enabled=false"],
    "zookeeper-acl-own-secret": ["--set", "zookeeper.acl.existingSecret=my-zk-admin"],
    "metrics-monitored": [
        "--set",
        "operator.metrics.serviceMonitor.enabled=true",
        "--set",
        "operator.metrics.serviceMonitor.labels.release=prom",
        "--set",
        "operator.metrics.port=9102",
    ],
    "metrics-off": ["--set", "operator.metrics.enabled=false"],
    "topic-monitors": [
        "--set",
        "topics.serviceMonitor.labels.release=prom",
        "--set",
        "topics.serviceMonitor.labels.team=ops",
        "--set",
        "topics.serviceMonitor.interval=1m",
    ],
    "alerts": ["--set", "alerts.enabled=true", "--set", "alerts.labels.release=prom"],
    "dashboards": ["--set", "dashboards.enabled=true", "--set", "dashboards.namespace=monitoring"],
    "tenant-policy": [
        "--set",
        "tenantPolicy.allowPrivateTargets=true",
        "--set",
        "tenantPolicy.allowedCidrs={10.96.0.0/12,fd00::/8}",
    ],
    "dedicated-nodes": [
        "--set",
        "topics.nodeSelector.pool=delayq",
        "--set",
        "zookeeper.nodeSelector.pool=delayq",
        "--set-json",
        'topics.tolerations=[{"key":"pool","value":"delayq","effect":"NoSchedule"}]',
        "--set-json",
        'zookeeper.tolerations=[{"key":"pool","value":"delayq","effect":"NoSchedule"}]',
    ],
    "tracing": [
        "--set",
        "topics.tracing.otlpEndpoint=http://otel-collector.observability.svc:4318",
        "--set",
        "topics.tracing.sampler=parentbased_traceidratio",
        "--set-string",
        "topics.tracing.samplerArg=0.25",
        "--set",
        "topics.tracing.headersSecret.name=otel-ingest",
        "--set",
        "topics.tracing.headersSecret.key=otlp-headers",
    ],
    "topic-monitors-off": [
        "--set",
        "topics.serviceMonitor.enabled=false",
        "--set",
        "operator.logFormat=text",
    ],
}


def helm() -> str:
    return installed("install-helm")


# helm built by `go install` assumes Kubernetes v1.20 (release builds set the default at link
# time), below the chart's kubeVersion: render for the version the e2e tier runs.
KUBE_VERSION = "1.33.13"


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    if args[0] in ("template", "lint") and "--kube-version" not in args:
        args = (*args, "--kube-version", KUBE_VERSION)
    return subprocess.run([helm(), *args], capture_output=True, text=True, check=False)


@functools.cache
def render(value_set: str, include_crds: bool = False) -> tuple[dict[str, Any], ...]:
    args = ["template", "rel", str(CHART), "--namespace", "delayq-system", *VALUE_SETS[value_set]]
    if include_crds:
        args.append("--include-crds")
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]



def operator_env(value_set: str) -> dict[str, str]:
    (deployment,) = of_kind(render(value_set), "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    values = {item["name"]: item["value"] for item in env if "value" in item}
    values["POD_NAMESPACE"] = "delayq-system"  # from the downward API
    return values

