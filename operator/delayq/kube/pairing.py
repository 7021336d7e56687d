"""A new broker's Redis pods are scheduled only once its delay-service pod is placed.

Broker `i`'s Redis pods prefer the node of delay-service pod `i` (builders/redis.py,
`redis_affinity`), but a preference matches only pods already bound to a node. The service
StatefulSet is applied first, yet on a loaded cluster its controller and the scheduler may take
the Redis pods first: broker 2's master then landed on another node than service pod 2 (e2e,
test_placement.py, seen under load in CI). So a Redis StatefulSet that does not exist yet is
created only once service pod `i` is bound, or once this reconcile has waited `wait_s` in all
(pods that cannot be scheduled never keep the brokers from starting; the pairing stays a
preference). A StatefulSet that exists is updated at once: a rolled or failed-over broker is
placed by its own pods' rules, and only the first placement waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from delayq.kube import naming
from delayq.kube.builders.common import Manifest
from delayq.kube.client import KubeClient

#: The most one reconcile waits for service pods to be placed (OperatorContext.pairing_wait_s).
PAIRING_WAIT_S = 20.0
POLL_S = 0.25  # between two lists of the service pods; placing one takes about a second


class ServicePodPlacement:
    """One reconcile's wait for the service pods its new Redis StatefulSets pair with: its
    `wait_s` counts from the first wait and is shared by every broker, so a topic of many
    brokers whose service pods cannot be scheduled waits `wait_s` once, not once a broker.
    Pods are listed by the topic's service selector (the operator may list pods in a tenant's
    namespace, not get them: charts/delayq/templates/operator/rbac.yaml)."""

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        topic: str,
        brokers: int,
        wait_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._selector = naming.service_selector(topic)
        self._service_pods = {
            naming.redis_statefulset(topic, broker): (
                f"{naming.service_statefulset(topic)}-{broker}"
            )
            for broker in range(brokers)
        }
        self._wait_s = wait_s
        self._monotonic = monotonic
        self._deadline: float | None = None
        self._placed: set[str] = set()  # service pods seen bound to a node

    async def before_create(self, manifest: Manifest) -> None:
        """Return once `manifest` may be created: at once unless it is a broker's Redis
        StatefulSet, else when its service pod is bound to a node or the wait is spent."""
        if manifest["kind"] != "StatefulSet":
            return
        pod = self._service_pods.get(manifest["metadata"]["name"])
        if pod is None:
            return
        if self._deadline is None:
            self._deadline = self._monotonic() + self._wait_s
        while pod not in self._placed and self._monotonic() < self._deadline:
            pods = await self._kube.list("v1", "Pod", self._namespace, self._selector)
            self._placed.update(
                found["metadata"]["name"]
                for found in pods
                if (found.get("spec") or {}).get("nodeName")
            )
            if pod not in self._placed:
                await asyncio.sleep(POLL_S)
