"""A topic's quota, `limits_max_pending`, against a real redis-server: each slot holds its
share, refused atomically in the schedule script."""

from __future__ import annotations

import pytest

from delayq.queue import OverQuotaError
from delayq.queue.codes import Code
from delayq.queue.model import Mode, ScheduleRequest, State

from .conftest import MakeQueue, claim


def test_limits_max_pending_refuses_new_messages_beyond_the_slot_share(
    make_queue: MakeQueue,
) -> None:
    """limits.maxPending 8 over 4 slots: 2 per slot. New ids beyond the share are refused
    (nothing stored), a replacement of a live one is not, and a delivery makes room."""
    queue = make_queue(limits_max_pending=8)
    assert queue.topic.max_pending_per_slot == 2
    slot = queue.topic.slot_of("q0")
    same_slot = [i for i in (f"q{n}" for n in range(200)) if queue.topic.slot_of(i) == slot][:4]
    results = queue.schedule_many([ScheduleRequest(i, b"", delay_ms=0) for i in same_slot])
    assert [r.code for r in results] == [Code.CREATED] * 2 + [Code.OVER_QUOTA] * 2
    assert queue.get(same_slot[2]).state is State.ABSENT
    replaced = queue.schedule(same_slot[0], b"new", delay_ms=0, mode=Mode.UPSERT)
    assert replaced.code is Code.UPDATED
    [message] = claim(queue, same_slot[0])  # in flight still counts
    with pytest.raises(OverQuotaError, match=f"{same_slot[2]!r}: OVER_QUOTA"):
        queue.schedule(same_slot[2], b"", delay_ms=0)  # a refusal is raised, not returned
    assert queue.get(same_slot[2]).state is State.ABSENT
    queue.ack(message.lease)  # delivered: room for one
    assert queue.schedule(same_slot[2], b"", delay_ms=0).code is Code.CREATED
