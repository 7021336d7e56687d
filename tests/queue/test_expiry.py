"""Message expiry, the retry window (`retry_for_ms`) and what happens at the end (dead or drop),
against a real redis-server on its clock.

A message past its expiry is never delivered: the claim gives it up instead (to dead with
reason `expired`, or dropped), and a nack whose retry would fall after it gives it up at once.
Retries end at max_retries or when the next attempt would fall after first attempt +
retry_for_ms; then the message goes to dead or is dropped, per the topic.
"""

from __future__ import annotations

import pytest

from delayq.queue import ExpiresBeforeDueError
from delayq.queue.backoff import Backoff
from delayq.queue.codes import Code
from delayq.queue.model import ScheduleRequest, State
from delayq.queue.topic import EndAction

from .conftest import MakeQueue, claim, server_ms, wait_for_server_ms

HOUR_MS = 3_600_000


def test_a_message_past_its_expiry_is_never_delivered_but_goes_to_dead(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    scheduled = queue.schedule("late", b"x", delay_ms=0, ttl_ms=50)
    info = queue.get("late")
    assert info.expire_at_ms == scheduled.due_ms + 50
    wait_for_server_ms(queue.redis, scheduled.due_ms + 50)
    assert claim(queue, "late") == []
    info = queue.get("late")
    assert (info.state, info.dead_reason, info.attempts) == (State.DEAD, "expired", 0)


def test_an_expired_message_is_dropped_and_remembered_when_the_topic_says_drop(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(expiry_action=EndAction.DROP, outcome_retention_ms=HOUR_MS)
    now = server_ms(queue.redis)
    queue.schedule("stale", b"x", at_ms=now - 10, expire_at_ms=now)
    wait_for_server_ms(queue.redis, now)
    assert claim(queue, "stale") == []
    assert queue.get("stale").state is State.EXPIRED
    assert queue.stats().dead == 0
    assert queue.schedule("stale", b"x", delay_ms=0).code is Code.ALREADY_DONE


def test_the_topic_default_applies_to_messages_without_their_own(make_queue: MakeQueue) -> None:
    queue = make_queue(expiry_ttl_ms=HOUR_MS)
    results = queue.schedule_many(
        [
            ScheduleRequest("default", b"", delay_ms=HOUR_MS),
            ScheduleRequest("own", b"", delay_ms=HOUR_MS, ttl_ms=5),
            ScheduleRequest("at", b"", at_ms=2**41, expire_at_ms=2**41 + 1),
        ]
    )
    default, own, at = (queue.get(r.id) for r in results)
    assert default.expire_at_ms == results[0].due_ms + HOUR_MS
    assert own.expire_at_ms == results[1].due_ms + 5
    assert at.expire_at_ms == 2**41 + 1


def test_the_largest_expiry_is_stored_exactly_and_the_message_delivered(
    make_queue: MakeQueue,
) -> None:
    """Regression: Lua writes a number of 15 digits or more as `4.5035996273705e+15`, which
    made the record of a message expiring at 2**52 (the largest expire_at_ms accepted)
    unreadable: every claim of its slot failed, so the slot stalled and the HTTP API answered
    500. Every instant is now written as an integer."""
    queue = make_queue()
    queue.schedule("far", b"x", delay_ms=0, expire_at_ms=2**52)
    assert queue.get("far").expire_at_ms == 2**52
    (leased,) = claim(queue, "far")
    assert leased.id == "far"


def test_an_expiry_not_after_the_due_time_is_refused(make_queue: MakeQueue) -> None:
    queue = make_queue()
    with pytest.raises(ExpiresBeforeDueError, match="'never': EXPIRES_BEFORE_DUE"):
        queue.schedule("never", b"", at_ms=2**41, expire_at_ms=2**41)
    [refused] = queue.schedule_many([ScheduleRequest("never", at_ms=2**41, expire_at_ms=2**41)])
    assert (refused.code, refused.state) == (Code.EXPIRES_BEFORE_DUE, State.ABSENT)  # per item
    assert queue.get("never").state is State.ABSENT


def test_a_retry_that_would_fall_after_the_expiry_gives_up_at_once(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.schedule("soon", b"", delay_ms=0, ttl_ms=60_000)
    [message] = claim(queue, "soon")
    outcome = queue.nack(message.lease, delay_ms=120_000, reason="receiver down")
    assert outcome.code is Code.DEAD
    assert queue.get("soon").dead_reason == "expired"


def test_retries_end_when_the_retry_window_is_over(make_queue: MakeQueue) -> None:
    queue = make_queue(max_retries=100, retry_for_ms=300)
    queue.schedule("flaky", b"", delay_ms=0)
    [first] = claim(queue, "flaky")
    assert first.attempt == 1
    assert queue.nack(first.lease, delay_ms=0).code is Code.RETRY_SCHEDULED
    [second] = claim(queue, "flaky")
    # the window counts from the first attempt's claim, not from this one
    assert queue.nack(second.lease, delay_ms=400, reason="HTTP 503").code is Code.DEAD
    info = queue.get("flaky")
    assert (info.state, info.attempts, info.dead_reason) == (State.DEAD, 2, "HTTP 503")


def test_a_lease_that_runs_out_is_not_retried_past_the_retry_window(
    make_queue: MakeQueue,
) -> None:
    """Regression: a lease that ran out was put back due after the retry backoff even when that
    fell after the window (the window was checked at the rollback's time, not the next
    attempt's), so a message went on being delivered after retry.for said retries ended."""
    queue = make_queue(max_retries=100, retry_for_ms=300)
    queue.schedule("slow", b"", delay_ms=0)
    slot = queue.topic.slot_of("slow")
    epoch = queue.take_over(slot)
    [first] = queue.claim(slot, epoch, 100, ack_timeout_ms=20).messages
    wait_for_server_ms(queue.redis, server_ms(queue.redis) + 21)
    backoff = Backoff(base_ms=1000, multiplier=2.0, max_ms=60_000)  # past the window's end
    assert queue.claim(slot, epoch, 100, backoff=backoff).messages == []
    info = queue.get("slow")
    assert (info.state, info.attempts) == (State.DEAD, 1), info
    assert info.dead_reason == "lease expired on attempt 1"
    assert first.attempt == 1


def test_exhausted_retries_are_dropped_when_the_topic_says_drop(make_queue: MakeQueue) -> None:
    queue = make_queue(
        max_retries=0, retry_exhausted_action=EndAction.DROP, outcome_retention_ms=HOUR_MS
    )
    queue.schedule("once", b"", delay_ms=0)
    [message] = claim(queue, "once")
    assert queue.nack(message.lease).code is Code.DROPPED
    assert (queue.get("once").state, queue.get("once").attempts) == (State.DROPPED, 1)

    # a lease that runs out on the last attempt is exhausted too
    queue.schedule("silent", b"", delay_ms=0)
    [leased] = claim(queue, "silent", ack_timeout_ms=1)
    wait_for_server_ms(queue.redis, server_ms(queue.redis) + 2)
    assert claim(queue, "silent") == []
    assert queue.get("silent").state is State.DROPPED

    # a poison message still goes to dead: the caller said so
    queue.schedule("poison", b"", delay_ms=0)
    [poison] = claim(queue, "poison")
    assert queue.nack(poison.lease, dead=True, reason="bad").code is Code.DEAD
    assert leased.id == "silent"


def test_a_redriven_message_starts_afresh_without_its_expiry(make_queue: MakeQueue) -> None:
    queue = make_queue(retry_for_ms=1)
    scheduled = queue.schedule("again", b"", delay_ms=0, ttl_ms=20)
    wait_for_server_ms(queue.redis, scheduled.due_ms + 20)
    assert claim(queue, "again") == []
    assert queue.redrive(queue.topic.slot_of("again"), ["again"])[0].code is Code.REDRIVEN
    assert queue.get("again").expire_at_ms is None
    [message] = claim(queue, "again")
    assert message.attempt == 1
