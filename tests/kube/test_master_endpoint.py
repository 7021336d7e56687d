"""The master Service's endpoint is written by the operator (kube/master_endpoint.py), on
kmock with real redis-servers: it follows the recorded master's readiness, a master's pod made
again is not the master until a failover decides so (its volume may be new), and a topic of a
version that labelled its master pod is taken over without a failover and without the Service
losing its master."""

from __future__ import annotations

import logging
from typing import Any

import kmock

from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from tests.kube.conftest import Clock
from tests.kube.pods import SLICES, RedisPods, add_service_pods, set_pod_ready
from tests.kube.test_handlers import body, existing, provision, put_topic, write_status

SERVICE = naming.redis_master_service("orders", 0)


def endpoints(api: kmock.KubernetesEmulator) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = existing(api, SLICES, SERVICE)["endpoints"]
    return found


async def test_the_slice_follows_readiness_and_a_remade_master_pod_waits_for_the_failover(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    put_topic(api, replicasPerBroker=1)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2, master=0)
    add_service_pods(api, 1)
    write_status(api, await refresh(ctx, body(api), logger))
    slice_ = existing(api, SLICES, SERVICE)
    assert slice_["metadata"]["labels"][naming.LABEL_SERVICE_NAME] == SERVICE
    assert slice_["metadata"]["labels"][naming.LABEL_SLICE_MANAGED_BY] == naming.SLICE_MANAGER
    assert slice_["metadata"]["ownerReferences"][0]["kind"] == "DelayTopic"  # deleted with it
    set_pod_ready(api, "orders-redis-0-0", False)
    write_status(api, await refresh(ctx, body(api), logger))
    assert endpoints(api)[0]["conditions"] == {"ready": False}  # no traffic while not ready
    set_pod_ready(api, "orders-redis-0-0", True)
    write_status(api, await refresh(ctx, body(api), logger))
    assert endpoints(api)[0]["conditions"] == {"ready": True}

    # The master's pod is made again (same name, new uid and IP, Ready): not the recorded
    # incarnation, so not master before the grace; then the failover picks by offset.
    redis_pods.recreate("orders-redis-0-0", "10.0.9.9")
    write_status(api, await refresh(ctx, body(api), logger))
    assert body(api)["status"]["brokers"][0]["state"] == "MasterMissing"
    assert endpoints(api)[0]["addresses"] == ["10.0.0.0"]  # still the recorded incarnation's
    clock.now += ctx.failover_grace_s + 1
    write_status(api, await refresh(ctx, body(api), logger))
    master = body(api)["status"]["brokers"][0]["masterPod"]
    assert redis_pods.recorded_master(0) == master
    assert endpoints(api)[0]["addresses"] == [redis_pods.pods[master].ip]
    assert redis_pods.served_master(0) is redis_pods.pods[master]
    assert body(api)["status"]["brokers"][0]["lastFailoverTime"]


async def test_a_topic_whose_master_was_labelled_keeps_its_master_and_its_service_converts(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Regression (upgrade): the operator before this one moved a role label and the master
    Service selected it; there is neither record nor slice. The labelled pod (pod 1 here: an
    election would pick pod 0) stays master, its slice is written, and only then does the
    Service lose its selector."""
    put_topic(api, replicasPerBroker=1)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2, master=1)
    add_service_pods(api, 1)
    # What the older operator left: no record, no slice, a label and a Service selecting it.
    del api.objects["v1/configmaps", "shop", naming.redis_masters_config_map("orders")]
    del api.objects[SLICES, "shop", SERVICE]
    label = {naming.LEGACY_LABEL_ROLE: naming.LEGACY_ROLE_MASTER}
    api.objects["v1/pods", "shop", "orders-redis-0-1"].patch({"metadata": {"labels": label}})
    selector = {**naming.redis_selector("orders", 0), **label}
    api.objects["v1/services", "shop", SERVICE].patch({"spec": {"selector": selector}})

    write_status(api, await refresh(ctx, body(api), logger))
    assert redis_pods.replication("orders-redis-0-1")["role"] == "master"
    assert redis_pods.replication("orders-redis-0-0")["role"] == "slave"
    assert redis_pods.recorded_master(0) == "orders-redis-0-1"
    assert redis_pods.served_master(0) is redis_pods.pods["orders-redis-0-1"]
    assert "selector" not in existing(api, "v1/services", SERVICE)["spec"]
    broker = body(api)["status"]["brokers"][0]
    assert (broker["masterPod"], broker["state"], broker.get("lastFailoverTime")) == (
        "orders-redis-0-1",
        "Ready",
        None,
    )
