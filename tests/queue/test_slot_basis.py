"""The `basis` part (docs/contracts.md §1): an entry per message scheduled with a custom slot
basis, kept as long as its record or its remembered outcome, so that a doubling of the slots
places the message by that basis (`queue/slot_split.py`); nothing for a default-basis one."""

from __future__ import annotations

import redis

from delayq.queue import Queue
from delayq.queue.codes import Code
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Message, Mode
from delayq.queue.topic import EndAction

from .conftest import TOPIC, MakeQueue, server_ms, wait_for_server_ms

BASIS = "customer-7"
SLOT = TOPIC.slot_of(BASIS)
#: ids whose own slot is the basis's: scheduled without a basis they land in the same slot
OWN_IDS = [f"m{i}" for i in range(200) if TOPIC.slot_of(f"m{i}") == SLOT]


def bases(admin: redis.Redis) -> dict[bytes, bytes]:
    return admin.hgetall(slot_keys(TOPIC, SLOT).key(Part.BASIS))  # type: ignore[return-value]


def claim_all(queue: Queue) -> dict[str, Message]:
    batch = queue.claim(SLOT, queue.take_over(SLOT), 100, 60_000)
    return {message.id: message for message in batch.messages}


def test_only_a_custom_basis_is_recorded_and_a_replacement_without_one_deletes_it(
    queue: Queue, redis_client: redis.Redis
):
    first, second, third = OWN_IDS[:3]
    queue.schedule(first, b"p", delay_ms=60_000, slot_basis=BASIS)
    queue.schedule(second, b"p", delay_ms=60_000)
    queue.schedule(third, b"p", delay_ms=60_000, slot_basis=BASIS)
    assert bases(redis_client) == {first.encode(): BASIS.encode(), third.encode(): BASIS.encode()}
    # create-only leaves the live message (and its entry) as it is
    assert queue.schedule(first, b"p", delay_ms=0).code is Code.EXISTS
    # an upsert stores the message with the basis it names, or none
    assert queue.schedule(first, b"p", delay_ms=0, mode=Mode.UPSERT).code is Code.UPDATED
    assert bases(redis_client) == {third.encode(): BASIS.encode()}


def test_finishing_a_message_deletes_its_entry_and_a_dead_one_keeps_it(
    make_queue: MakeQueue, redis_client: redis.Redis
):
    """Without outcome retention: ack, cancel, purge and a drop (retries exhausted) delete
    the entry with the record; dead and redriven messages keep it."""
    queue = make_queue(max_retries=0, retry_exhausted_action=EndAction.DROP)
    acked, cancelled, dead, dropped, later = OWN_IDS[:5]
    for message_id in (acked, dead, dropped):
        queue.schedule(message_id, b"p", delay_ms=0, slot_basis=BASIS)
    for message_id in (cancelled, later):
        queue.schedule(message_id, b"p", delay_ms=60_000, slot_basis=BASIS)
    leased = claim_all(queue)
    assert queue.ack(leased[acked].lease).code is Code.ACKED
    assert queue.nack(leased[dead].lease, dead=True).code is Code.DEAD
    assert queue.nack(leased[dropped].lease).code is Code.DROPPED
    assert queue.cancel(cancelled, BASIS).code is Code.CANCELLED
    assert set(bases(redis_client)) == {dead.encode(), later.encode()}
    assert [o.code for o in queue.redrive(SLOT, [dead])] == [Code.REDRIVEN]
    assert set(bases(redis_client)) == {dead.encode(), later.encode()}
    assert queue.nack(claim_all(queue)[dead].lease, dead=True).code is Code.DEAD
    assert [o.code for o in queue.purge(SLOT, [dead])] == [Code.PURGED]
    assert bases(redis_client) == {later.encode(): BASIS.encode()}


def test_with_outcome_retention_the_entry_goes_with_the_outcome(
    make_queue: MakeQueue, redis_client: redis.Redis
):
    """The entry of a finished message stays while its outcome does (a doubling moves the
    outcome by it, so a create-only resend stays ALREADY_DONE), and is forgotten with it, unless
    the id was scheduled again since: then the entry is the new message's."""
    queue = make_queue(outcome_retention_ms=200)
    finished, again, trigger = OWN_IDS[:3]
    for message_id in (finished, again):
        queue.schedule(message_id, b"p", delay_ms=0, slot_basis=BASIS)
    for message in claim_all(queue).values():
        queue.ack(message.lease)
    finished_ms = server_ms(redis_client)
    assert set(bases(redis_client)) == {finished.encode(), again.encode()}
    assert queue.schedule(finished, b"p", delay_ms=0, slot_basis=BASIS).code is Code.ALREADY_DONE

    wait_for_server_ms(redis_client, finished_ms + 200)
    assert queue.schedule(again, b"p", delay_ms=60_000, slot_basis=BASIS).code is Code.CREATED
    queue.schedule(trigger, b"p", delay_ms=0)
    queue.ack(claim_all(queue)[trigger].lease)  # a finish trims the outcomes past retention
    assert bases(redis_client) == {again.encode(): BASIS.encode()}
    assert queue.get(finished, BASIS).state.value == "absent"
    assert queue.get(again, BASIS).state.value == "scheduled"
