"""A batch over several slots is one call per broker (schedulemany-1) and answers every item
exactly as one schedule-10 call per slot did: compared on random mixed batches (new ids, ids
that exist or finished, slots over their quota share, a slot being moved, expiry before due, due
too far, ids with a slot basis entry, slots tracked for a doubling) from the same starting
state, item by item and in what each path stored and noted."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from delayq.local.redis_server import RedisServer
from delayq.queue import Recurrence, Schedule, consume_plans, plans, produce_plans, slot_split
from delayq.queue.client import Queue
from delayq.queue.codes import Code, SlotMovingError, StaleEpochError
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import (
    ClaimBatch,
    Lease,
    Mode,
    PartlyStoredError,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    SlotClaim,
    State,
)
from delayq.queue.schedules import occurrence_id
from delayq.queue.scripts import Script
from delayq.queue.topic import MAX_DELAY_MS

from .conftest import (
    ENGINE_PASSWORD,
    ENGINE_USER,
    TOPIC,
    engine_client,
    engine_user,
    server_ms,
    wait_for_server_ms,
)

HOUR_MS = 3_600_000
IDS = [f"id{n}" for n in range(12)]  # ~3 per slot of the 4
Answer = ScheduleResult | ScheduleFailure


@dataclasses.dataclass(frozen=True)
class Case:
    """A starting state and a batch: ids scheduled and ids cancelled before (remembered), those
    of them scheduled with a slot basis (an entry in `basis`), the slots frozen, the slots
    tracked for a doubling, each slot's quota share (0: none), the mode, and the batch's items
    as (id, kind) with kind 'ok', 'based' (with a slot basis), 'too far' or 'expires before
    due'."""

    existing: frozenset[str]
    cancelled: frozenset[str]
    based: frozenset[str]
    frozen: frozenset[int]
    tracked: frozenset[int]
    share: int
    mode: Mode
    items: tuple[tuple[str, str], ...]


CASES = st.builds(
    Case,
    existing=st.frozensets(st.sampled_from(IDS)),
    cancelled=st.frozensets(st.sampled_from(IDS)),
    based=st.frozensets(st.sampled_from(IDS), max_size=3),
    frozen=st.frozensets(st.sampled_from(range(TOPIC.slot_amount)), max_size=2),
    tracked=st.frozensets(st.sampled_from(range(TOPIC.slot_amount)), max_size=2),
    share=st.integers(0, 3),
    mode=st.sampled_from(list(Mode)),
    items=st.lists(
        st.tuples(
            st.sampled_from(IDS), st.sampled_from(["ok", "ok", "based", "too far", "expires"])
        ),
        min_size=1,
        max_size=30,
    ).map(tuple),
)


#: Always tried: every id replaced in one call over every slot, one slot tracked, an entry in
#: `basis` for a live and a finished id, which a replacement without a basis deletes
EVERY_SLOT_UPSERTED = Case(
    existing=frozenset(IDS[:6]),
    cancelled=frozenset(IDS[6:7]),
    based=frozenset({IDS[0], IDS[6]}),
    frozen=frozenset(),
    tracked=frozenset({0}),
    share=0,
    mode=Mode.UPSERT,
    items=tuple((message_id, "ok") for message_id in IDS),
)


def requests_of(case: Case, base_ms: int) -> list[ScheduleRequest]:
    requests = []
    for n, (message_id, kind) in enumerate(case.items):
        at_ms = base_ms + HOUR_MS + n
        if kind == "too far":
            at_ms = base_ms + MAX_DELAY_MS + HOUR_MS
        expire = at_ms if kind == "expires" else None
        basis = message_id if kind == "based" else None  # its own slot, but an entry
        requests.append(
            ScheduleRequest(message_id, f"p{n}", at_ms=at_ms, slot_basis=basis, expire_at_ms=expire)
        )
    return requests


def prepared(admin: redis.Redis, queue: Queue, case: Case, base_ms: int) -> None:
    """The case's starting state, from an empty topic (the ids written before the quota and
    the tracking)."""
    keys = list(admin.scan_iter(match="dq:{shop/orders/*", count=1000))
    if keys:
        admin.delete(*keys)
    queue = Queue(queue.redis, dataclasses.replace(queue.topic, limits_max_pending=0))

    def old(message_id: str) -> None:
        basis = message_id if message_id in case.based else None
        queue.schedule(message_id, b"old", at_ms=base_ms + 2 * HOUR_MS, slot_basis=basis)

    for message_id in sorted(case.cancelled):
        old(message_id)
        queue.cancel(message_id)
    for message_id in sorted(case.existing - case.cancelled):
        old(message_id)
    for slot in sorted(case.tracked):
        slot_split.track(admin, slot_keys(queue.topic, slot))
    for slot in sorted(case.frozen):
        Queue(admin, queue.topic).run(consume_plans.freeze(queue.topic, slot))


def per_slot(queue: Queue, requests: list[ScheduleRequest], mode: Mode) -> list[Answer]:
    """The path before schedulemany: one schedule-10 call per slot."""
    by_slot: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        by_slot.setdefault(queue.topic.slot_of(request.id), []).append(index)
    answers: list[Answer | None] = [None] * len(requests)
    for slot, indexes in by_slot.items():
        plan = produce_plans.schedule_answers(queue.topic, [requests[i] for i in indexes], mode)
        assert [call.script for call in plan.calls] == [Script.SCHEDULE]
        try:
            got: list[Answer] = queue.run(plan)
        except SlotMovingError as error:
            got = [ScheduleFailure(requests[i].id, slot, error) for i in indexes]
        for index, answer in zip(indexes, got, strict=True):
            answers[index] = answer
    return [a for a in answers if a is not None]


def per_broker(queue: Queue, requests: list[ScheduleRequest], mode: Mode) -> list[Answer]:
    plan = produce_plans.schedule_answers(queue.topic, requests, mode)
    slots = {queue.topic.slot_of(r.id) for r in requests}
    assert [call.script for call in plan.calls] == [
        Script.SCHEDULE_MANY if len(slots) > 1 else Script.SCHEDULE
    ]
    try:
        return queue.run(plan)
    except SlotMovingError as error:  # one slot in the batch, refused as a whole
        return [ScheduleFailure(r.id, queue.topic.slot_of(r.id), error) for r in requests]


def comparable(answer: Answer) -> tuple[object, ...]:
    """The answer, but the time an id finished (ALREADY_DONE's due_ms: each run's own) and the
    place Redis appends to a script's error (" script: <function>, on @user_function:<line>."):
    schedulemany-1 answers a moving slot's refusal as a value, not as an error."""
    if isinstance(answer, ScheduleResult):
        finished = answer.code is Code.ALREADY_DONE
        return tuple(answer._replace(due_ms=0) if finished else answer)
    text = str(answer.error).split(" script: ", 1)[0]
    return (answer.id, answer.slot, type(answer.error), text)


def stored(admin: redis.Redis, queue: Queue, frozen: frozenset[int]) -> dict[str, object]:
    """What the topic holds for every id (a frozen slot's ids cannot be read: left out), and
    per slot its basis entries and the changes noted for a doubling."""
    found: dict[str, object] = {}
    for message_id in IDS:
        if queue.topic.slot_of(message_id) not in frozen:
            info = queue.get(message_id)
            found[message_id] = (info.state, info.due_ms, info.payload, info.expire_at_ms)
    for slot in queue.topic.slots:
        keys = slot_keys(queue.topic, slot)
        found[f"basis {slot}"] = admin.hgetall(keys.key(Part.BASIS))
        found[f"changes {slot}"] = admin.smembers(keys.key(Part.CHANGES))
    return found


def test_per_broker_calls_answer_and_store_as_per_slot_calls(
    redis_server: object, redis_client: redis.Redis
) -> None:
    client = engine_client(redis_server, redis_client)  # type: ignore[arg-type]
    topic = dataclasses.replace(TOPIC, outcome_retention_ms=HOUR_MS)

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(case=CASES)
    @example(case=EVERY_SLOT_UPSERTED)
    def check(case: Case) -> None:
        queue = Queue(client, dataclasses.replace(topic, limits_max_pending=4 * case.share))
        base_ms = server_ms(redis_client)
        requests = requests_of(case, base_ms)
        runs: list[tuple[list[Answer], dict[str, object]]] = []
        path: Callable[[Queue, list[ScheduleRequest], Mode], list[Answer]]
        for path in (per_slot, per_broker):
            prepared(redis_client, queue, case, base_ms)
            answers = path(queue, requests, case.mode)
            runs.append(([*answers], stored(redis_client, queue, case.frozen)))
        (old_answers, old_stored), (new_answers, new_stored) = runs
        assert [comparable(a) for a in new_answers] == [comparable(a) for a in old_answers]
        assert new_stored == old_stored
        moving = [a for a in new_answers if isinstance(a, ScheduleFailure)]
        assert all(isinstance(a.error, SlotMovingError) for a in moving)
        assert {a.slot for a in moving} == {r.slot for r in new_answers} & case.frozen

    try:
        check()
    finally:
        client.close()


def test_a_batch_of_several_slots_refuses_a_moving_slot_only(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """One call holds the three slots: the moving ones' items fail with their slot's
    SlotMovingError, the other's are stored (PartlyStoredError); a batch of moving slots only
    raises the first item's error, as one call per slot did."""
    by_slot = {TOPIC.slot_of(f"k{n}"): f"k{n}" for n in range(40)}
    (slot_a, id_a), (slot_b, id_b), (_, id_c) = sorted(by_slot.items())[:3]
    for slot in (slot_a, slot_b):
        Queue(redis_client, TOPIC).run(consume_plans.freeze(TOPIC, slot))
    batch = [ScheduleRequest(i, b"x", delay_ms=HOUR_MS) for i in (id_a, id_b, id_c)]
    redis_client.config_resetstat()
    with pytest.raises(PartlyStoredError) as caught:
        queue.schedule_many(batch)
    assert redis_client.info("commandstats")["cmdstat_fcall"]["calls"] == 1
    failures = caught.value.failures
    assert [(f.id, f.slot) for f in failures] == [(id_a, slot_a), (id_b, slot_b)]
    assert all(isinstance(f.error, SlotMovingError) for f in failures)
    assert f"{{shop/orders/{slot_b}}}:epoch is moving" in str(failures[1].error)
    assert queue.get(id_c).state is State.SCHEDULED
    with pytest.raises(SlotMovingError, match=f"{{shop/orders/{slot_a}}}:epoch"):
        queue.schedule_many(batch[:2])


def test_a_batch_of_several_slots_declares_each_slot_by_its_store_key(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """schedulemany-1 declares one key a slot, its store, and names the slot's other parts
    after it: ten a slot were most of a call's arguments at 1,024 slots (docs/benchmarks.md).
    A declared key that is not a slot's store key is refused before anything is written, the
    other slots of the call included."""
    batch = [ScheduleRequest(f"d{n}", b"x", delay_ms=HOUR_MS) for n in range(12)]
    slots = dict.fromkeys(TOPIC.slot_of(r.id) for r in batch)  # in the order they come
    (call,) = produce_plans.schedule_answers(TOPIC, batch, Mode.CREATE).calls
    assert call.script is Script.SCHEDULE_MANY
    assert call.keys == [slot_keys(TOPIC, slot).key(Part.STORE) for slot in slots]
    queue.schedule_many(batch)
    assert {queue.get(r.id).state for r in batch} == {State.SCHEDULED}

    again = [r._replace(id=f"e{r.id}") for r in batch]
    (call,) = produce_plans.schedule_answers(TOPIC, again, Mode.CREATE).calls
    bad = dataclasses.replace(call, keys=[*call.keys[:-1], slot_keys(TOPIC, 0).key(Part.MSG)])
    with pytest.raises(redis.ResponseError, match="not a slot store key"):
        queue.run(plans.Plan([bad], lambda replies: replies))
    assert {queue.get(r.id).state for r in again} == {State.ABSENT}


def test_claims_and_acks_of_several_slots_declare_each_slot_by_its_store_key(
    queue: Queue,
) -> None:
    """claimmany-1 and ackmany-1 declare one key a slot too, as schedulemany-1: thirteen and
    seven a slot were most of a call's bytes in a burst over 1,024 slots (docs/benchmarks.md).
    A declared key that is not a slot's store key is refused before anything is written: no
    message of the call is claimed, no lease of it acked, the other slots' included."""
    batch = [ScheduleRequest(f"k{n}", b"x", delay_ms=0) for n in range(12)]
    queue.schedule_many(batch)
    slots = sorted({TOPIC.slot_of(r.id) for r in batch})
    stores = [slot_keys(TOPIC, slot).key(Part.STORE) for slot in slots]
    claims = [SlotClaim(slot, queue.take_over(slot), 10) for slot in slots]

    def refused(call: plans.ScriptCall) -> None:
        bad = dataclasses.replace(call, keys=[*call.keys[:-1], call.keys[-1][: -len("store")]])
        with pytest.raises(redis.ResponseError, match="not a slot store key"):
            queue.run(plans.Plan([bad], lambda replies: replies))

    (call,) = consume_plans.claim_slots(TOPIC, claims, 60_000).calls
    assert (call.script, call.keys) == (Script.CLAIM_MANY, stores)
    refused(call)
    assert {queue.get(r.id).state for r in batch} == {State.SCHEDULED}
    leases = [m.lease for b in claimed_batches(queue, claims) for m in b.messages]
    assert sorted(lease.id for lease in leases) == sorted(r.id for r in batch)

    (call,) = consume_plans.ack(TOPIC, leases).calls
    assert (call.script, call.keys) == (Script.ACK_MANY, stores)
    refused(call)
    assert {queue.get(r.id).state for r in batch} == {State.PREPARED}
    assert {o.code for o in queue.run(consume_plans.ack(TOPIC, leases))} == {Code.ACKED}
    assert {queue.get(r.id).state for r in batch} == {State.ABSENT}  # no outcome retention


def test_a_due_beyond_the_exact_integers_is_stored_as_given(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """The scripts give Redis a whole due as integer text (printf's %d, cheaper than the
    "%.17g" Redis writes a Lua number with); a hostile raw call's due beyond the doubles' exact
    integers, which %d would turn into another number, goes as the number it is."""
    (call,) = produce_plans.schedule_answers(
        TOPIC, [ScheduleRequest("far-past", b"x", at_ms=1)], Mode.CREATE
    ).calls
    args = [*call.args]
    args[9] = "-1e300"  # the when_ms of the one message (schedule-10's ARGV[10])
    queue.run(plans.Plan([dataclasses.replace(call, args=args)], lambda replies: replies))
    store = slot_keys(TOPIC, TOPIC.slot_of("far-past")).key(Part.STORE)
    assert redis_client.zscore(store, "far-past") == -1e300


@pytest.fixture
def own_broker() -> Iterator[tuple[redis.Redis, Queue]]:
    """An admin client and the topic's restricted user (with a socket timeout) on a
    redis-server of the test's own: a script that loops forever fails the test and loses only
    that server."""
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        engine_user(admin)
        client = redis.Redis.from_url(
            server.url, username=ENGINE_USER, password=ENGINE_PASSWORD, socket_timeout=5
        )
        try:
            yield admin, Queue(client, TOPIC)
        finally:
            client.close()
            admin.close()


def test_a_raw_call_with_hostile_counts_is_refused_not_looped_forever(
    own_broker: tuple[redis.Redis, Queue],
) -> None:
    """Regression: schedule-10 and schedulemany-1 step through their messages by ARGV[7] (8,
    or 9 with priorities) and schedulemany-1 through its slots by their message counts. A raw
    FCALL of the topic's own Redis user (which may call the engine's functions but no code of
    its own, lest it block the broker: test_acl.py) with 0 values a message looped forever
    (Lua 5.1's `for` with a step of 0), and a huge count looped over absent arguments for
    hours, after the call's earlier slots were written (then not even FUNCTION KILL stops
    it). Each is refused before anything is written, and the broker answers at once."""
    admin, queue = own_broker
    slots = [TOPIC.slot_of(basis) for basis in ("a", "b")]
    assert slots[0] != slots[1]
    batch = [ScheduleRequest(f"m-{b}", b"x", delay_ms=0, slot_basis=b) for b in ("a", "b")]
    (one,) = produce_plans.schedule_answers(TOPIC, batch[:1], Mode.CREATE).calls
    (many,) = produce_plans.schedule_answers(TOPIC, batch, Mode.CREATE).calls
    assert (one.script, many.script) == (Script.SCHEDULE, Script.SCHEDULE_MANY)
    head = [*one.args[:6], 0]  # ARGV[7]: 0 values a message
    hostile = [
        dataclasses.replace(one, args=head),
        dataclasses.replace(many, keys=many.keys[:1], args=[*head, 0]),
        # slot a's message, then slot b's count far beyond the arguments there are
        dataclasses.replace(many, args=[*many.args[: 7 + 1 + 8], 10**12]),
    ]
    for call in hostile:
        with pytest.raises(redis.ResponseError, match=r"values a message|message count"):
            queue.run(plans.Plan([call], lambda replies: replies))
    assert admin.ping()
    assert admin.keys("dq:*") == [], "nothing written"


def test_a_raw_ack_call_with_a_count_past_its_arguments_is_refused(
    own_broker: tuple[redis.Redis, Queue],
) -> None:
    """Regression: ackmany-1 steps through its slots by their message counts; a raw call's
    count past its arguments looped over absent ones for hours (with a stale epoch, one answer
    each: the broker's memory), the call's earlier slots acked. Refused before anything is
    written: the first slot's lease is not acked."""
    admin, queue = own_broker
    batch = [ScheduleRequest(f"m-{b}", b"x", delay_ms=0, slot_basis=b) for b in ("a", "b")]
    queue.schedule_many(batch)
    leases = []
    for slot in (TOPIC.slot_of("a"), TOPIC.slot_of("b")):
        leases += [m.lease for m in queue.claim(slot, queue.take_over(slot), 10, 60_000).messages]
    assert [lease.id for lease in leases] == ["m-a", "m-b"]
    (call,) = consume_plans.ack(TOPIC, leases).calls
    assert call.script is Script.ACK_MANY
    hostile = dataclasses.replace(call, args=[*call.args[:-3], 10**12])  # slot b's count
    with pytest.raises(redis.ResponseError, match="message count"):
        queue.run(plans.Plan([hostile], lambda replies: replies))
    assert admin.ping()
    assert queue.get("m-a", slot_basis="a").state is State.PREPARED


@dataclasses.dataclass(frozen=True)
class ClaimCase:
    """Messages of each kind ('due', 'later', 'expired': its expiry passed, 'leased': claimed
    with a lease that ran out), the slots tracked for a doubling and per slot a claim:
    (max_count, stale: an older epoch)."""

    kinds: tuple[str, ...]
    tracked: frozenset[int]
    claims: tuple[tuple[int, bool], ...]


CLAIM_CASES = st.builds(
    ClaimCase,
    kinds=st.lists(
        st.sampled_from(["due", "later", "expired", "leased"]), min_size=1, max_size=24
    ).map(tuple),
    tracked=st.frozensets(st.sampled_from(range(TOPIC.slot_amount)), max_size=2),
    claims=st.lists(
        st.tuples(st.integers(0, 4), st.booleans()),
        min_size=TOPIC.slot_amount,
        max_size=TOPIC.slot_amount,
    ).map(tuple),
)


def claim_state(admin: redis.Redis, queue: Queue, case: ClaimCase, base_ms: int) -> list[SlotClaim]:
    """The case's slots, from an empty topic: its claims, under each slot's current epoch (or
    the one before: a newer owner)."""
    keys = list(admin.scan_iter(match="dq:{shop/orders/*", count=1000))
    if keys:
        admin.delete(*keys)
    ids = [f"c{n}-{kind}" for n, kind in enumerate(case.kinds)]
    for message_id, kind in zip(ids, case.kinds, strict=True):
        if kind == "leased":
            queue.schedule(message_id, b"l", at_ms=1_000)
    epochs = {slot: queue.take_over(slot) for slot in TOPIC.slots}
    for slot, epoch in epochs.items():
        queue.claim(slot, epoch, 100, 1)
    # every lease (1 ms from its claim) ran out: a bound taken before the claims was not that
    wait_for_server_ms(admin, server_ms(admin) + 2)
    for message_id, kind in zip(ids, case.kinds, strict=True):
        if kind == "due":
            queue.schedule(message_id, b"d", at_ms=1_000)
        elif kind == "later":
            queue.schedule(message_id, b"w", at_ms=base_ms + HOUR_MS)
        elif kind == "expired":
            queue.schedule(message_id, b"e", at_ms=1_000, expire_at_ms=2_000)
    for slot in sorted(case.tracked):
        slot_split.track(admin, slot_keys(TOPIC, slot))
    return [
        SlotClaim(slot, epochs[slot] - stale, count)
        for slot, (count, stale) in zip(TOPIC.slots, case.claims, strict=True)
    ]


def claimed_view(batch: ClaimBatch | StaleEpochError) -> tuple[object, ...]:
    """A slot's claim without what each run's own clock decides (now, lease deadlines, a
    rolled-back lease's retry time, the epochs: a take-over's epoch is a server time)."""
    if isinstance(batch, StaleEpochError):
        return ("stale",)
    messages = [
        (m.id, m.payload, m.headers, m.attempt, m.id.endswith("leased") or m.due_ms, m.lease_id)
        for m in batch.messages
    ]
    times = (batch.next_due_ms is None, batch.next_deadline_ms is None)
    return (batch.slot, times, messages, batch.topups_owed)


def test_one_claim_call_per_broker_claims_as_one_call_per_slot(
    redis_server: object, redis_client: redis.Redis
) -> None:
    """Each slot fenced by its own epoch (a stale one answers StaleEpochError, the others
    claim), expired leases rolled back, expired messages given up, each slot its own count."""
    client = engine_client(redis_server, redis_client)  # type: ignore[arg-type]
    queue = Queue(client, TOPIC)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(case=CLAIM_CASES)
    def check(case: ClaimCase) -> None:
        base_ms = server_ms(redis_client)
        claims = claim_state(redis_client, queue, case, base_ms)
        per_slot: list[ClaimBatch | StaleEpochError] = []
        for claim in claims:
            one = consume_plans.claim_slots(TOPIC, [claim], 60_000)
            assert [call.script for call in one.calls] == [Script.CLAIM]
            batches: list[ClaimBatch | StaleEpochError] = queue.run(one)
            per_slot += batches
        before = stored_claims(redis_client, queue, case)
        claims = claim_state(redis_client, queue, case, base_ms)
        plan = consume_plans.claim_slots(TOPIC, claims, 60_000)
        assert [call.script for call in plan.calls] == [Script.CLAIM_MANY]
        per_broker = queue.run(plan)
        assert [claimed_view(b) for b in per_broker] == [claimed_view(b) for b in per_slot]
        assert stored_claims(redis_client, queue, case) == before

    try:
        check()
    finally:
        client.close()


def stored_claims(admin: redis.Redis, queue: Queue, case: ClaimCase) -> list[object]:
    """Each message's state and attempts, and each slot's changes noted for a doubling."""
    infos = [queue.get(f"c{n}-{kind}") for n, kind in enumerate(case.kinds)]
    changes = [admin.smembers(slot_keys(TOPIC, slot).key(Part.CHANGES)) for slot in TOPIC.slots]
    return [*((info.state, info.attempts) for info in infos), *changes]


def test_a_call_finding_its_slots_untracked_does_not_hide_a_later_tracking(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """schedulemany-1 asks once whether any of its slots is tracked for a doubling; the
    library's calls share the wrapper that remembers it, so the next call must ask again: a
    slot tracked between two calls has the second call's writes noted, one slot or many."""
    batch = [ScheduleRequest(f"t{n}", b"x", delay_ms=HOUR_MS) for n in range(12)]
    assert len({TOPIC.slot_of(r.id) for r in batch}) == TOPIC.slot_amount
    queue.schedule_many(batch)  # every slot found untracked
    keys = slot_keys(TOPIC, TOPIC.slot_of("t0"))
    slot_split.track(redis_client, keys)
    queue.schedule("t0", b"y", delay_ms=HOUR_MS, mode=Mode.UPSERT)  # schedule-10
    assert redis_client.smembers(keys.key(Part.CHANGES)) == {b"", b"mt0"}
    queue.schedule_many([r._replace(payload=b"z") for r in batch], Mode.UPSERT)
    in_slot = {f"m{r.id}".encode() for r in batch if TOPIC.slot_of(r.id) == keys.slot}
    assert redis_client.smembers(keys.key(Part.CHANGES)) == {b""} | in_slot


def test_one_claim_call_per_broker_counts_the_top_ups_owed_in_each_slot(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """claimmany-1 asks once whether any slot owes a top-up: a slot whose schedule's
    occurrence it claims owes one from that claim on, in the same call, and a slot that owed
    one before still says so; the others owe none."""
    due_ms = queue.put_schedule(Schedule("tick", Recurrence(every_ms=200))).first_due_ms
    ticking = queue.get_schedule("tick").slot
    epochs = {slot: queue.take_over(slot) for slot in TOPIC.slots}
    wait_for_server_ms(redis_client, due_ms)
    claims = [SlotClaim(slot, epoch, 10) for slot, epoch in epochs.items()]
    owed = {slot: int(slot == ticking) for slot in TOPIC.slots}
    first = claimed_batches(queue, claims)
    assert {b.slot: b.topups_owed for b in first} == owed
    assert [m.id for m in first[ticking].messages] == [occurrence_id("tick", due_ms)]
    again = claimed_batches(queue, claims)  # not topped up meanwhile
    assert {b.slot: b.topups_owed for b in again} == owed


def claimed_batches(queue: Queue, claims: list[SlotClaim]) -> list[ClaimBatch]:
    """One claimmany-1 call's batches, none refused."""
    plan = consume_plans.claim_slots(TOPIC, claims, 60_000)
    assert [call.script for call in plan.calls] == [Script.CLAIM_MANY]
    batches: list[ClaimBatch | StaleEpochError] = queue.run(plan)
    assert all(isinstance(b, ClaimBatch) for b in batches)
    return cast(list[ClaimBatch], batches)


@dataclasses.dataclass(frozen=True)
class AckCase:
    """Leased messages (those in `based` scheduled with a slot basis), the outcome retention
    before the acks ('gone' ones remembered or not) and in them, the slots tracked for a
    doubling and acked under an older epoch, and the acks as (message number, kind) with kind
    'ok', 'lost' (another lease number) or 'gone' (acked before)."""

    messages: int
    based: frozenset[int]
    retention_before: bool
    retention: bool
    tracked: frozenset[int]
    stale: frozenset[int]
    acks: tuple[tuple[int, str], ...]


ACK_CASES = st.builds(
    AckCase,
    messages=st.just(12),
    based=st.frozensets(st.integers(0, 11), max_size=4),
    retention_before=st.booleans(),
    retention=st.booleans(),
    tracked=st.frozensets(st.sampled_from(range(TOPIC.slot_amount)), max_size=2),
    stale=st.frozensets(st.sampled_from(range(TOPIC.slot_amount)), max_size=2),
    acks=st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from(["ok", "ok", "lost", "gone"])),
        min_size=1,
        max_size=20,
    ).map(tuple),
)


#: Always tried: every message acked in one call over every slot, some with a basis entry
EVERY_LEASE_ACKED = AckCase(
    messages=12,
    based=frozenset({0, 5}),
    retention_before=False,
    retention=False,
    tracked=frozenset({1}),
    stale=frozenset(),
    acks=tuple((n, "ok") for n in range(12)),
)


def leased_state(admin: redis.Redis, queue: Queue, case: AckCase) -> list[Lease]:
    """The case's leases, from an empty topic: every message claimed, those acked 'gone'
    acked already; each ack's token (another lease number when 'lost', the slot's epoch before
    when the slot is stale)."""
    keys = list(admin.scan_iter(match="dq:{shop/orders/*", count=1000))
    if keys:
        admin.delete(*keys)
    for n in range(case.messages):
        queue.schedule(f"a{n}", b"p", at_ms=1_000, slot_basis=f"a{n}" if n in case.based else None)
    leases: dict[str, Lease] = {}
    for slot in TOPIC.slots:
        batch = queue.claim(slot, queue.take_over(slot), 100, 60_000)
        leases |= {m.id: Lease(slot, m.id, m.lease_id, m.epoch) for m in batch.messages}
    gone = {n for n, kind in case.acks if kind == "gone"}
    before = dataclasses.replace(TOPIC, outcome_retention_ms=HOUR_MS * case.retention_before)
    Queue(queue.redis, before).ack_many([leases[f"a{n}"] for n in sorted(gone)])
    for slot in sorted(case.tracked):
        slot_split.track(admin, slot_keys(TOPIC, slot))
    tokens = []
    for n, kind in case.acks:
        lease = leases[f"a{n}"]
        if kind == "lost":
            lease = lease._replace(lease_id=lease.lease_id + 1)
        if lease.slot in case.stale:
            lease = lease._replace(epoch=lease.epoch - 1)
        tokens.append(lease)
    return tokens


def acked_state(admin: redis.Redis, queue: Queue, case: AckCase) -> list[object]:
    """Each message's state, and per slot its basis entries, outcomes and changes noted."""
    found: list[object] = [queue.get(f"a{n}").state for n in range(case.messages)]
    for slot in TOPIC.slots:
        keys = slot_keys(TOPIC, slot)
        found += [admin.hgetall(keys.key(Part.BASIS)), admin.hkeys(keys.key(Part.OUTCOME))]
        found += [admin.smembers(keys.key(Part.CHANGES))]
    return found


def test_one_ack_call_per_broker_acks_as_one_call_per_slot(
    redis_server: object, redis_client: redis.Redis
) -> None:
    """ackmany-1 answers every lease and leaves every slot as one ack-7 call per slot and
    epoch did: a stale slot's acks refused, lost and repeated leases answered LEASE_LOST,
    basis entries and outcomes kept or dropped by the retention, changes noted."""
    client = engine_client(redis_server, redis_client)  # type: ignore[arg-type]

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(case=ACK_CASES)
    @example(case=EVERY_LEASE_ACKED)
    def check(case: AckCase) -> None:
        retention_ms = HOUR_MS if case.retention else 0
        queue = Queue(client, dataclasses.replace(TOPIC, outcome_retention_ms=retention_ms))
        runs: list[tuple[list[Code], list[object]]] = []
        tokens = leased_state(redis_client, queue, case)
        codes: list[Code] = []
        for slot in TOPIC.slots:  # one call per slot and epoch: ack-7
            mine = [t for t in tokens if t.slot == slot]
            if mine:
                plan = consume_plans.ack(queue.topic, mine)
                assert {call.script for call in plan.calls} == {Script.ACK}
                codes += [o.code for o in queue.run(plan)]
        order = sorted(range(len(tokens)), key=lambda i: tokens[i].slot)
        per_slot = [Code.ACKED] * len(tokens)
        for position, code in zip(order, codes, strict=True):
            per_slot[position] = code
        runs.append((per_slot, acked_state(redis_client, queue, case)))
        tokens = leased_state(redis_client, queue, case)
        plan = consume_plans.ack(queue.topic, tokens)
        several = len({(t.slot, t.epoch) for t in tokens}) > 1
        assert [call.script for call in plan.calls] == [Script.ACK_MANY if several else Script.ACK]
        runs.append(([o.code for o in queue.run(plan)], acked_state(redis_client, queue, case)))
        assert runs[1] == runs[0]
        if case == EVERY_LEASE_ACKED:
            assert set(runs[1][0]) == {Code.ACKED}

    try:
        check()
    finally:
        client.close()
