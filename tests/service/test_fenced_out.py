"""A slot fenced out from under its owner is taken back while ZooKeeper (here: the embedded
ownership) still grants it — never abandoned while readiness says all is well.

Reachable in production when a Redis failover or an `everysec` AOF loss rolls a slot's epoch
back, or when a stale process fences a slot it no longer owns: the rightful owner's claim is
refused with STALE_EPOCH. The service used to drop the slot for good (its messages undelivered,
`/readyz` 200); now its probe sees granted != consumed and, once the ownership confirms the slot
is still this process's, fences it again and consumes it.
"""

from __future__ import annotations

import redis.asyncio

from delayq.local.waiting import eventually
from delayq.queue import consume_plans
from delayq.queue.client import AsyncQueue
from delayq.queue.topic import Topic
from delayq.service.readiness import PROBE_INTERVAL_S, UNREADY_AFTER_S
from tests.service.conftest import NAMESPACE, TOPIC, Receiver, StartService
from tests.service.test_webhook import schedule


async def test_a_fenced_out_slot_is_taken_back_and_delivered(
    start_service: StartService, receiver: Receiver, async_redis_client: redis.asyncio.Redis
) -> None:
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)
    service = running.service
    assert service.owned_slots == [0, 1, 2, 3]
    slot = service.topic.slot_of("fenced")
    outsider = AsyncQueue(async_redis_client, Topic(TOPIC, namespace=NAMESPACE, slot_amount=4))
    await outsider.take_over(slot)  # the epoch moves on without the owner knowing
    await schedule(running, "fenced")  # due now: the owner's claim meets STALE_EPOCH
    await eventually(lambda: len(receiver.requests) == 1, 10, "the message delivered")
    assert service.owned_slots == [0, 1, 2, 3]
    assert await service.is_ready()


async def test_readiness_is_not_frozen_by_an_ownership_change_in_progress(
    start_service: StartService,
) -> None:
    """A slot not consumed while an ownership change holds the service's lock (own() stuck on
    a slow Redis): the probe reports it instead of waiting for the lock, so readiness turns false
    within its hysteresis, and comes back once the change is through."""
    running = await start_service()
    service = running.service
    await service._apply(frozenset({0}), release=True)  # granted, no longer consumed
    async with service._lock:  # the change that would fix it is still running
        await eventually(
            lambda: not service.readiness.ready,
            UNREADY_AFTER_S + 3 * PROBE_INTERVAL_S,
            "unready while a granted slot is not consumed",
        )
        assert service.readiness.reason == "granted slots not consumed"
    await eventually(lambda: service.readiness.ready, 5 * PROBE_INTERVAL_S, "ready again")
    assert service.owned_slots == [0, 1, 2, 3]


async def test_a_slot_frozen_by_a_move_is_skipped_reported_and_retried(
    start_service: StartService, async_redis_client: redis.asyncio.Redis
) -> None:
    """A granted slot that cannot be taken over (frozen by a move whose mover stopped) fails
    no other slot: the others are consumed at once, the process stays ready (no process could
    consume that slot), `/readyz` and the metric report it, and its own retry timer takes it
    over once the slot thaws."""
    outsider = AsyncQueue(async_redis_client, Topic(TOPIC, namespace=NAMESPACE, slot_amount=4))
    await outsider.run(consume_plans.freeze(outsider.topic, 1))
    running = await start_service()
    service = running.service
    assert service.owned_slots == [0, 2, 3]
    answer = await running.client.get("/readyz")
    body = await answer.json()
    assert (answer.status, body["ready"], list(body["unconsumedSlots"])) == (200, True, ["1"])
    assert body["unconsumedSlots"]["1"].startswith("moving: SLOT_MOVING")
    metrics = await (await running.client.get("/metrics")).text()
    series = f'delayq_unconsumed_slots{{reason="moving",topic="{TOPIC}",topic_namespace='
    assert f'{series}"{NAMESPACE}"}} 1.0' in metrics
    await outsider.run(consume_plans.thaw(outsider.topic, 1))
    await eventually(lambda: service.owned_slots == [0, 1, 2, 3], 3.0, "taken on its timer")

    async def reported_consumed() -> bool:  # forgotten once its broker's takeover call ends
        return (await (await running.client.get("/readyz")).json())["unconsumedSlots"] == {}

    await eventually(reported_consumed, 3.0, "/readyz to report every slot consumed")
