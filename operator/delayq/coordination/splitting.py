"""Double a topic's slot amount live, N -> 2N, resumable (docs/coordination.md, "Doubling the
slots").

Slot s splits into slots s and s + N on the broker of s (a later balance is made of ordinary
slot moves, `migration.py`). A writer whose slot amount is stale must never write into a slot
of the other amount, so the doubling moves the topic to the next key generation
(`Topic.slot_generation`, `queue/keys.py`): the old generation's keys stay frozen as
tombstones, like a moved slot's source, and refuse a stale writer with SLOT_MOVING; it reads
the routing again and follows. The copy runs before the freeze, so the time the topic is frozen
does not grow with its pending messages, only with what changes while it is copied. Steps, each
recorded in the `split` node (JSON) before the next one starts, each idempotent:

1. `copy`: first (before the first slot) the old generation's keys of all 2N slot numbers, on
   every broker but where an old slot lives, get frozen epochs (tombstones: a writer with a
   stale routing, or configured with 2N slots but the old generation, is refused). Then each
   old slot, one recorded step each (`copiedSlots`), while it takes writes and delivers: its
   change tracking is turned on, then it is split into the next generation's slots s and s + N
   on the same broker
   (`queue.slot_split`), whose epochs stay frozen. Once all are copied, what changed meanwhile
   is copied again, in rounds, until a round leaves at most `CATCH_UP_TARGET` changes (or after
   `MAX_ROUNDS`).
2. `freeze`: one old slot after the other, the next frozen only once the previous is listed:
   the slot frozen (freeze-1: writes refused, the old owner fenced out), what changed in it
   since the last round copied again, its per-slot parts (journal, lease counter, epoch)
   copied, its halves thawed (waiting for sync replicas), then the slot added to the
   routing's `doubled_slots` (compare-and-set, on the version this splitter wrote last: one
   ZooKeeper write, no read): writers that read it send the slot's messages to the halves
   from then on (`routed_queue.py`); the old slot stays frozen as a tombstone for the others.
   A few pipelines and ZooKeeper calls a slot, whatever the slot amount; a rerun skips the
   slots the routing lists (their halves take writes).
3. `switch`: the routing node becomes {2N slots, generation g + 1, s and s + N on the old
   broker of s}, written with compare-and-set. The delay services and routing clients watch it
   and move to the new keys; the new owners fence above the copied epochs.
4. `clean`: the old generation's keys are deleted but their frozen epochs, then the node.

A slot refuses writers that read `doubled_slots` while it is caught up and listed: its share of
one round's changes, not the pending messages nor the slot amount (docs/benchmarks.md).
Writers that do not read it (a process of an earlier version), and a pull topic's deliveries,
wait from the freeze of the first slot to `switch` (docs/coordination.md, what is left).

Crash points (a splitter killed, its lock gone with its session; the next run, the operator's
next pass or, once a slot is frozen, the old slots' owners past twice the session timeout
(`resume_frozen`, service/stopped_moves.py) resume the recorded step):
- before or in `copy`: no old slot is frozen; all take writes and deliver. Tracking is on in
  the slots copied so far (their `changes` sets grow with what is written until the rerun or
  `--abort`). A slot split half-way is split again (its halves are deleted first); taken
  changes stay in `recopy` until copied again, so none is lost to a crash in a round.
- in `freeze`: the one slot being caught up stays frozen until the rerun, which catches it
  up again (idempotent: its old slot is frozen, nothing changes it) and goes on with the
  rest; the slots listed before take routed writes meanwhile (a push topic's owners consume
  their halves).
  The frozen slot (the only one refusing every writer) lasts the owners' bound plus one
  catch-up, not one copy, nor until a person reruns it. A resuming owner killed inside
  leaves what a killed splitter leaves.
- in `switch` and `clean`: as before this design (the routing is compare-and-set; clean only
  deletes keys nobody routes to).

Nothing is lost: every member present throughout a copy is seen by its SCAN; every member a
script changed after tracking began is in `changes` (the scripts change the divided parts only
with ZADD, ZREM, HSET, HDEL, which `track_changes.lua` notes in the same atomic call) and is
copied again, under the freeze last, from the frozen source; never early: a message's due time
is copied as it is, and the halves take no write and deliver nothing before the freeze made them
exact; stale writers are refused: the old slots are frozen before the switch and stay
tombstones, the halves are frozen until the catch-up, and the unused slot numbers from the
start; a custom basis is placed by its recorded basis, read again for every recopied message.

`abort` rolls back before the first slot of the freeze is listed (the new generation's keys
deleted, the old slots thawed, their tracking off). One splitter at a time: the ephemeral lock
`movers/split`, checked before every write; a doubling refuses to start while slot moves are
recorded or locked, and a slot move refuses to start while a doubling is recorded or its lock
is held (each takes its lock before it looks).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.locks import LockHeld, MoveError, NodeLock
from delayq.coordination.migration import SlotMover, Step, thaw_replicated
from delayq.coordination.routing import Routing, halves, initial_routing
from delayq.queue import consume_plans, plans
from delayq.queue.client import Queue
from delayq.queue.keys import SlotKeys, slot_keys
from delayq.queue.slot_copy import MOVED_AWAY_PARTS, delete_slot
from delayq.queue.slot_split import (
    Division,
    catch_up,
    recopy,
    split_slot,
    take_changes,
    track,
    untrack,
)
from delayq.queue.topic import MAX_SLOT_AMOUNT, Topic, is_power_of_two

#: Called (in the splitter's thread) with the doubled routing right before the `switch` and
#: before the `clean`, as migration.BeforeSwitch for a move: from the switch on the messages
#: are only in the new generation's keys (all copied by then). Raising stops the doubling
#: there, recorded; the next run calls it again.
BeforeSplitSwitch = Callable[[Routing], None]

SPLIT_FORMAT_VERSION = 2
#: A doubling's steps, in order: the copy runs before the freeze (version 1 froze first).
SPLIT_STEPS = (Step.COPY, Step.FREEZE, Step.SWITCH, Step.CLEAN)
#: Tombstones frozen per pipeline (one small script each).
FREEZE_BATCH = 2000
#: The copy's rounds stop once one leaves at most this many changes for the catch-up under the
#: freeze (all slots together): about 0.1 s of copying (docs/benchmarks.md).
CATCH_UP_TARGET = 10_000
#: ... or after this many rounds (writes outpacing the copy): the freeze then waits for more.
MAX_ROUNDS = 8


class SplitLocked(LockHeld):
    """Another process holds `movers/split`: it is doubling the slots or rolling back now."""


@dataclass(frozen=True)
class Split:
    """The `split` node: N -> 2N from key generation g to g + 1, the routing of the N slots it
    started from, its step and how many old slots the copy step finished (in slot order)."""

    from_amount: int
    generation: int
    brokers: tuple[int, ...]
    step: Step
    copied_slots: int = 0

    @property
    def to_amount(self) -> int:
        return 2 * self.from_amount

    @property
    def following(self) -> Step | None:
        """The step after this one (SPLIT_STEPS), None after the clean."""
        index = SPLIT_STEPS.index(self.step)
        return SPLIT_STEPS[index + 1] if index + 1 < len(SPLIT_STEPS) else None

    @property
    def to_generation(self) -> int:
        return self.generation + 1

    def doubled(self, broker_count: int) -> Routing:
        """The routing the switch writes: s and s + N on the broker of s."""
        return Routing(
            self.to_amount, broker_count, self.brokers + self.brokers, self.to_generation
        )

    def encode(self) -> bytes:
        document = {
            "version": SPLIT_FORMAT_VERSION,
            "fromSlotAmount": self.from_amount,
            "toSlotAmount": self.to_amount,
            "fromGeneration": self.generation,
            "toGeneration": self.to_generation,
            "slots": list(self.brokers),
            "step": self.step.value,
            "copiedSlots": self.copied_slots,
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Split:
        document = json.loads(payload)
        version = document.get("version")
        if version not in (1, SPLIT_FORMAT_VERSION):
            raise ValueError(f"unknown split format version {version!r}")
        step, copied = Step(document["step"]), int(document["copiedSlots"])
        if version == 1 and step in (Step.FREEZE, Step.COPY):
            step, copied = Step.COPY, 0  # frozen first, copied after: copied again, tracked
        return cls(
            int(document["fromSlotAmount"]),
            int(document["fromGeneration"]),
            tuple(int(broker) for broker in document["slots"]),
            step,
            copied,
        )


def routed_topic(topic: Topic, routing: Routing) -> Topic:
    """`topic` with the routing's slot amount and key generation (the settings' slotAmount is
    only the desired one once a doubling ran)."""
    return replace(topic, slot_amount=routing.slot_amount, slot_generation=routing.generation)


class SlotSplitter:
    """Doubles the slots of one topic; `queues[b]` is broker b's engine client (sync), its
    topic's slot amount and generation are ignored (the routing node's count)."""

    def __init__(self, zk: KazooClient, paths: TopicPaths, queues: Sequence[Queue]) -> None:
        if not queues:
            raise ValueError("a topic needs at least one broker")
        self.zk = zk
        self.paths = paths
        self.queues = list(queues)
        self.topic = queues[0].topic
        self.lock = NodeLock(
            zk, paths.splitter, "the split", "run", "the split's lock", SplitLocked
        )

    # reading -------------------------------------------------------------------------------

    def routing(self) -> tuple[Routing, int | None]:
        """The routing and its node's version (None: no node yet; then the first routing of
        the settings' slot amount over these brokers, generation 0)."""
        try:
            payload, stat = self.zk.get(self.paths.routing)
        except NoNodeError:
            return initial_routing(self.topic.slot_amount, len(self.queues)), None
        return Routing.from_json(payload), stat.version

    def state(self) -> Split | None:
        """The doubling under way (or left behind by a crashed splitter), None when none is."""
        recorded = self._read()
        return None if recorded is None else recorded[0]

    def locked(self) -> bool:
        """Somebody (this splitter included) holds the split's lock now."""
        return self.zk.exists(self.paths.splitter) is not None

    def _read(self) -> tuple[Split, int] | None:
        try:
            payload, stat = self.zk.get(self.paths.split)
        except NoNodeError:
            return None
        return Split.decode(payload), stat.version

    def _read_or_rebuild(self) -> tuple[Split, int] | None:
        """`_read`, under the lock. A `split` node lost while the routing lists switched slots
        (ZooKeeper's data lost mid-freeze, the routing published again from status.routing)
        is recorded again at `freeze`: a slot is listed only once the copy and its rounds are
        done, and a doubling started again from its copy would replace the switched slots'
        halves, and what was written into them since, with the frozen old slots."""
        recorded = self._read()
        routing = self.routing()[0]
        if recorded is not None or not routing.doubled_slots:
            return recorded
        amount = routing.slot_amount
        split = Split(amount, routing.generation, routing.broker_of_slot, Step.FREEZE, amount)
        self.lock.check()
        try:
            self.zk.create(self.paths.split, split.encode(), makepath=True)
        except NodeExistsError:
            raise MoveError("another splitter recorded a doubling meanwhile; run again") from None
        return split, 0

    # doubling ------------------------------------------------------------------------------

    def split(
        self, to_amount: int, before_switch: BeforeSplitSwitch | None = None
    ) -> Split | None:
        """Double until the topic has `to_amount` slots (one doubling after another, each
        resumed if recorded); returns the last doubling done, None when the topic had
        `to_amount` slots already. Holds the lock throughout."""
        done = None
        try:
            while (current := self.start(to_amount)) is not None:
                done = self._run(*current, before_switch)
        finally:
            self.release()
        return done

    def start(self, to_amount: int) -> tuple[Split, int] | None:
        """Take the lock (SplitLocked if another process holds it; kept until `release`) and
        return the recorded doubling to resume, or record the next one toward `to_amount`;
        None when the topic has `to_amount` slots."""
        self.lock.acquire()
        try:
            recorded = self._read_or_rebuild()
            self._check_brokers(
                recorded[0].brokers if recorded else self.routing()[0].broker_of_slot
            )
            if recorded is None:
                return self._start(to_amount)
            if recorded[0].to_amount > to_amount:
                raise MoveError(
                    f"a doubling to {recorded[0].to_amount} slots is under way: finish it with "
                    f"--to-slots {recorded[0].to_amount} or --abort"
                )
            return recorded
        except BaseException:
            self.release()
            raise

    def resume_frozen(self) -> Split | None:
        """Complete the recorded doubling once its freeze began (its old slots refuse writes
        until it ends), never start or go on with one still copying (it freezes nothing: left
        to whoever started it); returns it, None when there was none to complete. Takes the
        lock first (SplitLocked while another process holds it) and reads the node under it,
        so what it completes is what is recorded now. For the slots' owners
        (service/stopped_moves.py), whose splitter stopped."""
        self.lock.acquire()
        try:
            recorded = self._read_or_rebuild()
            if recorded is None or recorded[0].step is Step.COPY:
                return None
            self._check_brokers(recorded[0].brokers)
            return self._run(*recorded, None)
        finally:
            self.release()

    def release(self) -> None:
        """Give the lock up (if held)."""
        self.lock.release()

    def _check_brokers(self, brokers: Sequence[int]) -> None:
        """MoveError before any write unless every broker the slots are on has a client: a
        freeze that stopped halfway on a missing one would leave slots refusing writes."""
        if brokers and max(brokers) >= len(self.queues):
            raise MoveError(
                f"the routing names broker {max(brokers)}, but {len(self.queues)} broker URL(s) "
                "were given: give every broker's URL, in broker index order"
            )

    def _start(self, to_amount: int) -> tuple[Split, int] | None:
        """Record the next doubling toward `to_amount`; None when the topic has it."""
        routing, _ = self.routing()
        if routing.slot_amount == to_amount:
            return None
        if (
            not is_power_of_two(to_amount)
            or to_amount < routing.slot_amount
            or to_amount > MAX_SLOT_AMOUNT
        ):
            raise MoveError(
                f"the topic has {routing.slot_amount} slots: it can grow to a power of two up "
                f"to {MAX_SLOT_AMOUNT} ({2 * routing.slot_amount}, ...), not {to_amount}"
            )
        mover = SlotMover(self.zk, self.paths, self.queues)
        self.zk.sync(self.paths.movers)  # a mover's lock taken by another session just now
        moving = sorted({m.slot for m in mover.migrations()} | mover.locked())
        if moving:
            raise MoveError(f"slots {moving} are moving: run again once their moves ended")
        split = Split(routing.slot_amount, routing.generation, routing.broker_of_slot, Step.COPY)
        self.lock.check()
        try:
            self.zk.create(self.paths.split, split.encode(), makepath=True)
        except NodeExistsError:
            raise MoveError("another splitter recorded a doubling meanwhile; run again") from None
        return split, 0

    def _run(
        self, split: Split, version: int, before_switch: BeforeSplitSwitch | None
    ) -> Split:
        current: tuple[Split, int] | None = (split, version)
        while current is not None:
            split = current[0]
            current = self.step(*current, before_switch)
        return split

    def step(
        self, split: Split, version: int, before_switch: BeforeSplitSwitch | None = None
    ) -> tuple[Split, int] | None:
        """Do the recorded step (the copy: one old slot, or its rounds once all are copied) and
        record what follows; None when the doubling is complete. MoveError before any write
        once the lock is not ours."""
        old, new = self._topics(split)
        if before_switch is not None and split.step in (Step.SWITCH, Step.CLEAN):
            routing = self.routing()[0]
            switched = routing.generation == split.to_generation
            before_switch(routing if switched else split.doubled(routing.broker_count))
        self.lock.check()
        if split.step is Step.COPY and split.copied_slots < split.from_amount:
            if split.copied_slots == 0:
                self._freeze_tombstones(split, old)
            self._copy(split, old, new, split.copied_slots)
            return self._record(replace(split, copied_slots=split.copied_slots + 1), version)
        if split.step is Step.COPY:
            self._converge(split, old, new)
        elif split.step is Step.FREEZE:
            listed = self.routing()
            for slot in self._unswitched(split, listed[0]):
                self._catch_up(split, old, new, slot)
                listed = self._switch_slot(split, slot, listed)
        elif split.step is Step.SWITCH:
            self._switch(split)
        elif split.step is Step.CLEAN:
            for slot, broker in enumerate(split.brokers):
                client = self.queues[broker].redis
                delete_slot(client, slot_keys(old, slot), MOVED_AWAY_PARTS)
                for stray in self._strays(split, old, slot + split.from_amount):
                    delete_slot(client, stray, MOVED_AWAY_PARTS)  # copied with slot s
            self.lock.check()
            self._delete_node(version)
            return None
        following = split.following
        assert following is not None
        return self._record(replace(split, step=following), version)

    def abort(self) -> Split:
        """Roll a doubling back while the routing still has the old slot amount: the new
        generation's keys are deleted and the old slots take writes again (their tombstones
        for N..2N-1 stay: they only refuse misconfigured writers). Refused after the switch."""
        self.lock.acquire()
        try:
            recorded = self._read_or_rebuild()
            if recorded is None:
                raise MoveError("no doubling is under way")
            split, version = recorded
            self._check_brokers(split.brokers)
            routing, _ = self.routing()
            if split.step is Step.CLEAN or routing.generation == split.to_generation:
                raise MoveError(
                    f"the routing has {split.to_amount} slots already: finish the doubling"
                )
            if routing.doubled_slots:
                raise MoveError(
                    f"slots {sorted(routing.doubled_slots)} are switched to their halves, "
                    "which take writes: finish the doubling"
                )
            old, new = self._topics(split)
            for slot in range(split.to_amount):
                broker = split.brokers[slot % split.from_amount]
                self.lock.check()
                delete_slot(self.queues[broker].redis, slot_keys(new, slot))
            for slot, broker in enumerate(split.brokers):
                self.lock.check()
                self.queues[broker].run(consume_plans.thaw(old, slot))
                untrack(self.queues[broker].redis, slot_keys(old, slot))
            self._delete_node(version)
            return split
        finally:
            self.release()

    # the steps -----------------------------------------------------------------------------

    def _topics(self, split: Split) -> tuple[Topic, Topic]:
        """The topic before (N slots, generation g) and after (2N, g + 1) the doubling."""
        old = replace(self.topic, slot_amount=split.from_amount, slot_generation=split.generation)
        new = replace(old, slot_amount=split.to_amount, slot_generation=split.to_generation)
        return old, new

    def _freeze_tombstones(self, split: Split, old: Topic) -> None:
        """Freeze the old generation's keys of every slot number of 2N on every broker but the
        live old slots: a tombstone for a writer with a stale routing, or configured with 2N
        slots but the old generation. Generation 0 too (once past it): a writer that does not
        read the routing (a plain Queue built from the settings, whose slotAmount is the desired
        one) is always at generation 0, and an earlier doubling froze its keys of fewer slot
        numbers only. Each
        live old slot (generation g, on its own broker) takes writes until `freeze`."""
        for broker, queue in enumerate(self.queues):
            live = {slot for slot, owner in enumerate(split.brokers) if owner == broker}
            for generation in sorted({0, split.generation}):
                stale = replace(old, slot_amount=split.to_amount, slot_generation=generation)
                calls = [
                    consume_plans.freeze(stale, slot).calls[0]
                    for slot in range(split.to_amount)
                    if generation != split.generation or slot not in live
                ]
                self._run_batched(queue, calls)

    @staticmethod
    def _run_batched(queue: Queue, calls: Sequence[plans.ScriptCall]) -> None:
        """Independent script calls (freeze-1, thaw-1), FREEZE_BATCH per pipeline."""
        for start in range(0, len(calls), FREEZE_BATCH):
            queue.run(plans.Plan(list(calls[start : start + FREEZE_BATCH]), len))

    def _division(self, split: Split, old: Topic, new: Topic, slot: int) -> Division:
        """The old slot `slot`, its two halves and the strays copied with it."""
        upper = slot + split.from_amount
        strays = tuple(self._strays(split, old, upper))
        return Division(slot_keys(old, slot), slot_keys(new, slot), slot_keys(new, upper), strays)

    def _copy(self, split: Split, old: Topic, new: Topic, slot: int) -> None:
        """Track the old slot's changes, then split it as it is (it takes writes meanwhile)."""
        client = self.queues[split.brokers[slot]].redis
        division = self._division(split, old, new, slot)
        track(client, division.source)
        split_slot(client, division)

    def _recopy(self, split: Split, old: Topic, new: Topic, slot: int) -> int:
        """Copy again what changed in the old slot since its last take; returns how many."""
        client = self.queues[split.brokers[slot]].redis
        division = self._division(split, old, new, slot)
        take_changes(client, division.source)
        return recopy(client, division)

    def _converge(self, split: Split, old: Topic, new: Topic) -> None:
        """Rounds of `_recopy` over all old slots until one leaves at most CATCH_UP_TARGET
        changes (what the copy of the last round let pile up is what the freeze waits for)."""
        for _ in range(MAX_ROUNDS):
            changed = 0
            for slot in range(split.from_amount):
                self.lock.check()
                changed += self._recopy(split, old, new, slot)
            if changed <= CATCH_UP_TARGET:
                return

    @staticmethod
    def _unswitched(split: Split, routing: Routing) -> list[int]:
        """The old slots `routing` does not send to their halves yet, in slot order. A switched
        slot's halves take writes, so a rerun must never catch them up again (that would
        overwrite them)."""
        switched = routing.doubled_slots if routing.generation == split.generation else frozenset()
        return [slot for slot in range(split.from_amount) if slot not in switched]

    def _catch_up(self, split: Split, old: Topic, new: Topic, slot: int) -> None:
        """The old `slot` frozen (writes refused, the old owner fenced out), its last changes
        and its per-slot parts copied again, its halves thawed (waiting for sync replicas): a
        few round trips, whatever the slot amount."""
        broker = split.brokers[slot]
        queue = self.queues[broker]
        self.lock.check()
        queue.run(consume_plans.freeze(old, slot))
        catch_up(queue.redis, [self._division(split, old, new, slot)])
        self.lock.check()
        thaw_replicated(queue, new, halves(slot, split.from_amount), broker)

    def _strays(self, split: Split, old: Topic, upper: int) -> list[SlotKeys]:
        """The keys of slot number `upper` (s + N) at the old generation and at generation 0,
        on the broker of s: where a writer at 2N that does not read the routing (always at
        generation 0: reconcile renders 2N before the doubling starts) stored before the
        freeze. Nobody owns them; the copy of s takes their messages to the new slot s + N."""
        generations = sorted({0, split.generation})
        return [
            slot_keys(replace(old, slot_amount=split.to_amount, slot_generation=g), upper)
            for g in generations
        ]

    def _switch_slot(
        self, split: Split, slot: int, read: tuple[Routing, int | None]
    ) -> tuple[Routing, int]:
        """Add `slot` (caught up, its halves thawed) to the routing's `doubled_slots` with
        compare-and-set: from now on writers that read it send its messages to the halves, and
        the old slot stays frozen as a tombstone for those that do not. `read` is the routing
        and node version this splitter read or wrote last (one write a slot, no read); returns
        the ones written."""
        def switched(routing: Routing) -> Routing:
            self._check_unchanged(split, routing)
            return replace(routing, doubled_slots=routing.doubled_slots | {slot})

        written = self._write_routing(switched, read)
        assert written is not None
        return written

    @staticmethod
    def _check_unchanged(split: Split, routing: Routing) -> None:
        """MoveError when the routing is not the one the doubling started from (the copies
        follow that one)."""
        if (routing.slot_amount, routing.generation, routing.broker_of_slot) != (
            split.from_amount,
            split.generation,
            split.brokers,
        ):
            raise MoveError("the routing changed during the doubling: --abort it")

    def _switch(self, split: Split) -> None:
        """Write the doubled routing with compare-and-set; a lost race reads again. Refuses
        when the routing changed since the doubling started (the copies follow that one)."""
        def doubled(routing: Routing) -> Routing | None:
            if routing.generation == split.to_generation:
                return None  # switched by an earlier run that crashed before recording it
            self._check_unchanged(split, routing)
            return split.doubled(routing.broker_count)

        self._write_routing(doubled, self.routing())

    def _write_routing(
        self, change: Callable[[Routing], Routing | None], read: tuple[Routing, int | None]
    ) -> tuple[Routing, int] | None:
        """Write `change(routing)` over the routing node `read` (routing, version) with
        compare-and-set, reading it again after a lost race (the operator wrote it meanwhile:
        more brokers); returns what was written and its version, None when `change` returned
        None (nothing written). Under the split lock, checked before each write."""
        routing, version = read
        while True:
            new = change(routing)
            if new is None:
                return None
            self.lock.check()
            try:
                if version is None:
                    self.zk.create(self.paths.routing, new.to_json(), makepath=True)
                    return new, 0
                return new, self.zk.set(self.paths.routing, new.to_json(), version=version).version
            except (BadVersionError, NodeExistsError):
                routing, version = self.routing()

    # ZooKeeper writes ----------------------------------------------------------------------

    def _record(self, split: Split, version: int) -> tuple[Split, int]:
        try:
            stat = self.zk.set(self.paths.split, split.encode(), version=version)
        except (BadVersionError, NoNodeError):
            raise MoveError("another splitter changed the doubling meanwhile; run again") from None
        return split, stat.version

    def _delete_node(self, version: int) -> None:
        try:
            self.zk.delete(self.paths.split, version=version)
        except NoNodeError:
            pass
        except BadVersionError:
            raise MoveError("another splitter changed the doubling meanwhile") from None
