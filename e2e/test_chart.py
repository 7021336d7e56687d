"""``helm install`` of charts/delayq on a real API server (issue 5, point 1).

Template rendering is unit-tested; only a real API server proves that every rendered object is
accepted (schemas, RBAC escalation checks, CRDs before the objects that use them), that the
workloads become ready, and that the operator's ServiceAccount ends up with exactly the
permissions the chart claims: everything the operator does, nothing more.
"""

from __future__ import annotations

import json

import pytest

from e2e.harness.kube import Kube, Release, condition
from e2e.harness.operator import tenant_namespace


def test_release_is_deployed(kube: Kube, chart_release: Release) -> None:
    """helm reports the release deployed (``--wait`` succeeded, nothing failed to apply)."""
    status = json.loads(kube.helm("status", chart_release.name, "-n", chart_release.namespace,
                                  "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"


def test_chart_crds_are_established(kube: Kube, chart_release: Release) -> None:
    """The chart's crds/ were installed before its templates and are served."""
    obj = kube.wait(lambda: kube.get("crd", "delaytopics.delayq.io"), timeout_s=30,
                    what="CRD delaytopics.delayq.io")
    assert condition(obj, "Established") == "True"


def test_operator_deployment_is_available(kube: Kube, chart_release: Release) -> None:
    """The operator Deployment is Available with every replica Running on a node."""
    deployment = kube.get("deployment", f"{chart_release.fullname}-operator",
                          chart_release.namespace)
    assert deployment is not None
    assert condition(deployment, "Available") == "True"
    assert deployment["status"]["readyReplicas"] == deployment["spec"]["replicas"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == \
        chart_release.service_account
    pods = kube.items("pods", chart_release.namespace,
                      selector="app.kubernetes.io/name=delayq-operator")
    assert len(pods) == deployment["spec"]["replicas"]
    assert all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] for p in pods)


def test_bundled_zookeeper_is_ready_with_a_bound_volume(
    kube: Kube, chart_release: Release
) -> None:
    """The bundled ZooKeeper StatefulSet is ready and its volume claim is Bound."""
    sts = kube.get("statefulset", f"{chart_release.fullname}-zookeeper", chart_release.namespace)
    assert sts is not None
    assert sts["status"].get("readyReplicas") == sts["spec"]["replicas"]
    claims = kube.items("pvc", chart_release.namespace)
    assert claims
    assert all(c["status"]["phase"] == "Bound" for c in claims)


#: (verb, resource, expected) for the operator's ServiceAccount in a namespace nobody opted in
#: to delayq: what it needs to watch and serve a DelayTopic, and what least privilege says it
#: must not have. StatefulSets (workloads) are written only where a tenant namespace is opted
#: in (test_statefulset_writes_only_where_the_platform_opted_a_namespace_in).
PERMISSIONS = [
    ("watch", "delaytopics.delayq.io", True),
    ("patch", "delaytopics.delayq.io/status", True),
    ("get", "statefulsets.apps", True),
    ("create", "statefulsets.apps", False),
    ("patch", "statefulsets.apps", False),
    ("create", "services", True),
    ("create", "configmaps", True),
    ("create", "secrets", True),
    ("create", "poddisruptionbudgets.policy", True),
    ("create", "networkpolicies.networking.k8s.io", True),
    ("list", "pods", True),  # the health pass reads IPs, readiness, deletionTimestamp
    ("patch", "pods", False),  # the master Service follows the operator's EndpointSlice
    ("create", "endpointslices.discovery.k8s.io", True),
    ("patch", "endpointslices.discovery.k8s.io", True),
    ("delete", "endpointslices.discovery.k8s.io", False),
    ("delete", "persistentvolumeclaims", False),  # the StatefulSet controller deletes them
    ("create", "events", True),
    ("list", "secrets", False),
    # tenants' Secrets are written, never read or deleted (the operator's copies are in the
    # release's namespace: test_operator_reads_secrets_only_in_the_release_namespace)
    ("get", "secrets", False),
    ("patch", "secrets", True),
    ("delete", "secrets", False),
    ("delete", "statefulsets.apps", False),
    ("delete", "delaytopics.delayq.io", False),
    ("create", "pods", False),
    # spec.backup's CronJob: its last run read everywhere, written where workloads are
    ("get", "cronjobs.batch", True),
    ("create", "cronjobs.batch", False),
    ("delete", "cronjobs.batch", False),
    ("create", "jobs.batch", False),
]


#: The leader Lease, in the release's namespace only, and only the chart's Lease by name.
LEASE_PERMISSIONS = [
    ("get", "leases.coordination.k8s.io/delayq-operator", True),
    ("patch", "leases.coordination.k8s.io/delayq-operator", True),
    ("create", "leases.coordination.k8s.io", True),
    ("patch", "leases.coordination.k8s.io/another", False),
    ("delete", "leases.coordination.k8s.io/delayq-operator", False),
    ("list", "leases.coordination.k8s.io", False),
]


@pytest.mark.parametrize(("verb", "resource", "allowed"), LEASE_PERMISSIONS,
                         ids=[f"{v}-{r}" for v, r, _ in LEASE_PERMISSIONS])
def test_operator_may_only_use_its_leader_lease(
    kube: Kube, chart_release: Release, namespace: str, verb: str, resource: str, allowed: bool
) -> None:
    """The Lease grants hold in the release's namespace and nowhere else."""
    subject = f"system:serviceaccount:{chart_release.namespace}:{chart_release.service_account}"
    for ns, expected in ((chart_release.namespace, allowed), (namespace, False)):
        result = kube.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={subject}",
                              check=False)
        assert result.stdout.strip() == ("yes" if expected else "no"), (ns, result.stderr)


@pytest.mark.parametrize("verb", ["get", "list", "delete"])
def test_operator_reads_secrets_only_in_the_release_namespace(
    kube: Kube, chart_release: Release, namespace: str, verb: str
) -> None:
    """Its copies of the topics' credentials (kube/credentials.py): read, listed and collected
    in the release's namespace, not in a tenant's."""
    subject = f"system:serviceaccount:{chart_release.namespace}:{chart_release.service_account}"
    for ns, expected in ((chart_release.namespace, "yes"), (namespace, "no")):
        result = kube.kubectl("auth", "can-i", verb, "secrets", "-n", ns, f"--as={subject}",
                              check=False)
        assert result.stdout.strip() == expected, (ns, result.stderr)


@pytest.mark.parametrize(("verb", "resource", "allowed"), PERMISSIONS,
                         ids=[f"{v}-{r}" for v, r, _ in PERMISSIONS])
def test_operator_service_account_permissions(
    kube: Kube, chart_release: Release, namespace: str, verb: str, resource: str, allowed: bool
) -> None:
    """RBAC as evaluated by the API server for the chart's ServiceAccount (``auth can-i``)."""
    subject = f"system:serviceaccount:{chart_release.namespace}:{chart_release.service_account}"
    result = kube.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={subject}",
                          check=False)
    assert result.stdout.strip() == ("yes" if allowed else "no"), result.stderr


def test_statefulset_writes_only_where_the_platform_opted_a_namespace_in(
    kube: Kube, chart_release: Release, namespace: str
) -> None:
    """The chart's default binds its workloads ClusterRole nowhere; a RoleBinding in a tenant
    namespace (tenant_namespace, as a platform team does) grants exactly create and patch."""
    subject = f"system:serviceaccount:{chart_release.namespace}:{chart_release.service_account}"
    tenant = f"{namespace}-t"
    tenant_namespace(kube, chart_release, tenant)
    try:
        for verb, allowed in (("create", True), ("patch", True), ("delete", False)):
            for ns, expected in ((tenant, allowed), (namespace, False)):
                result = kube.kubectl("auth", "can-i", verb, "statefulsets.apps", "-n", ns,
                                      f"--as={subject}", check=False)
                assert result.stdout.strip() == ("yes" if expected else "no"), (verb, ns)
    finally:
        kube.kubectl("delete", "namespace", tenant, "--wait=false", "--ignore-not-found")
