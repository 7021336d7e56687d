"""The planned switchover, on real redis-servers: a terminating master hands over first.

The health pass runs as the leader's loop runs it (`serialized`), against kmock and the pods of
tests/kube/pods.py. A `ServiceWriter` schedules messages without a break through the master
Service (which follows the EndpointSlice the operator writes) while the master's pod is marked
terminating, as a rollout or a drain does: every acknowledged message must be on the new master
afterwards, and the longest gap between two acknowledgements is the writes' pause (printed; the
figure with a target is bench/bench_switchover.py's).
"""

from __future__ import annotations

import logging

import kmock
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.redisctl import SWITCH_PAUSE_MS, CatchUpTimeout, RedisCommands
from delayq.local.waiting import wait_until
from delayq.queue import Queue, State, Topic, acl
from tests.kube.pods import (
    LOOPBACK,
    NAMESPACE,
    SYNC_TIMEOUT_S,
    RedisPods,
    ServiceWriter,
    add_service_pods,
    fill,
    master_service_host,
    terminate,
)
from tests.kube.test_events import posted, run
from tests.kube.test_handlers import body, put_topic

ORDERS = {"topic_namespace": NAMESPACE, "topic": "orders"}


async def serving(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
    pods: int,
) -> Topic:
    """A provisioned topic of one broker whose pod 0 is master and whose replicas are linked."""
    put_topic(api, replicasPerBroker=pods - 1, slotAmount=4)
    await run(ctx, api, logger, reconcile)
    redis_pods.add(0, pods, master=0)
    add_service_pods(api, 1)
    await run(ctx, api, logger, refresh)
    for ordinal in range(1, pods):
        redis_pods.wait_for_offset(f"orders-redis-0-{ordinal}", 0)
    return Topic("orders", namespace=NAMESPACE, slot_amount=4)


def writer(redis_pods: RedisPods, topic: Topic) -> ServiceWriter:
    return ServiceWriter(
        lambda: redis_pods[master_service_host(0)], redis_pods.admin_password(), topic
    )


def master_of(redis_pods: RedisPods) -> str | None:
    """Broker 0's master as recorded, checked against the one its Service reaches."""
    served = redis_pods.served_master(0)
    recorded = redis_pods.recorded_master(0)
    assert served is not None
    assert served.name == recorded
    return recorded


def missing_on(redis_pods: RedisPods, pod: str, topic: Topic, ids: list[str]) -> list[str]:
    """The ids among `ids` that pod's Redis does not hold as scheduled messages."""
    queue = Queue(redis_pods.client(pod), topic)
    try:
        return [i for i in ids if queue.get(i).state is not State.SCHEDULED]
    finally:
        queue.close()


async def test_a_terminating_master_hands_over_at_once_and_loses_no_write(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Regression: before the switchover, a terminating master that still ran stayed master
    until its pod was gone, then cost the failover grace; here one pass moves it, with no time
    passing on the operator's clock."""
    topic = await serving(api, ctx, redis_pods, logger, pods=3)
    with writer(redis_pods, topic) as writes:
        writes.wait_for(200)
        terminate(api, "orders-redis-0-0")
        await run(ctx, api, logger, refresh)
        writes.wait_for(200)
    acked = [message_id for message_id, _ in writes.acked]
    print(f"write pause {writes.max_gap_s() * 1000:.1f} ms over {len(acked)} writes")

    # the replica with the higher offset when the pass looked (both move with the writes)
    new = body(api)["status"]["brokers"][0]["masterPod"]
    assert new in ("orders-redis-0-1", "orders-redis-0-2")
    other = ({"orders-redis-0-1", "orders-redis-0-2"} - {new}).pop()
    assert redis_pods.replication(new)["role"] == "master"
    assert master_of(redis_pods) == new
    assert redis_pods.replicates_from("orders-redis-0-0", new)
    assert redis_pods.replicates_from(other, new)  # re-pointed
    assert missing_on(redis_pods, new, topic, acked) == []
    broker = body(api)["status"]["brokers"][0]
    assert broker["state"] == "Ready"
    assert broker["lastSwitchoverTime"]
    assert "lastFailoverTime" not in broker  # planned: not a failover
    assert posted(api).count(("Normal", "SwitchedOver")) == 1
    assert ctx.metrics.registry.get_sample_value("delayq_operator_switchovers_total", ORDERS) == 1
    assert (
        ctx.metrics.registry.get_sample_value("delayq_operator_switchover_pause_seconds_count") == 1
    )

    # The next pass leaves it so: the stopping pod is a replica now, nothing to switch.
    await run(ctx, api, logger, refresh)
    assert redis_pods.replication(new)["role"] == "master"
    assert posted(api).count(("Normal", "SwitchedOver")) == 1


async def test_without_a_replica_the_terminating_master_is_left_alone(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """replicasPerBroker 0: nothing to switch to; the pod stops (its preStop hook does not wait
    without a connected replica, tests/kube/test_redis_start_script.py) and comes back."""
    await serving(api, ctx, redis_pods, logger, pods=1)
    terminate(api, "orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert master_of(redis_pods) == "orders-redis-0-0"
    assert body(api)["status"]["brokers"][0]["state"] == "Ready"
    assert not [reason for _, reason in posted(api) if reason.startswith("Switch")]


async def test_a_replica_that_cannot_catch_up_defers_the_switchover_and_writes_resume(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    redis_commands: RedisCommands,
    logger: logging.Logger,
) -> None:
    """hand_over on real servers: the replica's link breaks before the master's last writes, so
    it never reaches the paused master's offset. The switchover is given up after
    redisctl.CATCH_UP_TIMEOUT_S, nothing is promoted, and the old master takes writes again."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    redis_pods.cut_from_master("orders-redis-0-1")
    master = redis_pods.queue("orders-redis-0-0", topic.slot_amount)
    try:
        fill(master, [0], scheduled=3, prepared=0)
        ips = {name: pod.ip for name, pod in redis_pods.pods.items()}
        with pytest.raises(CatchUpTimeout):
            await redis_commands.hand_over(
                ips["orders-redis-0-0"], ips["orders-redis-0-1"], redis_pods.admin_password()
            )
        master.schedule("after", b"x", delay_ms=60_000)  # not paused any more
    finally:
        master.close()
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"


async def test_a_replica_of_another_stream_is_never_promoted_even_ahead_in_offset(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Regression for the offset check: the replica is linked, but to another master (a
    foreign server with more writes, so a higher offset). Offsets of different streams are not
    comparable: the switchover is deferred, the old master keeps its role and its writes."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    (foreign,) = redis_pods.add(1, 1, master=0)  # broker 1: not a pod of this 1-broker topic
    with redis_pods.client("orders-redis-0-1") as client:
        client.replicaof(LOOPBACK, str(foreign.server.port))
    wait_until(
        lambda: redis_pods.replication("orders-redis-0-1")["master_link_status"] == "up",
        SYNC_TIMEOUT_S,
        "the replica linked to the foreign master",
    )
    other = redis_pods.queue(foreign.name, topic.slot_amount)
    try:
        fill(other, [0, 1, 2, 3], scheduled=200, prepared=0, prefix="foreign")
    finally:
        other.close()
    redis_pods.wait_for_offset("orders-redis-0-1", redis_pods.offset(foreign.name))
    assert redis_pods.offset("orders-redis-0-1") > redis_pods.offset("orders-redis-0-0")
    terminate(api, "orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert master_of(redis_pods) == "orders-redis-0-0"
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    assert posted(api).count(("Warning", "SwitchoverDeferred")) == 1
    assert body(api)["status"]["brokers"][0]["masterPod"] == "orders-redis-0-0"
    assert "lastSwitchoverTime" not in body(api)["status"]["brokers"][0]
    master = redis_pods.queue("orders-redis-0-0", topic.slot_amount)
    try:
        master.schedule("after", b"x", delay_ms=60_000)  # its writes are not paused
    finally:
        master.close()


async def test_a_failed_promotion_resumes_the_old_masters_writes_at_once(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    """Regression: the replica refuses REPLICAOF NO ONE after the master was paused. The pass
    fails (retried), and the old master takes writes again at once, not after the pause's
    10 s bound: a write with a 3 s timeout goes through."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    with redis_pods.client("orders-redis-0-1") as client:
        client.execute_command("ACL", "SETUSER", acl.ADMIN_USER, "-replicaof")
    terminate(api, "orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert redis_pods.replication("orders-redis-0-1")["role"] == "slave"
    assert master_of(redis_pods) == "orders-redis-0-0"
    client = redis.Redis(
        port=redis_pods.pods["orders-redis-0-0"].server.port,
        username=acl.ADMIN_USER,
        password=redis_pods.admin_password(),
        socket_timeout=3,
        retry=Retry(NoBackoff(), 0),  # one try: a paused master times it out
    )
    master = Queue(client, topic)
    try:
        master.schedule("after", b"x", delay_ms=60_000)
    finally:
        master.close()


async def test_an_interrupted_switchover_is_repaired_then_completed(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    redis_commands: RedisCommands,
    logger: logging.Logger,
) -> None:
    """The operator stops after hand_over, before the label moves: the labelled old master runs
    as a replica of a master no client reaches, its writes still paused. The next pass makes it
    master again and ends the pause (before: writes waited out the switchover's 10 s pause,
    and this test raced it), the one after switches over properly."""
    topic = await serving(api, ctx, redis_pods, logger, pods=2)
    password = redis_pods.admin_password()
    ips = {name: pod.ip for name, pod in redis_pods.pods.items()}
    with writer(redis_pods, topic) as writes:
        writes.wait_for(50)
        terminate(api, "orders-redis-0-0")
        await redis_commands.hand_over(ips["orders-redis-0-0"], ips["orders-redis-0-1"], password)
        await run(ctx, api, logger, refresh)  # repair: the labelled pod is master again
        assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
        assert redis_pods.replicates_from("orders-redis-0-1", "orders-redis-0-0")
        writes.wait_for(50, timeout_s=SWITCH_PAUSE_MS / 2000)  # not the pause's 10 s
        await run(ctx, api, logger, refresh)  # the switchover
        writes.wait_for(50)
    assert master_of(redis_pods) == "orders-redis-0-1"
    acked = [message_id for message_id, _ in writes.acked]
    assert missing_on(redis_pods, "orders-redis-0-1", topic, acked) == []
    assert posted(api).count(("Normal", "SwitchedOver")) == 1
