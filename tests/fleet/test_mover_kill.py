"""kill -9 of a real mover process in each step of a move, under load: `delayq routing
move-slot` (the SlotMover the operator runs in its threads) is held inside the step that
ZooKeeper shows in `migrations/<slot>`, killed there with SIGKILL, and the operator's resharding
then finishes that move and the rest while two `delayq serve` processes deliver a steady stream.
Nothing lost, nothing early, the slots balanced 8/8.

What holds the process in its step, with no hook in the product:
* freeze: the source's Redis pauses writes (CLIENT PAUSE WRITE), the freeze script waits;
* copy: the target's Redis pauses writes, the copy's MULTI waits;
* switch: the mover reaches ZooKeeper through a ZkHold proxy that passes none of its requests
  after the write recording `switch`: it waits on its read of the routing, which it never
  wrote;
* clean: held in copy as above, then the source pauses writes and the target resumes: the
  mover copies, switches, records `clean` and waits on its UNLINK of the source's keys.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import replace
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

from .conftest import NAMESPACE, SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_reshard import operator_context, reshard_pass, two_broker_spec
from .test_slot_move import (
    MEMBERS,
    MOVE_BOUND_S,
    RoutedProducer,
    deliveries,
    second_broker,
    two_broker_fleet,
)
from .zk_hold import ZkHold

__all__ = ["second_broker", "two_broker_fleet"]  # fixtures shared with test_slot_move

pytestmark = pytest.mark.slow
SLOT = 9  # the slot the killed mover moved (one the plan moves: 8..15)
PAUSE_MS = 30_000  # a paused Redis resumes by itself after this, should the test die
HOLD_TIMEOUT_S = 30.0


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


@pytest.mark.parametrize("step", list(Step), ids=[f"killed-in-{s}" for s in Step])
async def test_a_mover_killed_in_each_step_leaves_a_move_the_operator_finishes(
    two_broker_fleet: tuple[ProcessFleet, list[str]], step: Step
) -> None:
    fleet, urls = two_broker_fleet
    for member in MEMBERS:
        fleet.start(member)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    spec = two_broker_spec(fleet)
    ctx = operator_context(fleet, urls)
    admins = [redis.Redis.from_url(url) for url in urls]
    async_clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    producer = RoutedProducer(fleet, [AsyncQueue(c, fleet.topic) for c in async_clients])
    migration = TopicPaths(NAMESPACE, fleet.topic.name).migration(SLOT)
    hold = ZkHold(
        ("127.0.0.1", fleet.zookeeper.port),
        lambda path, data: (
            step is Step.SWITCH and path == migration and Migration.decode(data).step is step
        ),
    )
    stop = asyncio.Event()
    producing = asyncio.create_task(producer.run(stop))
    status: dict[str, Any] = {}
    try:
        await deliveries(fleet, async_clients[0], lambda: len(fleet.deliveries) >= 100, 30.0)
        if step is not Step.SWITCH:  # the Redis the step writes first (clean: see held_in)
            admins[0 if step is Step.FREEZE else 1].client_pause(PAUSE_MS, all=False)
        try:
            mover = start_mover(fleet, hold.hosts)
            try:
                await held_in(step, fleet, admins)
            finally:
                os.kill(mover.pid, signal.SIGKILL)  # in the step (the test failing: to stop it)
                mover.wait()
        finally:
            for admin in admins:
                admin.client_unpause()
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
        before_end = set(fleet.scheduled)
        await deliveries(
            fleet, async_clients[0], lambda: len(fleet.scheduled) > len(before_end) + 200
        )
    finally:
        stop.set()
        await producing
    try:
        await deliveries(fleet, async_clients[0], lambda: not fleet.missing(), MOVE_BOUND_S)
        early = [d for d in fleet.deliveries if d.at_ms < producer.due_ms[d.message_id]]
        assert not early
        assert status["resharding"] == {"moved": SLOTS // 2, "total": SLOTS // 2}
        assert routed_to(fleet) == 1
        queues = [Queue.from_url(url, fleet.topic) for url in urls]
        paths = TopicPaths(NAMESPACE, fleet.topic.name)
        assert SlotMover(fleet.observer(), paths, queues).migrations() == []
        for queue in queues:
            queue.close()
        payload, _ = fleet.observer().get(paths.routing)
        assert Routing.from_json(payload).slots_per_broker() == {0: SLOTS // 2, 1: SLOTS // 2}
        after = {fleet.topic.slot_of(i.encode()) for i in fleet.scheduled - before_end}
        assert after == set(range(SLOTS))  # every slot delivers after the moves
        print(
            f"mover killed -9 in {step}: {len(fleet.scheduled)} messages, lost "
            f"{len(fleet.missing())}, early {len(early)}, {fleet.duplicates()} duplicates, "
            f"{producer.refused} writes refused and resent"
        )
    finally:
        hold.close()
        for admin in admins:
            admin.close()
        for client in async_clients:
            await client.aclose()
        await asyncio.to_thread(ctx.store.close)  # type: ignore[attr-defined]
