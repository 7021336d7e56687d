"""A slot frozen by a stopped move stalls no other slot (issue 35, defect 1).

Two `delayq serve` processes deliver a steady stream on two brokers. `delayq routing move-slot`
moves the lowest slot of one process to broker 1 and is killed with SIGKILL in `copy` (the
target's Redis pauses writes, the copy's MULTI waits): the slot stays frozen. Then that process
is killed with SIGKILL. The survivor takes over every slot the dead one held; the frozen one is
refused as moving, and used to fail the survivor's whole ownership pass, so the slots after it
were consumed by nobody. Now every other slot delivers again within the failover bound (session
timeout + 2 s, as `test_failover.py`), and the survivor ends the stopped move itself once it
stayed frozen past its bound (`move_stall_s`, twice the session timeout): nothing lost, nothing
early, the slot on its new broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoNodeError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotLocked, SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.local.processes import config_env
from delayq.local.waiting import eventually
from delayq.queue import Queue

from .conftest import NAMESPACE, SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_mover_kill import PAUSE_MS, Load, load  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow
FAILOVER_BOUND_S = SESSION_TIMEOUT_S + 2.0  # as tests/fleet/test_failover.py
#: The survivor ends the move once the slot stayed frozen 2 session timeouts; then the copy,
#: the switch and the takeover on broker 1, with room for a loaded machine.
MOVE_ENDED_BOUND_S = 2 * SESSION_TIMEOUT_S + 15.0


def migration_step(fleet: ProcessFleet, slot: int) -> Step | None:
    try:
        payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).migration(slot))
    except NoNodeError:
        return None
    return Migration.decode(payload).step


def routed_to(fleet: ProcessFleet, slot: int) -> int:
    payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).routing)
    return Routing.from_json(payload).broker_of_slot[slot]


def start_mover(fleet: ProcessFleet, slot: int) -> subprocess.Popen[bytes]:
    command = ["routing", "move-slot", "--slot", str(slot), "--to-broker", "1"]
    with (fleet.log_dir / "mover.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *command],
            env={**os.environ, **config_env(fleet.config("mover"))},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def test_a_slot_frozen_by_a_killed_mover_stalls_no_other_slot(load: Load) -> None:  # noqa: F811
    fleet = load.fleet
    owners = fleet.owners()
    victim = owners[0]
    victim_slots = {slot for slot, member in owners.items() if member == victim}
    frozen = min(victim_slots)  # the first one a pass takes over: it used to stop the rest
    others = victim_slots - {frozen}
    assert others
    load.admins[1].client_pause(PAUSE_MS, all=False)  # the copy's MULTI waits on the target
    mover = start_mover(fleet, frozen)
    try:
        await eventually(
            lambda: migration_step(fleet, frozen) is Step.COPY, 30.0, "the mover in copy"
        )
    finally:
        os.kill(mover.pid, signal.SIGKILL)
        mover.wait()
        load.admins[1].client_unpause()
    try:
        await victim_killed_with_the_slot_frozen(load, victim, frozen, others)
    except BaseException:
        await asyncio.to_thread(finish_move, load, frozen)  # the producer's writes held back
        raise


def finish_move(running: Load, slot: int) -> None:
    """Complete the stopped move (a failed test's cleanup: the producer stops only once every
    write it holds back landed, and the frozen slot's never would)."""
    queues = [Queue.from_url(url, running.fleet.topic) for url in running.urls]
    mover = SlotMover(
        running.fleet.observer(), TopicPaths(NAMESPACE, running.fleet.topic.name), queues
    )
    deadline = time.monotonic() + SESSION_TIMEOUT_S + 10.0
    try:
        while mover.migrations():
            try:
                mover.move(slot, 1)
            except SlotLocked:  # the killed mover's lock, until its session ran out
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        for queue in queues:
            queue.close()


async def victim_killed_with_the_slot_frozen(
    running: Load, victim: str, frozen: int, others: set[int]
) -> None:
    fleet = running.fleet
    fleet.processes[victim].kill()
    seconds, micros = running.admins[0].time()
    killed_ms = int(seconds) * 1000 + int(micros) // 1000
    first: dict[int, int] = {}

    def delivering() -> bool:
        for delivery in fleet.deliveries:
            slot = fleet.topic.slot_of(delivery.message_id)
            if slot in others and delivery.at_ms > killed_ms and slot not in first:
                first[slot] = delivery.at_ms
        return set(first) == others

    try:
        await running.delivered(delivering, FAILOVER_BOUND_S + 10.0)
    except TimeoutError:
        print(f"slots delivering again: {sorted(first)} of {sorted(others)}")
        raise
    gap_s = (max(first.values()) - killed_ms) / 1000
    assert migration_step(fleet, frozen) is Step.COPY  # still frozen meanwhile
    await eventually(
        lambda: migration_step(fleet, frozen) is None, MOVE_ENDED_BOUND_S, "the move ended"
    )
    assert routed_to(fleet, frozen) == 1  # completed, not rolled back: the target answers
    # the frozen slot's writes held back by the producer land first: 400 more for all slots
    before_end = await running.more_scheduled(400)
    running.stop.set()
    await running.delivered(lambda: not fleet.missing(), 30.0)
    due = running.producer.due_ms
    early = [d.message_id for d in fleet.deliveries if d.at_ms < due[d.message_id]]
    assert not early
    later = {fleet.topic.slot_of(i.encode()) for i in fleet.scheduled - before_end}
    assert later == set(range(SLOTS))  # every slot delivers, the frozen one from broker 1
    queues = [Queue.from_url(url, fleet.topic) for url in running.urls]
    paths = TopicPaths(NAMESPACE, fleet.topic.name)
    assert SlotMover(fleet.observer(), paths, queues).migrations() == []
    for queue in queues:
        queue.close()
    print(
        f"\nmover of slot {frozen} killed in copy, then its owner killed -9: the other "
        f"{len(others)} slots delivering again {gap_s:.2f} s after the kill (bound "
        f"{FAILOVER_BOUND_S:.0f} s); move ended by the survivor; {len(fleet.scheduled)} "
        f"messages, lost 0, early 0, {fleet.duplicates()} duplicates"
    )
    assert gap_s <= FAILOVER_BOUND_S
