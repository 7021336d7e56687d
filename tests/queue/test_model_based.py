"""Model-based test: random operation sequences against the real Redis and a pure reference model.

Every message's due time is either "due now" (an instant in the past) or "a day away", so the
model knows exactly what a claim must return without depending on wall-clock timing. The topic
remembers finished ids for a day (outcome retention), so the model also holds what each acked,
cancelled or purged id finished as, and create-only scheduling must answer it. Recurring
schedules (daily, starting a day away, so their occurrences never fall due here) are put,
replaced and deleted among the messages: their waiting occurrences must be exactly the model's,
and claims of slots holding schedules must go on answering as for plain messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from delayq.local.waiting import wait_until
from delayq.queue import produce_plans
from delayq.queue.client import Queue
from delayq.queue.codes import Code, NotFoundError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Lease, Mode, Retry, ScheduleRequest, State, Target
from delayq.queue.recurrence import Recurrence
from delayq.queue.schedules import Schedule, occurrence_target
from delayq.queue.topic import EndAction, Topic

from .conftest import server_ms

PAST_MS = 1_000
DAY_MS = 86_400_000
TOPIC = Topic("model", slot_amount=2, max_retries=1, outcome_retention_ms=DAY_MS)
STORE_BUCKETS_AFTER_MS = TOPIC.redis_store_buckets_after_ms  # the default, 10s
ALL_IDS = ["a", "b", "c"]
IDS = st.sampled_from(ALL_IDS)
SEED_PRIORITIES = [0, 3, 9]  # every path meets messages of each kind from the start
SCHEDULE_IDS = st.sampled_from(["s1", "s2"])
LONG_LEASE_MS = 600_000


@dataclass
class Ref:
    """What the reference model believes about one message."""

    state: State
    due_now: bool = True
    attempts: int = 0
    payload: bytes = b""
    lease: Lease | None = None
    lease_expired: bool = False
    expired: bool = False  # scheduled with an expiry in the past: given up when claimed
    priority: int = 0  # a claim takes a slot's due messages of higher priority first


class QueueMachine(RuleBasedStateMachine):
    client: redis.Redis  # set by the test function from the fixture
    exhausted: EndAction  # the topic's retry_exhausted_action and expiry_action, set by the test

    def __init__(self) -> None:
        super().__init__()
        self.client.flushall()
        self.topic = dataclasses.replace(
            TOPIC, retry_exhausted_action=self.exhausted, expiry_action=self.exhausted
        )
        self.queue = Queue(self.client, self.topic)
        self.model: dict[str, Ref] = {}
        # what each finished id finished as, and its attempts then (consulted while not live)
        self.finished: dict[str, tuple[State, int]] = {}
        self.old_leases: list[Lease] = []
        self.future_ms = server_ms(self.client) + DAY_MS
        self.epochs: dict[int, int] = {}
        self.schedules: dict[str, bytes] = {}  # schedule id -> payload of its occurrences
        self.settings_version = 0  # of the settings record this machine publishes
        # where the owner has the slots keep records and waiting messages (the switch rules)
        self.record_buckets = self.store_buckets = False
        self.store_buckets_after_ms = STORE_BUCKETS_AFTER_MS

    @initialize()
    def take_over_all_slots_and_seed(self) -> None:
        """Start with every id due, so short runs already reach leases, retries and dead, and
        with priorities, so they reach each transition of the priority index too."""
        self.epochs = {slot: self.queue.take_over(slot) for slot in self.topic.slots}
        for message_id, priority in zip(ALL_IDS, SEED_PRIORITIES, strict=True):
            self.queue.schedule(message_id, b"seed", at_ms=PAST_MS, priority=priority)
            self.model[message_id] = Ref(State.SCHEDULED, True, 0, b"seed", priority=priority)

    @rule(on=st.booleans())
    def switch_record_buckets(self, on: bool) -> None:
        """The owner turns recordBuckets on or off (as admin: the broker's libraries all read
        buckets): records move as they are written, and every call finds each where it is."""
        self.record_buckets = on
        self._publish_layout()

    @rule(on=st.booleans(), due_soon_too=st.booleans())
    def switch_store_buckets(self, on: bool, due_soon_too: bool) -> None:
        """The owner turns storeBuckets on or off: waiting messages move as they are written,
        and every claim, count and lookup finds each where it waits. `due_soon_too`: with
        storeBucketsAfter 0s, messages due now go into buckets too, so claims take them there."""
        self.store_buckets = on
        self.store_buckets_after_ms = 0 if due_soon_too else STORE_BUCKETS_AFTER_MS
        self._publish_layout()

    def _publish_layout(self) -> None:
        self.settings_version += 1
        topic = dataclasses.replace(
            self.topic,
            redis_record_buckets=self.record_buckets,
            redis_store_buckets=self.store_buckets,
            redis_store_buckets_after_ms=self.store_buckets_after_ms,
        )
        Queue(self.client, topic).publish_settings("model", self.settings_version)

    def _when(self, due_now: bool) -> int:
        return PAST_MS if due_now else self.future_ms

    def _finish(self, message_id: str, state: State) -> None:
        ref = self.model.pop(message_id)
        self._forget_lease(ref)
        self.finished[message_id] = (state, ref.attempts)

    def _forget_lease(self, ref: Ref) -> None:
        if ref.lease is not None:
            self.old_leases.append(ref.lease)
        ref.lease, ref.lease_expired = None, False

    @rule(
        message_id=IDS,
        due_now=st.booleans(),
        upsert=st.booleans(),
        payload=st.binary(max_size=8),
        expired=st.booleans(),
        priority=st.sampled_from([0, 3, 9]),
    )
    def schedule(
        self,
        message_id: str,
        due_now: bool,
        upsert: bool,
        payload: bytes,
        expired: bool,
        priority: int,
    ) -> None:
        """`expired`: an expiry just after PAST_MS, already over (a due-now message is given
        up when claimed; one due in a day expires before its due time and is refused)."""
        mode = Mode.UPSERT if upsert else Mode.CREATE
        expire_at_ms = PAST_MS + 1 if expired else None
        request = ScheduleRequest(
            message_id,
            payload,
            at_ms=self._when(due_now),
            expire_at_ms=expire_at_ms,
            priority=priority,
        )
        [result] = self.queue.schedule_many([request], mode)
        ref = self.model.get(message_id)
        if expired and not due_now:
            assert result.code is Code.EXPIRES_BEFORE_DUE
        elif ref is None and not upsert and message_id in self.finished:
            assert (result.code, result.state) == (Code.ALREADY_DONE, self.finished[message_id][0])
        elif ref is None:
            assert result.code is Code.CREATED
            self.model[message_id] = Ref(
                State.SCHEDULED, due_now, 0, payload, expired=expired, priority=priority
            )
        elif not upsert:
            assert (result.code, result.state) == (Code.EXISTS, ref.state)
        else:
            assert result.code is Code.UPDATED
            self._forget_lease(ref)
            self.model[message_id] = Ref(
                State.SCHEDULED, due_now, 0, payload, expired=expired, priority=priority
            )

    @rule(message_id=IDS)
    def cancel(self, message_id: str) -> None:
        outcome = self.queue.cancel(message_id)
        live = message_id in self.model
        assert outcome.code is (Code.CANCELLED if live else Code.NOT_FOUND)
        if live:
            self._finish(message_id, State.CANCELLED)

    @rule(message_id=IDS, due_now=st.booleans())
    def reschedule(self, message_id: str, due_now: bool) -> None:
        ref = self.model.get(message_id)
        move = (Target(message_id), None, self._when(due_now))
        result = self.queue.run(produce_plans.reschedule(self.topic, [move]))[0]
        if ref is None:
            assert result.code is Code.NOT_FOUND
        elif ref.state is State.DEAD:
            assert result.code is Code.WRONG_STATE
        else:
            assert result.code is Code.RESCHEDULED
            self._forget_lease(ref)
            ref.state, ref.due_now = State.SCHEDULED, due_now

    @rule()
    def claim_all(self) -> None:
        for message_id, ref in list(self.model.items()):
            if ref.state is State.PREPARED and ref.lease_expired:
                self._forget_lease(ref)
                if ref.attempts <= self.topic.max_retries:
                    ref.state, ref.due_now = State.SCHEDULED, True
                elif self.exhausted is EndAction.DROP:
                    self._finish(message_id, State.DROPPED)
                else:
                    ref.state = State.DEAD
        for message_id, ref in list(self.model.items()):
            if ref.state is State.SCHEDULED and ref.due_now and ref.expired:
                if self.exhausted is EndAction.DROP:
                    self._finish(message_id, State.EXPIRED)
                else:
                    ref.state = State.DEAD
        expected = {i for i, r in self.model.items() if r.state is State.SCHEDULED and r.due_now}
        claimed = {}
        for slot in self.topic.slots:
            batch = self.queue.claim(slot, self.epochs[slot], 1000, LONG_LEASE_MS)
            claimed.update({m.id: m for m in batch.messages})
            priorities = [self.model[m.id].priority for m in batch.messages]
            assert priorities == sorted(priorities, reverse=True)  # the higher ones first

        assert set(claimed) == expected
        for message_id, message in claimed.items():
            ref = self.model[message_id]
            ref.attempts += 1
            assert (message.attempt, message.payload) == (ref.attempts, ref.payload)
            ref.state, ref.lease, ref.lease_expired = State.PREPARED, message.lease, False

    def _leased(self, message_id: str) -> Ref | None:
        ref = self.model.get(message_id)
        return ref if ref is not None and ref.state is State.PREPARED else None

    def _pick(self, data: st.DataObject, state: State) -> str:
        """Mostly an id in `state` (so the rule does real work), sometimes any id."""
        in_state = sorted(i for i, r in self.model.items() if r.state is state)
        if in_state and data.draw(st.integers(0, 4)) > 0:
            return data.draw(st.sampled_from(in_state))
        return data.draw(IDS)

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        message_id = self._pick(data, State.PREPARED)
        ref = self._leased(message_id)
        if ref is None or ref.lease is None:
            return
        outcome = self.queue.ack_many([ref.lease])[0]
        assert outcome.code is Code.ACKED
        self._finish(message_id, State.DONE)

    @rule(data=st.data())
    def ack_with_a_stale_lease(self, data: st.DataObject) -> None:
        if not self.old_leases:
            return
        lease = data.draw(st.sampled_from(self.old_leases))
        ref = self.model.get(lease.id)
        if ref is not None and ref.lease == lease:
            return
        assert self.queue.ack_many([lease])[0].code is Code.LEASE_LOST

    @rule(data=st.data(), retry_now=st.booleans(), dead=st.booleans())
    def nack(self, data: st.DataObject, retry_now: bool, dead: bool) -> None:
        message_id = self._pick(data, State.PREPARED)
        ref = self._leased(message_id)
        if ref is None or ref.lease is None:
            return
        delay_ms = 0 if retry_now else DAY_MS
        outcome = self.queue.nack_many([Retry(ref.lease, delay_ms, "no", dead)])[0]
        self._forget_lease(ref)
        if not dead and ref.attempts > self.topic.max_retries and self.exhausted is EndAction.DROP:
            assert outcome.code is Code.DROPPED
            self._finish(message_id, State.DROPPED)
        elif dead or ref.attempts > self.topic.max_retries:
            assert outcome.code is Code.DEAD
            ref.state = State.DEAD
        else:
            assert outcome.code is Code.RETRY_SCHEDULED
            ref.state, ref.due_now = State.SCHEDULED, retry_now

    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        message_id = self._pick(data, State.PREPARED)
        ref = self._leased(message_id)
        if ref is None or ref.lease is None:
            return
        outcome = self.queue.extend_many([ref.lease], 1)[0]
        if ref.lease_expired:  # an expired lease is never revived, not even to expire it again
            assert outcome.code is Code.LEASE_LOST
            return
        assert outcome.code is Code.EXTENDED
        assert outcome.at_ms is not None
        deadline = outcome.at_ms
        wait_until(lambda: server_ms(self.client) > deadline, 5, "the lease deadline")
        ref.lease_expired = True

    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        message_id = self._pick(data, State.PREPARED)
        ref = self._leased(message_id)
        if ref is None or ref.lease is None:
            return
        outcome = self.queue.extend_many([ref.lease], LONG_LEASE_MS)[0]
        assert outcome.code is (Code.LEASE_LOST if ref.lease_expired else Code.EXTENDED)

    @rule(data=st.data())
    def redrive(self, data: st.DataObject) -> None:
        message_id = self._pick(data, State.DEAD)
        outcome = self.queue.redrive(self.topic.slot_of(message_id), [message_id])[0]
        ref = self.model.get(message_id)
        if ref is not None and ref.state is State.DEAD:
            assert outcome.code is Code.REDRIVEN
            ref.state, ref.due_now, ref.attempts = State.SCHEDULED, True, 0
            ref.expired = False  # a redrive starts afresh, without the expiry
        else:
            assert outcome.code is Code.WRONG_STATE

    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        message_id = self._pick(data, State.DEAD)
        outcome = self.queue.purge(self.topic.slot_of(message_id), [message_id])[0]
        ref = self.model.get(message_id)
        if ref is not None and ref.state is State.DEAD:
            assert outcome.code is Code.PURGED
            self._finish(message_id, State.PURGED)
        else:
            assert outcome.code is Code.WRONG_STATE

    @rule(schedule_id=SCHEDULE_IDS, payload=st.binary(max_size=8))
    def put_schedule(self, schedule_id: str, payload: bytes) -> None:
        recurrence = Recurrence(every_ms=DAY_MS, start_ms=self.future_ms)
        result = self.queue.put_schedule(Schedule(schedule_id, recurrence, payload))
        replaced = schedule_id in self.schedules
        assert result.code is (Code.UPDATED if replaced else Code.CREATED)
        assert result.first_due_ms == self.future_ms
        self.schedules[schedule_id] = payload

    @rule(schedule_id=SCHEDULE_IDS)
    def delete_schedule(self, schedule_id: str) -> None:
        if schedule_id in self.schedules:
            assert self.queue.delete_schedule(schedule_id).code is Code.CANCELLED
            del self.schedules[schedule_id]
            return
        try:
            self.queue.delete_schedule(schedule_id)
        except NotFoundError:
            return
        raise AssertionError(f"{schedule_id} deleted twice")

    @invariant()
    def schedules_agree_with_the_model(self) -> None:
        listed = {info.schedule.id: info for info in self.queue.list_schedules()}
        assert set(listed) == set(self.schedules)
        for schedule_id in ("s1", "s2"):
            occurrence = self.queue.get_many([occurrence_target(schedule_id, self.future_ms)])[0]
            if schedule_id in self.schedules:
                assert (occurrence.state, occurrence.payload) == (
                    State.SCHEDULED,
                    self.schedules[schedule_id],
                )
                info = listed[schedule_id]
                assert (info.current_due_ms, info.next_due_ms, info.waiting) == (
                    self.future_ms,
                    self.future_ms + DAY_MS,
                    True,
                )
            else:
                assert occurrence.state is State.ABSENT

    @invariant()
    def redis_agrees_with_the_model(self) -> None:
        for message_id in ALL_IDS:
            info = self.queue.get(message_id)
            ref = self.model.get(message_id)
            if ref is None:
                state, attempts = self.finished.get(message_id, (State.ABSENT, 0))
                assert (info.state, info.attempts) == (state, attempts), message_id
                continue
            assert (info.state, info.attempts, info.payload, info.priority) == (
                ref.state,
                ref.attempts,
                ref.payload,
                ref.priority,
            ), message_id
        # the priority index holds exactly the waiting messages of priority above 0
        indexed = set()
        for slot in self.topic.slots:
            key = slot_keys(self.topic, slot).key(Part.PRIORITY)
            members = cast("list[bytes]", self.client.zrange(key, 0, -1))
            indexed |= {member.decode() for member in members}
        waiting = {i for i, r in self.model.items() if r.state is State.SCHEDULED and r.priority}
        assert indexed == waiting
        stats = self.queue.stats()
        states = [r.state for r in self.model.values()]
        assert (stats.scheduled, stats.prepared, stats.dead) == (
            states.count(State.SCHEDULED) + len(self.schedules),
            states.count(State.PREPARED),
            states.count(State.DEAD),
        )


@pytest.mark.parametrize("exhausted", list(EndAction))
def test_engine_matches_reference_model(redis_client: redis.Redis, exhausted: EndAction) -> None:
    QueueMachine.client = redis_client
    QueueMachine.exhausted = exhausted
    machine = QueueMachine.TestCase
    machine.settings = settings(
        max_examples=100,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine().runTest()
