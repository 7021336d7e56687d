"""Recurring schedules on a real redis-server: the series survives failures, crashes, downtime."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue import (
    AsyncQueue,
    CatchUp,
    Code,
    Message,
    NotFoundError,
    Queue,
    Recurrence,
    Schedule,
    State,
    occurrence_target,
)
from delayq.queue.keys import Part, slot_keys
from delayq.queue.schedules import occurrence_id

from .conftest import ENGINE_PASSWORD, ENGINE_USER, TOPIC, server_ms, wait_for_server_ms
from .consumer_support import running

EVERY_MS = 200


def due_of(message_id: str) -> int:
    return int(message_id.rsplit("@", 1)[1])


def drain(queue: Queue, slot: int, epoch: int, client: redis.Redis) -> list[str]:
    """Claim, ack and top up the slot until nothing of it is due: what a consumer would deliver."""
    delivered: list[str] = []
    for _ in range(50):
        batch = queue.claim(slot, epoch)
        delivered += [m.id for m in batch.messages]
        queue.ack_many(batch.messages)
        queue.top_up_schedules(slot)
        if not batch.messages and not batch.topups_owed:
            head = queue.stats([slot]).slots[0].next_due_ms
            if head is None or head > server_ms(client):
                return delivered
    raise AssertionError(f"the slot never settled: {delivered}")


def test_put_materialises_the_first_occurrence_and_precomputes_the_second(queue: Queue) -> None:
    result = queue.put_schedule(Schedule("tick", Recurrence(every_ms=EVERY_MS), payload="p"))
    assert result.code is Code.CREATED
    info = queue.get_schedule("tick")
    assert (info.current_due_ms, info.next_due_ms) == (
        result.first_due_ms,
        result.first_due_ms + EVERY_MS,
    )
    assert info.waiting
    assert not info.ended
    occurrence = queue.get(occurrence_id("tick", result.first_due_ms), slot_basis="tick")
    assert (occurrence.state, occurrence.due_ms, occurrence.payload) == (
        State.SCHEDULED,
        result.first_due_ms,
        b"p",
    )
    assert [i.schedule.id for i in queue.list_schedules()] == ["tick"]


def test_replace_and_delete_take_the_waiting_occurrence_with_them(queue: Queue) -> None:
    first = queue.put_schedule(Schedule("tick", Recurrence(every_ms=60_000)))
    replaced = queue.put_schedule(Schedule("tick", Recurrence(every_ms=30_000), payload="v2"))
    assert replaced.code is Code.UPDATED
    assert queue.get_many([occurrence_target("tick", first.first_due_ms)])[0].state is State.ABSENT
    waiting = occurrence_target("tick", replaced.first_due_ms)
    assert queue.get_many([waiting])[0].payload == b"v2"
    assert queue.delete_schedule("tick").code is Code.CANCELLED
    assert queue.get_many([waiting])[0].state is State.ABSENT
    with pytest.raises(NotFoundError, match=r"^get: schedule 'tick': NOT_FOUND$"):
        queue.get_schedule("tick")
    with pytest.raises(NotFoundError, match=r"^delete: schedule 'tick': NOT_FOUND$"):
        queue.delete_schedule("tick")  # the API's words, not the script's (drop-7)


def test_the_claim_materialises_the_next_occurrence_before_delivering(
    queue: Queue, redis_client: redis.Redis
) -> None:
    first = queue.put_schedule(Schedule("tick", Recurrence(every_ms=EVERY_MS))).first_due_ms
    slot = queue.get_schedule("tick").slot
    epoch = queue.take_over(slot)
    wait_for_server_ms(redis_client, first)
    batch = queue.claim(slot, epoch)
    assert [m.id for m in batch.messages] == [occurrence_id("tick", first)]
    assert batch.topups_owed == 1
    # in the same script: the next occurrence is scheduled before anyone sees the current one
    info = queue.get_schedule("tick")
    assert (info.current_due_ms, info.next_due_ms, info.waiting) == (first + EVERY_MS, None, True)
    assert queue.top_up_schedules(slot) == 1
    assert queue.get_schedule("tick").next_due_ms == first + 2 * EVERY_MS
    assert queue.top_up_schedules(slot) == 0  # nothing owed: a no-op


async def test_a_consumer_delivers_an_every_n_series_on_time(async_queue: AsyncQueue) -> None:
    seen: list[tuple[str, int]] = []

    async def handler(message: Message) -> None:
        seconds, micros = await async_queue.redis.time()
        seen.append((message.id, int(seconds) * 1000 + int(micros) // 1000))

    first = (
        await async_queue.put_schedule(Schedule("tick", Recurrence(every_ms=EVERY_MS)))
    ).first_due_ms
    async with running(async_queue, handler) as consumer:
        await eventually(lambda: len(seen) >= 6, 10, "six occurrences")
        await eventually(
            lambda: consumer.counters.schedules_topped_up >= 6, 10, "six top-ups counted"
        )
    ids = [message_id for message_id, _ in seen[:6]]
    assert ids == [occurrence_id("tick", first + k * EVERY_MS) for k in range(6)]
    lateness = [at - due_of(message_id) for message_id, at in seen[:6]]
    assert min(lateness) >= 0  # never early (on the Redis clock)
    assert max(lateness) < 500, lateness


async def test_a_failing_handler_does_not_stop_the_series(async_queue: AsyncQueue) -> None:
    first_attempts: list[str] = []

    async def handler(message: Message) -> None:
        if message.attempt == 1:
            first_attempts.append(message.id)
        raise RuntimeError("the handler always fails")

    first = (
        await async_queue.put_schedule(Schedule("tick", Recurrence(every_ms=EVERY_MS)))
    ).first_due_ms
    async with running(async_queue, handler):
        await eventually(lambda: len(first_attempts) >= 4, 10, "four occurrences")
    assert first_attempts[:4] == [occurrence_id("tick", first + k * EVERY_MS) for k in range(4)]


CLAIM_AND_DIE = """
    import os, sys, redis
    from delayq.queue import Queue, Topic
    topic = Topic("orders", namespace="shop", slot_amount=4, max_retries=2)
    client = redis.Redis.from_url(sys.argv[1], username=sys.argv[3], password=sys.argv[4])
    queue = Queue(client, topic)
    slot, due = int(sys.argv[2]), int(sys.argv[5])
    epoch = queue.take_over(slot)
    while True:  # wait for the first occurrence on the server clock (startup takes a while)
        seconds, micros = queue.redis.time()
        if seconds * 1000 + micros // 1000 >= due:
            break
    batch = queue.claim(slot, epoch, ack_timeout_ms=300)
    print(len(batch.messages), batch.topups_owed, flush=True)
    os.kill(os.getpid(), 9)  # between the claim and the top-up
"""


async def test_a_crash_between_claim_and_top_up_is_healed_by_the_next_owner(
    async_queue: AsyncQueue, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    start = server_ms(redis_client) + 3_000  # the crashing process starts in time for it
    schedule = Schedule("tick", Recurrence(every_ms=EVERY_MS, start_ms=start))
    first = (await async_queue.put_schedule(schedule)).first_due_ms
    slot = (await async_queue.get_schedule("tick")).slot
    died = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(CLAIM_AND_DIE),
            redis_server.url,
            str(slot),
            ENGINE_USER,
            ENGINE_PASSWORD,
            str(first),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert died.returncode == -9, died.stderr
    assert died.stdout.split() == ["1", "1"]  # claimed the first, one top-up owed
    info = await async_queue.get_schedule("tick")
    # the crash lost the top-up, not the series: the second occurrence exists already
    assert (info.current_due_ms, info.next_due_ms, info.waiting) == (first + EVERY_MS, None, True)

    seen: list[Message] = []

    async def handler(message: Message) -> None:
        seen.append(message)

    async with running(async_queue, handler):
        await eventually(lambda: len({m.id for m in seen}) >= 4, 10, "the series going on")
    on_time = [m.id for m in seen if m.attempt == 1]
    assert on_time[:3] == [occurrence_id("tick", first + k * EVERY_MS) for k in (1, 2, 3)]
    assert occurrence_id("tick", first) in {m.id for m in seen}  # its lease expired: redelivered
    assert len(on_time) == len(set(on_time))  # nothing doubled


@pytest.mark.parametrize("catch_up", list(CatchUp))
def test_catch_up_after_a_downtime(
    queue: Queue, redis_client: redis.Redis, catch_up: CatchUp
) -> None:
    schedule = Schedule("tick", Recurrence(every_ms=EVERY_MS), catch_up=catch_up, catch_up_max=3)
    first = queue.put_schedule(schedule).first_due_ms
    slot = queue.get_schedule("tick").slot
    epoch = queue.take_over(slot)
    wait_for_server_ms(redis_client, first + 10 * EVERY_MS)  # nobody claims: ten missed
    delivered = drain(queue, slot, epoch, redis_client)
    resumed = queue.get_schedule("tick")
    now = server_ms(redis_client)
    # the series resumes on its grid, after now, with its successor precomputed
    assert resumed.waiting
    assert resumed.current_due_ms > now - EVERY_MS
    assert (resumed.current_due_ms - first) % EVERY_MS == 0
    assert resumed.next_due_ms == resumed.current_due_ms + EVERY_MS
    dues = [due_of(i) for i in delivered]
    assert dues == sorted(set(dues))  # none doubled, in order
    if catch_up is CatchUp.SKIP:
        assert delivered == []
    elif catch_up is CatchUp.ONCE:
        assert delivered == [occurrence_id("tick", first)]
    else:
        # the waiting one, its precomputed successor, then the 3 latest missed ones
        assert dues[:2] == [first, first + EVERY_MS]
        assert 3 <= len(dues) - 2 <= 4
        assert dues[-3:] == [dues[-1] - 2 * EVERY_MS, dues[-1] - EVERY_MS, dues[-1]]
        assert dues[-1] + EVERY_MS >= resumed.current_due_ms


def test_a_cron_schedule_fires_on_its_instants(queue: Queue, redis_client: redis.Redis) -> None:
    cron = Recurrence(cron="* * * * * *", time_zone="Europe/Berlin")  # every second
    first = queue.put_schedule(Schedule("second", cron)).first_due_ms
    assert first % 1000 == 0
    assert first > server_ms(redis_client)
    slot = queue.get_schedule("second").slot
    epoch = queue.take_over(slot)
    wait_for_server_ms(redis_client, first)
    assert drain(queue, slot, epoch, redis_client) == [occurrence_id("second", first)]
    assert queue.get_schedule("second").next_due_ms == first + 2000


async def test_the_async_client_has_the_same_schedule_operations(async_queue: AsyncQueue) -> None:
    cron = Recurrence(cron="0 9 * * 1-5", time_zone="Europe/Berlin")
    created = await async_queue.put_schedule(Schedule("report", cron, headers={"kind": "r"}))
    assert created.code is Code.CREATED
    [listed] = await async_queue.list_schedules()
    assert (listed.schedule.recurrence, listed.current_due_ms) == (cron, created.first_due_ms)
    waiting = await async_queue.get_many([occurrence_target("report", created.first_due_ms)])
    assert (waiting[0].state, waiting[0].headers) == (State.SCHEDULED, {"kind": "r"})
    assert await async_queue.top_up_schedules(listed.slot) == 0  # nothing owed yet
    assert (await async_queue.delete_schedule("report")).code is Code.CANCELLED
    assert await async_queue.list_schedules() == []
    with pytest.raises(NotFoundError):
        await async_queue.get_schedule("report")


def test_a_missed_occurrence_retried_before_its_top_up_does_not_hold_the_series(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """`once`: the claim of a missed occurrence materialises nothing (the top-up resumes after
    now). When its handler fails first, the retry waits in the store again: it is not the
    unclaimed occurrence the series waits for, so the top-up still moves the series on."""
    first = queue.put_schedule(Schedule("tick", Recurrence(every_ms=EVERY_MS))).first_due_ms
    slot = queue.get_schedule("tick").slot
    epoch = queue.take_over(slot)
    wait_for_server_ms(redis_client, first + 2 * EVERY_MS)
    [missed] = queue.claim(slot, epoch).messages
    queue.nack(missed.lease, delay_ms=3_600_000)  # before the top-up
    assert queue.get_schedule("tick").waiting is False
    queue.top_up_schedules(slot)
    resumed = queue.get_schedule("tick")
    assert resumed.current_due_ms > first + 2 * EVERY_MS
    assert resumed.waiting
    assert resumed.next_due_ms == resumed.current_due_ms + EVERY_MS
    assert queue.get(missed.id, slot_basis="tick").attempts == 1  # its retry goes on apart


async def test_cancelling_the_waiting_occurrence_skips_just_that_one(
    async_queue: AsyncQueue,
) -> None:
    schedule = Schedule("tick", Recurrence(every_ms=EVERY_MS))
    first = (await async_queue.put_schedule(schedule)).first_due_ms
    cancelled = await async_queue.cancel_many([occurrence_target("tick", first)])
    assert cancelled[0].code is Code.CANCELLED
    owed = await async_queue.get_schedule("tick")
    assert (owed.current_due_ms, owed.next_due_ms, owed.waiting) == (first, None, False)
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(message.id)

    # the cancel woke the slot: the consumer's first claim reports the top-up and runs it
    async with running(async_queue, handler):
        await eventually(lambda: len(seen) >= 3, 10, "the series going on")
    assert seen[:3] == [occurrence_id("tick", first + k * EVERY_MS) for k in (1, 2, 3)]


def test_a_first_occurrence_a_millisecond_away_is_still_ahead_when_stored(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """The first occurrence is computed with a margin over the server's now: even every 1 ms,
    it is still in the future when define-9 checks it after the round trip."""
    before = server_ms(redis_client)
    result = queue.put_schedule(Schedule("fast", Recurrence(every_ms=1)))
    assert result.code is Code.CREATED
    assert result.first_due_ms > before + 100


def test_occurrences_carry_the_schedules_priority_and_group_and_are_indexed_by_them(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Each occurrence, the first (put) and the ones the claims materialise, is a message of
    the schedule's priority and group: it says so when delivered and enters the slot's priority
    index and group round, so it goes before a plain message due earlier (the claim's priority
    pass) and takes its group's turn."""
    series = Schedule("urgent", Recurrence(every_ms=EVERY_MS), priority=7, group="tenant:9")
    first = queue.put_schedule(series).first_due_ms
    info = queue.get_schedule("urgent")
    assert (info.schedule.priority, info.schedule.group) == (7, "tenant:9")
    slot = info.slot
    queue.schedule("plain", at_ms=first - 100, slot_basis="urgent")
    keys = slot_keys(TOPIC, slot)
    epoch = queue.take_over(slot)
    wait_for_server_ms(redis_client, first)
    [message] = queue.claim(slot, epoch, 1).messages
    assert (message.id, message.priority, message.group) == (
        occurrence_id("urgent", first),
        7,
        "tenant:9",
    )
    second = occurrence_id("urgent", first + EVERY_MS)  # the claim materialised it
    waiting = queue.get(second, slot_basis="urgent")
    assert (waiting.state, waiting.priority, waiting.group) == (State.SCHEDULED, 7, "tenant:9")
    assert redis_client.zrange(keys.key(Part.PRIORITY), 0, -1) == [second.encode()]
    grouped: list[bytes] = redis_client.zrange(keys.key(Part.GROUP_WAIT), 0, -1)  # type: ignore[assignment]
    assert grouped[0].startswith(b"tenant:9\0")
    assert grouped == [grouped[0]]
    assert grouped[0].endswith(b"\0" + second.encode())
