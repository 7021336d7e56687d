"""Session expiry of a live member, and an outage of ZooKeeper itself."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from delayq.local.zookeeper_server import ZooKeeperServer

from .conftest import SLOTS, TEST_SESSION_TIMEOUT_S, Fleet, eventually, expire_session


async def test_expired_member_stops_at_once_and_the_others_take_its_slots(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    for name in ("a", "b", "c"):
        await fleet.join(name)
    await fleet.settle()
    victim = fleet.members["b"]
    lost = victim.owned
    assert lost

    expired_at = time.monotonic()
    await asyncio.to_thread(expire_session, zookeeper_server.hosts, victim)
    await eventually(
        lambda: (fleet.timeline.last_empty("b") or 0) > expired_at, 5.0, "b to stop claiming"
    )
    stopped_ms = ((fleet.timeline.last_empty("b") or 0) - expired_at) * 1000
    print(f"\nexpired member stopped claiming {stopped_ms:.0f} ms after the expiry began")
    # its slots move to the survivors; nobody shares a slot at any instant before b stopped
    await eventually(
        lambda: lost <= fleet.members["a"].owned | fleet.members["c"].owned, 10.0, "takeover"
    )
    stopped = fleet.timeline.last_empty("b")
    assert stopped is not None
    assert not [o for o in fleet.timeline.overlaps if o[0] < stopped]
    # b comes back with a new session, registers again, and the fleet rebalances
    await fleet.settle()
    assert fleet.sizes() == [5, 5, 6]
    assert victim.owned


@pytest.fixture
def private_zookeeper() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test alone: restarting the shared one would disturb nothing, but
    keeping outages private makes failures here impossible to blame on other tests."""
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


async def test_fleet_recovers_after_zookeeper_restart(private_zookeeper: ZooKeeperServer) -> None:
    fleet = Fleet(private_zookeeper.hosts, f"t-{uuid.uuid4().hex[:10]}")
    try:
        for name in ("a", "b", "c"):
            await fleet.join(name)
        await fleet.settle()

        await asyncio.to_thread(private_zookeeper.stop, True)
        # without ZooKeeper nobody may keep claiming: every member drops everything
        await eventually(
            lambda: not any(fleet.owned().values()), TEST_SESSION_TIMEOUT_S + 2, "all stopped"
        )
        assert not any(member.ready for member in fleet.members.values())

        await asyncio.to_thread(private_zookeeper.start)
        recovered_s = await fleet.settle(timeout_s=30.0)
        print(f"\nfleet owned all {SLOTS} slots again {recovered_s:.2f} s after the restart")
        assert fleet.sizes() == [5, 5, 6]
        assert fleet.timeline.overlaps == []
    finally:
        await fleet.close()
