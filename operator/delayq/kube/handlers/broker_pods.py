"""A broker's Redis pods as the operator observes them (Kubernetes and INFO replication), for
failover.decide (handlers/health.py) and the roll (handlers/rolling.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.failover import RedisPod
from delayq.kube.spec import TopicSpec

REVISION_LABEL = "controller-revision-hash"  # set by the StatefulSet controller on its pods


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def service_nodes(pods: Iterable[Mapping[str, Any]], topic: str) -> dict[int, str]:
    """Broker index -> the node its delay-service pod is bound to (pod `<t>-service-<i>`
    works broker `i`'s slots). Only the service StatefulSet's pods count: anyone may label a pod
    of their own like one."""
    statefulset = naming.service_statefulset(topic)
    nodes = {}
    for pod in pods:
        ordinal = naming.pod_ordinal(statefulset, pod["metadata"]["name"])
        node = (pod.get("spec") or {}).get("nodeName")
        if ordinal is not None and node:
            nodes[ordinal] = str(node)
    return nodes


@dataclass(frozen=True)
class BrokerPods:
    """A broker's Redis pods as observed: for failover.decide, and their addresses and UIDs."""

    pods: list[RedisPod]
    addresses: dict[str, str | None]
    uids: dict[str, str]
    revisions: dict[str, str]  # the pods' StatefulSet revision (controller-revision-hash)

    @property
    def ready(self) -> set[str]:
        return {pod.name for pod in self.pods if pod.ready}


async def observe_pods(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    password: str,
    recorded: str | None,
    service_node: str = "",
) -> BrokerPods:
    """The broker's Redis pods, each with its replication as it answers (None: silent),
    whether it is the recorded master and whether it runs on `service_node` (the node of the
    broker's delay-service pod; empty: unknown or not placed)."""
    raw_pods = await ctx.kube.list(
        "v1", "Pod", spec.namespace, naming.redis_selector(spec.name, broker)
    )
    pods, addresses, uids, revisions = [], {}, {}, {}
    statefulset = naming.redis_statefulset(spec.name, broker)
    for pod in raw_pods:
        name = pod["metadata"]["name"]
        ordinal = naming.pod_ordinal(statefulset, name)
        if ordinal is None:
            continue  # labelled like the broker's pods, not one of them
        address = (pod.get("status") or {}).get("podIP")
        addresses[name] = address
        uids[name] = str(pod["metadata"].get("uid") or "")
        labels = pod["metadata"].get("labels") or {}
        revisions[name] = str(labels.get(REVISION_LABEL) or "")
        if recorded is None:
            named = labels.get(naming.LEGACY_LABEL_ROLE) == naming.LEGACY_ROLE_MASTER
        else:
            named = naming.master_record(name, uids[name]) == recorded
        info = await ctx.redis.inspect(address, password) if address else None
        pods.append(
            RedisPod(
                name=name,
                ordinal=ordinal,
                ready=pod_ready(pod),
                named_master=named,
                role=info.role if info else None,
                offset=info.offset if info else 0,
                keys=info.keys if info else 0,
                terminating=bool(pod["metadata"].get("deletionTimestamp")),
                link_up=bool(info and info.link_up),
                synced=bool(info and info.synced),
                master_volume=not named and (recorded or "").startswith(f"{name}/"),
                beside_service=bool(service_node)
                and (pod.get("spec") or {}).get("nodeName") == service_node,
            )
        )
    return BrokerPods(pods, addresses, uids, revisions)
