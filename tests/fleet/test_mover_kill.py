"""kill -9 in each step of a move, under load: `delayq routing move-slot` (the SlotMover the
operator runs in its threads) is held inside the step that ZooKeeper shows in
`migrations/<slot>` while two `delayq serve` processes deliver a steady stream, and there

* the mover is killed with SIGKILL; the operator's resharding then finishes that move and the
  rest (the slots balanced 8/8);
* the `delayq serve` process owning the slot is killed with SIGKILL; the mover is let go and
  completes the move, the other process takes the slot over from the new broker.

Nothing lost, nothing early, no message later than a bound (`STALL_BOUND_S`).

What holds the process in its step, with no hook in the product:
* freeze: the source's Redis pauses writes (CLIENT PAUSE WRITE), the freeze script waits;
* copy: the target's Redis pauses writes, the copy's MULTI waits;
* switch: the mover reaches ZooKeeper through a ZkHold proxy that passes none of its requests
  after the write recording `switch`: it waits on its read of the routing, which it never
  wrote;
* clean: held in copy as above, then the source pauses writes and the target resumes: the
  mover copies, switches, records `clean` and waits on its UNLINK of the source's keys.

Letting go of the mover resumes the paused Redis (CLIENT UNPAUSE) or the proxy (ZkHold.release).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis
import redis.asyncio

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.local.processes import config_env
from delayq.local.waiting import eventually
from delayq.queue import AsyncQueue, Queue
from delayq.queue.keys import Part, slot_keys

from .conftest import ACK_TIMEOUT_MS, NAMESPACE, SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_reshard import operator_context, reshard_pass, two_broker_spec
from .test_slot_move import (
    MEMBERS,
    MOVE_BOUND_S,
    RoutedProducer,
    deliveries,
)
from .zk_hold import ZkHold

pytestmark = pytest.mark.slow
SLOT = 9  # the slot the killed mover moved (one the plan moves: 8..15)
PAUSE_MS = 30_000  # a paused Redis resumes by itself after this, should the test die
HOLD_TIMEOUT_S = 30.0
#: No message is delivered later than this after its due time when the slot's owner is killed
#: mid-move: the hold (a mover process starting while a broker pauses, a few seconds), the
#: killed process's session running out (SESSION_TIMEOUT_S), a lease of a message it had
#: claimed running out (ACK_TIMEOUT_MS), and room for a loaded machine.
STALL_BOUND_S = 3.0 + SESSION_TIMEOUT_S + ACK_TIMEOUT_MS / 1000 + 6.0


def step_shown(fleet: ProcessFleet) -> Step | None:
    """The step `migrations/<SLOT>` records right now (None: no move recorded)."""
    path = TopicPaths(NAMESPACE, fleet.topic.name).migration(SLOT)
    found = fleet.observer().exists(path)
    return Migration.decode(fleet.observer().get(path)[0]).step if found else None


def routed_to(fleet: ProcessFleet) -> int:
    payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).routing)
    return Routing.from_json(payload).broker_of_slot[SLOT]


def start_mover(fleet: ProcessFleet, zookeeper_connect: str) -> subprocess.Popen[bytes]:
    """`delayq routing move-slot` of SLOT to broker 1, with the fleet's settings."""
    config = replace(fleet.config("mover"), zookeeper_connect=zookeeper_connect)
    command = ["routing", "move-slot", "--slot", str(SLOT), "--to-broker", "1"]
    with (fleet.log_dir / "mover.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *command],
            env={**os.environ, **config_env(config)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def held_in(step: Step, fleet: ProcessFleet, admins: list[redis.Redis]) -> None:
    """Wait until ZooKeeper shows the mover in `step`, with the step held (module docstring)."""

    async def shown(expected: Step) -> None:
        await eventually(lambda: step_shown(fleet) is expected, HOLD_TIMEOUT_S, str(expected))

    if step is Step.CLEAN:
        await shown(Step.COPY)
        admins[0].client_pause(PAUSE_MS, all=False)
        admins[1].client_unpause()
    await shown(step)


@dataclass
class Load:
    """Two serve processes delivering the RoutedProducer's stream on two brokers, all of it
    on broker 0 at first; `admins[b]` pauses broker b's Redis."""

    fleet: ProcessFleet
    urls: list[str]
    admins: list[redis.Redis]
    clients: list[redis.asyncio.Redis]
    producer: RoutedProducer
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def delivered(self, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        await deliveries(self.fleet, self.clients[0], condition, timeout_s)

    async def more_scheduled(self, count: int = 200) -> set[str]:
        """The ids scheduled so far, once `count` more were scheduled after them."""
        before = set(self.fleet.scheduled)
        await self.delivered(lambda: len(self.fleet.scheduled) > len(before) + count)
        return before


@pytest.fixture
async def load(two_broker_fleet: tuple[ProcessFleet, list[str]]) -> AsyncIterator[Load]:
    fleet, urls = two_broker_fleet
    for member in MEMBERS:
        fleet.start(member)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    producer = RoutedProducer(fleet, [AsyncQueue(c, fleet.topic) for c in clients])
    running = Load(fleet, urls, [redis.Redis.from_url(url) for url in urls], clients, producer)
    producing = asyncio.create_task(producer.run(running.stop))
    try:
        await running.delivered(lambda: len(fleet.deliveries) >= 100)
        yield running
    finally:
        running.stop.set()
        await producing
        for admin in running.admins:
            admin.client_unpause()
            admin.close()
        for client in clients:
            await client.aclose()


def switch_hold(fleet: ProcessFleet, step: Step) -> ZkHold:
    """The proxy a mover reaches ZooKeeper through: it holds the mover after it recorded
    `switch` when `step` is that, else passes everything."""
    migration = TopicPaths(NAMESPACE, fleet.topic.name).migration(SLOT)
    return ZkHold(
        ("127.0.0.1", fleet.zookeeper.port),
        lambda path, data: (
            step is Step.SWITCH and path == migration and Migration.decode(data).step is step
        ),
    )


@contextlib.asynccontextmanager
async def mover_held_in(
    step: Step, load: Load, hold: ZkHold
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`delayq routing move-slot` started and held inside `step` (module docstring) for the
    body; then the paused Redis resumes and the proxy passes again, so a mover still alive
    goes on. A body that fails kills it."""
    if step is not Step.SWITCH:  # the Redis the step writes first (clean: see held_in)
        load.admins[0 if step is Step.FREEZE else 1].client_pause(PAUSE_MS, all=False)
    try:
        mover = start_mover(load.fleet, hold.hosts)
        try:
            await held_in(step, load.fleet, load.admins)
            yield mover
        except BaseException:
            os.kill(mover.pid, signal.SIGKILL)
            mover.wait()
            raise
    finally:
        for admin in load.admins:
            admin.client_unpause()
        hold.release()


async def finished(mover: subprocess.Popen[bytes]) -> int:
    """The mover's exit code once it ended; past HOLD_TIMEOUT_S it is killed (the test fails)."""
    try:
        return await asyncio.to_thread(mover.wait, HOLD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(mover.pid, signal.SIGKILL)
        mover.wait()
        raise


async def settled(load: Load, after: set[str], bound_s: float) -> tuple[list[str], int]:
    """Once every message is delivered (within `bound_s`): nothing early, SLOT routed to broker
    1, no move left recorded, every slot delivering the messages scheduled after `after`.
    Returns the early ids and the greatest lateness of a first delivery (ms)."""
    fleet = load.fleet
    await load.delivered(lambda: not fleet.missing(), bound_s)
    due = load.producer.due_ms
    early = [d.message_id for d in fleet.deliveries if d.at_ms < due[d.message_id]]
    first: dict[str, int] = {}
    for delivery in fleet.deliveries:
        first.setdefault(delivery.message_id, delivery.at_ms - due[delivery.message_id])
    assert routed_to(fleet) == 1
    queues = [Queue.from_url(url, fleet.topic) for url in load.urls]
    paths = TopicPaths(NAMESPACE, fleet.topic.name)
    assert SlotMover(fleet.observer(), paths, queues).migrations() == []
    for queue in queues:
        queue.close()
    later = {fleet.topic.slot_of(i.encode()) for i in fleet.scheduled - after}
    assert later == set(range(SLOTS))  # every slot delivers after the move
    return early, max(first.values())


@pytest.mark.parametrize("step", list(Step), ids=[f"killed-in-{s}" for s in Step])
async def test_a_mover_killed_in_each_step_leaves_a_move_the_operator_finishes(
    load: Load, step: Step
) -> None:
    fleet = load.fleet
    spec = two_broker_spec(fleet)
    ctx = operator_context(fleet, load.urls)
    hold = switch_hold(fleet, step)
    status: dict[str, Any] = {}
    try:
        async with mover_held_in(step, load, hold) as mover:
            os.kill(mover.pid, signal.SIGKILL)
            mover.wait()
        assert mover.returncode == -signal.SIGKILL
        assert step_shown(fleet) is step  # killed in it: the next step never recorded
        assert routed_to(fleet) == (1 if step is Step.CLEAN else 0)
        lock = TopicPaths(NAMESPACE, fleet.topic.name).mover(SLOT)
        await eventually(  # its lock goes with its session: until then no one takes the slot
            lambda: not fleet.observer().exists(lock), SESSION_TIMEOUT_S + 5.0, "the lock gone"
        )
        reasons = [await reshard_pass(ctx, spec, fleet, status)]
        while reasons[-1] != "Completed":
            reasons.append(await reshard_pass(ctx, spec, fleet, status))
            assert len(reasons) < 20, reasons
        before_end = await load.more_scheduled()
        load.stop.set()
        early, late_ms = await settled(load, before_end, MOVE_BOUND_S)
        assert not early
        assert status["resharding"] == {"moved": SLOTS // 2, "total": SLOTS // 2}
        payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).routing)
        assert Routing.from_json(payload).slots_per_broker() == {0: SLOTS // 2, 1: SLOTS // 2}
        print(
            f"mover killed -9 in {step}: {len(fleet.scheduled)} messages, lost "
            f"{len(fleet.missing())}, early {len(early)}, {fleet.duplicates()} duplicates, "
            f"{load.producer.refused} writes refused and resent, latest {late_ms} ms late"
        )
    finally:
        hold.close()
        await asyncio.to_thread(ctx.store.close)  # type: ignore[attr-defined]


@pytest.mark.parametrize("step", list(Step), ids=[f"owner-killed-in-{s}" for s in Step])
async def test_the_slots_serve_process_killed_in_each_step_loses_nothing(
    load: Load, step: Step
) -> None:
    """The owner of the moving slot dies with SIGKILL while the mover is held in `step`; the
    mover then completes, and the other process takes the slot over on its new broker once
    the dead one's session ran out: lost 0, early 0, no message later than STALL_BOUND_S."""
    fleet = load.fleet
    hold = switch_hold(fleet, step)
    try:
        async with mover_held_in(step, load, hold) as mover:
            owner = fleet.owners()[SLOT]
            fleet.processes[owner].kill()
        assert await finished(mover) == 0  # the move completed
        survivor = next(m for m in MEMBERS if m != owner)
        await eventually(
            lambda: set(fleet.owners().values()) == {survivor},
            SESSION_TIMEOUT_S + 20.0,
            "the survivor owning every slot",
        )
        before_end = await load.more_scheduled()
        load.stop.set()
        early, late_ms = await settled(load, before_end, STALL_BOUND_S)
        assert not early
        assert late_ms <= STALL_BOUND_S * 1000
        source = load.admins[0]
        keys = slot_keys(fleet.topic, SLOT)
        assert source.exists(*keys.keys(*Part)) == 1  # the tombstone only: it left the source
        print(
            f"owner of slot {SLOT} killed -9 in {step}: {len(fleet.scheduled)} messages, lost "
            f"{len(fleet.missing())}, early {len(early)}, {fleet.duplicates()} duplicates, "
            f"{load.producer.refused} writes refused and resent, latest {late_ms} ms late"
        )
    finally:
        hold.close()
