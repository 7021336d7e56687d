"""A doubling's splitter stopped before any step (or any slot of its copy), repeated after a
crash, killed in its copy or its freeze, or rolled back: the next run completes it or the slots
are left as they were; killed in its freeze, only the slot it was catching up refuses writes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from delayq.coordination import migration, splitting
from delayq.coordination.migration import MoveError, Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import Split, SplitLocked
from delayq.queue import SlotMovingError, consume_plans
from delayq.queue.keys import Part
from delayq.queue.model import State

from .splits import (
    NAMESPACE,
    ROUTING,
    SLOTS,
    Cluster,
    assert_split_exactly,
    basis_in,
    broker_queue,
    churn,
    doubled,
    fill,
    frozen_before,
    old_frozen,
    run_steps,
    snapshot,
)

# the copy of each of the 4 slots, its rounds, freeze (and catch-up), switch, clean
ALL_STEPS = 1 + SLOTS + 1 + 1 + 1


@pytest.mark.parametrize("steps_done", range(ALL_STEPS))
def test_a_splitter_stopped_before_any_step_is_completed_by_the_next_run(
    cluster: Cluster, steps_done: int
):
    fill(cluster)
    before = frozen_before(cluster)
    first = cluster.splitter()
    split, _ = run_steps(first, steps_done)
    first.zk.stop()  # killed: its lock goes with its session
    assert cluster.splitter().state() == split
    assert cluster.splitter().split(2 * SLOTS) == replace(
        split, step=Step.CLEAN, copied_slots=SLOTS
    )
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)


@pytest.mark.parametrize("steps_done", [1, 2, 1 + SLOTS, 2 + SLOTS])
def test_a_step_repeated_after_a_crash_before_its_record_changes_nothing(
    cluster: Cluster, steps_done: int
):
    """A crash between doing a step and recording what follows: the next run does it again
    (a slot's split deletes its halves first)."""
    fill(cluster)
    before = frozen_before(cluster)
    splitter = cluster.splitter()
    split, _ = run_steps(splitter, steps_done)
    stat = cluster.zk.set(cluster.paths.split, split.encode())
    splitter.step(split, stat.version)  # done, then "crashed": the record says it again
    stat = cluster.zk.set(cluster.paths.split, split.encode())
    assert splitter.split(2 * SLOTS) is not None
    assert_split_exactly(cluster, before)


@pytest.mark.parametrize("steps_done", range(ALL_STEPS - 2))
def test_a_doubling_rolled_back_before_its_switch_leaves_the_slots_as_they_were(
    cluster: Cluster, steps_done: int
):
    fill(cluster)
    before = {slot: snapshot(cluster, cluster.topic, slot) for slot in cluster.topic.slots}
    splitter = cluster.splitter()
    run_steps(splitter, steps_done)
    splitter.zk.stop()
    assert cluster.splitter().abort().to_amount == 2 * SLOTS
    for slot in cluster.topic.slots:
        assert snapshot(cluster, cluster.topic, slot) == before[slot]
    for admin in cluster.admins:
        assert admin.keys(f"dq:{{{NAMESPACE}/{cluster.topic.name}/g1/*") == []
    assert cluster.routing() == Routing(SLOTS, 2, ROUTING)
    assert not cluster.zk.exists(cluster.paths.split)
    for slot in cluster.topic.slots:  # takes writes again
        broker_queue(cluster, slot).schedule(
            "after", b"p", delay_ms=0, slot_basis=basis_in(cluster.topic, slot)
        )


@pytest.mark.parametrize("steps_done", [1, SLOTS // 2, SLOTS, SLOTS + 1])
def test_a_splitter_killed_in_its_copy_leaves_every_old_slot_taking_writes_and_delivering(
    cluster: Cluster, steps_done: int
):
    """Killed after 1, 2 or 4 slots copied, or after the copy's rounds: no old slot is frozen
    (the copy freezes none), each takes writes and delivers; the next run copies again what
    changed meanwhile, and every part of every slot ends up in its half exactly."""
    fill(cluster)
    first = cluster.splitter()
    split, _ = run_steps(first, steps_done)
    first.zk.stop()  # killed: its lock goes with its session
    assert split.step is (Step.COPY if steps_done <= SLOTS else Step.FREEZE)
    assert old_frozen(cluster) == []
    churn(cluster, "k")
    before = frozen_before(cluster)
    assert cluster.splitter().split(2 * SLOTS) is not None
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)


class Killed(Exception):
    """The splitter dies here (its session is then stopped: its lock goes)."""


@pytest.mark.parametrize("record", ["kept", "lost"])
def test_a_splitter_killed_in_its_freeze_leaves_one_slot_refusing_writes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, record: str
):
    """Killed while it catches up old slot 1, slot 0 listed: only the slot it was catching up
    refuses a routed write; the others' writes go to their halves (slot 0) or their old slots
    (2 and 3, not frozen yet) at once (before: a batch of up to 4 slots of a broker refused
    them, and before that every old slot, until the doubling was completed). The rerun
    completes it exactly, without catching up a switched slot again: what was written into
    its halves meanwhile stays. Also when the `split` node
    was lost (ZooKeeper's data lost, the routing published again from status.routing with its
    doubledSlots): the rerun records it again at `freeze` (before: it started a new doubling,
    whose copy replaced the switched slots' halves with their frozen old slots)."""
    fill(cluster)
    first = cluster.splitter()
    split, version = run_steps(first, SLOTS + 1)
    assert split.step is Step.FREEZE
    churn(cluster, "k")  # after the rounds: only the catch-up copies these
    before = frozen_before(cluster)
    thaws: list[object] = []
    thaw = migration.thaw_replicated

    def dies_at_its_second_thaw(*args: Any) -> None:
        thaws.append(args)
        if len(thaws) == 2:
            raise Killed
        thaw(*args)

    monkeypatch.setattr(splitting, "thaw_replicated", dies_at_its_second_thaw)
    with pytest.raises(Killed):
        first.step(split, version)
    first.zk.stop()  # killed
    monkeypatch.undo()
    user, password = f"{NAMESPACE}.{cluster.topic.name}", "engine-secret"
    urls = [server.url for server in cluster.servers]
    client = RoutedQueue.connect(
        urls,
        cluster.topic,
        zookeeper=ZkConnection(cluster.hosts),
        move_wait_ms=300,
        username=user,
        password=password,
    )
    written: list[tuple[int, str, str]] = []
    refused: list[int] = []
    try:
        for slot in cluster.topic.slots:
            message_id = f"after-kill-{slot}"
            basis = basis_in(cluster.topic, slot)
            try:
                client.schedule(message_id, b"a", delay_ms=600_000, slot_basis=basis)
                written.append((slot, message_id, basis))
            except SlotMovingError:
                refused.append(slot)
    finally:
        client.close()
    assert refused == [1]
    if record == "lost":
        cluster.zk.delete(cluster.paths.split)
    with pytest.raises(MoveError, match=r"slots \[0\] are switched .* finish the doubling"):
        cluster.splitter().abort()  # their halves take writes: never dropped
    assert cluster.splitter().split(2 * SLOTS) is not None
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, {1: before[1]})  # 2 and 3 took writes since: below
    new = doubled(cluster.topic)
    for slot, message_id, basis in written:
        found = cluster.login(ROUTING[slot], new).get(message_id, basis)
        assert found.state is State.SCHEDULED
    for slot in (0,):  # switched before the kill: every message of the old slot, in a half
        halves = [snapshot(cluster, new, half) for half in (slot, slot + SLOTS)]
        stored = {m for half in halves for m in half.get(Part.STORE, {})}
        assert set(before[slot].get(Part.STORE, {})) <= stored


def test_resume_frozen_completes_only_a_stopped_doubling_whose_freeze_began(cluster: Cluster):
    """What the frozen slots' owners run (service/stopped_moves.py): no doubling started, none
    taken from a splitter holding the lock, none still copying (it freezes nothing); one whose
    splitter stopped in its freeze (half the old slots frozen) completed exactly."""
    fill(cluster)
    assert cluster.splitter().resume_frozen() is None
    assert not cluster.zk.exists(cluster.paths.split)
    first = cluster.splitter()
    run_steps(first, 1)  # one slot copied, the lock held
    with pytest.raises(SplitLocked):
        cluster.splitter().resume_frozen()
    first.zk.stop()  # killed in its copy
    assert cluster.splitter().resume_frozen() is None
    assert cluster.splitter().state() == Split(SLOTS, 0, ROUTING, Step.COPY, 1)
    second = cluster.splitter()
    split, _ = run_steps(second, SLOTS)  # the other slots copied, the rounds
    assert split.step is Step.FREEZE
    churn(cluster, "r")  # after the rounds: only the catch-up copies these
    before = frozen_before(cluster)
    old, _ = second._topics(split)
    for slot in range(SLOTS // 2):
        second.queues[split.brokers[slot]].run(consume_plans.freeze(old, slot))
    second.zk.stop()  # killed in its freeze
    assert old_frozen(cluster) == list(range(SLOTS // 2))
    assert cluster.splitter().resume_frozen() == replace(split, step=Step.CLEAN)
    assert cluster.routing() == Routing(2 * SLOTS, 2, ROUTING + ROUTING, 1)
    assert_split_exactly(cluster, before)
    assert cluster.splitter().resume_frozen() is None


@pytest.mark.parametrize(
    ("recorded", "resumed"),
    [
        ((Step.FREEZE, 0), (Step.COPY, 0)),
        ((Step.COPY, 3), (Step.COPY, 0)),  # frozen first, then copied: copied again, tracked
        ((Step.SWITCH, 4), (Step.SWITCH, 4)),
        ((Step.CLEAN, 4), (Step.CLEAN, 4)),
    ],
)
def test_a_node_of_the_freeze_first_format_is_resumed_in_the_copy_first_order(
    recorded: tuple[Step, int], resumed: tuple[Step, int]
):
    old = Split(SLOTS, 0, ROUTING, *recorded)
    document = json.loads(old.encode()) | {"version": 1}
    split = Split.decode(json.dumps(document).encode())
    assert (split.step, split.copied_slots) == resumed
    assert json.loads(split.encode())["version"] == 2


def test_a_switched_doubling_cannot_be_rolled_back(cluster: Cluster):
    splitter = cluster.splitter()
    run_steps(splitter, ALL_STEPS - 1)  # switched, the clean next
    with pytest.raises(MoveError, match="the routing has 8 slots already: finish the doubling"):
        splitter.abort()
    assert splitter.split(2 * SLOTS) is not None
    assert splitter.split(2 * SLOTS) is None  # nothing left to do
    with pytest.raises(MoveError, match="no doubling is under way"):
        splitter.abort()
