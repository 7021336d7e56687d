"""Session expiry of a live member, and an outage of ZooKeeper itself."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from delayq.coordination.ownership import SESSION_STATES
from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.service.metrics import ServiceMetrics

from .conftest import SLOTS, TEST_SESSION_TIMEOUT_S, Fleet, expire_session
from .proxy import FreezableProxy


@pytest.mark.parametrize("victim_id", ["b", "a"], ids=["member", "coordinator"])
async def test_expired_member_stops_at_once_and_the_others_take_its_slots(
    fleet: Fleet, zookeeper_server: ZooKeeperServer, victim_id: str
) -> None:
    for name in ("a", "b", "c"):
        await fleet.join(name)
    await fleet.settle()
    victim = fleet.members[victim_id]
    others = [fleet.members[name] for name in ("a", "b", "c") if name != victim_id]
    lost = victim.owned
    assert lost

    expired_at = time.monotonic()
    await asyncio.to_thread(expire_session, zookeeper_server.hosts, victim._client)
    await eventually(
        lambda: (fleet.timeline.last_empty(victim_id) or 0) > expired_at, 5.0, "victim stopped"
    )
    stopped = fleet.timeline.last_empty(victim_id)
    assert stopped is not None
    print(
        f"\nexpired {victim_id} stopped claiming {(stopped - expired_at) * 1000:.0f} ms "
        "after the expiry began"
    )
    # its slots move to the survivors (a new coordinator computes that when the coordinator
    # was the victim); overlaps are possible only before the victim heard of its expiry,
    # which is what the fencing epoch in Redis covers
    await eventually(lambda: lost <= others[0].owned | others[1].owned, 10.0, "takeover")
    assert not [o for o in fleet.timeline.overlaps if o[0] > stopped]
    # the victim comes back with a new session, registers again, and the fleet rebalances
    await fleet.settle()
    assert fleet.sizes() == [5, 5, 6]
    assert victim.owned
    assert sum(member.is_coordinator for member in fleet.members.values()) == 1


async def test_partitioned_member_stops_before_anyone_else_starts(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    proxy = await FreezableProxy(zookeeper_server.port).start()
    try:
        await fleet.join("a")
        await fleet.join("b", hosts=proxy.hosts)  # b reaches ZooKeeper only through the proxy
        await fleet.join("c")
        await fleet.settle()
        lost = fleet.members["b"].owned
        partitioned_at = time.monotonic()
        proxy.freeze()
        await eventually(
            lambda: lost <= fleet.members["a"].owned | fleet.members["c"].owned,
            TEST_SESSION_TIMEOUT_S + 5,
            "takeover",
        )
        stopped = fleet.timeline.last_empty("b")
        assert stopped is not None
        assert stopped > partitioned_at
        taken = fleet.timeline.first_taken(lost, "b", partitioned_at)
        print(
            f"\npartition of b (session timeout {TEST_SESSION_TIMEOUT_S:.0f} s): b stopped "
            f"claiming after {stopped - partitioned_at:.2f} s, the others started after "
            f"{taken - partitioned_at:.2f} s"
        )
        assert stopped < taken  # b stopped on its own, before anyone else could start
        assert fleet.timeline.overlaps == []
        proxy.thaw()  # b learns its session expired, joins again with a new one
        await fleet.settle(timeout_s=30.0)
        assert fleet.sizes() == [5, 5, 6]
        assert fleet.timeline.overlaps == []
    finally:
        await fleet.close()
        await proxy.close()


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


async def test_a_revocation_that_fails_is_handed_over_again_and_the_session_is_exported(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """The service drops its slots on a session suspension and then fails (its Redis is down
    too); when the same session comes back with the same slots, they must be handed over again
    — an equal set compared with the one before the failed revocation hid them for good.
    `delayq_zookeeper_session_state` follows the session through it."""
    proxy = await FreezableProxy(zookeeper_server.port).start()
    consumed: set[int] = set()
    fail_revocation = True

    async def on_change(slots: frozenset[int]) -> None:
        nonlocal fail_revocation
        consumed.clear()
        consumed.update(slots)  # the service applied the change, then a Redis call failed
        if not slots and fail_revocation:
            fail_revocation = False
            raise ConnectionError("redis down while releasing")

    member = ZkOwnership(
        ZkSettings(
            hosts=proxy.hosts,
            namespace="tests",
            topic=f"revoke-{uuid.uuid4().hex[:8]}",
            slot_amount=SLOTS,
            member_id="only",
            session_timeout_s=TEST_SESSION_TIMEOUT_S,
        )
    )
    metrics = ServiceMetrics("tests", member.settings.topic)
    metrics.watch_session(member)

    def session_state() -> str:
        """The state `/metrics` exports as 1 (each of the others is 0)."""
        samples = [
            line for line in metrics.render().decode().splitlines()
            if line.startswith("delayq_zookeeper_session_state{")
        ]
        assert len(samples) == len(SESSION_STATES)
        [current] = [line for line in samples if line.endswith(" 1.0")]
        return current.split('state="', 1)[1].split('"', 1)[0]

    assert session_state() == "lost"  # no session yet
    try:
        await member.start(on_change)
        assert session_state() == "connected"
        await eventually(lambda: len(consumed) == SLOTS, 10.0, "every slot consumed")
        proxy.freeze()  # shorter than the session timeout: SUSPENDED, then the same session
        await eventually(lambda: not consumed, TEST_SESSION_TIMEOUT_S, "slots revoked")
        assert session_state() == "suspended"
        proxy.thaw()
        await eventually(lambda: len(consumed) == SLOTS, 10.0, "slots handed over again")
        await eventually(lambda: member.ready, 5.0, "ready again")
        assert session_state() == "connected"
    finally:
        await member.stop()
        await proxy.close()
    assert session_state() == "lost"


def test_an_owner_watch_fired_by_a_session_event_is_harmless() -> None:
    """kazoo fires every pending watch with `path=None` when the session is lost (seen in
    chaos runs as an AttributeError in its callback thread): it only wakes the pass."""
    from kazoo.protocol.states import EventType, KazooState, WatchedEvent

    member = ZkOwnership(ZkSettings(hosts="127.0.0.1:1", namespace="t", topic="t", slot_amount=1))
    member._on_owner_watch(WatchedEvent(EventType.NONE, KazooState.LOST, None))
