"""The health pass publishes each DelayTopic's settings record on its masters (kube/
settings_record.py): a client holding a stale `Topic` obeys the spec, and a spec change reaches
it within a pass, without a restart (kmock API, real redis-servers playing the pods)."""

from __future__ import annotations

import logging

import kmock

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.queue.client import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import slot_keys
from delayq.queue.topic import Topic
from tests.kube.pods import NAMESPACE, RedisPods
from tests.kube.test_handlers import body, provision, put_topic, update_spec, write_status

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
        assert stale.schedule(ids[1], b"", delay_ms=60_000).code is Code.OVER_QUOTA
        record = master.hmget(slot_keys(STALE, 3).settings, "owner", "version")
        assert record == [b"uid-orders", b"1"]

        update_spec(api, slotAmount=4, limits={"maxPending": 8})  # two per slot
        write_status(api, await refresh(ctx, body(api), logger))
        assert stale.schedule(ids[1], b"", delay_ms=60_000).code is Code.CREATED
        assert stale.schedule(ids[2], b"", delay_ms=60_000).code is Code.OVER_QUOTA
        assert master.hget(slot_keys(STALE, 0).settings, "version") == b"2"
