"""Handler bodies against kmock (the Kubernetes API) with real ZooKeeper and Redis servers.

The handlers are called directly, the way the kopf wrappers in operator.py call them, and the
status patches they return are applied to the stored DelayTopic as kopf would. What they did
outside Kubernetes is read back from the real servers: the nodes in ZooKeeper, and each Redis
pod's `INFO replication` (its pods are local redis-servers, see pods.py).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from typing import Any, cast

import kmock
import kopf
import pytest
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths, encode_member
from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.errors import TopicFailure
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.libraries import LIBRARY_GRACE_S
from delayq.kube.operator import serialized
from delayq.queue import acl, functions
from tests.kube.conftest import (
    DT,
    Clock,
    own_slots,
    published_routing,
    topic_tree_exists,
)
from tests.kube.pods import (
    NAMESPACE,
    OPERATOR_NAMESPACE,
    RedisPods,
    add_service_pods,
    fill,
    set_pod_ready,
)

STS = "apps/v1/statefulsets"


def put_topic(api: kmock.KubernetesEmulator, name: str = "orders", **spec: Any) -> None:
    api.objects[DT, NAMESPACE, name] = {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "generation": 1},
        "spec": spec,
    }


def body(api: kmock.KubernetesEmulator, name: str = "orders") -> dict[str, Any]:
    raw: dict[str, Any] = api.objects[DT, NAMESPACE, name].raw
    return raw


def update_spec(api: kmock.KubernetesEmulator, name: str = "orders", **spec: Any) -> None:
    obj = api.objects[DT, NAMESPACE, name]
    generation = obj.raw["metadata"]["generation"] + 1
    obj.patch({"spec": spec, "metadata": {"generation": generation}})


def write_status(
    api: kmock.KubernetesEmulator, patch: dict[str, Any], name: str = "orders"
) -> None:
    if patch:
        api.objects[DT, NAMESPACE, name].patch({"status": patch})


def condition(api: kmock.KubernetesEmulator, kind: str, name: str = "orders") -> dict[str, Any]:
    for item in body(api, name).get("status", {}).get("conditions", []):
        if item["type"] == kind:
            return dict(item)
    raise AssertionError(f"no {kind} condition")


def get(api: kmock.KubernetesEmulator, resource: str, name: str) -> dict[str, Any] | None:
    try:
        obj = api.objects[resource, NAMESPACE, name]
    except KeyError:
        return None
    return None if obj.deleted else dict(obj.raw)


def existing(api: kmock.KubernetesEmulator, resource: str, name: str) -> dict[str, Any]:
    obj = get(api, resource, name)
    assert obj is not None, f"no {resource} {name}"
    return obj


async def provision(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    write_status(api, await reconcile(ctx, body(api), logger))


# --- create ---------------------------------------------------------------------------------


async def test_create_provisions_everything_and_publishes_routing(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, brokers=2, replicasPerBroker=1, slotAmount=8)
    await provision(api, ctx, logger)
    for name in ("orders-redis-0", "orders-redis-1", "orders-service"):
        assert get(api, STS, name) is not None
    assert get(api, "v1/secrets", "orders-credentials") is not None
    for policy in ("orders-redis", "orders-service"):
        assert get(api, "networking.k8s.io/v1/networkpolicies", policy) is not None
    assert get(api, "monitoring.coreos.com/v1/servicemonitors", "orders-api") is None
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0, 0, 0, 0, 1, 1, 1, 1)
    config_map = existing(api, "v1/configmaps", "orders-config")
    assert '"slot_amount": 8' in config_map["data"][naming.CONFIG_KEY]  # what pods read
    status = body(api)["status"]
    assert status["observedGeneration"] == 1
    assert status["appliedSlotAmount"] == 8
    assert condition(api, "Provisioned")["reason"] == "ResourcesApplied"
    assert condition(api, "Ready")["status"] == "False"


async def test_service_monitor_is_created_when_its_crd_exists(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    api.resources["monitoring.coreos.com/v1/servicemonitors"] = kmock.ResourceInfo(
        kind="ServiceMonitor", namespaced=True, verbs={"list"}
    )
    put_topic(api)
    await provision(api, ctx, logger)
    assert get(api, "monitoring.coreos.com/v1/servicemonitors", "orders-api") is not None


async def test_credentials_are_generated_once_and_never_rotated(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    first = get(api, "v1/secrets", "orders-credentials")
    assert first is not None
    keys = (
        naming.SECRET_API_TOKEN,
        naming.SECRET_READ_TOKEN,
        naming.SECRET_METRICS_TOKEN,
        naming.SECRET_LEASE_TOKEN_KEY,
        naming.SECRET_OPERATOR_METRICS_TOKEN,
    )
    tokens = {first["data"][k] for k in keys}
    assert len(tokens) == 5  # each token and the lease-token key is its own secret
    update_spec(api, maxRetries=3)
    await provision(api, ctx, logger)
    assert get(api, "v1/secrets", "orders-credentials") == first


@pytest.mark.parametrize(
    "added",
    [
        naming.SECRET_ZOOKEEPER_PASSWORD,
        naming.SECRET_READ_TOKEN,
        naming.SECRET_METRICS_TOKEN,
        naming.SECRET_LEASE_TOKEN_KEY,
        naming.SECRET_OPERATOR_METRICS_TOKEN,
    ],
)
async def test_a_credential_an_older_operator_did_not_create_is_added_and_none_rotated(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger, added: str
) -> None:
    """An older operator kept no copy of the credentials (kube/credentials.py): with
    legacy_secret_read the topic's Secret seeds it, and the keys it lacks are added."""
    put_topic(api)
    await provision(api, ctx, logger)
    first = get(api, "v1/secrets", "orders-credentials")
    assert first is not None
    older = {k: v for k, v in first["data"].items() if k != added}
    api.objects["v1/secrets", NAMESPACE, "orders-credentials"] = {**first, "data": older}
    del api.objects["v1/secrets", OPERATOR_NAMESPACE, naming.credentials_copy(NAMESPACE, "orders")]
    ctx.config = dataclasses.replace(ctx.config, legacy_secret_read=True)
    update_spec(api, maxRetries=3)
    await provision(api, ctx, logger)
    after = get(api, "v1/secrets", "orders-credentials")
    assert after is not None
    assert after["data"][added]  # the pods' env needs the key
    assert {k: after["data"][k] for k in older} == older  # no live credential rotated


async def test_the_stream_readers_password_is_generated_once_into_its_own_secret(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api, topicType="stream", replicasPerBroker=0)
    await provision(api, ctx, logger)
    reader = existing(api, "v1/secrets", "orders-stream-reader")
    password = reader["data"][naming.SECRET_STREAM_READER_PASSWORD]
    credentials = existing(api, "v1/secrets", "orders-credentials")["data"].values()
    assert password
    assert password not in credentials  # a login of its own
    update_spec(api, topicType="stream", replicasPerBroker=0, maxRetries=3)
    await provision(api, ctx, logger)
    assert existing(api, "v1/secrets", "orders-stream-reader") == reader  # never rotated


async def test_second_reconcile_writes_nothing(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    secrets = {name: existing(api, "v1/secrets", name) for name in ("orders-credentials",)}
    before = len(list(api))  # kmock iterates over the requests it served
    assert await reconcile(ctx, body(api), logger) == {}
    writes = [r for r in list(api)[before:] if r.method.value in ("POST", "PATCH")]
    # the tenant's Secret is written blind (never read), with what it already holds
    assert [(w.method.value, str(w.url.path)) for w in writes] == [
        ("PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/orders-credentials")
    ]
    assert {name: existing(api, "v1/secrets", name) for name in secrets} == secrets


# --- update ---------------------------------------------------------------------------------


async def test_more_brokers_and_replicas_roll_out_without_moving_slots(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, brokers=1, replicasPerBroker=0, slotAmount=4)
    await provision(api, ctx, logger)
    update_spec(api, brokers=2, replicasPerBroker=2)
    await provision(api, ctx, logger)
    assert existing(api, STS, "orders-redis-0")["spec"]["replicas"] == 3
    assert existing(api, STS, "orders-redis-1")["spec"]["replicas"] == 3
    assert existing(api, STS, "orders-service")["spec"]["replicas"] == 2
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0, 0, 0, 0)  # messages stay where they are
    assert routing.broker_count == 2


async def test_slot_amount_growth_renders_the_desired_amount_and_keeps_the_routing(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    """Growth is provisioned at once: the pods get the new amount (they serve the routing's),
    the routing keeps the served amount until the health pass splits the slots."""
    put_topic(api, slotAmount=8)
    await provision(api, ctx, logger)
    update_spec(api, slotAmount=16)
    await provision(api, ctx, logger)
    provisioned = condition(api, "Provisioned")
    assert (provisioned["status"], provisioned["reason"]) == ("True", "ResourcesApplied")
    assert body(api)["status"]["appliedSlotAmount"] == 8
    routing = published_routing(zk)
    assert routing is not None
    assert routing.slot_amount == 8
    config_map = existing(api, "v1/configmaps", "orders-config")
    assert '"slot_amount": 16' in config_map["data"][naming.CONFIG_KEY]  # what pods read
    assert body(api)["status"]["observedGeneration"] == 2


async def test_slot_amount_shrink_stored_before_the_rule_is_refused(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, slotAmount=16)
    await provision(api, ctx, logger)
    update_spec(api, slotAmount=8)
    await provision(api, ctx, logger)
    provisioned = condition(api, "Provisioned")
    assert (provisioned["status"], provisioned["reason"]) == ("False", "SlotAmountShrinkRejected")
    assert "keeps serving 16 slots" in provisioned["message"]
    routing = published_routing(zk)
    assert routing is not None
    assert routing.slot_amount == 16
    config_map = existing(api, "v1/configmaps", "orders-config")
    assert '"slot_amount": 16' in config_map["data"][naming.CONFIG_KEY]


async def test_worker_settings_roll_the_service_pods(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    template = existing(api, STS, "orders-service")["spec"]["template"]
    before = template["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION]
    update_spec(api, worker={"concurrency": 99})
    await provision(api, ctx, logger)
    template = existing(api, STS, "orders-service")["spec"]["template"]
    assert template["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION] != before
    config = existing(api, "v1/configmaps", "orders-config")["data"][naming.CONFIG_KEY]
    assert '"worker_concurrency": 99' in config


# --- invalid spec, transient failures, pause --------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"topicType": "webhook"}, ("webhook.url",)),
        # a valid Kubernetes quantity whose exact value has a billion digits: sizing maxmemory
        # from it held the operator's event loop (every topic's reconciles, health passes and
        # its leader lease) for hours (before: no answer within the test's timeout)
        (
            {"redis": {"resources": {"limits": {"memory": "1e999999999"}}}},
            ("redis.resources.limits.memory", "exponent of at most two digits"),
        ),
    ],
    ids=["webhook-without-url", "huge-memory-exponent"],
)
async def test_invalid_spec_is_a_permanent_failure_with_a_reason(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    spec: dict[str, Any],
    named: tuple[str, ...],
) -> None:
    put_topic(api, **spec)
    with pytest.raises(TopicFailure) as failure:
        await reconcile(ctx, body(api), logger)
    assert failure.value.permanent
    write_status(api, failure.value.status)
    ready = condition(api, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    for text in named:
        assert text in ready["message"]
    for built in ("orders-service", "orders-redis-0"):
        assert get(api, STS, built) is None  # nothing half-built


async def test_unreachable_zookeeper_is_transient_with_backoff(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, dead_zookeeper: str, logger: logging.Logger
) -> None:
    put_topic(api, zookeeper={"connect": dead_zookeeper})
    with pytest.raises(TopicFailure) as failure:
        await reconcile(ctx, body(api), logger)
    assert not failure.value.permanent
    assert failure.value.delay_s > 0
    write_status(api, failure.value.status)
    assert condition(api, "Provisioned")["reason"] == "ZooKeeperUnavailable"
    assert get(api, STS, "orders-redis-0") is not None  # the pods still come up


async def test_paused_topic_is_not_reconciled(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api)
    api.objects[DT, NAMESPACE, "orders"].patch(
        {"metadata": {"annotations": {naming.PAUSED_ANNOTATION: "true"}}}
    )
    await provision(api, ctx, logger)
    assert get(api, STS, "orders-service") is None
    assert not topic_tree_exists(zk)  # nothing published
    assert condition(api, "Provisioned")["reason"] == "Paused"
    assert await refresh(ctx, body(api), logger) == {}


# --- health and failover --------------------------------------------------------------------


async def two_fresh_brokers(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Topic `orders` provisioned with 2 brokers and 4 slots, every slot owned, its service
    pods ready and each broker's 2 Redis pods fresh: replicas of a master Service that selects
    nothing yet, so the next health pass elects the first masters."""
    put_topic(api, brokers=2, slotAmount=4)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)
    redis_pods.add(1, 2)
    add_service_pods(api, 2)
    own_slots(zk, 4)


async def test_health_elects_masters_and_reports_ready(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    await two_fresh_brokers(api, ctx, zk, redis_pods, logger)
    assert redis_pods.replication("orders-redis-0-0")["role"] == "slave"
    write_status(api, await refresh(ctx, body(api), logger))
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"  # promoted
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    assert redis_pods.recorded_master(0) == "orders-redis-0-0"
    served = redis_pods.served_master(0)
    assert served is not None
    assert served.name == "orders-redis-0-0"
    status = body(api)["status"]
    assert [b["masterPod"] for b in status["brokers"]] == ["orders-redis-0-0", "orders-redis-1-0"]
    assert status["brokers"][0]["replicasReady"] == 1
    assert status["slots"] == {"total": 4, "owned": 4, "unowned": 0}
    assert condition(api, "Ready")["reason"] == "Serving"
    assert condition(api, "Degraded")["status"] == "False"

    # Real messages on each elected master: 5 still delayed and 1 claimed by a worker.
    routing = published_routing(zk)
    assert routing is not None
    for broker, master in enumerate(("orders-redis-0-0", "orders-redis-1-0")):
        queue = redis_pods.queue(master, slot_amount=4)
        fill(queue, routing.slots_of(broker), scheduled=5, prepared=1)
        queue.close()
    write_status(api, await refresh(ctx, body(api), logger))
    assert body(api)["status"]["depths"] == {"scheduled": 10, "prepared": 2, "dead": 0}
    # A pass with nothing changed writes nothing.
    assert await refresh(ctx, body(api), logger) == {}


def on_node(api: kmock.KubernetesEmulator, pod: str, node: str) -> None:
    """What the scheduler's binding leaves on a pod."""
    api.objects["v1/pods", NAMESPACE, pod].patch({"spec": {"nodeName": node}})


async def test_health_elects_the_redis_pod_beside_each_service_pod_first(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Broker 0's replica took service pod 0's node (seen in e2e, 2026-11-30): it, not pod 0,
    becomes the first master; broker 1 waits for its pod beside service pod 1 to be ready."""
    await two_fresh_brokers(api, ctx, zk, redis_pods, logger)
    for pod, node in {
        "orders-service-0": "node-b",
        "orders-service-1": "node-c",
        "orders-redis-0-0": "node-a",
        "orders-redis-0-1": "node-b",
        "orders-redis-1-0": "node-a",
        "orders-redis-1-1": "node-c",
    }.items():
        on_node(api, pod, node)
    # a pod labelled like a service pod, not one of the StatefulSet's, is no service pod
    api.objects["v1/pods", NAMESPACE, "impostor"] = {
        "metadata": {
            "name": "impostor",
            "namespace": NAMESPACE,
            "labels": naming.service_selector("orders"),
        },
        "spec": {"nodeName": "node-a"},
    }
    set_pod_ready(api, "orders-redis-1-1", False)
    write_status(api, await refresh(ctx, body(api), logger))
    brokers = body(api)["status"]["brokers"]
    assert (brokers[0]["state"], brokers[0]["masterPod"]) == ("Ready", "orders-redis-0-1")
    assert redis_pods.replication("orders-redis-0-1")["role"] == "master"
    assert (brokers[1]["state"], brokers[1]["masterPod"]) == ("WaitingForPodBesideService", "")
    assert redis_pods.recorded_master(1) is None
    set_pod_ready(api, "orders-redis-1-1", True)
    write_status(api, await refresh(ctx, body(api), logger))
    assert body(api)["status"]["brokers"][1]["masterPod"] == "orders-redis-1-1"
    assert redis_pods.replication("orders-redis-1-1")["role"] == "master"
    assert condition(api, "Ready")["reason"] == "Serving"


async def test_health_loads_the_functions_library_on_a_master_that_lost_it(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The service user may only FCALL: the operator (as delayq-operator) loads the engine's
    library on each master, on a new broker and again after FUNCTION FLUSH (or a restart
    without its data). Replicas get it by replication (tests/kube/test_redis_start_script.py)."""
    put_topic(api)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)
    library = functions.library()
    caplog.set_level(logging.INFO)
    for _ in range(2):
        caplog.clear()
        write_status(api, await refresh(ctx, body(api), logger))
        assert "loaded the functions library on broker 0" in caplog.messages
        with redis_pods.client("orders-redis-0-0") as master:
            assert master.fcall_ro(library.version_function, 0) == library.name.encode()
            master.function_flush()
    caplog.clear()
    await refresh(ctx, body(api), logger)
    assert "loaded the functions library on broker 0" in caplog.messages
    await refresh(ctx, body(api), logger)  # there already: nothing to load
    assert caplog.messages.count("loaded the functions library on broker 0") == 1


async def test_health_deletes_a_functions_library_nobody_calls_after_a_grace(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each version's library stays on the brokers until none of its clients is left: the
    operator's own and those live members name (an old pod of a rolling upgrade) are kept, and
    so is every one while a member names none (an older version: unknown); the others go once
    unused for LIBRARY_GRACE_S. Before, they accumulated forever (~75 KB each)."""
    put_topic(api)
    await provision(api, ctx, logger)
    redis_pods.add(0, 1)
    write_status(api, await refresh(ctx, body(api), logger))  # elects orders-redis-0-0
    current = functions.library()
    old, stale = "delayq_00000000000000a1", "delayq_00000000000000a2"
    with redis_pods.client("orders-redis-0-0") as master:
        for name in (old, stale):  # earlier versions' libraries: same code, another name
            master.function_load(current.source.replace(current.name, name))

    def loaded() -> set[str]:
        with redis_pods.client("orders-redis-0-0") as master:
            return {str(entry[1].decode()) for entry in master.function_list("delayq_*")}

    paths = TopicPaths(NAMESPACE, "orders")
    members = {"new": current.name, "old": old, "older": ""}  # "older" names no library
    for member, library in members.items():
        payload = encode_member("orders-redis-0", 1, member, library) if library else b"{}"
        zk.create(paths.member(member), payload, ephemeral=True, makepath=True)
    await refresh(ctx, body(api), logger)
    clock.now += LIBRARY_GRACE_S
    await refresh(ctx, body(api), logger)
    assert loaded() == {current.name, old, stale}  # an unknown member: nothing goes
    zk.delete(paths.member("older"))  # rolled
    await refresh(ctx, body(api), logger)
    clock.now += LIBRARY_GRACE_S - 1
    await refresh(ctx, body(api), logger)
    assert loaded() == {current.name, old, stale}  # within the grace
    clock.now += 1
    await refresh(ctx, body(api), logger)
    assert loaded() == {current.name, old}  # the old pod still calls its own
    with redis_pods.client("orders-redis-0-0") as master:
        master.function_delete(old)  # lost anyway (FUNCTION FLUSH): only its pod has the code
    caplog.clear()
    await refresh(ctx, body(api), logger)
    assert f"broker 0 lacks functions library {old} that a live member calls" in caplog.text
    zk.delete(paths.member("old"))
    await refresh(ctx, body(api), logger)
    clock.now += LIBRARY_GRACE_S
    await refresh(ctx, body(api), logger)
    assert loaded() == {current.name}


async def test_delivery_paused_is_held_on_every_master_and_reported(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """spec.delivery.paused true pauses every master (and pauses it again after an API resume),
    false resumes; unset leaves the API's pause alone. The status reports what Redis holds."""
    put_topic(api, brokers=2, slotAmount=4, delivery={"paused": True})
    await provision(api, ctx, logger)
    redis_pods.add(0, 1)
    redis_pods.add(1, 1)
    add_service_pods(api, 2)
    own_slots(zk, 4)
    masters = [redis_pods.queue(f"orders-redis-{b}-0", slot_amount=4) for b in (0, 1)]
    try:
        write_status(api, await refresh(ctx, body(api), logger))
        assert [queue.is_paused() for queue in masters] == [True, True]
        assert body(api)["status"]["paused"] is True
        assert [b["paused"] for b in body(api)["status"]["brokers"]] == [True, True]

        masters[1].resume()  # the API's resume does not outlast the spec
        write_status(api, await refresh(ctx, body(api), logger))
        assert masters[1].is_paused()

        update_spec(api, delivery={"paused": False})
        write_status(api, await refresh(ctx, body(api), logger))
        assert [queue.is_paused() for queue in masters] == [False, False]
        assert body(api)["status"]["paused"] is False

        update_spec(api, delivery={"paused": None})  # unset: pausing is the API's
        masters[0].pause()
        write_status(api, await refresh(ctx, body(api), logger))
        assert [queue.is_paused() for queue in masters] == [True, False]
        assert body(api)["status"]["paused"] is True
        assert [b["paused"] for b in body(api)["status"]["brokers"]] == [True, False]
    finally:
        for queue in masters:
            queue.close()


async def test_failover_promotes_highest_offset_after_grace_and_fences_old_master(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    put_topic(api, replicasPerBroker=2)
    await provision(api, ctx, logger)
    redis_pods.add(0, 3, master=0)
    add_service_pods(api, 1)
    # Real replication offsets: both replicas sync, 0-1 loses its link, 0-2 follows further.
    queue = redis_pods.queue("orders-redis-0-0", body(api)["status"]["appliedSlotAmount"])
    fill(queue, [0], scheduled=3, prepared=0, prefix="first")
    for replica in ("orders-redis-0-1", "orders-redis-0-2"):
        redis_pods.wait_for_offset(replica, redis_pods.offset("orders-redis-0-0"))
    redis_pods.cut_from_master("orders-redis-0-1")
    fill(queue, [0], scheduled=3, prepared=0, prefix="second")
    queue.close()
    redis_pods.wait_for_offset("orders-redis-0-2", redis_pods.offset("orders-redis-0-0"))
    assert redis_pods.offset("orders-redis-0-2") > redis_pods.offset("orders-redis-0-1")
    write_status(api, await refresh(ctx, body(api), logger))
    assert body(api)["status"]["brokers"][0]["masterPod"] == "orders-redis-0-0"

    # The master's pod is not ready and the operator cannot reach its Redis (a partition).
    set_pod_ready(api, "orders-redis-0-0", False)
    redis_pods.partition("orders-redis-0-0")
    write_status(api, await refresh(ctx, body(api), logger))
    assert condition(api, "Ready")["reason"] == "BrokersUnavailable"
    assert body(api)["status"]["brokers"][0]["state"] == "MasterMissing"
    assert redis_pods.replication("orders-redis-0-2")["role"] == "slave"  # still within grace

    clock.now += ctx.failover_grace_s + 1
    write_status(api, await refresh(ctx, body(api), logger))
    assert redis_pods.replication("orders-redis-0-2")["role"] == "master"  # its offset is higher
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    assert redis_pods.recorded_master(0) == "orders-redis-0-2"
    assert redis_pods.served_master(0) is redis_pods.pods["orders-redis-0-2"]
    broker = body(api)["status"]["brokers"][0]
    assert broker["masterPod"] == "orders-redis-0-2"
    assert broker["lastFailoverTime"]

    # The old master returns, still acting as master with the most data: it is demoted to a
    # replica of the new master (through the master Service), not promoted.
    set_pod_ready(api, "orders-redis-0-0", True)
    redis_pods.heal("orders-redis-0-0")
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert redis_pods.offset("orders-redis-0-0") >= redis_pods.offset("orders-redis-0-2")
    write_status(api, await refresh(ctx, body(api), logger))
    assert redis_pods.replicates_from("orders-redis-0-0", "orders-redis-0-2")
    assert redis_pods.replication("orders-redis-0-2")["role"] == "master"
    assert redis_pods.served_master(0) is redis_pods.pods["orders-redis-0-2"]
    assert condition(api, "Ready")["status"] == "True"


# --- health pass failures, serialization ----------------------------------------------------


async def test_health_pass_failures_are_transient(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)
    # The pod answers INFO but its Redis refuses the promotion: a real command failure.
    with redis_pods.client("orders-redis-0-0") as client:
        client.execute_command("ACL", "SETUSER", acl.ADMIN_USER, "-replicaof")
    with pytest.raises(TopicFailure) as failure:
        await refresh(ctx, body(api), logger)
    assert not failure.value.permanent
    assert failure.value.delay_s > 0
    assert redis_pods.replication("orders-redis-0-0")["role"] == "slave"


async def test_handlers_run_one_at_a_time_on_a_fresh_copy(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api, slotAmount=8)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)
    # What a timer started before the update would hold.
    stale = cast(kopf.RawBody, copy.deepcopy(body(api)))
    update_spec(api, slotAmount=4)  # a shrink stored before the rule that refuses it
    await asyncio.gather(
        serialized(ctx, kopf.Body(stale), logger, refresh),
        serialized(ctx, kopf.Body(stale), logger, reconcile),
        serialized(ctx, kopf.Body(stale), logger, refresh),
    )
    assert condition(api, "Provisioned")["reason"] == "SlotAmountShrinkRejected"
    assert condition(api, "Ready")["reason"] == "ServingDegraded"


async def test_master_replaced_by_a_new_pod_keeps_the_grace_and_records_the_failover(
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
    assert body(api)["status"]["brokers"][0]["masterPod"] == "orders-redis-0-0"

    # The StatefulSet recreates the deleted master's pod: same name, not ready.
    old = get(api, "v1/pods", "orders-redis-0-0")
    assert old is not None
    api.objects["v1/pods", NAMESPACE, "orders-redis-0-0"] = {
        "metadata": {
            "name": "orders-redis-0-0",
            "namespace": NAMESPACE,
            "labels": old["metadata"]["labels"],
        },
        "status": {
            "podIP": old["status"]["podIP"],
            "conditions": [{"type": "Ready", "status": "False"}],
        },
    }
    redis_pods.partition("orders-redis-0-0")
    for _ in range(2):  # several passes within the grace: the lost master is remembered
        write_status(api, await refresh(ctx, body(api), logger))
        broker = body(api)["status"]["brokers"][0]
        assert broker["state"] == "MasterMissing"
        assert broker["masterPod"] == "orders-redis-0-0"
        assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
        clock.now += ctx.failover_grace_s / 3

    clock.now += ctx.failover_grace_s
    write_status(api, await refresh(ctx, body(api), logger))
    assert redis_pods.replication("orders-redis-0-1")["role"] == "master"
    broker = body(api)["status"]["brokers"][0]
    assert broker["masterPod"] == "orders-redis-0-1"
    assert broker["lastFailoverTime"]
    assert broker["state"] == "Ready"
