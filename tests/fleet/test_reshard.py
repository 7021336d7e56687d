"""Brokers 1 -> 2 under load: the operator's resharding (kube/resharding.py) moves half the
slots while two real `delayq serve` processes deliver a steady stream, one of them is killed
with SIGKILL half way, and a move was left recorded at each step by a mover that died (what a
killed operator leaves). Nothing lost, nothing early, every slot delivering again after the
moves, the slots balanced 8/8.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
import redis.asyncio

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.kube import naming, resharding
from delayq.kube.builders.common import BuildContext
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.redisctl import RedisCommands
from delayq.kube.routing_record import routing_record
from delayq.kube.spec import TopicSpec
from delayq.kube.zk import KazooTopicStore
from delayq.local.waiting import eventually
from delayq.queue import AsyncQueue, Queue, acl

from .conftest import NAMESPACE, SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_slot_move import (
    MEMBERS,
    MOVE_BOUND_S,
    RoutedProducer,
    deliveries,
)

pytestmark = pytest.mark.slow
ADMIN_PASSWORD = "operator-secret"
LEFT_RECORDED = 9  # the slot whose move a dead mover left behind (one the plan moves: 8..15)
LOGGER = logging.getLogger("tests.fleet.reshard")


def operator_context(fleet: ProcessFleet, urls: list[str]) -> OperatorContext:
    """The operator's own ZooKeeper store and Redis commands, the master Services mapped to the
    fleet's redis-servers (which get the operator's Redis user, as the pods have)."""
    addresses = {}
    for broker, url in enumerate(urls):
        client = redis.Redis.from_url(url)
        client.execute_command(
            "ACL", "SETUSER", acl.ADMIN_USER, *acl.ADMIN_RULES, f">{ADMIN_PASSWORD}"
        )
        port = client.connection_pool.connection_kwargs["port"]
        client.close()
        host = naming.redis_master_host(fleet.topic.name, NAMESPACE, broker)
        addresses[host] = ("127.0.0.1", int(port))
    config = OperatorConfig(build=BuildContext(default_zookeeper=fleet.zookeeper.hosts))
    store = KazooTopicStore(config.build.zookeeper_ensembles)
    return OperatorContext(config, store=store, redis=RedisCommands(addresses=addresses))


def two_broker_spec(fleet: ProcessFleet) -> TopicSpec:
    """The fleet's topic as the operator reads it once `spec.brokers` grew to 2."""
    return TopicSpec(
        name=fleet.topic.name,
        namespace=NAMESPACE,
        slot_amount=SLOTS,
        brokers=2,
        zookeeper_connect=fleet.zookeeper.hosts,
        resharding_max_concurrent_moves=2,
    )


async def reshard_pass(
    ctx: OperatorContext, spec: TopicSpec, fleet: ProcessFleet, status: dict[str, Any]
) -> str:
    """One health pass's resharding; folds what it reports into `status` as the pass writes
    it (status.routing before each switch), and returns the Resharding condition's reason."""
    payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, spec.name).routing)

    async def record(routing: Routing) -> None:
        status["routing"] = routing_record(routing)

    done = await resharding.reshard(
        ctx, spec, Routing.from_json(payload), ADMIN_PASSWORD, status, LOGGER, record
    )
    assert done.condition is not None
    status["conditions"] = [{"type": done.condition.type, "status": done.condition.status}]
    status["resharding"] = done.progress
    return done.condition.reason


@pytest.mark.parametrize("steps", range(len(Step)), ids=[f"left-before-{s}" for s in Step])
async def test_brokers_grow_under_load_through_a_serve_kill_and_a_dead_mover(
    two_broker_fleet: tuple[ProcessFleet, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    steps: int,
) -> None:
    monkeypatch.setattr(resharding, "MOVES_BUDGET_S", 0.0)  # a batch per pass: room to kill
    fleet, urls = two_broker_fleet
    for member in MEMBERS:
        fleet.start(member)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    spec = two_broker_spec(fleet)
    ctx = operator_context(fleet, urls)
    async_clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    sync_queues = [Queue.from_url(url, fleet.topic) for url in urls]
    producer = RoutedProducer(fleet, [AsyncQueue(c, fleet.topic) for c in async_clients])
    stop = asyncio.Event()
    producing = asyncio.create_task(producer.run(stop))
    status: dict[str, Any] = {}
    try:
        await deliveries(fleet, async_clients[0], lambda: len(fleet.deliveries) >= 100, 30.0)
        mover = SlotMover(fleet.observer(), TopicPaths(NAMESPACE, fleet.topic.name), sync_queues)
        left: tuple[Migration, int] | None = mover.start(LEFT_RECORDED, 1)
        for _ in range(steps):  # then the mover "dies": only ZooKeeper and Redis remember
            assert left is not None
            left = await asyncio.to_thread(mover.step, *left)
        mover.release(LEFT_RECORDED)  # its lock goes with its session
        reasons = [await reshard_pass(ctx, spec, fleet, status)]
        fleet.processes[MEMBERS[1]].kill()  # kill -9 of a serve process mid-resharding
        while reasons[-1] != "Completed":
            reasons.append(await reshard_pass(ctx, spec, fleet, status))
            assert len(reasons) < 20, reasons
        before_end = set(fleet.scheduled)
        await deliveries(
            fleet, async_clients[0], lambda: len(fleet.scheduled) > len(before_end) + 200
        )
    finally:
        stop.set()
        await producing
    try:
        # the killed process's slots wait for its session to expire, then for a lease
        bound_s = MOVE_BOUND_S + SESSION_TIMEOUT_S
        await deliveries(fleet, async_clients[0], lambda: not fleet.missing(), bound_s)
        early = [d for d in fleet.deliveries if d.at_ms < producer.due_ms[d.message_id]]
        assert not early
        assert set(reasons[:-1]) == {"MovingSlots"}
        assert status["resharding"] == {"moved": SLOTS // 2, "total": SLOTS // 2}  # 9 of them
        payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).routing)
        routing = Routing.from_json(payload)
        assert routing.slots_per_broker() == {0: SLOTS // 2, 1: SLOTS // 2}
        assert routing.broker_of_slot[LEFT_RECORDED] == 1
        assert mover.migrations() == []
        after = {fleet.topic.slot_of(i.encode()) for i in fleet.scheduled - before_end}
        assert after == set(range(SLOTS))  # every slot delivers after the moves
        print(
            f"1 -> 2 brokers in {len(reasons)} passes under load, a serve process killed: "
            f"{len(fleet.scheduled)} messages, lost {len(fleet.missing())}, early {len(early)}, "
            f"{fleet.duplicates()} duplicates, {producer.refused} writes refused and resent"
        )
    finally:
        for client in async_clients:
            await client.aclose()
        for queue in sync_queues:
            queue.close()
        await asyncio.to_thread(ctx.store.close)  # type: ignore[attr-defined]
