"""A takeover does not wait a lease for the previous owner's leases (issue 35, defect 2).

Two `delayq serve` processes deliver a webhook topic whose lease (30 s) is far longer than the
ZooKeeper session (4 s). The receiver hangs while one process claims a batch of messages of its
own slots; that process is then SIGSTOPped (past its session, shorter than the lease) or killed
with SIGKILL. Its slots move to the survivor after the session timeout, and the survivor's fence
rolls the stopped owner's leases back (fence-10), so every held message is delivered again
within session timeout + REDELIVER_BOUND_S of the fault, not after the lease. The rolled-back
lease counts as an attempt: the survivor sends attempt 2.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import redis.asyncio

from delayq.local.processes import ServeProcess
from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue
from delayq.queue.model import ScheduleRequest, State
from delayq.queue.topic import TopicType
from tests.chaos.receiver import SECRET, Behaviour, Receiver

from .conftest import SESSION_TIMEOUT_S, SLOTS, ProcessFleet

pytestmark = pytest.mark.slow
MEMBERS = ("lease-0", "lease-1")
VICTIM = "lease-1"
LEASE_MS = 30_000
WEBHOOK_TIMEOUT_MS = 10_000
HELD = 20  # messages the victim holds claimed when it stops
#: Past the session timeout: the survivor's pass (assignment, owner nodes, fence) and its claim,
#: with room for a loaded machine; far below the lease, which is what a message waited before.
REDELIVER_BOUND_S = 4.0


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    running = await Receiver().start()
    try:
        yield running
    finally:
        await running.stop()


def start_webhook_fleet(fleet: ProcessFleet, receiver: Receiver) -> None:
    for member in MEMBERS:
        config = replace(
            fleet.config(member),
            topic_type=TopicType.WEBHOOK,
            webhook_url=receiver.url,
            webhook_secret=SECRET,
            webhook_timeout_ms=WEBHOOK_TIMEOUT_MS,
            ack_timeout_ms=LEASE_MS,
        )
        fleet.processes[member] = ServeProcess(config, fleet.log_dir / f"{member}.log").start()


@pytest.mark.parametrize("fault", ["sigstop", "kill9"])
async def test_the_new_owner_redelivers_the_stopped_owners_leases_at_once(
    process_fleet: ProcessFleet,
    receiver: Receiver,
    async_redis_client: redis.asyncio.Redis,
    fault: str,
) -> None:
    fleet = process_fleet
    start_webhook_fleet(fleet, receiver)
    await eventually(
        lambda: len(fleet.owners()) == SLOTS and set(fleet.owners().values()) == set(MEMBERS),
        60.0,
        "both processes owning slots",
    )
    victim_slots = {slot for slot, member in fleet.owners().items() if member == VICTIM}
    ids: list[str] = []
    while len(ids) < HELD:
        candidate = uuid.uuid4().hex
        if fleet.topic.slot_of(candidate) in victim_slots:
            ids.append(candidate)
    queue = AsyncQueue(async_redis_client, fleet.topic)
    receiver.behaviour = Behaviour(slow_s=(2 * WEBHOOK_TIMEOUT_MS / 1000,) * 2)  # never answers
    due_ms = time.time() * 1000  # due at once (the body's dueMs is the rolled-back one)
    await queue.schedule_many([ScheduleRequest(i, b"x", delay_ms=0) for i in ids])

    async def all_claimed() -> bool:
        states = [(await queue.get(i)).state for i in ids]
        return all(state is State.PREPARED for state in states)

    await eventually(all_claimed, 20.0, "every message claimed by the victim")
    await eventually(
        lambda: any(a.member == VICTIM for a in receiver.arrivals), 10.0, "a POST in flight"
    )
    victim = fleet.processes[VICTIM]
    fault_ms = time.time() * 1000  # the receiver's clock
    if fault == "sigstop":
        os.kill(victim.pid, signal.SIGSTOP)
    else:
        victim.kill()
    receiver.behaviour = Behaviour()
    survivor = next(m for m in MEMBERS if m != VICTIM)
    try:

        def redelivered() -> dict[str, float]:
            again = {a.message_id: a for a in receiver.arrivals if a.member == survivor}
            return {i: again[i].at_ms - fault_ms for i in ids if i in again}

        try:
            await eventually(
                lambda: len(redelivered()) == HELD,
                SESSION_TIMEOUT_S + REDELIVER_BOUND_S,
                "the held messages delivered by the new owner",
            )
        except TimeoutError:
            print(f"redelivered {len(redelivered())} of {HELD} within the bound")
            raise
        again = [a for a in receiver.arrivals if a.member == survivor]
        attempts = {a.attempt for a in again}
        late_s = max(redelivered().values()) / 1000
        lateness_s = sorted((a.at_ms - due_ms) / 1000 for a in again)
        print(
            f"\n{fault} of the owner of {HELD} claimed messages (lease {LEASE_MS / 1000:.0f} s, "
            f"session {SESSION_TIMEOUT_S:.0f} s): all delivered by the new owner "
            f"{late_s:.2f} s after the fault, attempts {sorted(attempts)}; lateness p50 "
            f"{lateness_s[len(lateness_s) // 2]:.2f} s, max {lateness_s[-1]:.2f} s"
        )
        assert attempts == {2}  # the rolled-back lease counted as an attempt
    finally:
        if fault == "sigstop" and victim.running():
            os.kill(victim.pid, signal.SIGCONT)
