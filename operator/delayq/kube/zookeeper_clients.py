"""Which namespaces may reach the bundled ZooKeeper: those holding DelayTopics, kept current.

Pod labels alone are no identity: any tenant can label its own pods like delay-service pods. A
namespace's `kubernetes.io/metadata.name` label is set by the API server and cannot be changed,
so the ZooKeeper NetworkPolicy admits delay-service pods only from namespaces named there. With
`operator.watchNamespaces` the chart lists them; in the cluster-wide mode the chart creates the
NetworkPolicy `<release>-zookeeper-clients` without rules (it admits nothing) and the leader's
health loop (healthloop.py) replaces its rules with the namespaces that hold DelayTopics on every
tick. A narrow Role lets the operator get and patch that one policy in its own namespace and
nothing else; the chart leaves its rules alone on upgrade (it never renders them).

A namespace gains access at most one health interval after its first DelayTopic appears (its
pods take longer to start), and loses it one interval after its last topic is gone.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from delayq.kube.client import KubeClient
from delayq.kube.naming import (
    COMPONENT_BACKUP,
    COMPONENT_SERVICE,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)

#: The policy's name, set by the chart in the cluster-wide mode with the bundled ZooKeeper only.
POLICY_ENV = "DELAYQ_ZOOKEEPER_CLIENTS_POLICY"
CLIENT_PORT = 2181
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server, immutable
#: The topics' pods that read the routing: delay-service pods and scheduled backups' pods.
CLIENT_PODS = {
    "matchLabels": {LABEL_MANAGED_BY: MANAGED_BY},
    "matchExpressions": [
        {"key": LABEL_COMPONENT, "operator": "In", "values": [COMPONENT_BACKUP, COMPONENT_SERVICE]}
    ],
}
NETWORKING = "networking.k8s.io/v1"


def clients_ingress(namespaces: Iterable[str]) -> list[dict[str, Any]]:
    """The policy's ingress rules: delay-service and backup pods of `namespaces`, ZooKeeper's
    client port.

    No namespace gives no rule at all: a rule with an empty `from` would admit every source.
    """
    peers = [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
            "podSelector": copy.deepcopy(CLIENT_PODS),
        }
        for namespace in sorted(set(namespaces))
    ]
    if not peers:
        return []
    return [{"ports": [{"port": CLIENT_PORT, "protocol": "TCP"}], "from": peers}]


async def admit_topic_namespaces(
    kube: KubeClient,
    namespace: str,
    name: str,
    topics: Iterable[Mapping[str, Any]],
    logger: logging.Logger,
) -> None:
    """Make the policy `namespace/name` admit exactly the namespaces of `topics` (one GET, and a
    merge patch replacing the rules when they differ). A missing policy is logged: the chart
    creates it, so it is gone only by hand, and nothing the operator may do recreates it."""
    admitted = sorted({topic["metadata"]["namespace"] for topic in topics})
    wanted = clients_ingress(admitted)
    policy = await kube.get(NETWORKING, "NetworkPolicy", namespace, name)
    if policy is None:
        logger.warning(
            "NetworkPolicy %s/%s is missing: no topic reaches ZooKeeper", namespace, name
        )
        return
    if (policy.get("spec", {}).get("ingress") or []) == wanted:
        return
    await kube.patch(NETWORKING, "NetworkPolicy", namespace, name, {"spec": {"ingress": wanted}})
    logger.info("ZooKeeper admits the delay-service pods of namespaces %s", admitted)
