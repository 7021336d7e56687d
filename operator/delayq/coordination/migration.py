"""Move one slot of a topic from its broker to another, live and resumable (docs/coordination.md,
"Moving a slot").

The move is a sequence of steps, each recorded in ZooKeeper (`migrations/<slot>`, JSON) before
the next one starts, and each idempotent, so a mover that crashes anywhere is completed by the
next run (`SlotMover.move` resumes the recorded step) or rolled back (`SlotMover.abort`, only
before the routing switched):

1. `freeze`: the slot's epoch on the source becomes 'moving:<epoch>' (freeze-1). The old owner is
   fenced out (its claims and acks are stale) and cannot fence again; every producing write is
   refused with SLOT_MOVING. Nothing changes in the slot on the source any more.
2. `copy`: every key of the slot is copied to the target, deleted there first, then written page
   by page (`queue.slot_copy`: the copier's memory stays bounded whatever the slot holds), the
   lock checked before each page; then the target's copy is thawed (its epoch a number again).
   Nobody routes to the target yet; a copy cut short is done again from the deletion on.
3. `switch`: the routing node names the target for the slot, written with compare-and-set on the
   node's version. The delay services watch that node; the slot's owner releases the slot on the
   source, fences it on the target (epoch above the old one) and claims from there.
4. `clean`: the source's keys are deleted but its frozen epoch, a tombstone that refuses a writer
   whose routing is stale, then the migration node.

Writes refused in between are retried by their callers against the new routing.

One process at a time works on a slot: `start` and `abort` take the slot's lock, the ephemeral
node `movers/<slot>` (its data names the holder, `<host>-<pid>/<random>`), and every step checks,
right before its Redis or routing write, that the node is still this mover's; a mover whose
ZooKeeper session was suspended or expired (the lock may be gone, or someone else's) stops
there with MoveError. Compare-and-set on `migrations/<slot>` alone would stop a second mover
only after its Redis work: a late copy could overwrite the target after the first switched it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.locks import LockHeld, NodeLock
from delayq.coordination.locks import MoveError as MoveError
from delayq.coordination.routing import Move, Routing, initial_routing
from delayq.queue import consume_plans, plans
from delayq.queue.client import Queue
from delayq.queue.codes import ReplicationTimeoutError
from delayq.queue.keys import slot_keys
from delayq.queue.slot_copy import MOVED_AWAY_PARTS, copy_slot, delete_slot
from delayq.queue.topic import Topic

MIGRATION_FORMAT_VERSION = 1
#: How often the copy reads the slot's lock node again while it writes page after page (the
#: connection and session are checked before every page, `NodeLock.check`): a read of
#: ZooKeeper before each of a 100,000-message slot's ~100 pages made its write pause ~1.4x.
COPY_LOCK_READ_S = 0.5

#: Called (in the mover's thread) right before a move's `switch` and before its `clean`: from
#: the switch on, the slot's messages are only where the new routing says, so a copy of the
#: routing kept outside ZooKeeper (the operator's status.routing) must name the target by then.
#: The target holds a complete copy already (the copy step is done). Raising stops the move
#: there, recorded; the next run calls it again.
BeforeSwitch = Callable[[Move], None]


class Step(enum.StrEnum):
    """The next thing a move (or a doubling, splitting.py) does; recorded before it is done, so
    a crash repeats it."""

    FREEZE = "freeze"
    COPY = "copy"
    SWITCH = "switch"
    CLEAN = "clean"

    @property
    def following(self) -> Step | None:
        steps = list(Step)
        index = steps.index(self)
        return steps[index + 1] if index + 1 < len(steps) else None


class SlotLocked(LockHeld):
    """Another process holds the slot's lock (`movers/<slot>`): it is moving or rolling back
    the slot now. Nothing was done; try again once it ended."""


@dataclass(frozen=True)
class Migration:
    """The `migrations/<slot>` node: which slot moves from which broker to which, and its step."""

    slot: int
    source: int
    target: int
    step: Step

    def encode(self) -> bytes:
        document = {
            "version": MIGRATION_FORMAT_VERSION,
            "slot": self.slot,
            "sourceBroker": self.source,
            "targetBroker": self.target,
            "step": self.step.value,
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Migration:
        document = json.loads(payload)
        if document.get("version") != MIGRATION_FORMAT_VERSION:
            raise ValueError(f"unknown migration format version {document.get('version')!r}")
        return cls(
            int(document["slot"]),
            int(document["sourceBroker"]),
            int(document["targetBroker"]),
            Step(document["step"]),
        )


def thaw_replicated(queue: Queue, topic: Topic, slots: Sequence[int], broker: int) -> None:
    """Thaw the copies of `slots` on `queue` (broker `broker`, one pipeline); on a topic with
    `redis_sync_replicas` that waits (WAIT, after the copy too: replication is ordered) until
    that many of the broker's replicas have them, else the step fails and is repeated: `clean`
    deletes the source after the switch, so a master lost before replicating would otherwise
    lose whole slots."""
    try:
        queue.run(plans.Plan([consume_plans.thaw(topic, slot).calls[0] for slot in slots], len))
    except ReplicationTimeoutError as error:
        named = f"slot {slots[0]}: " if len(slots) == 1 else f"slots {list(slots)}: "
        whose = "its" if len(slots) == 1 else "their"
        raise MoveError(
            f"{named}{error.confirmed} of {error.wanted} replicas of broker {broker} "
            f"confirmed {whose} copy within {topic.redis_sync_timeout_ms} ms; run again"
        ) from error


class SlotMover:
    """Moves slots of one topic; `queues[b]` is broker b's engine client (sync)."""

    def __init__(self, zk: KazooClient, paths: TopicPaths, queues: Sequence[Queue]) -> None:
        if not queues:
            raise ValueError("a topic needs at least one broker")
        self.zk = zk
        self.paths = paths
        self.queues = list(queues)
        self.topic = queues[0].topic
        self._locks: dict[int, NodeLock] = {}  # slot -> the lock this mover holds

    # reading -------------------------------------------------------------------------------

    def routing(self) -> tuple[Routing, int | None]:
        """The routing and its node's version (None: no node yet, the fleet then uses the
        first routing over this mover's brokers, which is what is returned)."""
        try:
            payload, stat = self.zk.get(self.paths.routing)
        except NoNodeError:
            return initial_routing(self.topic.slot_amount, len(self.queues)), None
        routing = Routing.from_json(payload)
        if (routing.slot_amount, routing.generation) != (
            self.topic.slot_amount,
            self.topic.slot_generation,
        ):
            raise MoveError(
                f"the routing is for {routing.slot_amount} slots (generation "
                f"{routing.generation}), the topic has {self.topic.slot_amount} (generation "
                f"{self.topic.slot_generation})"
            )
        return routing, stat.version

    def migrations(self) -> list[Migration]:
        """Every move under way (or left behind by a crashed mover), by slot."""
        try:
            children = self.zk.get_children(self.paths.migrations)
        except NoNodeError:
            return []
        found = [self._read(int(child)) for child in children if child.isdigit()]
        return sorted((m for m, _ in filter(None, found)), key=lambda m: m.slot)

    def locked(self) -> frozenset[int]:
        """The slots whose lock somebody holds now (a mover at work, this one included)."""
        try:
            children = self.zk.get_children(self.paths.movers)
        except NoNodeError:
            return frozenset()
        return frozenset(int(child) for child in children if child.isdigit())

    def _read(self, slot: int) -> tuple[Migration, int] | None:
        try:
            payload, stat = self.zk.get(self.paths.migration(slot))
        except NoNodeError:
            return None
        return Migration.decode(payload), stat.version

    # moving --------------------------------------------------------------------------------

    def start(self, slot: int, target: int) -> tuple[Migration, int]:
        """Record a new move of `slot` to broker `target`, or return the recorded one (a
        re-run resumes it); refuses a move elsewhere while one is under way. Takes the slot's
        lock (SlotLocked if another process holds it), kept until `release`."""
        if not 0 <= slot < self.topic.slot_amount:
            raise MoveError(f"slot {slot} is outside 0..{self.topic.slot_amount - 1}")
        self.acquire(slot)
        try:
            return self._start(slot, target)
        except BaseException:
            self.release(slot)
            raise

    def _start(self, slot: int, target: int) -> tuple[Migration, int]:
        recorded = self._read(slot)
        if recorded is None:
            # the doubling's lock too, not only its node: a splitter takes the lock, looks for
            # moves, then records `split`; this mover holds its slot's lock already, so one of
            # the two sees the other (sync: the latest writes of the other's session)
            self.zk.sync(self.paths.movers)
            if self.zk.exists(self.paths.split) or self.zk.exists(self.paths.splitter):
                raise MoveError("the topic's slots are being doubled: run again once it ended")
            routing, _ = self.routing()
            if not 0 <= target < min(routing.broker_count, len(self.queues)):
                brokers = min(routing.broker_count, len(self.queues))
                raise MoveError(f"broker {target} is outside 0..{brokers - 1}")
            source = routing.broker_of_slot[slot]
            if source == target:
                raise MoveError(f"slot {slot} is on broker {target} already")
            migration = Migration(slot, source, target, Step.FREEZE)
            try:
                self.zk.create(self.paths.migration(slot), migration.encode(), makepath=True)
                return migration, 0
            except NodeExistsError:
                recorded = self._read(slot)
                if recorded is None:
                    raise MoveError(f"slot {slot}: a concurrent mover just finished") from None
        migration, version = recorded
        if migration.target != target:
            raise MoveError(
                f"slot {slot} is moving to broker {migration.target} already (step "
                f"{migration.step}): finish it with --to-broker {migration.target} or --abort"
            )
        return migration, version

    def step(
        self, migration: Migration, version: int, before_switch: BeforeSwitch | None = None
    ) -> tuple[Migration, int] | None:
        """Do the recorded step and record the next; None when the move is complete. Stops
        with MoveError, before any write, when this mover no longer holds the slot's lock."""
        source, target = self.queues[migration.source], self.queues[migration.target]
        keys = slot_keys(self.topic, migration.slot)
        if before_switch is not None and migration.step in (Step.SWITCH, Step.CLEAN):
            before_switch(Move(migration.slot, migration.source, migration.target))
        self._check_lock(migration.slot)
        if migration.step is Step.FREEZE:
            source.run(consume_plans.freeze(self.topic, migration.slot))
        elif migration.step is Step.COPY:
            copy_slot(
                source.redis,
                target.redis,
                keys,
                lambda: self._check_lock(migration.slot, COPY_LOCK_READ_S),
            )
            self._check_lock(migration.slot)
            thaw_replicated(target, self.topic, [migration.slot], migration.target)
        elif migration.step is Step.SWITCH:
            self._switch(migration)
        else:
            delete_slot(source.redis, keys, MOVED_AWAY_PARTS)
            self._check_lock(migration.slot)
            self._delete_node(migration.slot, version)
            return None
        following = migration.step.following
        assert following is not None
        return self._record(replace(migration, step=following), version)

    def move(self, slot: int, target: int, before_switch: BeforeSwitch | None = None) -> Migration:
        """Move `slot` to broker `target`, resuming a move recorded earlier; returns the
        completed move. Holds the slot's lock throughout."""
        migration, version = self.start(slot, target)
        try:
            current: tuple[Migration, int] | None = (migration, version)
            while current is not None:
                migration = current[0]
                current = self.step(*current, before_switch)
        finally:
            self.release(slot)
        return migration

    def abort(self, slot: int) -> Migration:
        """Roll a move back while the routing still names the source: the target's copy is
        deleted and the source takes writes again. Refused once the routing switched, and
        while another process holds the slot's lock."""
        self.acquire(slot)
        try:
            recorded = self._read(slot)
            if recorded is None:
                raise MoveError(f"slot {slot} is not moving")
            migration, version = recorded
            routing, _ = self.routing()
            if migration.step is Step.CLEAN or routing.broker_of_slot[slot] == migration.target:
                raise MoveError(
                    f"slot {slot} is routed to broker {migration.target} already: finish the move"
                )
            self._check_lock(slot)
            delete_slot(self.queues[migration.target].redis, slot_keys(self.topic, slot))
            self._check_lock(slot)
            self.queues[migration.source].run(consume_plans.thaw(self.topic, slot))
            self._delete_node(slot, version)
            return migration
        finally:
            self.release(slot)

    # the slot's lock -----------------------------------------------------------------------

    def acquire(self, slot: int) -> None:
        """Take the slot's lock (`movers/<slot>`, locks.NodeLock); a no-op when this mover
        holds it. SlotLocked names the holder when another one does."""
        lock = self._locks.get(slot) or NodeLock(
            self.zk, self.paths.mover(slot), f"slot {slot}", "moved", "the slot's lock", SlotLocked
        )
        lock.acquire()
        self._locks[slot] = lock

    def release(self, slot: int) -> None:
        """Give the slot's lock up (if this mover holds it)."""
        lock = self._locks.pop(slot, None)
        if lock is not None:
            lock.release()

    def _check_lock(self, slot: int, reread_after_s: float = 0.0) -> None:
        """MoveError unless the slot's lock node is this mover's right now (before every write;
        `reread_after_s`: NodeLock.check)."""
        lock = self._locks.get(slot)
        if lock is None:
            raise MoveError(f"slot {slot}: this mover does not hold the slot's lock")
        lock.check(reread_after_s)

    # ZooKeeper writes ----------------------------------------------------------------------

    def _switch(self, migration: Migration) -> None:
        """Route the slot to the target with compare-and-set; a lost race reads again."""
        while True:
            routing, version = self.routing()
            if routing.broker_of_slot[migration.slot] == migration.target:
                return  # switched by an earlier run that crashed before recording it
            brokers = list(routing.broker_of_slot)
            brokers[migration.slot] = migration.target
            payload = replace(routing, broker_of_slot=tuple(brokers)).to_json()
            try:
                if version is None:
                    self.zk.create(self.paths.routing, payload, makepath=True)
                else:
                    self.zk.set(self.paths.routing, payload, version=version)
                return
            except (BadVersionError, NodeExistsError):
                continue  # the operator (or another move) wrote it meanwhile: read again

    def _record(self, migration: Migration, version: int) -> tuple[Migration, int]:
        try:
            stat = self.zk.set(
                self.paths.migration(migration.slot), migration.encode(), version=version
            )
        except (BadVersionError, NoNodeError):
            raise MoveError(
                f"slot {migration.slot}: another mover changed the move meanwhile; run again"
            ) from None
        return migration, stat.version

    def _delete_node(self, slot: int, version: int) -> None:
        try:
            self.zk.delete(self.paths.migration(slot), version=version)
        except NoNodeError:
            pass
        except BadVersionError:
            raise MoveError(f"slot {slot}: another mover changed the move meanwhile") from None
