"""Upgrades that lose nothing, on real redis-servers: the operator's roll of a broker onto its
StatefulSet's new spec (kube/rolling.py; the StatefulSet controller is played here: it makes a
deleted pod again with the new revision), and what the health pass promotes when a broker's
pods run different credentials (a replica that never synced is never promoted)."""

from __future__ import annotations

import logging

import kmock

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.broker_pods import REVISION_LABEL
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.rolling import SYNC_WAIT_S
from delayq.kube.redisctl import RedisCommands
from tests.kube.conftest import Clock
from tests.kube.pods import NAMESPACE, RedisPods, fill, set_pod_ready
from tests.kube.test_events import posted, run
from tests.kube.test_handlers import body
from tests.kube.test_switchover import master_of, missing_on, serving, writer

OLD, NEW = "orders-redis-0-old", "orders-redis-0-new"


def new_spec(api: kmock.KubernetesEmulator, redis_pods: RedisPods) -> None:
    """Broker 0's StatefulSet got a new spec: its pods run the old revision (OnDelete: the
    controller restarts none of them)."""
    statefulset = api.objects["apps/v1/statefulsets", NAMESPACE, "orders-redis-0"]
    assert statefulset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    pods = len(redis_pods.pods)
    status = {"replicas": pods, "updatedReplicas": 0, "currentRevision": OLD, "updateRevision": NEW}
    statefulset.patch({"status": status})
    for name in redis_pods.pods:
        api.objects["v1/pods", NAMESPACE, name].patch(
            {"metadata": {"labels": {REVISION_LABEL: OLD}}}
        )


def gone(api: kmock.KubernetesEmulator, redis_pods: RedisPods) -> list[str]:
    """The broker's pods the operator deleted (kmock drops them at once)."""
    return [name for name in redis_pods.pods if not exists(api, name)]


def exists(api: kmock.KubernetesEmulator, name: str) -> bool:
    """kmock keeps a deleted object's key, with an empty body."""
    try:
        return bool(dict(api.objects["v1/pods", NAMESPACE, name]))
    except KeyError:
        return False


async def test_the_roll_restarts_replicas_first_and_switches_over_before_the_master(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Regression: the broker StatefulSets rolled by the controller's RollingUpdate, which
    restarts the next pod as soon as the last is Ready, synced or not; now the operator rolls
    them one pod per pass, each back in sync first, and the master only after a switchover
    (no failover during its own roll), while writes go on without loss."""
    topic = await serving(api, ctx, redis_pods, logger, pods=3)
    new_spec(api, redis_pods)
    with writer(redis_pods, topic) as writes:
        writes.wait_for(100)
        order = []
        for _ in range(3):
            await run(ctx, api, logger, refresh)
            [deleted] = gone(api, redis_pods)
            order.append(deleted)
            # held while the pod is missing, then while it resyncs
            await run(ctx, api, logger, refresh)
            assert gone(api, redis_pods) == [deleted]
            redis_pods.make_again(deleted, {REVISION_LABEL: NEW})
            redis_pods.restart_replica(deleted, redis_pods.admin_password())
            redis_pods.wait_for_offset(deleted, 1)
            writes.wait_for(100)
        await run(ctx, api, logger, refresh)
        assert gone(api, redis_pods) == []
        writes.wait_for(100)
    assert order == ["orders-redis-0-2", "orders-redis-0-1", "orders-redis-0-0"]
    new = master_of(redis_pods)
    assert new in ("orders-redis-0-1", "orders-redis-0-2")
    acked = [message_id for message_id, _ in writes.acked]
    assert missing_on(redis_pods, new, topic, acked) == []
    print(f"write pause {writes.max_gap_s() * 1000:.1f} ms over {len(acked)} writes")
    broker = body(api)["status"]["brokers"][0]
    assert "lastFailoverTime" not in broker
    assert posted(api).count(("Normal", "SwitchedOver")) == 1
    assert posted(api).count(("Normal", "BrokerPodRolled")) == 3


async def test_the_roll_holds_while_a_replica_is_out_of_sync(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    await serving(api, ctx, redis_pods, logger, pods=3)
    new_spec(api, redis_pods)
    redis_pods.cut_from_master("orders-redis-0-1")
    await run(ctx, api, logger, refresh)
    await run(ctx, api, logger, refresh)
    assert gone(api, redis_pods) == []


async def test_a_statefulset_its_controller_rolls_is_left_to_it(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """An earlier version's StatefulSet (RollingUpdate) in a namespace where the operator may
    not update it: its controller rolls the pods; the operator deletes none (it may not even
    have the right: pod delete comes with the StatefulSet writes)."""
    await serving(api, ctx, redis_pods, logger, pods=3)
    new_spec(api, redis_pods)
    statefulset = api.objects["apps/v1/statefulsets", NAMESPACE, "orders-redis-0"]
    statefulset.patch({"spec": {"updateStrategy": {"type": "RollingUpdate"}}})
    await run(ctx, api, logger, refresh)
    await run(ctx, api, logger, refresh)
    assert gone(api, redis_pods) == []


async def test_a_replica_that_cannot_log_in_to_its_master_is_never_promoted(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    redis_commands: RedisCommands,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    """Regression: a replica restarted with a password its master does not accept (a
    credentials or configuration change that reached one pod of the broker) never synced, yet
    after the grace it was promoted as the most advanced ready pod: every message was lost."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    queue = redis_pods.queue("orders-redis-0-0", topic.slot_amount)
    fill(queue, range(topic.slot_amount), scheduled=20, prepared=0)
    redis_pods.restart_replica("orders-redis-0-1", masterauth="the-previous-password")
    address = redis_pods.pods["orders-redis-0-1"].ip
    replica = await redis_commands.inspect(address, redis_pods.admin_password())
    assert replica is not None
    assert (replica.role, replica.link_up, replica.synced) == ("slave", False, False)
    info = redis_pods.replication("orders-redis-0-1")
    assert (info["master_link_status"], info["master_link_down_since_seconds"]) == ("down", -1)

    set_pod_ready(api, "orders-redis-0-0", False)
    redis_pods.partition("orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    clock.now += ctx.failover_grace_s + 1
    await run(ctx, api, logger, refresh)
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    broker = body(api)["status"]["brokers"][0]
    assert (broker["state"], broker["masterPod"]) == ("NoSyncedReplica", "orders-redis-0-0")
    assert "lastFailoverTime" not in broker
    assert posted(api).count(("Warning", "FailoverRefused")) == 1

    # the master returns with every message: it is master again
    set_pod_ready(api, "orders-redis-0-0", True)
    redis_pods.heal("orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert body(api)["status"]["brokers"][0]["state"] == "Ready"
    assert posted(api).count(("Normal", "MasterReturned")) == 1
    assert redis_pods.recorded_master(0) == "orders-redis-0-0"
    try:
        assert queue.stats().scheduled == 20
    finally:
        queue.close()


async def test_a_master_whose_updated_replica_cannot_log_in_restarts_in_place(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    """Regression for CHANGELOG "Upgrading from 0.1.0" (users raised failoverGraceSeconds by
    hand): the replica rolled onto a login its master does not accept never syncs. The roll
    waits for it, then restarts the master in place; it comes back as master with its data
    (no failover grace, no failover) and the replica then syncs from it."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    queue = redis_pods.queue("orders-redis-0-0", topic.slot_amount)
    fill(queue, range(topic.slot_amount), scheduled=20, prepared=0)
    new_spec(api, redis_pods)
    await run(ctx, api, logger, refresh)
    assert gone(api, redis_pods) == ["orders-redis-0-1"]
    redis_pods.make_again("orders-redis-0-1", {REVISION_LABEL: NEW})
    redis_pods.restart_replica("orders-redis-0-1", masterauth="another-password")
    await run(ctx, api, logger, refresh)
    clock.now += SYNC_WAIT_S - 1
    await run(ctx, api, logger, refresh)
    assert gone(api, redis_pods) == []  # waited for
    clock.now += 1
    await run(ctx, api, logger, refresh)
    assert gone(api, redis_pods) == ["orders-redis-0-0"]

    # made again on its volume: a replica of the master Service (no endpoint), its data kept
    redis_pods.make_again("orders-redis-0-0", {REVISION_LABEL: NEW})
    redis_pods.cut_from_master("orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert redis_pods.recorded_master(0) == "orders-redis-0-0"
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    try:
        assert queue.stats().scheduled == 20
    finally:
        queue.close()
    assert posted(api).count(("Normal", "MasterRestarted")) == 1
    await run(ctx, api, logger, refresh)
    broker = body(api)["status"]["brokers"][0]
    assert (broker["state"], broker["masterPod"]) == ("Ready", "orders-redis-0-0")
    assert "lastFailoverTime" not in broker
