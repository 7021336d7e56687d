"""Where a broker's master Service points, written by the operator without touching a pod.

The master Service has no selector; its one endpoint is an EndpointSlice the operator writes
(builders/redis.py master_endpoint_slice) for the pod recorded as master in the ConfigMap
`<topic>-redis-masters` (builders/redis.py masters_config_map; name and uid: one incarnation
of the pod, as a label on it was), which the Redis pods also read when they start. So failover
needs no right to patch pods (docs/security.md); the operator's rights stay on objects it owns.

Every health pass publishes the broker's master again (ensure: no write when nothing changed),
so its readiness, and after a failover the new master's IP, reach the slice within one pass.
The record is written before the slice: a pass that stops between the two finds the recorded
master and writes its slice. A master Service from a version that selected by a pod label
loses its selector only after the slice exists, so the Service never goes without its master.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.kube import naming
from delayq.kube.apply import ensure
from delayq.kube.builders.bundle import adopted
from delayq.kube.builders.redis import master_endpoint_slice, masters_config_map
from delayq.kube.context import OperatorContext
from delayq.kube.spec import TopicSpec

SLICE_API = "discovery.k8s.io/v1"


async def recorded_masters(ctx: OperatorContext, spec: TopicSpec) -> dict[str, str]:
    """The topic's master record: naming.master_key(broker) -> pod name (empty: none yet)."""
    record = await ctx.kube.get(
        "v1", "ConfigMap", spec.namespace, naming.redis_masters_config_map(spec.name)
    )
    return dict((record or {}).get("data") or {})


async def publish_master(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    pod: str,
    uid: str,
    address: str | None,
    ready: bool,
) -> None:
    """Record `pod` as broker `broker`'s master and point the master Service at it; while the
    pod has no IP an existing slice is emptied (no traffic to a gone address) and none is
    created (its address family is not known yet)."""
    service = naming.redis_master_service(spec.name, broker)
    manifests = [masters_config_map(spec, broker, naming.master_record(pod, uid))]
    if address or await ctx.kube.get(SLICE_API, "EndpointSlice", spec.namespace, service):
        manifests.append(master_endpoint_slice(spec, broker, pod, address, ready))
    for manifest in adopted(owner, manifests):
        await ensure(ctx.kube, manifest)
    found = await ctx.kube.get("v1", "Service", spec.namespace, service)
    if found is not None and (found.get("spec") or {}).get("selector"):
        patch = {"spec": {"selector": None}}  # merge patch: null removes the field
        await ctx.kube.patch("v1", "Service", spec.namespace, service, patch)
