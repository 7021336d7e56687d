"""The chart's RBAC: exactly the verbs the operator uses, workloads only where opted in, no
Secret of a tenant readable, the leader Lease by name (docs/security.md, "Operator RBAC")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kube.chart_support import (
    VALUE_SETS,
    of_kind,
    render,
)

# Exactly what the operator's code calls (client.py users and kopf); nothing more.
TOPIC_RULES = {
    ("delayq.io", "delaytopics"): {"get", "list", "watch", "patch"},
    ("delayq.io", "delaytopics/status"): {"get", "patch"},
    ("apps", "statefulsets"): {"get"},  # writes: WORKLOAD_RULES, where tenants run topics
    ("batch", "cronjobs"): {"get"},  # spec.backup's status; writes: WORKLOAD_RULES
    ("", "services"): {"get", "create", "patch"},
    ("", "configmaps"): {"get", "create", "patch"},
    # written, never read, listed or deleted: the operator's copies are in its own namespace
    ("", "secrets"): {"create", "patch"},
    # no patch: the master Service follows an EndpointSlice; delete: WORKLOAD_RULES
    ("", "pods"): {"list"},
    ("discovery.k8s.io", "endpointslices"): {"get", "create", "patch"},
    ("", "events"): {"create"},
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"get", "create", "patch", "delete"},
    ("monitoring.coreos.com", "servicemonitors"): {"get", "create", "patch"},
}
# where tenants run topics: the StatefulSets, and their broker pods' roll (delete, uid
# precondition: the operator rolls what it updated, updateStrategy OnDelete)
WORKLOAD_RULES = {
    ("apps", "statefulsets"): {"create", "patch"},
    ("", "pods"): {"delete"},
    # spec.backup's CronJob, deleted when spec.backup is removed (owned ones only)
    ("batch", "cronjobs"): {"create", "patch", "delete"},
}
CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
}


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    result: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"], "no wildcard verbs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in resource, "no wildcard resources"
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


def merged(*rule_sets: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    result: dict[tuple[str, str], set[str]] = {}
    for rules in rule_sets:
        for key, verbs in rules.items():
            result.setdefault(key, set()).update(verbs)
    return result


def named(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in of_kind(docs, kind)}


def workload_bindings(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        binding
        for binding in [*of_kind(docs, "RoleBinding"), *of_kind(docs, "ClusterRoleBinding")]
        if binding["roleRef"]["name"] == "rel-delayq-workloads"
    ]


def test_cluster_wide_rbac_is_least_privilege_with_no_workload_writes_anywhere() -> None:
    """The default: the ClusterRole bound cluster-wide cannot create or patch a StatefulSet;
    the workloads ClusterRole exists to be bound per namespace, and nothing binds it."""
    docs = render("defaults")
    roles = named(docs, "ClusterRole")
    assert set(roles) == {"rel-delayq-cluster", "rel-delayq-workloads"}
    assert grants(roles["rel-delayq-cluster"]) == {**CLUSTER_RULES, **TOPIC_RULES}
    assert grants(roles["rel-delayq-workloads"]) == WORKLOAD_RULES
    assert workload_bindings(docs) == []


def test_workload_namespaces_get_a_role_binding_each() -> None:
    docs = render("workload-namespaces")
    bindings = workload_bindings(docs)
    assert sorted((b["kind"], b["metadata"]["namespace"]) for b in bindings) == [
        ("RoleBinding", "billing"),
        ("RoleBinding", "shop"),
    ]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "ClusterRole"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-delayq", "namespace": "delayq-system"}
        ]
    cluster = named(docs, "ClusterRole")["rel-delayq-cluster"]
    assert grants(cluster) == {**CLUSTER_RULES, **TOPIC_RULES}


def test_cluster_wide_workloads_is_the_earlier_grant_when_asked_for() -> None:
    docs = render("cluster-wide-workloads")
    roles = named(docs, "ClusterRole")
    assert set(roles) == {"rel-delayq-cluster"}
    assert grants(roles["rel-delayq-cluster"]) == merged(CLUSTER_RULES, TOPIC_RULES, WORKLOAD_RULES)


def test_namespaced_rbac_uses_roles_per_namespace() -> None:
    docs = render("namespaced")
    (cluster_role,) = of_kind(docs, "ClusterRole")
    assert grants(cluster_role) == CLUSTER_RULES
    roles = [role for role in of_kind(docs, "Role") if role["metadata"]["name"] == "rel-delayq"]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["billing", "shop"]
    for role in roles:  # a watched namespace is one where delayq is installed for tenants
        assert grants(role) == merged(TOPIC_RULES, WORKLOAD_RULES)
    assert workload_bindings(docs) == []


def test_no_secret_of_a_tenant_is_readable_and_the_copies_are_in_the_release_namespace() -> None:
    """Cluster-wide, the default: Secrets are create/patch everywhere (the tenants'
    <t>-credentials), get/list/delete only in the release's namespace (the operator's copies,
    kube/credentials.py); operator.legacySecretRead adds get, for one release."""
    for value_set in ("defaults", "workload-namespaces", "namespaced"):
        docs = render(value_set)
        everywhere = [*of_kind(docs, "ClusterRole")]
        everywhere += [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == "rel-delayq"]
        for role in everywhere:
            assert grants(role).get(("", "secrets"), {"create", "patch"}) == {"create", "patch"}
        (copies,) = [
            r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-credentials")
        ]
        assert copies["metadata"]["namespace"] == "delayq-system"
        assert grants(copies) == {("", "secrets"): {"get", "list", "create", "patch", "delete"}}
        (binding,) = [
            b
            for b in of_kind(docs, "RoleBinding")
            if b["metadata"]["name"] == "rel-delayq-credentials"
        ]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rel-delayq-credentials",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-delayq", "namespace": "delayq-system"}
        ]
        (deployment,) = of_kind(docs, "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"name": "DELAYQ_LEGACY_SECRET_READ", "value": "false"} in container["env"]
    legacy = render("legacy-secret-read")
    cluster = named(legacy, "ClusterRole")["rel-delayq-cluster"]
    assert grants(cluster)[("", "secrets")] == {"get", "create", "patch"}
    (deployment,) = of_kind(legacy, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "DELAYQ_LEGACY_SECRET_READ", "value": "true"} in container["env"]


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_the_leader_lease_role_is_namespaced_and_limited_to_the_lease(value_set: str) -> None:
    docs = render(value_set)
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == "rel-delayq-leader"]
    assert role["metadata"]["namespace"] == "delayq-system"  # the release's, where it runs
    assert grants(role) == {("coordination.k8s.io", "leases"): {"get", "create", "patch"}}
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["delayq-operator"],
            "verbs": ["get", "patch"],
        }
    ]
    (binding,) = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == "rel-delayq-leader"
    ]
    assert binding["roleRef"]["name"] == "rel-delayq-leader"
    assert binding["metadata"]["namespace"] == "delayq-system"
    assert not [doc for doc in docs if doc["apiVersion"].startswith("kopf.dev/")]
