"""Three delay-service processes under a continuous load: kill -9 and graceful SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio

from delayq.local.waiting import eventually
from delayq.queue.client import AsyncQueue

from .conftest import ACK_TIMEOUT_MS, SESSION_TIMEOUT_S, SLOTS, ProcessFleet

POLL_S = 0.02  # each check reads the owner nodes from ZooKeeper

MEMBERS = ("fleet-0", "fleet-1", "fleet-2")
VICTIM = "fleet-1"
pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def running(fleet: ProcessFleet, client: redis.asyncio.Redis) -> AsyncIterator[asyncio.Event]:
    """Start the fleet and a steady producer; on exit stop producing and wait until every
    scheduled message has been delivered (leases of a killed process expire first)."""
    for member in MEMBERS:
        fleet.start(member)
    owners: dict[int, str] = {}

    def all_owned() -> bool:
        owners.update(fleet.owners())
        return len(owners) == SLOTS and set(owners.values()) == set(MEMBERS)

    await eventually(all_owned, 60.0, "three processes owning every slot", interval_s=POLL_S)
    stop = asyncio.Event()
    producer = asyncio.create_task(fleet.produce(AsyncQueue(client, fleet.topic), stop))
    try:
        await wait_for_deliveries(fleet, client, lambda: len(fleet.deliveries) >= 200, "flow")
        yield stop
    finally:
        stop.set()
        await producer
    try:
        await wait_for_deliveries(
            fleet, client, lambda: not fleet.missing(), "every message", ACK_TIMEOUT_MS / 1000 + 20
        )
    except TimeoutError:
        by_slot = Counter(fleet.topic.slot_of(message_id) for message_id in fleet.missing())
        print(f"undelivered by slot: {dict(by_slot)}; owners now: {fleet.owners()}")
        raise


async def wait_for_deliveries(
    fleet: ProcessFleet,
    client: redis.asyncio.Redis,
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 20.0,
) -> None:
    async def read_then_check() -> bool:
        await fleet.read_deliveries(client)
        return condition()

    await eventually(read_then_check, timeout_s, what, interval_s=0.05)


async def slots_of(fleet: ProcessFleet, member: str) -> set[int]:
    return {slot for slot, m in (await asyncio.to_thread(fleet.owners)).items() if m == member}


def moved_away(fleet: ProcessFleet, slots: set[int], member: str) -> Callable[[], bool]:
    """Condition: every one of `slots` has an owner node held by someone else than `member`."""

    def check() -> bool:
        owners = fleet.owners()
        return all(owners.get(slot) not in (None, member) for slot in slots)

    return check


async def server_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_kill_9_fails_over_within_session_timeout_and_loses_nothing(
    process_fleet: ProcessFleet, async_redis_client: redis.asyncio.Redis
) -> None:
    fleet, client = process_fleet, async_redis_client
    async with running(fleet, client) as stop:
        victim_slots = await slots_of(fleet, VICTIM)
        assert victim_slots
        killed_ms = await server_ms(client)
        fleet.processes[VICTIM].kill()
        killed_at = time.monotonic()
        await eventually(
            moved_away(fleet, victim_slots, VICTIM),
            SESSION_TIMEOUT_S + 10,
            "slots moved",
            interval_s=POLL_S,
        )
        owned_s = time.monotonic() - killed_at
        first: dict[int, int] = {}

        def delivering() -> bool:
            for delivery in fleet.deliveries:
                slot = fleet.topic.slot_of(delivery.message_id)
                if slot in victim_slots and delivery.at_ms > killed_ms and slot not in first:
                    first[slot] = delivery.at_ms
            return set(first) == victim_slots

        await wait_for_deliveries(fleet, client, delivering, "the moved slots delivering")
        stop.set()
    gap_s = (max(first.values()) - killed_ms) / 1000
    print(
        f"\nkill -9 of {VICTIM} ({len(victim_slots)} of {SLOTS} slots, session timeout "
        f"{SESSION_TIMEOUT_S:.0f} s): slots owned again after {owned_s:.2f} s, every moved "
        f"slot delivering again after {gap_s:.2f} s; {len(fleet.scheduled)} messages, "
        f"0 lost, {fleet.redeliveries()} redeliveries (leases of the killed process)"
    )
    assert owned_s <= SESSION_TIMEOUT_S + 2
    assert gap_s <= SESSION_TIMEOUT_S + 2
    assert not fleet.missing()


async def test_sigterm_hands_slots_over_without_redeliveries(
    process_fleet: ProcessFleet, async_redis_client: redis.asyncio.Redis
) -> None:
    fleet, client = process_fleet, async_redis_client
    async with running(fleet, client) as stop:
        victim_slots = await slots_of(fleet, VICTIM)
        started = time.monotonic()
        fleet.processes[VICTIM].terminate()
        assert await asyncio.to_thread(fleet.processes[VICTIM].wait, 20.0) == 0
        await eventually(
            moved_away(fleet, victim_slots, VICTIM), 10.0, "slots moved", interval_s=POLL_S
        )
        handoff_s = time.monotonic() - started
        delivered = len(fleet.deliveries)
        await wait_for_deliveries(
            fleet, client, lambda: len(fleet.deliveries) > delivered + 400, "flow after handoff"
        )
        stop.set()
    print(
        f"\nSIGTERM of {VICTIM}: exit and handoff of {len(victim_slots)} slots in "
        f"{handoff_s:.2f} s; {len(fleet.scheduled)} messages, {fleet.redeliveries()} "
        f"redeliveries, {fleet.duplicates()} duplicates"
    )
    assert handoff_s < SESSION_TIMEOUT_S  # released, not expired
    assert fleet.redeliveries() == 0
    assert fleet.duplicates() == 0
    assert not fleet.missing()


async def test_a_fourth_process_joining_takes_its_share_without_loss(
    process_fleet: ProcessFleet, async_redis_client: redis.asyncio.Redis
) -> None:
    fleet, client = process_fleet, async_redis_client
    async with running(fleet, client) as stop:
        started = time.monotonic()
        fleet.start("fleet-3")

        def balanced() -> bool:
            counts = Counter(fleet.owners().values())
            return len(counts) == 4 and sorted(counts.values()) == [4, 4, 4, 4]

        await eventually(balanced, 30.0, "four processes with four slots each", interval_s=POLL_S)
        rebalance_s = time.monotonic() - started
        delivered = len(fleet.deliveries)
        await wait_for_deliveries(
            fleet, client, lambda: len(fleet.deliveries) > delivered + 400, "flow after join"
        )
        stop.set()
    print(
        f"\nfourth process joined: 4 x 4 slots after {rebalance_s:.2f} s (process start "
        f"included); {len(fleet.scheduled)} messages, {fleet.redeliveries()} redeliveries "
        "(leases in flight on the slots that moved)"
    )
    assert not fleet.missing()
