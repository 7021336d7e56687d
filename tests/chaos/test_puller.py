"""The pull consumers' bookkeeping (pure, no processes): an arrival's status is what the service
said of its ack, and an ack answered `lease_lost` after a failed request is settled by the
attempt the message's outcome remembers, never counted for a later attempt's ack."""

from __future__ import annotations

from .puller import Puller, acked_by
from .receiver import Arrival


def arrival(message_id: str, attempt: int = 1) -> Arrival:
    return Arrival(message_id, attempt, "c0", 1000.0, 1000, 900, 11_000)


def test_an_acks_answer_decides_its_arrivals_status() -> None:
    puller = Puller()
    first, second = arrival("m1"), arrival("m2")
    results = [{"id": "m1", "result": "acked"}, {"id": "m2", "result": "lease_lost"}]
    puller._settle([("t1", first), ("t2", second)], results, resent=False)
    assert (first.status, second.status) == (204, 409)
    assert puller.ambiguous == {}  # sent once: lease_lost is the truth


def test_a_lease_lost_after_a_failed_request_is_asked_again() -> None:
    puller = Puller()
    lost = arrival("m1")
    puller._settle([("t1", lost)], [{"id": "m1", "result": "lease_lost"}], resent=True)
    assert lost.status == 409
    assert puller.ambiguous == {"m1": lost}


def test_only_the_outcome_of_this_attempt_counts_as_its_ack() -> None:
    assert acked_by({"state": "done", "attempts": 1}, 1)
    assert not acked_by({"state": "done", "attempts": 2}, 1)  # a later lease's ack
    assert not acked_by({"state": "scheduled", "attempts": 1}, 1)  # comes again
    assert not acked_by({"state": "prepared", "attempts": 2}, 1)
    assert not acked_by({"state": "absent"}, 1)  # outcomes not remembered: not known
