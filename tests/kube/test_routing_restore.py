"""A topic's routing survives ZooKeeper losing its data (handlers/restore.py, routing_record.py).

Handlers against kmock with real ZooKeeper and real redis-servers as the Redis pods (pods.py).
The topic's whole ZooKeeper tree is deleted, as an ensemble rebuilt on empty disks leaves it,
after slots moved and after the slots doubled; reconcile, or the leader's health pass, then
publishes again the routing kept in `status.routing`, equal to the one before the loss, says so
(a Warning Event `RoutingRestored`), and every message pending before the loss is found in its
slot on the broker that routing names. Without the copy, reconcile published the first routing:
slots routed to brokers that do not hold them, and after a doubling the keys of generation 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable

import kmock
import kopf
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import SlotMover, Step
from delayq.coordination.routing import Routing, initial_routing
from delayq.coordination.splitting import SlotSplitter, Split
from delayq.kube import naming, resharding
from delayq.kube.context import OperatorContext
from delayq.kube.credentials import operator_credentials
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.operator import serialized
from delayq.kube.resharding import reshard
from delayq.kube.routing_ahead import status_writer
from delayq.kube.routing_record import routing_record
from delayq.kube.topics import parse_body
from delayq.kube.zk import topic_root
from delayq.local.waiting import eventually
from delayq.queue import Queue
from tests.kube.conftest import published_routing
from tests.kube.pods import NAMESPACE, RedisPods
from tests.kube.test_doubling import IDS, found_where_routed, topic_of_4_slots_grown_to_8
from tests.kube.test_events import posted
from tests.kube.test_handlers import body, condition, provision, write_status
from tests.kube.test_resharding import (
    HUNG_MOVE,
    abandon_pass_in_move,
    grown_topic,
    health,
    masters,
    moves_recorded,
    target_writes_held,
    where_they_are,
)

__all__ = ["masters"]  # the fixture shared with test_resharding (both brokers' masters)

Pass = Callable[[kmock.KubernetesEmulator, OperatorContext, logging.Logger], Awaitable[None]]
# reconcile (a change of the spec, the operator's restart) and the leader's health pass
PASSES: dict[str, Pass] = {"reconcile": provision, "health pass": health}
RESTORED = ("Warning", "RoutingRestored")


def wipe(zk: KazooClient) -> None:
    """What a ZooKeeper rebuilt from empty disks holds of the topic: nothing."""
    zk.delete(topic_root(NAMESPACE, "orders"), recursive=True)
    assert published_routing(zk) is None


def recorded(api: kmock.KubernetesEmulator) -> object:
    return body(api)["status"].get("routing")


def stored(routing: Routing) -> dict[str, object]:
    """The copy of `routing` as the merge patch leaves it in the status (no null field)."""
    return {name: value for name, value in routing_record(routing).items() if value is not None}


async def balanced_out_of_order(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> tuple[dict[int, tuple[int, int]], Routing]:
    """Brokers 1 -> 2 with messages pending in every slot, balanced by the health pass; then
    slot 0 moved to broker 1 by hand and the balance restored by the pass (slot 7 back to 0):
    a routing the first one is not. Returns each slot's counts and the routing."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger)
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters).move(0, 1)
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (1, 0, 0, 0, 1, 1, 1, 0)
    assert where_they_are(zk, masters) == before
    assert recorded(api) == stored(routing)
    return before, routing


@pytest.mark.parametrize("run", PASSES.values(), ids=list(PASSES))
async def test_after_slot_moves_the_lost_routing_is_published_again_from_status(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    run: Pass,
) -> None:
    before, routing = await balanced_out_of_order(api, ctx, zk, redis_pods, masters, logger)
    wipe(zk)
    await run(api, ctx, logger)
    assert published_routing(zk) == routing
    assert routing != initial_routing(routing.slot_amount, routing.broker_count)
    assert where_they_are(zk, masters) == before  # every pending message where it is routed
    assert RESTORED in posted(api)
    assert recorded(api) == stored(routing)

    await health(api, ctx, logger)  # restored once: the node is there again
    await provision(api, ctx, logger)
    assert posted(api).count(RESTORED) == 1
    assert published_routing(zk) == routing


@pytest.mark.parametrize("run", PASSES.values(), ids=list(PASSES))
async def test_after_a_doubling_the_lost_routing_keeps_its_key_generation(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    run: Pass,
) -> None:
    """Every message sits in the keys of generation 1: a routing of generation 0 (the first
    one) would send every pod and client to keys that hold nothing but tombstones."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    await health(api, ctx, logger)  # doubles
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    assert recorded(api) == stored(routing)
    wipe(zk)
    await run(api, ctx, logger)
    assert published_routing(zk) == routing
    assert found_where_routed(masters, routing) == IDS
    assert RESTORED in posted(api)
    assert body(api)["status"]["appliedSlotAmount"] == 8


async def test_a_doubling_whose_record_was_lost_before_its_switch_is_done_again(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A doubling stopped after the copy of one slot (no old slot frozen: the copy runs first),
    its `split` node lost with ZooKeeper's data. The restored routing is the one it started
    from, `spec.slotAmount` is still above it: the pass doubles again from the start (the
    freeze a no-op, the copy redone from the old keys, which a doubling only reads before its
    switch), so no slot stays frozen and every message is found under 8 slots."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    splitter = SlotSplitter(zk, TopicPaths(NAMESPACE, "orders"), masters)
    current: tuple[Split, int] | None = splitter.start(8)
    while current is not None and current[0].copied_slots < 1:
        current = splitter.step(*current)
    assert current is not None
    assert current[0].step is Step.COPY
    splitter.release()
    wipe(zk)
    await health(api, ctx, logger)  # restores the routing of 4 slots, then doubles
    routing = published_routing(zk)
    assert routing is not None
    assert (routing.slot_amount, routing.generation) == (8, 1)
    assert found_where_routed(masters, routing) == IDS
    assert RESTORED in posted(api)
    assert recorded(api) == stored(routing)


async def test_a_move_whose_record_was_lost_before_its_switch_is_planned_again(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """The operator's move of slot 4 stopped after its freeze (slot 4 frozen on broker 0), its
    `migrations/4` node lost with ZooKeeper's data. The restored routing is the one the move
    was planned from, so the pass plans the same move and runs it from the start."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    mover.step(*mover.start(4, 1))  # frozen on broker 0, the copy next
    mover.release(4)
    wipe(zk)
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0, 0, 0, 0, 1, 1, 1, 1)
    assert where_they_are(zk, masters) == before
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert RESTORED in posted(api)


async def test_a_topic_without_a_copy_gets_one_and_a_stale_copy_follows_zookeeper(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A topic last written by an operator before the copy existed gets it on the next pass;
    a copy behind ZooKeeper (the operator stopped between a move's switch and its status
    patch) is brought up to ZooKeeper's routing, never published over it."""
    _, routing = await balanced_out_of_order(api, ctx, zk, redis_pods, masters, logger)
    write_status(api, {"routing": None})
    assert recorded(api) is None
    await health(api, ctx, logger)
    assert recorded(api) == stored(routing)

    stale = routing_record(initial_routing(8, 2))
    write_status(api, {"routing": stale})
    await provision(api, ctx, logger)
    assert published_routing(zk) == routing
    assert recorded(api) == stored(routing)
    assert RESTORED not in posted(api)


async def test_an_unreadable_copy_publishes_nothing(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """With the node lost and a copy that is not an exact array (edited by hand), guessing
    would strand messages: nothing is published, Provisioned says why, the health pass moves
    nothing; once the copy is put right, the next pass publishes it."""
    _, routing = await balanced_out_of_order(api, ctx, zk, redis_pods, masters, logger)
    good = routing_record(routing)
    wipe(zk)
    write_status(api, {"routing": {**good, "slots": "0-3:0"}})
    with pytest.raises(kopf.TemporaryError, match=r"status\.routing is unreadable"):
        await serialized(ctx, body(api), logger, reconcile)  # as kopf runs it
    refused = condition(api, "Provisioned")
    assert (refused["status"], refused["reason"]) == ("False", "RoutingRecordInvalid")
    await health(api, ctx, logger)
    assert published_routing(zk) is None
    write_status(api, {"routing": good})
    await health(api, ctx, logger)
    assert published_routing(zk) == routing


async def test_a_pass_that_never_wrote_its_status_left_the_copy_naming_its_moves(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """The pass moves slots 4-7 and the operator dies before the pass's status patch (the
    pass's work run, its patch dropped), then ZooKeeper loses its data. Each move patched
    status.routing before its switch, so the copy names where the slots went. A copy naming
    the source would make the next pass move them again, copying the source's tombstone over
    the target's messages."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger)
    await refresh(ctx, body(api), logger)  # the pass's patch is never written
    moved = published_routing(zk)
    assert moved is not None
    assert moved.broker_of_slot == (0, 0, 0, 0, 1, 1, 1, 1)
    assert recorded(api) == stored(moved)
    wipe(zk)
    await health(api, ctx, logger)
    assert published_routing(zk) == moved
    assert where_they_are(zk, masters) == before


async def test_a_doubling_recorded_its_routing_before_its_switch(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """The same for a doubling: a copy of the old generation, restored, would make the next
    pass double again, replacing the new generation's keys with the cleaned old ones."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    await refresh(ctx, body(api), logger)  # doubles; the pass's patch is never written
    doubled = published_routing(zk)
    assert doubled is not None
    assert doubled.generation == 1
    assert recorded(api) == stored(doubled)
    wipe(zk)
    await health(api, ctx, logger)
    assert published_routing(zk) == doubled
    assert found_where_routed(masters, doubled) == IDS


async def test_a_move_whose_routing_cannot_be_recorded_does_not_switch(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """No status patch (the API unreachable, or this replica no longer leads): every move
    stops before its switch, recorded, the routing unchanged; the next pass finishes them."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger)
    topic, spec = body(api), parse_body(body(api))
    password = (await operator_credentials(ctx, topic, spec))[naming.SECRET_REDIS_ADMIN_PASSWORD]
    routing = published_routing(zk)
    assert routing is not None
    client, ctx.client = ctx.client, None  # ctx.kube raises: as after losing the lead
    try:
        write = status_writer(ctx, spec)
        result = await reshard(ctx, spec, routing, password, topic["status"], logger, write)
    finally:
        ctx.client = client
    assert result.condition is not None
    assert result.condition.reason == "MoveFailed"
    assert "status.routing not written before the switch" in result.condition.message
    assert published_routing(zk) == routing
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    assert {m.step for m in mover.migrations()} == {Step.SWITCH}
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert where_they_are(zk, masters) == before


async def test_a_routing_unreadable_after_the_moves_leaves_the_copy_naming_them(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZooKeeper fails the pass's read of the routing after its moves (its movers read it
    fine): the pass's status patch must keep what its movers recorded before their switches,
    not the routing it read before them."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger)
    read = resharding._routing

    def only_movers_read(mover: SlotMover) -> Routing:
        if not threading.current_thread().name.startswith("delayq-slot-mover"):
            raise ConnectionLoss("the pass's own read after the moves")
        return read(mover)

    monkeypatch.setattr(resharding, "_routing", only_movers_read)
    await health(api, ctx, logger)
    moved = published_routing(zk)
    assert moved is not None
    assert moved.broker_of_slot == (0, 0, 0, 0, 1, 1, 1, 1)
    assert "reading the routing" in condition(api, "Resharding")["message"]
    assert recorded(api) == stored(moved)
    wipe(zk)
    monkeypatch.setattr(resharding, "_routing", read)
    await health(api, ctx, logger)
    assert published_routing(zk) == moved
    assert where_they_are(zk, masters) == before


async def test_a_doubling_whose_result_is_unreadable_keeps_the_copy_its_splitter_wrote(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass fails to read the doubled routing (the resharding skipped, as ZooKeeper
    failing would), on a topic whose status has no copy yet: the pass must not write the
    routing it read before the doubling over the one the splitter recorded."""
    await topic_of_4_slots_grown_to_8(api, ctx, zk, redis_pods, masters, logger)
    write_status(api, {"routing": None})  # stored by an operator before the copy existed
    read = SlotSplitter.routing

    def only_splitters_read(splitter: SlotSplitter) -> tuple[Routing, int | None]:
        if not threading.current_thread().name.startswith("delayq-slot-mover"):
            raise ConnectionLoss("the pass's own read after the doubling")
        return read(splitter)

    monkeypatch.setattr(SlotSplitter, "routing", only_splitters_read)
    await health(api, ctx, logger)
    doubled = published_routing(zk)
    assert doubled is not None
    assert doubled.generation == 1
    assert recorded(api) == stored(doubled)


async def test_a_pass_beside_an_abandoned_move_leaves_the_copy_to_it(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A pass abandoned at its bound leaves its move running (a thread); the next pass reads
    the routing, and the move may switch before that pass patches the status: the pass must
    not write its older read over the copy the move patched before its switch. The move is
    held in its copy until the second pass ended (target_writes_held), and is seen still
    there after it: whatever status.routing holds then, that pass wrote it."""
    await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=1)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    with target_writes_held(api, redis_pods):
        await abandon_pass_in_move(api, ctx, logger, mover)
        write_status(api, {"routing": None})  # a copy the pass would write, were it allowed
        await health(api, ctx, logger)  # beside the abandoned move
        copy = recorded(api)
        # read after the copy: the move patches status.routing only past its copy step
        assert moves_recorded(mover) == HUNG_MOVE
        assert copy is None
    # the pause lifted, the move goes on: it patches the copy, then switches
    await eventually(lambda: not mover.migrations(), 10.0, "the abandoned move to end")
    moved = published_routing(zk)
    assert moved is not None
    assert moved.broker_of_slot[4] == 1
    assert recorded(api) == stored(moved)  # its mover's, before its switch
    await health(api, ctx, logger)  # the moves left, the copy following them
    after = published_routing(zk)
    assert after is not None
    assert after.slots_per_broker() == {0: 4, 1: 4}
    assert recorded(api) == stored(after)
