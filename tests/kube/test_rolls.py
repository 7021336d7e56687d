"""Upgrades that lose nothing, on real redis-servers: what the health pass promotes when a
broker's pods run different credentials (a replica that never synced is never promoted)."""

from __future__ import annotations

import logging

import kmock

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.redisctl import RedisCommands
from tests.kube.conftest import Clock
from tests.kube.pods import RedisPods, fill, set_pod_ready
from tests.kube.test_events import run
from tests.kube.test_handlers import body
from tests.kube.test_switchover import serving


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

    # the master returns with every message: it is master again
    set_pod_ready(api, "orders-redis-0-0", True)
    redis_pods.heal("orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    assert body(api)["status"]["brokers"][0]["state"] == "Ready"
    assert redis_pods.recorded_master(0) == "orders-redis-0-0"
    try:
        assert queue.stats().scheduled == 20
    finally:
        queue.close()
