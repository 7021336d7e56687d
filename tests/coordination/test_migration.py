"""Moving one slot between two real redis-servers, recorded in a real ZooKeeper
(`delayq.coordination.migration`, `delayq routing`): what is copied, what is refused meanwhile,
and a mover that stops after any step is completed (or rolled back) by the next run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import redis

from delayq.cli import main
from delayq.coordination.locks import NodeLock
from delayq.coordination.migration import Migration, MoveError, SlotLocked, SlotMover, Step
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import (
    Queue,
    Recurrence,
    Schedule,
    SlotMovingError,
    StaleEpochError,
    Topic,
    reply_cap,
    slot_copy,
)
from delayq.queue.keys import Part, slot_keys

from .brokers import TwoBrokers, two_brokers
from .conftest import expire_session, traced_peak

NAMESPACE = "moves"
SLOTS = 4
BASIS = "k"  # every message of these tests goes into one slot


@dataclass
class Topology(TwoBrokers):
    @property
    def slot(self) -> int:
        return self.topic.slot_of(BASIS.encode())

    def mover(self) -> SlotMover:
        """A mover of its own (its own ZooKeeper session), as a fresh run of the command."""
        return SlotMover(self.session(), self.paths, self.queues)

    def unlocked(self) -> bool:
        """No mover holds the slot's lock (a killed one's went with its session)."""
        return not self.zk.exists(self.paths.mover(self.slot))


@pytest.fixture
def topology(
    redis_server: RedisServer, second_broker: RedisServer, zookeeper_server: ZooKeeperServer
) -> Iterator[Topology]:
    servers = (redis_server, second_broker)
    with two_brokers(Topology, servers, zookeeper_server, NAMESPACE, "m", (0,) * SLOTS) as built:
        yield built


def snapshot(client: redis.Redis, topic: Topic, slot: int) -> dict[str, Any]:
    """Every key of the slot, read back by type (DUMP bytes may differ in encoding)."""
    keys = slot_keys(topic, slot)
    found: dict[str, Any] = {}
    for part in Part:
        name = keys.key(part)
        kind = str(client.type(name), "ascii")  # type: ignore[arg-type]
        if kind == "zset":
            found[part] = client.zrange(name, 0, -1, withscores=True)
        elif kind == "hash":
            found[part] = client.hgetall(name)
        elif kind == "string":
            found[part] = client.get(name)
        elif kind == "list":
            found[part] = client.lrange(name, 0, -1)
        elif kind == "stream":
            found[part] = client.xrange(name)
    return found


def fill(queue: Queue, slot: int) -> Any:
    """A slot with something in every part: scheduled, leased, dead, acked (outcome), a
    recurring schedule, the journal; returns the lease still held."""
    for i in range(6):
        queue.schedule(f"m{i}", b"p", delay_ms=0 if i < 4 else 60_000, slot_basis=BASIS)
    queue.put_schedule(Schedule(BASIS, Recurrence(every_ms=60_000), payload="s"))
    epoch = queue.take_over(slot)
    leased = list(queue.claim(slot, epoch, max_count=3, ack_timeout_ms=60_000).messages)
    queue.ack(leased[0].lease)
    queue.nack(leased[1].lease, dead=True, reason="broken")
    return leased[2]


def test_a_move_copies_every_key_switches_routing_and_leaves_a_tombstone(topology: Topology):
    source, target = topology.queues
    slot = topology.slot
    held = fill(source, slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    assert set(before) >= {Part.STORE, Part.PREPARE, Part.DEAD, Part.MSG, Part.OUTCOME}
    assert {Part.JOURNAL, Part.SCHEDULES, Part.EPOCH, Part.LEASES, Part.BASIS} <= set(before)

    done = topology.mover().move(slot, 1)

    assert done == Migration(slot, 0, 1, Step.CLEAN)
    assert topology.routing().broker_of_slot[slot] == 1
    assert snapshot(topology.admins[1], topology.topic, slot) == before
    left = snapshot(topology.admins[0], topology.topic, slot)
    assert left == {Part.EPOCH: b"moving:" + before[Part.EPOCH]}  # the tombstone only
    with pytest.raises(SlotMovingError):
        source.schedule("late", b"p", delay_ms=0, slot_basis=BASIS)
    assert not topology.zk.get_children(topology.paths.migrations)
    # the new owner fences above every epoch of the old one, whose lease is stale now
    assert target.take_over(slot) > held.epoch
    with pytest.raises(StaleEpochError):
        target.ack(held.lease)
    assert target.get("m5", slot_basis=BASIS).state.value == "scheduled"


def test_a_frozen_slot_refuses_every_write_and_read_by_id_with_slot_moving(topology: Topology):
    source, _ = topology.queues
    slot = topology.slot
    held = fill(source, slot)
    mover = topology.mover()
    migration, version = mover.start(slot, 1)
    mover.step(migration, version)  # freeze
    refused = [
        lambda: source.schedule("new", b"p", delay_ms=0, slot_basis=BASIS),
        lambda: source.cancel("m5", BASIS),
        lambda: source.reschedule("m5", delay_ms=1000, slot_basis=BASIS),
        lambda: source.redrive(slot, ["m1"]),
        lambda: source.purge(slot, ["m1"]),
        lambda: source.put_schedule(Schedule(BASIS, Recurrence(every_ms=1000))),
        lambda: source.delete_schedule(BASIS),
        lambda: source.take_over(slot),
        lambda: source.get("m5", BASIS),  # the source is emptied after the move
    ]
    for write in refused:
        with pytest.raises(SlotMovingError, match=r"^SLOT_MOVING"):
            write()
    with pytest.raises(StaleEpochError):  # the old owner is fenced out
        source.ack(held.lease)
    with pytest.raises(StaleEpochError):
        source.claim(slot, held.epoch)


@pytest.mark.parametrize("steps_done", range(len(Step)))
def test_a_mover_stopped_after_any_step_is_completed_by_the_next_run(
    topology: Topology, steps_done: int
):
    source = topology.queues[0]
    slot = topology.slot
    fill(source, slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    first = topology.mover()
    current: tuple[Migration, int] | None = first.start(slot, 1)
    for _ in range(steps_done):
        assert current is not None
        current = first.step(*current)
    assert current is not None
    first.zk.stop()  # the first mover is gone (killed): its lock with its session
    assert topology.mover().migrations() == [current[0]]
    assert topology.mover().move(slot, 1).step is Step.CLEAN
    assert topology.routing().broker_of_slot[slot] == 1
    assert snapshot(topology.admins[1], topology.topic, slot) == before
    assert list(snapshot(topology.admins[0], topology.topic, slot)) == [Part.EPOCH]


@pytest.mark.parametrize("steps_done", range(1, 4))
def test_a_step_repeated_after_a_crash_before_its_record_changes_nothing(
    topology: Topology, steps_done: int
):
    """A crash between doing a step and recording the next: the next run does it again."""
    source = topology.queues[0]
    slot = topology.slot
    fill(source, slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    mover = topology.mover()
    current: tuple[Migration, int] | None = mover.start(slot, 1)
    for _ in range(steps_done):
        assert current is not None
        migration, version = current
        mover.step(migration, version)  # done, then "crashed": re-record the step it did
        stat = topology.zk.set(topology.paths.migration(slot), migration.encode())
        current = mover.step(migration, stat.version)
    assert mover.move(slot, 1).step is Step.CLEAN
    assert snapshot(topology.admins[1], topology.topic, slot) == before


@pytest.mark.parametrize("steps_done", range(3))
def test_a_move_rolled_back_before_its_switch_leaves_the_slot_as_it_was(
    topology: Topology, steps_done: int
):
    source = topology.queues[0]
    slot = topology.slot
    fill(source, slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    mover = topology.mover()
    current: tuple[Migration, int] | None = mover.start(slot, 1)
    for _ in range(steps_done):
        assert current is not None
        current = mover.step(*current)
    mover.zk.stop()  # gone, with its lock
    topology.mover().abort(slot)
    assert snapshot(topology.admins[0], topology.topic, slot) == before
    assert snapshot(topology.admins[1], topology.topic, slot) == {}
    assert topology.routing().broker_of_slot[slot] == 0
    assert not topology.zk.get_children(topology.paths.migrations)
    source.schedule("after", b"p", delay_ms=0, slot_basis=BASIS)  # takes writes again


def test_a_switched_move_cannot_be_rolled_back_and_a_second_target_is_refused(
    topology: Topology,
):
    slot = topology.slot
    mover = topology.mover()
    current: tuple[Migration, int] | None = mover.start(slot, 1)
    for _ in range(3):
        assert current is not None
        current = mover.step(*current)
    with pytest.raises(MoveError, match="routed to broker 1 already: finish the move"):
        mover.abort(slot)
    with pytest.raises(MoveError, match="moving to broker 1 already"):
        mover.start(slot, 0)
    mover.move(slot, 1)
    mover.move(slot, 0)  # and back: the tombstone is replaced by the copy
    assert topology.routing().broker_of_slot[slot] == 0


def test_a_second_mover_cannot_start_or_abort_while_the_first_holds_the_slot(
    topology: Topology, capsys: pytest.CaptureFixture[str]
):
    """Compare-and-set on `migrations/<slot>` stops a second mover only after its Redis work;
    the slot's lock refuses it before any, here a second process and the CLI."""
    slot = topology.slot
    fill(topology.queues[0], slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    first = topology.mover()
    current = first.step(*first.start(slot, 1))  # frozen, the copy next
    assert current is not None
    second = topology.mover()
    for attempt in (lambda: second.move(slot, 1), lambda: second.abort(slot)):
        with pytest.raises(SlotLocked, match=rf"slot {slot} is being moved by .*-{os.getpid()}/"):
            attempt()
    assert snapshot(topology.admins[1], topology.topic, slot) == {}  # no copy, no delete
    for extra in ((), ("--abort",)):
        argv = topology.routing_argv("move-slot", "--slot", str(slot), "--to-broker", "1", *extra)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"delayq routing move-slot: slot {slot} is being moved by ")
        assert err.count("\n") == 1
    assert second.locked() == {slot}
    assert first.move(slot, 1).step is Step.CLEAN  # the holder goes on, then lets go
    assert second.locked() == frozenset()
    assert snapshot(topology.admins[1], topology.topic, slot) == before
    second.move(slot, 0)  # the slot is free again


def test_a_mover_whose_session_expired_stops_before_its_next_redis_write(topology: Topology):
    """The first mover's session expires after its freeze (its lock goes with it); a second
    mover takes the slot and completes the move; the first's late copy must not land on the
    target, which now takes the slot's writes."""
    slot = topology.slot
    fill(topology.queues[0], slot)
    first = topology.mover()
    current = first.step(*first.start(slot, 1))  # frozen, the copy next
    assert current is not None
    expire_session(topology.hosts, first.zk)
    wait_until(topology.unlocked, 10.0, "the expired lock gone")
    assert topology.mover().move(slot, 1).step is Step.CLEAN
    topology.queues[1].schedule("after-switch", b"p", delay_ms=0, slot_basis=BASIS)
    moved = snapshot(topology.admins[1], topology.topic, slot)
    with pytest.raises(MoveError, match=r"lost the slot's lock|ZooKeeper connection"):
        first.step(*current)
    assert snapshot(topology.admins[1], topology.topic, slot) == moved  # not overwritten
    first.zk.stop()
    with pytest.raises(MoveError, match="ZooKeeper connection"):
        first.step(*current)


def test_a_lock_read_as_ours_is_read_again_after_the_interval_or_in_a_new_session(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
):
    """The copy checks its lock before every page, but reads the node at most every
    COPY_LOCK_READ_S (a read before each of ~100 pages made a moving slot's write pause
    ~1.4x): a node read as ours stays ours for the session timeout. In between the check is
    local, and a new session (the old one expired: its node is gone) makes it read at once;
    an interval past a quarter of the session timeout (10 s here) is not leaned on."""
    zk = topology.session()
    lock = NodeLock(zk, topology.paths.mover(topology.slot), "slot", "moved", "the slot's lock")
    lock.acquire()
    reads: list[str] = []
    read = zk.get

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(path)
        return read(path, *args, **kwargs)

    monkeypatch.setattr(zk, "get", counted)
    for _ in range(50):
        lock.check(reread_after_s=2.0)
    assert reads == []  # the create read it as ours
    lock.check()
    lock.check(reread_after_s=60.0)
    assert len(reads) == 2
    session = zk.client_id
    expire_session(topology.hosts, zk)
    wait_until(lambda: zk.connected and zk.client_id != session, 10.0, "a new session")
    with pytest.raises(MoveError, match="lost the slot's lock"):
        lock.check(reread_after_s=2.0)


def fill_pages(queue: Queue, slot: int, count: int) -> None:
    """`fill`, then `count` more messages waiting: every part of the slot longer than a page
    of 7 (its store, its records, kept as a hashtable past 128, its journal)."""
    fill(queue, slot)
    for i in range(count):
        queue.schedule(f"w{i:03d}", b"p" * 40, delay_ms=60_000 + i, slot_basis=BASIS)


def test_a_slot_longer_than_a_page_is_copied_page_by_page_checking_the_lock(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
):
    """The copier holds at most GROUP keys of BATCH entries: the operator moves slots in its
    leader, whose memory a tenant's slot must not size (it read the slot whole: a slot of a
    few hundred MB killed every leader in turn). With pages of 7 entries and 3 keys a round
    trip, every key is copied exactly, and the mover's lock is checked before every page (a
    mover that lost it stops at its next page, not after the whole copy)."""
    monkeypatch.setattr(slot_copy, "BATCH", 7)
    monkeypatch.setattr(slot_copy, "GROUP", 3)
    slot = topology.slot
    fill_pages(topology.queues[0], slot, 300)
    before = snapshot(topology.admins[0], topology.topic, slot)
    assert len(before[Part.STORE]) > 300
    assert len(before[Part.MSG]) > 300
    checks: list[int] = []
    check_lock = SlotMover._check_lock

    def counted(mover: SlotMover, checked: int, reread_after_s: float = 0.0) -> None:
        checks.append(checked)
        check_lock(mover, checked, reread_after_s)

    monkeypatch.setattr(SlotMover, "_check_lock", counted)
    topology.mover().move(slot, 1)
    assert snapshot(topology.admins[1], topology.topic, slot) == before
    assert len(checks) > 302 // 7  # at least a check a page of the store alone (2 before)


def test_a_copy_cut_short_is_done_again_by_the_next_run(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
):
    """A mover that loses its lock in the middle of a copy leaves part of the slot on the
    target, which nobody routes to; the next run copies again from the deletion on."""
    monkeypatch.setattr(slot_copy, "BATCH", 7)
    slot = topology.slot
    fill_pages(topology.queues[0], slot, 300)
    before = snapshot(topology.admins[0], topology.topic, slot)
    check_lock = SlotMover._check_lock
    checks: list[int] = []

    def lost_at_the_twentieth(mover: SlotMover, checked: int, reread_after_s: float = 0.0) -> None:
        checks.append(checked)
        if len(checks) == 20:
            raise MoveError("lost the slot's lock (test)")
        check_lock(mover, checked, reread_after_s)

    monkeypatch.setattr(SlotMover, "_check_lock", lost_at_the_twentieth)
    with pytest.raises(MoveError, match="lost the slot's lock"):
        topology.mover().move(slot, 1)
    partial = snapshot(topology.admins[1], topology.topic, slot)
    assert partial
    assert partial != before
    assert topology.routing().broker_of_slot[slot] == 0
    assert topology.mover().move(slot, 1).step is Step.CLEAN
    assert snapshot(topology.admins[1], topology.topic, slot) == before


def test_a_slot_of_large_messages_is_copied_without_a_page_of_them_in_memory(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
):
    """A count of entries bounds no bytes: a page of 2,000 records of 1 MiB payloads (the
    default maxPayloadBytes) is 2 GB in the operator, whose memory every tenant shares. Each
    read of the copy is capped in bytes: past PAGE_MAX_BYTES it is made again at half the
    entries, one entry past it alone. With 40 payloads of 256 KiB among small messages and
    pages of 64 KiB, the copy is exact and its peak is a few entries, not the 10 MB slot (it
    read the 40 in one page)."""
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 64 * 1024)
    queue = topology.queues[0]
    fill_pages(queue, topology.slot, 50)
    for i in range(40):
        queue.schedule(f"big{i:02d}", os.urandom(256 * 1024), delay_ms=60_000, slot_basis=BASIS)
    before = snapshot(topology.admins[0], topology.topic, topology.slot)
    with traced_peak() as peak:
        topology.mover().move(topology.slot, 1)
        held = peak()
    assert snapshot(topology.admins[1], topology.topic, topology.slot) == before
    assert held < 3 * 1024 * 1024, held


def test_an_entry_larger_than_any_message_stops_the_copy_unread(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
):
    """Whoever holds a broker's admin login (the topic's Secret) may write a field of any
    size into the slot's keys. The copy reads no entry past ENTRY_MAX_BYTES (the largest
    record delayq writes): the move stops at its copy, naming the key, without holding the
    entry, and nothing is routed to the target."""
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 64 * 1024)
    monkeypatch.setattr(reply_cap, "ENTRY_MAX_BYTES", 512 * 1024)
    fill(topology.queues[0], topology.slot)
    records = slot_keys(topology.topic, topology.slot).key(Part.MSG)
    topology.admins[0].hset(records, "planted", b"x" * 4 * 1024 * 1024)
    with traced_peak() as peak:
        with pytest.raises(redis.RedisError, match=f"{records}: one entry passes"):
            topology.mover().move(topology.slot, 1)
        held = peak()
    assert held < 2 * 1024 * 1024, held
    assert topology.routing().broker_of_slot[topology.slot] == 0


def test_the_copy_waits_for_the_targets_replicas_before_the_switch(topology: Topology):
    """A topic with syncReplicas 1: `clean` deletes the source after the switch, so the copy
    must be on a replica of the target first (a target master lost before replicating would
    lose the slot). With the replica stopped the step fails and stays recorded; once it runs
    again the move completes and the replica has the slot."""
    target = topology.servers[1]
    with RedisServer(extra_config={"replicaof": f"127.0.0.1 {target.port}"}) as replica:
        wait_until(
            lambda: topology.admins[1].info("replication")["connected_slaves"] == 1,
            10.0,
            "the target's replica attached",
        )
        topic = replace(topology.topic, redis_sync_replicas=1, redis_sync_timeout_ms=1000)
        user, password = f"{NAMESPACE}.{topic.name}", "engine-secret"
        queues = [
            Queue.from_url(server.url, topic, username=user, password=password)
            for server in topology.servers
        ]
        slot = topology.slot
        fill(topology.queues[0], slot)  # broker 0 has no replica
        before = snapshot(topology.admins[0], topology.topic, slot)
        mover = SlotMover(topology.mover().zk, topology.paths, queues)
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(MoveError, match="0 of 1 replicas of broker 1 confirmed its copy"):
                mover.move(slot, 1)
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert mover.migrations() == [Migration(slot, 0, 1, Step.COPY)]
        assert topology.routing().broker_of_slot[slot] == 0
        with redis.Redis.from_url(replica.url) as replica_admin:
            offset = topology.admins[1].info("replication")["master_repl_offset"]
            wait_until(
                lambda: replica_admin.info("replication")["slave_repl_offset"] >= offset,
                10.0,
                "the replica caught up",
            )
            assert mover.move(slot, 1).step is Step.CLEAN
            assert snapshot(replica_admin, topology.topic, slot) == before
        for queue in queues:
            queue.close()


def test_without_a_routing_node_the_first_routing_is_moved_from(topology: Topology):
    topology.zk.delete(topology.paths.routing)
    topology.mover().move(0, 1)
    assert topology.routing().broker_of_slot == (1, 0, 1, 1)  # first routing over 2 brokers


def test_the_cli_moves_shows_and_refuses_bad_input_in_one_line(
    topology: Topology, capsys: pytest.CaptureFixture[str]
):
    slot = topology.slot
    assert main(topology.routing_argv("move-slot", "--slot", str(slot), "--to-broker", "1")) == 0
    assert capsys.readouterr().out == f"slot {slot}: moved from broker 0 to broker 1\n"
    assert main(topology.routing_argv("show", "--json")) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["routing"]["slots"][slot] == 1
    assert shown["migrations"] == []
    assert main(topology.routing_argv("show")) == 0
    assert "broker 1: 1 slots" in capsys.readouterr().out
    for args, error in [
        (("--slot", "9", "--to-broker", "1"), "slot 9 is outside 0..3"),
        (("--slot", str(slot), "--to-broker", "1"), f"slot {slot} is on broker 1 already"),
        (("--slot", "0", "--to-broker", "5"), "broker 5 is outside 0..1"),
        (("--slot", "0", "--to-broker", "1", "--abort"), "slot 0 is not moving"),
    ]:
        assert main(topology.routing_argv("move-slot", *args)) == 2
        err = capsys.readouterr().err
        assert err == f"delayq routing move-slot: {error}\n"


def test_an_unreachable_zookeeper_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str]):
    """kazoo's start timeout is no KazooException: it ended in a traceback."""
    argv = ["routing", "show", "--topic", "t", "--slot-amount", "4", "--insecure-no-auth"]
    argv += ["--redis-url", "redis://127.0.0.1:1/0", "--zookeeper-connect", "127.0.0.1:1"]
    assert main([*argv, "--zookeeper-session-timeout-ms", "2000"]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("delayq routing show: KazooTimeoutError: ")


@pytest.mark.parametrize(
    ("stopped_broker", "step"),
    [(0, Step.FREEZE), (1, Step.COPY)],
    ids=["killed-in-freeze", "killed-in-copy"],
)
def test_the_mover_process_killed_9_in_a_step_is_completed_by_the_next_run(
    topology: Topology, stopped_broker: int, step: Step
):
    """The real command, SIGKILLed while a broker it waits on is stopped (SIGSTOP): the source
    in `freeze`, the target in `copy`; a second run of the same command completes the move."""
    slot = topology.slot
    fill(topology.queues[0], slot)
    before = snapshot(topology.admins[0], topology.topic, slot)
    server = topology.servers[stopped_broker].process
    assert server is not None
    argv = [
        *topology.routing_argv("move-slot", "--slot", str(slot), "--to-broker", "1"),
        "--zookeeper-session-timeout-ms",
        "2000",  # its lock outlives it by this much
    ]
    os.kill(server.pid, signal.SIGSTOP)
    try:
        mover = subprocess.Popen([sys.executable, "-m", "delayq.cli", *argv], env=os.environ)
        try:
            wait_until(
                lambda: topology.mover().migrations() == [Migration(slot, 0, 1, step)],
                30.0,
                f"the mover in step {step}",
                abort=lambda: f"mover exited {mover.returncode}" if mover.poll() else None,
            )
        finally:
            mover.kill()
            mover.wait()
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert topology.mover().migrations() == [Migration(slot, 0, 1, step)]
    assert topology.routing().broker_of_slot[slot] == 0
    wait_until(topology.unlocked, 10.0, "the killed mover's lock gone")
    assert main(argv) == 0
    assert topology.routing().broker_of_slot[slot] == 1
    assert snapshot(topology.admins[1], topology.topic, slot) == before
    assert not topology.mover().migrations()
