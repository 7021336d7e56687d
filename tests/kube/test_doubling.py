"""Growing `spec.slotAmount`: the health pass doubles the slots (kube/resharding.py `_double`).

Handlers against kmock with real ZooKeeper and real redis-servers as the Redis pods (pods.py):
a 2-broker topic of 4 slots with messages pending grows to 8. The pods get the new amount at
once, the routing keeps 4 until the leader's pass doubles it; every message is then found in
its slot under 8, on the broker the routing names, and the status, the condition and an Event
say so. A doubling a stopped splitter left recorded is finished first; one whose lock another
process holds is left to it.
"""

from __future__ import annotations

import logging

import kmock
import pytest
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.coordination.splitting import SlotSplitter, Split, routed_topic
from delayq.kube.context import OperatorContext
from delayq.queue import Queue
from delayq.queue.model import State
from delayq.queue.topic import slot_of
from tests.kube.conftest import own_slots, published_routing
from tests.kube.pods import NAMESPACE, RedisPods, add_service_pods
from tests.kube.test_events import posted
from tests.kube.test_handlers import body, condition, provision, put_topic, update_spec
from tests.kube.test_resharding import health, masters

__all__ = ["masters"]  # the fixture shared with test_resharding (both brokers' masters)

MASTERS = ("orders-redis-0-0", "orders-redis-1-0")
IDS = [f"order-{index}" for index in range(120)]


async def topic_of_4_slots_grown_to_8(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """Two brokers of 2 slots each, IDS pending (an hour away) on their slots' brokers, then
    `spec.slotAmount` 4 -> 8 reconciled; the service pods run the new spec."""
    put_topic(api, brokers=2, slotAmount=4, replicasPerBroker=0)
    await provision(api, ctx, logger)
    redis_pods.add(0, 1)
    redis_pods.add(1, 1)
    add_service_pods(api, 2)
    own_slots(zk, 4)
    await health(api, ctx, logger)  # elects the masters
    masters += [redis_pods.queue(name, slot_amount=4) for name in MASTERS]
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0, 0, 1, 1)
    for message_id in IDS:
        broker = routing.broker_of_slot[slot_of(message_id, 4)]
        masters[broker].schedule(message_id, b"x", delay_ms=3_600_000)
    update_spec(api, slotAmount=8)
    await provision(api, ctx, logger)
    add_service_pods(api, 2)  # rolled to the new spec


def found_where_routed(masters: list[Queue], routing: Routing) -> list[str]:
    """The ids each found scheduled in its slot under `routing`, on the broker it names."""
    found = []
    for message_id in IDS:
        broker = routing.broker_of_slot[slot_of(message_id, routing.slot_amount)]
        queue = Queue(masters[broker].redis, routed_topic(masters[broker].topic, routing))
        if queue.get(message_id).state is State.SCHEDULED:
            found.append(message_id)
    return found


async def test_slot_amount_growth_doubles_the_slots_with_every_message(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    assert body(api)["status"]["appliedSlotAmount"] == 4  # reconcile does not split
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    assert routing.broker_of_slot == (0, 0, 1, 1, 0, 0, 1, 1)  # s and s + 4 on the broker of s
    assert found_where_routed(masters, routing) == IDS
    status = body(api)["status"]
    assert status["appliedSlotAmount"] == 8
    assert [b["slots"] for b in status["brokers"]] == [4, 4]
    assert status["depths"]["scheduled"] == len(IDS)
    done = condition(api, "Resharding")
    assert (done["status"], done["reason"]) == ("False", "Completed")
    assert "Doubled the slots 4 -> 8" in done["message"]
    assert ("Normal", "SlotsSplit") in posted(api)

    await health(api, ctx, logger)  # balanced at 8: nothing to do
    assert [reason for _, reason in posted(api)].count("SlotsSplit") == 1
    await provision(api, ctx, logger)  # a reconcile keeps the doubled routing
    assert published_routing(zk) == routing


@pytest.mark.parametrize(
    "step", [Step.COPY, Step.SWITCH, Step.CLEAN], ids=lambda step: str(step)
)
async def test_a_doubling_a_stopped_splitter_recorded_is_finished_first(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    step: Step,
) -> None:
    """What an operator killed mid-doubling leaves (its memory gone): the doubling recorded
    at a step, the old slots frozen. The next leader's pass completes it."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    splitter = SlotSplitter(zk, TopicPaths(NAMESPACE, "orders"), masters)
    current: tuple[Split, int] | None = splitter.start(8)
    while current is not None and current[0].step is not step:
        current = splitter.step(*current)
    splitter.release()  # the splitter dies: its lock goes with its session
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    assert splitter.state() is None
    assert found_where_routed(masters, routing) == IDS
    assert condition(api, "Resharding")["reason"] == "Completed"


async def test_a_doubling_whose_lock_another_process_holds_is_left_to_it(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """`delayq routing split` at work (or an operator process still stopping): the pass
    neither runs a second splitter beside it nor moves a slot; it says what it waits for."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    splitter = SlotSplitter(zk, TopicPaths(NAMESPACE, "orders"), masters)
    assert splitter.start(8) is not None  # recorded, at its freeze, and locked
    try:
        await health(api, ctx, logger)
        waiting = condition(api, "Resharding")
        assert (waiting["status"], waiting["reason"]) == ("True", "SplittingSlots")
        assert "holds the split's lock" in waiting["message"]
        routing = published_routing(zk)
        assert routing is not None
        assert routing.slot_amount == 4
    finally:
        splitter.release()
    await health(api, ctx, logger)  # resumes the recorded doubling
    routing = published_routing(zk)
    assert routing is not None
    assert routing.slot_amount == 8
    assert found_where_routed(masters, routing) == IDS


async def test_a_move_a_stopped_mover_recorded_is_finished_before_the_doubling(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A move left recorded at its copy (an operator killed mid-move, or one whose move failed:
    slot 0 frozen) when `spec.slotAmount` grows. The doubling refuses to start while a move is
    recorded, and the pass went to it before the moves: every pass failed the same way, and
    the frozen slot refused its writes for good. The pass finishes the move, then doubles."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    mover.step(*mover.start(0, 1))  # frozen on broker 0, the copy next
    mover.release(0)  # the mover dies: its lock goes with its session
    for _ in range(3):
        await health(api, ctx, logger)
    assert mover.migrations() == []
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    assert found_where_routed(masters, routing) == IDS
    assert condition(api, "Resharding")["status"] == "False"


async def test_unreadable_moves_hold_the_doubling_and_say_why(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A `migrations/<slot>` node of a newer format while a doubling is wanted: the doubling
    waits for the moves, and the reason is logged (it was swallowed) besides the condition."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    zk.create(TopicPaths(NAMESPACE, "orders").migration(1), b'{"version": 2}', makepath=True)
    caplog.clear()
    await health(api, ctx, logger)
    assert any(
        "no doubling while the moves are unreadable" in line and "format version 2" in line
        for line in caplog.messages
    ), caplog.messages
    assert condition(api, "Resharding")["reason"] == "MoveFailed"
    routing = published_routing(zk)
    assert routing is not None
    assert routing.slot_amount == 4
