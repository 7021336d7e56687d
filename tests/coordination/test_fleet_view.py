"""`ZkOwnership.fleet`: every member's slots as the dashboard and `delayq slots` see them, read
from a real ZooKeeper."""

from __future__ import annotations

from delayq.coordination.ownership import FleetReader
from delayq.local.waiting import eventually

from .conftest import SLOTS, Fleet


async def test_fleet_names_every_holder_and_sees_a_departure(fleet: Fleet) -> None:
    for name in ("a", "b"):
        await fleet.join(name)
    await fleet.settle()
    reader = fleet.members["a"]
    assert isinstance(reader, FleetReader)
    view = await reader.fleet(range(SLOTS))
    assert view.members == ("a", "b")
    assert view.held == frozenset(range(SLOTS))
    owned = fleet.owned()
    assert view.holders == {slot: m for m, slots in owned.items() for slot in slots}
    assert dict(view.assigned) == dict(view.holders)
    counts_only = await reader.fleet()
    assert counts_only.holders == {}
    assert counts_only.held == view.held

    await fleet.leave("b")
    await fleet.settle()

    async def alone() -> bool:
        return (await reader.fleet()).members == ("a",)

    await eventually(alone, 10, "b's departure seen by the fleet view")
    final = await reader.fleet([0, SLOTS - 1])
    assert final.holders == {0: "a", SLOTS - 1: "a"}
