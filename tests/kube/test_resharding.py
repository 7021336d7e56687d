"""Growing brokers: the health pass moves slots onto an added broker (kube/resharding.py).

Handlers against kmock with real ZooKeeper and real redis-servers as the Redis pods (pods.py):
brokers 1 -> 2 with messages pending, a batch of moves per pass, progress in status, Events,
the pause annotation, and a move a stopped mover (a killed operator) recorded at each step,
resumed by the next pass. Nothing is lost: every slot's messages are counted on the broker it
is routed to, before and after.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import kmock
import pytest
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover, Step
from delayq.kube import naming, resharding
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.operator import serialized
from delayq.kube.topics import parse_body
from delayq.local.waiting import eventually
from delayq.queue import Queue, functions
from tests.kube.conftest import DT, own_slots, published_routing
from tests.kube.pods import NAMESPACE, RedisPods, add_service_pods, fill, services_rolled_to
from tests.kube.test_events import posted
from tests.kube.test_handlers import (
    body,
    condition,
    provision,
    put_topic,
    update_spec,
)

SLOTS = 8
MASTERS = ("orders-redis-0-0", "orders-redis-1-0")
#: CLIENT PAUSE's own timer, a backstop only: target_writes_held lifts the pause itself
HELD_WRITES_MS = 600_000


@pytest.fixture
def one_move_batch_per_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """No time budget: each pass runs exactly one batch, so progress is seen pass by pass."""
    monkeypatch.setattr(resharding, "MOVES_BUDGET_S", 0.0)


@pytest.fixture
def masters(redis_pods: RedisPods) -> Iterator[list[Queue]]:
    """The test's own engine clients of both brokers' masters (pods added by the test)."""
    queues: list[Queue] = []
    yield queues
    for queue in queues:
        queue.close()


async def grown_topic(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    **resharding_spec: int,
) -> dict[int, tuple[int, int]]:
    """A 1-broker topic serving messages, then grown to 2 brokers whose new master is ready;
    returns each slot's (scheduled, prepared) before any move."""
    put_topic(api, brokers=1, slotAmount=SLOTS, replicasPerBroker=0)
    await provision(api, ctx, logger)
    redis_pods.add(0, 1)
    add_service_pods(api, 1)
    own_slots(zk, SLOTS)
    await health(api, ctx, logger)  # elects broker 0's master
    masters.append(redis_pods.queue(MASTERS[0], slot_amount=SLOTS))
    fill(masters[0], list(range(SLOTS)), scheduled=40, prepared=8)
    before = counts(masters[0], range(SLOTS))
    update_spec(api, brokers=2, resharding=resharding_spec)
    await provision(api, ctx, logger)
    redis_pods.add(1, 1, master=0)  # the new broker's Redis is up and Ready
    add_service_pods(api, 2)
    masters.append(redis_pods.queue(MASTERS[1], slot_amount=SLOTS))
    return before


async def health(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """One health pass as the leader's loop runs it: status written, Events posted."""
    await serialized(ctx, body(api), logger, refresh)


@contextmanager
def target_writes_held(api: kmock.KubernetesEmulator, redis_pods: RedisPods) -> Iterator[None]:
    """Broker 1's master answers reads but holds every write (CLIENT PAUSE WRITE) until the
    block ends, so a move onto it hangs in its copy: it cannot patch status.routing nor switch
    meanwhile. The pause is lifted by the block, not by its timer: a timer outrun by a slow
    machine let the move finish under the test's assertions. Left paused, a mover's own bound
    ends it (redisctl.MOVE_TIMEOUT_S per try, redis-py's retries: about 110 s). The functions
    library and the settings record a pass writes first are put in place before: the pass
    reaches the move at once instead of timing out on them."""
    with redis_pods.client(MASTERS[1]) as target:
        functions.load(target)
        owner = body(api)["metadata"]
        Queue(target, parse_body(body(api)).topic).publish_settings(
            owner["uid"], owner["generation"]
        )
        target.client_pause(HELD_WRITES_MS, all=False)
    try:
        yield
    finally:
        with redis_pods.client(MASTERS[1]) as target:
            target.client_unpause()


#: The move a pass of `grown_topic(maxConcurrentMoves=1)` starts first, hung in its copy
HUNG_MOVE = [(4, Step.COPY)]


def moves_recorded(mover: SlotMover) -> list[tuple[int, Step]]:
    return [(m.slot, m.step) for m in mover.migrations()]


async def abandon_pass_in_move(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger, mover: SlotMover
) -> None:
    """A health pass abandoned, as by the loop at its bound, once its move runs (a thread the
    cancel cannot stop); returns once the move hangs in its copy (target_writes_held). Not
    as soon as the move is submitted (`resharding.moving`): cancelled before a thread picks it
    up, which a loaded machine delays, the move never runs."""
    first = asyncio.create_task(health(api, ctx, logger))
    # recorded by the move's thread (SlotMover.start): it runs
    await eventually(lambda: moves_recorded(mover), 30.0, "the first pass's move to start")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert resharding.moving(parse_body(body(api)))
    await eventually(
        lambda: moves_recorded(mover) == HUNG_MOVE, 10.0, "the abandoned move to reach its copy"
    )


def counts(queue: Queue, slots: range | list[int]) -> dict[int, tuple[int, int]]:
    return {s.slot: (s.scheduled, s.prepared) for s in queue.stats(list(slots)).slots}


def where_they_are(zk: KazooClient, masters: list[Queue]) -> dict[int, tuple[int, int]]:
    """Each slot's counts, read on the broker the published routing names for it."""
    routing = published_routing(zk)
    assert routing is not None
    found: dict[int, tuple[int, int]] = {}
    for broker, queue in enumerate(masters):
        found.update(counts(queue, routing.slots_of(broker)))
    return found


async def test_brokers_grow_1_to_2_moving_half_the_slots_batch_by_batch(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    one_move_batch_per_pass: None,
) -> None:
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=2)
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_count == 2
    assert routing.broker_of_slot == (0,) * SLOTS  # reconcile grew it without moving a slot

    await health(api, ctx, logger)  # the first batch of 2 moves
    status = body(api)["status"]
    assert status["resharding"] == {"moved": 2, "total": 4}
    moving = condition(api, "Resharding")
    assert (moving["status"], moving["reason"]) == ("True", "MovingSlots")
    assert "2/4 slot moves done" in moving["message"]
    assert [b["slots"] for b in status["brokers"]] == [6, 2]
    assert where_they_are(zk, masters) == before

    api.objects[DT, NAMESPACE, "orders"].patch(
        {"metadata": {"annotations": {naming.PAUSED_ANNOTATION: "true"}}}
    )
    await health(api, ctx, logger)  # paused: no move
    paused = published_routing(zk)
    assert paused is not None
    assert paused.slots_per_broker() == {0: 6, 1: 2}
    api.objects[DT, NAMESPACE, "orders"].patch(
        {"metadata": {"annotations": {naming.PAUSED_ANNOTATION: "false"}}}
    )

    await health(api, ctx, logger)  # the last 2
    status = body(api)["status"]
    assert status["resharding"] == {"moved": 4, "total": 4}
    done = condition(api, "Resharding")
    assert (done["status"], done["reason"]) == ("False", "Completed")
    assert [b["slots"] for b in status["brokers"]] == [4, 4]
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0, 0, 0, 0, 1, 1, 1, 1)
    assert where_they_are(zk, masters) == before  # nothing lost, nothing left behind
    assert status["depths"]["scheduled"] == sum(s for s, _ in before.values())
    assert SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters).migrations() == []
    reasons = [reason for _, reason in posted(api)]
    assert reasons.count("ReshardingStarted") == 1
    assert reasons.count("SlotsMoved") == 2
    assert reasons.count("ReshardingCompleted") == 1

    await health(api, ctx, logger)  # balanced: nothing to do, nothing new in status
    assert await refresh(ctx, body(api), logger) == {}
    await provision(api, ctx, logger)  # a reconcile keeps the moved slots where they are
    assert published_routing(zk) == routing


@pytest.mark.parametrize("steps", range(len(Step)), ids=[f"stopped-before-{s}" for s in Step])
async def test_a_move_a_stopped_mover_recorded_is_finished_first(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    steps: int,
) -> None:
    """What an operator killed mid-move leaves (ZooKeeper and Redis, its memory gone): the
    slot's move recorded at any step. The next leader's pass completes it, then the plan."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=1)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    stopped: tuple[Migration, int] | None = mover.start(1, 1)  # a slot the plan does not move
    for _ in range(steps):
        assert stopped is not None
        stopped = mover.step(*stopped)
    mover.release(1)  # the mover dies: its lock goes with its session
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot[1] == 1  # the recorded move was completed, not redone
    assert routing.slots_per_broker() == {0: 4, 1: 4}  # and the plan balanced around it
    assert mover.migrations() == []
    assert where_they_are(zk, masters) == before
    assert condition(api, "Resharding")["reason"] == "Completed"


async def test_a_failed_move_is_reported_and_resumed_by_the_next_pass(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """The new broker's master refuses writes (min-replicas-to-write without a replica): the
    copy fails, the pass says so (MoveFailed, a ReshardingFailed Event) and leaves the move
    recorded, its slot frozen on the source; once the broker takes writes, the next pass
    resumes that move first and completes the resharding. Nothing lost."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=1)
    with redis_pods.client(MASTERS[1]) as target:
        target.config_set("min-replicas-to-write", 1)
        await health(api, ctx, logger)
        failed = condition(api, "Resharding")
        assert (failed["status"], failed["reason"]) == ("True", "MoveFailed")
        assert "slot 4 to broker 1" in failed["message"]
        assert "NOREPLICAS" in failed["message"]
        assert ("Warning", "ReshardingFailed") in posted(api)
        recorded = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters).migrations()
        assert [(m.slot, m.step) for m in recorded] == [(4, Step.COPY)]
        target.config_set("min-replicas-to-write", 0)
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert body(api)["status"]["resharding"] == {"moved": 4, "total": 4}
    assert where_they_are(zk, masters) == before


async def test_a_pass_abandoned_mid_move_is_not_joined_by_a_second_mover(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The health loop abandons a pass stuck in a move (its bound) but cannot stop the move's
    thread: the next pass must not run a second mover of the slot beside it (a late copy of
    the first would overwrite the target after the second switched). It waits; once the
    stuck move ends, the passes go on. Nothing lost."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=1)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    with target_writes_held(api, redis_pods):
        await abandon_pass_in_move(api, ctx, logger, mover)
        with caplog.at_level(logging.WARNING, logger=logger.name):
            await health(api, ctx, logger)
        assert "a move of an abandoned pass still runs" in caplog.text
        assert moves_recorded(mover) == HUNG_MOVE  # the pass ran beside it throughout
    await eventually(lambda: not mover.migrations(), 10.0, "the abandoned move to end")
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert where_they_are(zk, masters) == before


async def test_a_move_whose_mover_holds_its_lock_is_left_to_it(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A mover at work elsewhere (the CLI; an old operator process whose threads still run)
    holds the slot's lock: the pass neither resumes its recorded move nor plans around it,
    so no second copy lands on the target. Once that mover ended, the pass balances."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=2)
    mover = SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters)
    held: tuple[Migration, int] | None = mover.step(*mover.start(4, 1))  # frozen, alive
    await health(api, ctx, logger)
    assert [(m.slot, m.step) for m in mover.migrations()] == [(4, Step.COPY)]
    assert counts(masters[1], [4]) == {4: (0, 0)}  # nothing copied by the pass
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0,) * SLOTS
    while held is not None:
        held = mover.step(*held)
    mover.release(4)
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert where_they_are(zk, masters) == before


async def test_an_unreadable_move_is_reported_not_raised(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """A `migrations/<slot>` node of a newer format (a newer mover wrote it): the pass says
    so (MoveFailed, ReshardingFailed) and still writes the rest of its status."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=2)
    newer = TopicPaths(NAMESPACE, "orders").migration(5)
    zk.create(newer, b'{"version": 2, "slot": 5}', makepath=True)
    await health(api, ctx, logger)
    failed = condition(api, "Resharding")
    assert (failed["status"], failed["reason"]) == ("True", "MoveFailed")
    assert "ValueError: unknown migration format version 2" in failed["message"]
    assert ("Warning", "ReshardingFailed") in posted(api)
    assert [b["slots"] for b in body(api)["status"]["brokers"]] == [SLOTS, 0]
    zk.delete(newer)
    await health(api, ctx, logger)
    assert condition(api, "Resharding")["reason"] == "Completed"
    assert where_they_are(zk, masters) == before


async def test_no_slot_moves_before_every_delay_service_runs_the_new_brokers(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    masters: list[Queue],
    logger: logging.Logger,
) -> None:
    """Service pod 0 still on the spec of one broker ignores a routing naming broker 1: slots
    moved there would wait for it to roll. The pass waits for the rollout to finish."""
    before = await grown_topic(api, ctx, zk, redis_pods, masters, logger, maxConcurrentMoves=2)
    services_rolled_to(api, 2, updated=1)  # pod 1 new, pod 0 still on the old spec
    await health(api, ctx, logger)
    routing = published_routing(zk)
    assert routing is not None
    assert routing.broker_of_slot == (0,) * SLOTS
    assert SlotMover(zk, TopicPaths(NAMESPACE, "orders"), masters).migrations() == []
    services_rolled_to(api, 2)
    await health(api, ctx, logger)
    moved = published_routing(zk)
    assert moved is not None
    assert moved.slots_per_broker() == {0: 4, 1: 4}
    assert where_they_are(zk, masters) == before
