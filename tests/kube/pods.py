"""Pods as a real cluster's controllers would create them (kmock runs no controllers)."""

from __future__ import annotations

import kmock

from delayq.kube import naming
from delayq.kube.redisctl import Replication
from tests.kube.conftest import NAMESPACE
from tests.kube.fakes import FakeRedis


def add_redis_pods(
    api: kmock.KubernetesEmulator,
    redis_fake: FakeRedis,
    broker: int,
    count: int,
    master: int | None = None,
    offsets: tuple[int, ...] = (),
) -> None:
    for ordinal in range(count):
        name = naming.redis_pod("orders", broker, ordinal)
        labels = {
            naming.LABEL_TOPIC: "orders",
            naming.LABEL_COMPONENT: naming.COMPONENT_REDIS,
            naming.LABEL_BROKER: str(broker),
        }
        if master == ordinal:
            labels[naming.LABEL_ROLE] = naming.ROLE_MASTER
        ip = f"10.0.{broker}.{ordinal}"
        api.objects["v1/pods", NAMESPACE, name] = {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        offset = offsets[ordinal] if ordinal < len(offsets) else 0
        role = "master" if master == ordinal else "slave"
        redis_fake.nodes[ip] = Replication(role, offset, offset)


def set_pod_ready(api: kmock.KubernetesEmulator, name: str, ready: bool) -> None:
    status = "True" if ready else "False"
    api.objects["v1/pods", NAMESPACE, name].patch(
        {"status": {"conditions": [{"type": "Ready", "status": status}]}}
    )


def add_service_pods(api: kmock.KubernetesEmulator, count: int) -> None:
    for ordinal in range(count):
        name = f"orders-service-{ordinal}"
        api.objects["v1/pods", NAMESPACE, name] = {
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": naming.service_selector("orders"),
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
