"""Growing brokers live: the health pass moves slots onto the brokers that have too few.

When `spec.brokers` grows, reconcile publishes the routing with more brokers and every slot where
it was (routing.plan_routing is sticky: a slot's messages live on its broker). The leader's
health pass then calls `reshard` once every broker has a ready master and every delay-service
pod runs the service StatefulSet's current spec (`services_rolled`). It

1. finishes every move recorded in ZooKeeper (`migrations/<slot>`): one a mover left when it
   stopped (this operator killed or demoted mid-move, a `delayq routing move-slot` that died).
   The recorded move is completed, never rolled back: its steps are idempotent, and completing
   also serves the plan, which it was taken from. A move whose slot's lock (`movers/<slot>`) is
   held is left to its mover (the CLI, an operator process stopping), and nothing is planned
   while one is;
2. doubles the slots while `spec.slotAmount` is above the routing's (or a doubling is
   recorded in ZooKeeper, `split`): coordination.splitting.SlotSplitter, whole, in one pass;
   that pass moves nothing (the next one plans on the new slots). A move recorded or locked
   with no doubling recorded comes first (a doubling refuses to start beside it): step 3;
3. plans the fewest moves that balance the slots (routing.plan_moves) and runs them with
   coordination.migration.SlotMover, `spec.resharding.maxConcurrentMoves` at a time, until
   MOVES_BUDGET_S of the pass is spent. The next pass plans again from the routing in ZooKeeper
   and goes on, so nothing but ZooKeeper remembers a plan: a new leader continues it.

It runs inside the health pass on purpose: passes are serialized per topic with reconcile (the
other writer of the routing, which never moves a slot: zk.RoutingChanged), run only on the
leader, and do not run while the topic carries `delayq.io/paused`. The annotation is read when a
pass starts: a pass under way goes on starting batches until its budget is spent; the next
starts none. Progress is `status.resharding` (moves `moved` of
`total`), the `Resharding` condition (True while slots move, False `Completed` after) and
Events (ReshardingStarted, SlotsMoved per batch, ReshardingCompleted, SlotsSplit,
ReshardingFailed); the
per-broker slot counts are the brokers' `slots` in status.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from delayq.coordination.migration import MoveError, SlotMover
from delayq.coordination.routing import Move, Routing, plan_moves
from delayq.coordination.splitting import SlotSplitter, routed_topic
from delayq.kube import naming
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.events import NORMAL, WARNING, TopicEvent
from delayq.kube.fair_pool import FairPool
from delayq.kube.routing_ahead import RecordRouting, RoutingAhead
from delayq.kube.spec import TopicSpec
from delayq.kube.status import FALSE, RESHARDING, TRUE, Condition
from delayq.queue import Queue

# How long one health pass keeps starting batches of moves (at least one; a batch under way is
# finished), inside the pass's bound (healthloop.PASS_TIMEOUT_S). A slot of 100k messages moves
# in ~0.13 s (docs/benchmarks.md). A pass can still be cancelled with moves under way (a Redis
# call hanging up to redisctl.MOVE_TIMEOUT_S): see MOVERS.
MOVES_BUDGET_S = 10.0
#: What a move may fail with and be tried again by the next pass (which resumes it first).
MOVE_ERRORS = (MoveError, redis.RedisError, *TRANSIENT_ERRORS)
#: The threads the moves run in (min(32, cpus + 4), shared by every topic, each topic at most
#: its share of them at once: fair_pool.py; maxConcurrentMoves bounds one topic's batch, not
#: the threads), and each topic's moves under way. A thread cannot be cancelled: when the
#: health loop abandons a pass, its moves go on (holding their slots' locks, SlotMover). A
#: pass starts no move while one of an abandoned pass still runs; a move cancelled before its
#: thread started never runs (its future is done either way).
MOVERS = FairPool(min(32, (os.cpu_count() or 1) + 4), "delayq-slot-mover")
_under_way: dict[tuple[str, str], list[Future[Any]]] = {}


#: How long a clean stop waits for this process's moves before releasing the leader Lease
#: (inside Kubernetes' default 30 s grace): a standby then starts none beside them. Past it the
#: Lease is not released, it runs out; the slots' locks keep a standby off them meanwhile.
MOVERS_STOP_S = 20.0


def moving(spec: TopicSpec) -> bool:
    """A move (or doubling) of the topic that an abandoned pass started still runs."""
    return not all(move.done() for move in _under_way.get((spec.namespace, spec.name), []))


async def movers_stopped(timeout_s: float = MOVERS_STOP_S) -> bool:
    """Wait up to `timeout_s` for every move thread of this process to end; False if one
    still runs (a thread cannot be cancelled)."""
    running = [f for moves in _under_way.values() for f in moves if not f.done()]
    if not running:
        return True
    _, left = await asyncio.wait([asyncio.wrap_future(f) for f in running], timeout=timeout_s)
    return not left


@dataclass(frozen=True)
class Resharding:
    """One pass's resharding: the routing after it, and what the status and Events say."""

    routing: Routing
    condition: Condition | None = None  # None: nothing to report (never resharded)
    progress: dict[str, int] | None = None  # status.resharding: {moved, total}
    events: list[TopicEvent] = field(default_factory=list)
    recorded: bool = False  # status.routing was patched ahead of a switch (routing_ahead.py)


def services_rolled(statefulset: Mapping[str, Any] | None) -> bool:
    """Every delay-service pod runs the StatefulSet's current spec, which lists every broker's
    URL. A pod still on the old spec knows fewer brokers: it ignores a routing naming one it
    has no URL for, so the slots moved there would wait for that pod to roll."""
    if statefulset is None:
        return False
    status = statefulset.get("status") or {}
    generation = (statefulset.get("metadata") or {}).get("generation")
    replicas = (statefulset.get("spec") or {}).get("replicas", 1)
    counts = tuple(status.get(f, 0) for f in ("replicas", "updatedReplicas", "readyReplicas"))
    return (
        (generation is None or status.get("observedGeneration") == generation)
        and counts == (replicas, replicas, replicas)
        and status.get("currentRevision") == status.get("updateRevision")
    )


async def reshard(
    ctx: OperatorContext,
    spec: TopicSpec,
    routing: Routing,
    password: str,
    status: Mapping[str, Any],
    logger: Logger,
    record: RecordRouting,
) -> Resharding:
    """Resume recorded moves, then run planned ones, for up to MOVES_BUDGET_S. `routing` is
    the one the pass read: while it lacks the new brokers (reconcile has not published them)
    nothing moves; the returned routing is read again after the moves. `record` writes the
    routing after each switch before the switch (routing_ahead.py; the health pass's writes
    status.routing)."""
    if routing.broker_count < spec.brokers:
        return Resharding(routing)  # reconcile has not published the new brokers yet
    key = (spec.namespace, spec.name)
    if moving(spec):
        logger.warning("resharding waits: a move of an abandoned pass still runs")
        return Resharding(routing)
    topic = routed_topic(spec.topic, routing)  # its syncReplicas too
    hosts = [naming.redis_master_host(spec.name, spec.namespace, b) for b in range(spec.brokers)]
    connect = zookeeper_connect(spec, ctx.build)

    def open_tools() -> tuple[SlotMover, SlotSplitter, list[Queue]]:
        queues = [ctx.redis.broker_queue(host, password, topic) for host in hosts]
        mover = ctx.store.slot_mover(connect, spec.namespace, spec.name, queues)
        splitter = ctx.store.slot_splitter(connect, spec.namespace, spec.name, queues)
        return mover, splitter, queues

    mover, splitter, queues = await asyncio.to_thread(open_tools)
    ahead = RoutingAhead(record, asyncio.get_running_loop(), lambda: _routing(mover))
    try:
        result = await _double(splitter, mover, spec, routing, logger, key, ahead)
        if result is None:  # else the moves are planned by the next pass, on the new slots
            result = await _run(mover, spec, routing, status, logger, key, ahead)
        return replace(result, recorded=ahead.written is not None)
    finally:
        for queue in queues:
            queue.close()


async def _double(
    splitter: SlotSplitter,
    mover: SlotMover,
    spec: TopicSpec,
    routing: Routing,
    logger: Logger,
    key: tuple[str, str],
    ahead: RoutingAhead,
) -> Resharding | None:
    """Double the slots up to `spec.slotAmount` (finishing a doubling recorded in ZooKeeper
    first); None when none is wanted or recorded, or while slot moves are recorded or locked
    and no doubling is: a doubling refuses to start then, so the moves (one a stopped mover
    left, its slot frozen) are finished first by `_run`. The whole doubling runs in one thread: its
    old slots refuse writes from its freeze to its switch, so it is never left half done by
    the pass's budget (a pass abandoned meanwhile leaves it running, as a move)."""
    try:
        state, locked = await asyncio.to_thread(lambda: (splitter.state(), splitter.locked()))
    except Exception as error:
        failure = f"reading the doubling: {_describe(error)}"
        return Resharding(routing, Condition(RESHARDING, TRUE, "SplitFailed", failure + "."))
    target = max(spec.slot_amount, state.to_amount if state is not None else 0)
    if state is None and routing.slot_amount >= target:
        return None
    if state is None and await _moving(mover, logger):
        return None  # the moves first (`_run`, which reports an unreadable one too)
    what = f"Doubling the slots {routing.slot_amount} -> {target}"
    if locked:  # `delayq routing split` by hand, an operator process stopping, or the
        # frozen slots' owners completing a doubling whose splitter stopped (stopped_moves.py)
        message = f"{what}: waiting for another process that holds the split's lock."
        return Resharding(routing, Condition(RESHARDING, TRUE, "SplittingSlots", message))
    logger.info("resharding: %s", what.lower())
    started = time.monotonic()
    future = MOVERS.submit(key, splitter.split, target, ahead.doubling)
    _under_way[key] = [future]
    try:
        await asyncio.wrap_future(future)
    except MOVE_ERRORS as error:
        failure = _describe(error)
        logger.warning("resharding: %s failed: %s", what.lower(), failure)
        return Resharding(
            routing,
            Condition(RESHARDING, TRUE, "SplitFailed", f"{what} failed (retried): {failure}."),
            events=[TopicEvent(WARNING, "ReshardingFailed", f"{what}: {failure}; retried.")],
        )
    doubled = await asyncio.to_thread(lambda: splitter.routing()[0])
    counts = ", ".join(f"{b}: {n}" for b, n in doubled.slots_per_broker().items())
    message = (
        f"Doubled the slots {routing.slot_amount} -> {doubled.slot_amount} in "
        f"{time.monotonic() - started:.1f} s; slots per broker {counts}."
    )
    logger.info("resharding: %s", message)
    return Resharding(
        doubled,
        Condition(RESHARDING, FALSE, "Completed", message),
        events=[TopicEvent(NORMAL, "SlotsSplit", message)],
    )


async def _moving(mover: SlotMover, logger: Logger) -> bool:
    """Slot moves are recorded or locked (or their nodes unreadable): no doubling starts.
    Unreadable is logged here; `_run` then reports it in the condition."""
    try:
        return await asyncio.to_thread(lambda: bool(mover.migrations() or mover.locked()))
    except Exception as error:
        logger.warning("resharding: no doubling while the moves are unreadable: %r", error)
        return True


async def _run(
    mover: SlotMover,
    spec: TopicSpec,
    read: Routing,
    status: Mapping[str, Any],
    logger: Logger,
    key: tuple[str, str],
    ahead: RoutingAhead,
) -> Resharding:
    previous = _condition(status)
    moving = previous is not None and previous.get("status") == TRUE
    recorded = status.get("resharding") or {}
    deadline = time.monotonic() + MOVES_BUDGET_S
    done: list[Move] = []
    failure = ""
    plan, failure = await _read_plan(mover, spec.brokers)
    pending = plan.moves
    moved = int(recorded.get("moved", 0)) if moving else 0
    total = max(int(recorded.get("total", 0)), moved + len(pending)) if moving else len(pending)
    if not pending and not moving and not failure:  # balanced, or a mover by hand at work
        return Resharding(await asyncio.to_thread(_routing, mover))
    events = [_started(pending, spec)] if pending and not moving else []
    while pending and not failure:
        batch = pending[: spec.resharding_max_concurrent_moves]
        moves = [
            MOVERS.submit(key, mover.move, move.slot, move.target, ahead.moving) for move in batch
        ]
        _under_way[key] = moves
        results = await asyncio.gather(
            *(asyncio.wrap_future(move) for move in moves), return_exceptions=True
        )
        for move, result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                failure = f"slot {move.slot} to broker {move.target}: {_describe(result)}"
                logger.warning("resharding: move of %s failed", failure)
            elif isinstance(result, BaseException):
                raise result  # cancelled: the pass ends
            else:
                done.append(move)
        plan, failure = await _read_plan(mover, spec.brokers, failure)
        pending = plan.moves
        if time.monotonic() >= deadline:
            break
    try:
        routing = await asyncio.to_thread(_routing, mover)
    except Exception as error:
        # every switch of this pass came after its routing was patched into status.routing:
        # that one, not the read before the moves, is what the status copy must keep
        routing = ahead.written or read
        failure = failure or f"reading the routing: {_describe(error)}"
    moved += len(done)
    total = max(total, moved + len(pending))
    if done:
        events.append(_moved(done, moved, total))
        logger.info("resharding: moved %d slots (%d/%d)", len(done), moved, total)
    if failure:
        events.append(TopicEvent(WARNING, "ReshardingFailed", f"Moving {failure}; retried."))
    counts = ", ".join(f"{b}: {n}" for b, n in routing.slots_per_broker().items())
    if pending or failure or plan.held:
        message = f"{moved}/{total} slot moves done; slots per broker {counts}."
        if plan.held:
            slots = ", ".join(map(str, plan.held))
            message += f" Waiting for another mover of slots {slots} (their lock is held)."
        if failure:
            message += f" Last failure (retried next pass): {failure}."
        reason = "MoveFailed" if failure else "MovingSlots"
        condition = Condition(RESHARDING, TRUE, reason, message)
        return Resharding(routing, condition, {"moved": moved, "total": total}, events)
    message = f"Moved {moved} slots; slots per broker {counts}."
    events.append(TopicEvent(NORMAL, "ReshardingCompleted", message))
    condition = Condition(RESHARDING, FALSE, "Completed", message)
    return Resharding(routing, condition, {"moved": moved, "total": total}, events)


@dataclass(frozen=True)
class Plan:
    """What a pass may move now, and the slots another mover holds (left to it)."""

    moves: list[Move]
    held: tuple[int, ...]


async def _read_plan(mover: SlotMover, broker_count: int, failure: str = "") -> tuple[Plan, str]:
    """`_pending`, an unreadable node (a newer format, a broker gone) reported as the pass's
    failure rather than raised: raising would fail the whole health pass, freezing status."""
    try:
        return await asyncio.to_thread(_pending, mover, broker_count), failure
    except Exception as error:
        return Plan([], ()), failure or f"reading the moves: {_describe(error)}"


def _pending(mover: SlotMover, broker_count: int) -> Plan:
    """The recorded moves first (one a stopped mover left), else the plan from the routing;
    never a slot whose lock someone holds (a mover at work: the CLI, an operator stopping).
    While a recorded move is held, nothing is planned: the plan waits for it."""
    locked = mover.locked()
    recorded = mover.migrations()
    held = tuple(sorted(m.slot for m in recorded if m.slot in locked))
    free = [Move(m.slot, m.source, m.target) for m in recorded if m.slot not in locked]
    if recorded:
        return Plan(free, held)
    routing, version = mover.routing()
    if version is None:
        return Plan([], ())  # no routing published yet: reconcile writes the first one
    planned = plan_moves(routing, broker_count)
    return Plan(
        [m for m in planned if m.slot not in locked],
        tuple(sorted(m.slot for m in planned if m.slot in locked)),
    )


def _describe(error: BaseException) -> str:
    """One line: a MoveError's own text, the type for the rest (a KeyError says little)."""
    return str(error) if isinstance(error, MoveError) else f"{type(error).__name__}: {error}"


def _routing(mover: SlotMover) -> Routing:
    return mover.routing()[0]


def _condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == RESHARDING), None)


def _started(pending: Sequence[Move], spec: TopicSpec) -> TopicEvent:
    targets = sorted({move.target for move in pending})
    return TopicEvent(
        NORMAL,
        "ReshardingStarted",
        f"Moving {len(pending)} slots to brokers {', '.join(map(str, targets))} to balance "
        f"{spec.brokers} brokers, {spec.resharding_max_concurrent_moves} at a time.",
    )


def _moved(done: Sequence[Move], moved: int, total: int) -> TopicEvent:
    moves = ", ".join(f"{m.slot} ({m.source} -> {m.target})" for m in done)
    return TopicEvent(NORMAL, "SlotsMoved", f"Moved slots {moves}: {moved}/{total} done.")
