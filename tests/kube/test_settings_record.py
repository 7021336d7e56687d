"""The health pass publishes each DelayTopic's settings record on its masters (kube/
settings_record.py): a client holding a stale `Topic` obeys the spec, and a spec change reaches
it within a pass, without a restart (kmock API, real redis-servers playing the pods)."""

from __future__ import annotations

import logging

import kmock
import pytest
from kazoo.client import KazooClient

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.queue.client import Queue
from delayq.queue.codes import Code, OverQuotaError
from delayq.queue.keys import SlotKeys, slot_keys
from delayq.queue.topic import Topic
from tests.kube.conftest import published_routing
from tests.kube.pods import NAMESPACE, RedisPods
from tests.kube.test_doubling import topic_of_4_slots_grown_to_8
from tests.kube.test_handlers import body, provision, put_topic, update_spec, write_status
from tests.kube.test_resharding import health, masters

__all__ = ["masters"]  # the fixture shared with test_resharding

#: A producer's hand-made view of the topic: no quota.
STALE = Topic("orders", namespace=NAMESPACE, slot_amount=4)


async def test_the_health_pass_publishes_the_spec_and_a_change_reaches_a_stale_client(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api, slotAmount=4, limits={"maxPending": 4})  # one per slot
    await provision(api, ctx, logger)
    redis_pods.add(0, 1)
    write_status(api, await refresh(ctx, body(api), logger))
    slot = STALE.slot_of("a")
    ids = [i for i in (f"m{n}" for n in range(100)) if STALE.slot_of(i) == slot][:3]
    with redis_pods.client("orders-redis-0-0") as master:
        stale = Queue(master, STALE)
        assert stale.schedule(ids[0], b"", delay_ms=60_000).code is Code.CREATED
        with pytest.raises(OverQuotaError):
            stale.schedule(ids[1], b"", delay_ms=60_000)
        record = master.hmget(slot_keys(STALE, 3).settings, "owner", "version")
        assert record == [b"uid-orders", b"1"]

        update_spec(api, slotAmount=4, limits={"maxPending": 8})  # two per slot
        write_status(api, await refresh(ctx, body(api), logger))
        assert stale.schedule(ids[1], b"", delay_ms=60_000).code is Code.CREATED
        with pytest.raises(OverQuotaError):
            stale.schedule(ids[2], b"", delay_ms=60_000)
        assert master.hget(slot_keys(STALE, 0).settings, "version") == b"2"


async def test_the_doubled_slots_find_their_record_at_the_switch(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """The pass that doubles the slots published the next generation's records before its
    switch: no client of the doubled slots falls back to its own values meanwhile."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    for master in masters:
        for slot in range(8):
            record = SlotKeys(NAMESPACE, "orders", slot, generation=1).settings
            assert master.redis.hget(record, "version") == b"2", (slot, record)
