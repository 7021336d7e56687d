"""Membership, assignment and handoff on a real ZooKeeper with in-process members."""

from __future__ import annotations

import json
import time

from kazoo.client import KazooClient

from delayq.coordination.assignment import moved
from delayq.coordination.layout import AssignmentDocument, TopicPaths, encode_member
from delayq.coordination.routing import initial_routing
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import functions

from .conftest import SLOTS, Fleet


def read_tree(hosts: str, topic: str) -> tuple[AssignmentDocument, dict[int, str], list[str]]:
    paths = TopicPaths("tests", topic)
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        document = AssignmentDocument.decode(client.get(paths.assignment)[0])
        owners = {
            int(slot): client.get(paths.owner(int(slot)))[0].decode()
            for slot in client.get_children(paths.owners)
        }
        members = sorted(client.get_children(paths.members))
        return document, owners, members
    finally:
        client.stop()
        client.close()


async def test_three_members_share_every_slot_balanced(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    for name in ("a", "b", "c"):
        await fleet.join(name)
    await fleet.settle()
    assert fleet.sizes() == [5, 5, 6]
    document, owners, members = read_tree(zookeeper_server.hosts, fleet.topic)
    assert members == ["a", "b", "c"]
    assert owners == document.slots  # every owner node matches the assignment
    assert {m: fleet.members[m].owned for m in members} == {
        m: frozenset(s for s, o in owners.items() if o == m) for m in members
    }
    assert sum(member.is_coordinator for member in fleet.members.values()) == 1
    assert fleet.members["a"].is_coordinator  # the oldest member coordinates
    assert fleet.timeline.overlaps == []


async def test_join_and_leave_move_few_slots_and_never_share_one(fleet: Fleet) -> None:
    for name in ("a", "b", "c"):
        await fleet.join(name)
    await fleet.settle()
    before = {slot: m for m, slots in fleet.owned().items() for slot in slots}

    await fleet.join("d")
    await fleet.settle()
    assert fleet.sizes() == [4, 4, 4, 4]
    after_join = {slot: m for m, slots in fleet.owned().items() for slot in slots}
    assert len(moved(before, after_join, {"a", "b", "c"})) == 4  # only d's share moved

    await fleet.leave("a")  # the coordinator leaves: b takes over coordination
    await fleet.settle()
    assert fleet.sizes() == [5, 5, 6]
    after_leave = {slot: m for m, slots in fleet.owned().items() for slot in slots}
    assert moved(after_join, after_leave, {"b", "c", "d"}) == set()
    assert fleet.members["b"].is_coordinator
    assert fleet.timeline.overlaps == []


async def test_slots_stay_with_the_pod_of_their_broker(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    routing = initial_routing(SLOTS, 3)
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        client.create(TopicPaths("tests", fleet.topic).routing, routing.to_json(), makepath=True)
    finally:
        client.stop()
        client.close()
    # joined in an order unrelated to the brokers, so locality is not an accident of ids
    for name, broker in (("x", "broker-2"), ("y", "broker-0"), ("z", "broker-1")):
        await fleet.join(name, broker)
    await fleet.settle()
    home = {"y": 0, "z": 1, "x": 2}
    for name, slots in fleet.owned().items():
        assert slots == frozenset(routing.slots_of(home[name]))

    await fleet.leave("z")  # broker 1's pod dies: its slots spread over the others
    await fleet.settle()
    assert fleet.sizes() == [8, 8]
    await fleet.join("z2", "broker-1")  # its replacement gets exactly broker 1's slots back
    await fleet.settle()
    assert fleet.members["z2"].owned == frozenset(routing.slots_of(1))
    assert fleet.timeline.overlaps == []


async def test_member_data_and_assignment_document(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    await fleet.join("solo", "broker-0")
    await fleet.settle()
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        paths = TopicPaths("tests", fleet.topic)
        data, stat = client.get(paths.member("solo"))
        assert json.loads(data)["broker"] == "broker-0"
        # the library it calls: the operator deletes no library a live member names
        assert json.loads(data)["library"] == functions.library().name
        assert stat.ephemeralOwner != 0
        document = json.loads(client.get(paths.assignment)[0])
        assert document["members"] == ["solo"]
        assert document["slots"] == [0] * SLOTS
        assert client.get(paths.assignment)[1].ephemeralOwner == 0  # persistent
    finally:
        client.stop()
        client.close()
    await fleet.leave("solo")
    # a graceful leave deletes its owner and member nodes at once, not at session expiry
    _, owners, members = read_tree(zookeeper_server.hosts, fleet.topic)
    assert owners == {}
    assert members == []


async def test_a_member_at_fewer_slots_never_takes_a_slot_past_its_amount(fleet: Fleet) -> None:
    """Across a doubling the members restart on the new slots one by one (service.py): for a
    moment a coordinator at 2N assigns to a member still at N. That member must not take a
    slot it has no keys for (its engine refuses slot numbers past N): those wait for it to
    restart, and it still takes its share below N."""
    await fleet.join("new", slot_amount=2 * SLOTS)  # the oldest member: the coordinator
    old = await fleet.join("old")

    def considered() -> bool:  # both named in an assignment of the coordinator's 2N slots,
        # the other half of them assigned to "old"
        members = fleet.members.values()
        return all(m.ready for m in members) and len(fleet.members["new"].owned) == SLOTS

    await eventually(considered, 15.0, "both members assigned")
    assert fleet.members["new"].is_coordinator
    assert old.owned <= frozenset(range(SLOTS)), sorted(old.owned)
    assert all(slot < SLOTS for _, member, slots in fleet.timeline.events
               if member == "old" for slot in slots)


async def test_a_node_no_member_wrote_gets_no_slot(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    """Issue 27, attack 2: a chroot pointed into a victim's tree made the operator create a
    persistent `members/delayq`, which the coordinator counted: slots 4-7 of 8 went to it and
    nobody consumed them. Only ephemeral nodes holding a member's JSON are members."""
    await fleet.join("a")
    await fleet.settle()
    paths = TopicPaths("tests", fleet.topic)
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        # a member's payload, but persistent: no session of a member holds it
        client.create(paths.member("delayq"), encode_member("broker-0", 1, "pod", "delayq_1"))
        await fleet.join("b")
        await fleet.settle()  # a and b consume every slot: nothing went to the phantom
        document, owners, _ = read_tree(zookeeper_server.hosts, fleet.topic)
        assert document.members == frozenset({"a", "b"})
        assert set(owners.values()) == {"a", "b"}
        assert (await fleet.members["a"].fleet()).members == ("a", "b")
        assert fleet.sizes() == [SLOTS // 2, SLOTS // 2]
    finally:
        client.stop()
        client.close()


async def test_a_slot_moved_away_is_consumed_until_its_taker_asks_or_a_session_timeout(
    fleet: Fleet, zookeeper_server: ZooKeeperServer
) -> None:
    """A rebalance hands a slot over when its new assignee asks for it (`handoffs/<slot>`):
    until then its holder keeps consuming it, so a taker slow to run its pass (a process just
    back, a loaded machine) leaves no slot consumed by nobody. A taker that never asks (an
    older version, a stalled process) gets the slot released after a session timeout."""
    holder = await fleet.join("a")
    await fleet.settle()
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    try:
        # a member that never asks: it registers and nothing more
        paths = TopicPaths("tests", fleet.topic)
        payload = encode_member("", 1, "pod", functions.library().name)
        client.create(paths.member("mute"), payload, ephemeral=True)
        moved_at = time.monotonic()

        def assigned_away() -> bool:
            document = AssignmentDocument.decode(client.get(paths.assignment)[0])
            return "mute" in document.slots.values()

        await eventually(assigned_away, 10.0, "half the slots assigned to the mute member")
        assert holder.owned == frozenset(range(SLOTS))  # kept: nobody asked
        assert holder.ready
        await eventually(
            lambda: len(holder.owned) == SLOTS // 2,
            fleet.session_timeout_s + 5.0,
            "the unasked slots released after a session timeout",
        )
        assert time.monotonic() - moved_at >= fleet.session_timeout_s - 0.5
    finally:
        client.stop()
        client.close()
