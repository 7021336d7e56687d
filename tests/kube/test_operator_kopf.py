"""The whole operator (kopf + our registry) against the in-memory Kubernetes API (kmock).

ZooKeeper and the Redis pods are real servers (see conftest.py and pods.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import kmock
import kopf
import pytest
from kazoo.client import KazooClient

from delayq.kube import naming, resharding
from delayq.kube.builders.common import BuildContext
from delayq.kube.client import KubeClient
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.leader_election import LeaderElector, LeadershipLost
from delayq.kube.leader_lease import LeaderLeaseTiming
from delayq.kube.operator import run
from delayq.kube.redisctl import RedisCommands
from delayq.kube.zk import KazooTopicStore
from delayq.local.waiting import eventually
from delayq.queue import State, Topic
from tests.kube.conftest import (
    DT,
    own_slots,
    published_routing,
    topic_tree_exists,
)
from tests.kube.pods import (
    NAMESPACE,
    RedisPods,
    ServiceWriter,
    add_service_pods,
    master_service_host,
    terminate,
)

TOPIC_PATH = f"/apis/delayq.io/v1alpha1/namespaces/{NAMESPACE}/delaytopics"


def topic(name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": spec,
    }


WAIT_S = 10.0  # how long the operator may take to act on a change


@contextlib.asynccontextmanager
async def operator(
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
    **config: object,
) -> AsyncIterator[OperatorContext]:
    settings = OperatorConfig(
        **{
            "standalone": True,
            "health_interval_s": 0.2,
            "liveness_endpoint": "",
            "metrics_endpoint": "",
            "build": BuildContext(operator_namespace="delayq-system", default_zookeeper=zk_connect),
            **config,
        }  # type: ignore[arg-type]
    )
    ctx = OperatorContext(
        settings, login=lambda: connection, store=store, redis=redis_commands, pairing_wait_s=0
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop_flag=stop, ctx=ctx))
    try:
        yield ctx
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


def stored(api: kmock.KubernetesEmulator, resource: str, name: str) -> bool:
    try:
        return not api.objects[resource, NAMESPACE, name].deleted
    except KeyError:
        return False


async def test_create_provisions_children_and_status(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    redis_pods: RedisPods,
    zk: KazooClient,
    zk_connect: str,
) -> None:
    async with operator(connection, store, redis_commands, zk_connect):
        response = await api.post(TOPIC_PATH, json=topic("orders", brokers=2, slotAmount=16))
        assert response.status < 300
        await eventually(
            lambda: stored(api, "apps/v1/statefulsets", "orders-service"), WAIT_S, "children"
        )
        await eventually(
            lambda: (
                (api.objects[DT, NAMESPACE, "orders"].get("status") or {}).get("appliedSlotAmount")
                == 16
            ),
            WAIT_S,
            "status",
        )
        for broker in (0, 1):
            assert stored(api, "apps/v1/statefulsets", f"orders-redis-{broker}")
        dt = api.objects[DT, NAMESPACE, "orders"]
        assert not dt["metadata"].get("finalizers")  # nothing that needs a running operator
        routing = published_routing(zk)
        assert routing is not None
        assert routing.slots_per_broker() == {0: 8, 1: 8}

        # The pods come up (a real cluster's controllers would do this): the health loop elects
        # masters and reports Ready.
        for broker in (0, 1):
            redis_pods.add(broker, 2)
        add_service_pods(api, 2)
        own_slots(zk, 16)
        await eventually(lambda: ready_reason(api, "orders") == "Serving", WAIT_S, "Ready=True")
        for broker in (0, 1):
            assert redis_pods.replication(f"orders-redis-{broker}-0")["role"] == "master"

        # An update through the API adds a broker: kopf's update handler provisions it.
        await api.patch(
            f"{TOPIC_PATH}/orders",
            json={"spec": {"brokers": 3}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        await eventually(
            lambda: stored(api, "apps/v1/statefulsets", "orders-redis-2"), WAIT_S, "broker 2"
        )


def ready_reason(api: kmock.KubernetesEmulator, name: str) -> str | None:
    for item in (api.objects[DT, NAMESPACE, name].get("status") or {}).get("conditions", []):
        if item["type"] == "Ready":
            return str(item["reason"])
    return None


async def test_the_running_operator_switches_a_terminating_master_over_before_the_grace(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    redis_pods: RedisPods,
    zk: KazooClient,
    zk_connect: str,
) -> None:
    """The leader's own health loop (every 0.2 s, the default 30 s failover grace on the real
    clock) moves a terminating master to its replica within WAIT_S, under a writer that loses
    nothing."""
    async with operator(connection, store, redis_commands, zk_connect):
        response = await api.post(TOPIC_PATH, json=topic("orders", slotAmount=4))
        assert response.status < 300
        await eventually(lambda: stored(api, "v1/secrets", "orders-credentials"), WAIT_S, "Secret")
        redis_pods.add(0, 2, master=0)
        add_service_pods(api, 1)
        own_slots(zk, 4)
        await eventually(lambda: ready_reason(api, "orders") == "Serving", WAIT_S, "Ready=True")
        writes = ServiceWriter(
            lambda: redis_pods[master_service_host(0)],
            redis_pods.admin_password(),
            Topic("orders", namespace=NAMESPACE, slot_amount=4),
        )
        with writes:
            await asyncio.to_thread(writes.wait_for, 100)
            terminate(api, "orders-redis-0-0")
            await eventually(
                lambda: redis_pods.served_master(0) is redis_pods.pods["orders-redis-0-1"],
                WAIT_S,
                "the switchover to orders-redis-0-1",
            )
            await asyncio.to_thread(writes.wait_for, 100)
        assert redis_pods.replication("orders-redis-0-1")["role"] == "master"
        queue = redis_pods.queue("orders-redis-0-1", slot_amount=4)
        try:
            states = {queue.get(message_id).state for message_id, _ in writes.acked}
        finally:
            queue.close()
        assert states == {State.SCHEDULED}


async def test_invalid_spec_gets_a_reason_and_no_retry_loop(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def failures() -> int:
        return sum("failed permanently" in record.getMessage() for record in caplog.records)

    async with operator(connection, store, redis_commands, zk_connect):
        await api.post(TOPIC_PATH, json=topic("bad", topicType="webhook"))
        await eventually(lambda: ready_reason(api, "bad") == "InvalidSpec", WAIT_S, "InvalidSpec")
        await asyncio.sleep(1.0)  # let the emulator's duplicate watch events settle
        settled = failures()
        await asyncio.sleep(2.0)  # a retry loop would keep failing here
        assert failures() == settled
    assert not stored(api, "apps/v1/statefulsets", "bad-service")


async def test_deletion_is_immediate_and_the_health_loop_collects_the_zookeeper_tree(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk: KazooClient,
    zk_connect: str,
) -> None:
    async with operator(connection, store, redis_commands, zk_connect):
        await api.post(TOPIC_PATH, json=topic("gone", deletionPolicy="Delete"))
        await eventually(lambda: ready_reason(api, "gone") is not None, WAIT_S, "provisioning")
        assert topic_tree_exists(zk, "gone")
        await api.delete(f"{TOPIC_PATH}/gone")
        assert api.objects[DT, NAMESPACE, "gone"].deleted  # at once: no finalizer to wait for
        await eventually(lambda: not topic_tree_exists(zk, "gone"), WAIT_S, "the tree collected")


async def test_paused_topic_is_left_alone(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk: KazooClient,
    zk_connect: str,
) -> None:
    body = topic("quiet")
    body["metadata"]["annotations"] = {naming.PAUSED_ANNOTATION: "true"}  # type: ignore[index]
    async with operator(connection, store, redis_commands, zk_connect):
        await api.post(TOPIC_PATH, json=body)
        await eventually(
            lambda: any(
                c["reason"] == "Paused"
                for c in (api.objects[DT, NAMESPACE, "quiet"].get("status") or {}).get(
                    "conditions", []
                )
            ),
            WAIT_S,
            "Paused condition",
        )
    assert not stored(api, "apps/v1/statefulsets", "quiet-service")
    assert not topic_tree_exists(zk, "quiet")


def finalizers(api: kmock.KubernetesEmulator, name: str) -> list[str]:
    return list(api.objects[DT, NAMESPACE, name]["metadata"].get("finalizers") or [])


async def test_the_finalizer_of_older_versions_is_removed_on_resume(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
) -> None:
    """Topics created by an older operator carry its finalizer; none may keep blocking.

    (kmock applies kopf's JSON patch of the finalizer list only roughly, so other finalizers
    are left out here; e2e removes it next to another finalizer on a real API server.)
    """
    for name in ("kept", "doomed"):
        old = topic(name)
        old["metadata"]["finalizers"] = [naming.FINALIZER]  # type: ignore[index]
        api.objects[DT, NAMESPACE, name] = old
    api.objects[DT, NAMESPACE, "doomed"].patch(
        {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}  # deleted while none ran
    )
    async with operator(connection, store, redis_commands, zk_connect):
        await eventually(lambda: finalizers(api, "kept") == [], WAIT_S, "the old finalizer removed")
        await eventually(
            lambda: api.objects[DT, NAMESPACE, "doomed"].deleted, WAIT_S, "deletion done"
        )


LEASES = "coordination.k8s.io/v1/leases"
FAST_LEADER_LEASE = LeaderLeaseTiming(
    lease_duration_s=2.0, renew_deadline_s=1.5, renew_interval_s=0.3, retry_interval_s=0.1
)


def leader_lease_holder(api: kmock.KubernetesEmulator) -> str | None:
    try:
        lease = api.objects[LEASES, "delayq-system", "delayq-operator"]
    except KeyError:
        return None
    return str(lease["spec"]["holderIdentity"])


async def test_only_the_lease_holder_reconciles_and_a_clean_stop_releases_the_lease(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
) -> None:
    kube = KubeClient(connection)
    rival = LeaderElector(kube, "delayq-system", "delayq-operator", "rival", FAST_LEADER_LEASE)
    try:
        assert await rival.acquire(asyncio.Event())
        renewing = asyncio.create_task(rival.hold())
        async with operator(
            connection,
            store,
            redis_commands,
            zk_connect,
            standalone=False,
            leader_lease=FAST_LEADER_LEASE,
        ):
            await api.post(TOPIC_PATH, json=topic("orders"))
            await asyncio.sleep(1.0)  # a standby that reconciled would have created children
            assert not stored(api, "apps/v1/statefulsets", "orders-service")
            assert leader_lease_holder(api) == "rival"

            renewing.cancel()
            await rival.release()
            await eventually(
                lambda: stored(api, "apps/v1/statefulsets", "orders-service"), WAIT_S, "lead"
            )
            assert leader_lease_holder(api) not in ("", "rival")
        # Released on the way out: a standby may take over at once.
        assert leader_lease_holder(api) == ""
    finally:
        await kube.close()


async def test_a_leader_that_loses_the_lease_stops_kopf_and_raises(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
) -> None:
    settings = OperatorConfig(
        leader_lease=FAST_LEADER_LEASE,
        health_interval_s=0.2,
        liveness_endpoint="",
        metrics_endpoint="",
        build=BuildContext(operator_namespace="delayq-system", default_zookeeper=zk_connect),
    )
    ctx = OperatorContext(
        settings, login=lambda: connection, store=store, redis=redis_commands, pairing_wait_s=0
    )
    task = asyncio.create_task(run(settings, stop_flag=asyncio.Event(), ctx=ctx))
    await eventually(lambda: leader_lease_holder(api) == ctx.identity, WAIT_S, "leadership")
    await api.post(TOPIC_PATH, json=topic("orders"))
    await eventually(
        lambda: stored(api, "apps/v1/statefulsets", "orders-service"), WAIT_S, "reconcile"
    )

    api.objects[LEASES, "delayq-system", "delayq-operator"].patch(
        {"spec": {"holderIdentity": "usurper"}}
    )
    with pytest.raises(LeadershipLost, match="usurper holds the lease"):
        await asyncio.wait_for(task, FAST_LEADER_LEASE.lease_duration_s + 3.0)
    assert ctx.client is None  # kopf and the leader's clients are gone
    assert leader_lease_holder(api) == "usurper"  # never touched again


async def test_a_clean_stop_releases_the_lease_only_once_its_slot_moves_ended(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A move's thread outlives kopf (it cannot be cancelled): the Lease stays held until it
    ended, so a standby never starts beside it (resharding.movers_stopped)."""
    settings = OperatorConfig(
        leader_lease=FAST_LEADER_LEASE,
        health_interval_s=0.2,
        liveness_endpoint="",
        metrics_endpoint="",
        build=BuildContext(operator_namespace="delayq-system", default_zookeeper=zk_connect),
    )
    ctx = OperatorContext(
        settings, login=lambda: connection, store=store, redis=redis_commands, pairing_wait_s=0
    )
    moving = threading.Event()
    move = resharding.MOVERS.submit((NAMESPACE, "stuck"), moving.wait, WAIT_S)
    monkeypatch.setitem(resharding._under_way, (NAMESPACE, "stuck"), [move])
    released_with_move_done: list[bool] = []
    release = LeaderElector.release

    async def watched_release(elector: LeaderElector) -> None:
        released_with_move_done.append(move.done())
        await release(elector)

    monkeypatch.setattr(LeaderElector, "release", watched_release)
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop_flag=stop, ctx=ctx))
    try:
        await eventually(lambda: leader_lease_holder(api) == ctx.identity, WAIT_S, "leadership")
        stop.set()
        await eventually(lambda: ctx.client is None, WAIT_S, "kopf stopped")
    finally:
        asyncio.get_running_loop().call_later(0.5, moving.set)  # the move ends a bit later
    await asyncio.wait_for(task, WAIT_S)
    assert released_with_move_done == [True]
    assert leader_lease_holder(api) == ""
