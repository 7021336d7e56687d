"""The health pass's typed status (kube/topic_health.py, pure): the fields it patches."""

from __future__ import annotations

import dataclasses

from delayq.kube.routing_record import RECORD_FIELD
from delayq.kube.status import DEGRADED, FALSE, TRUE, Condition
from delayq.kube.topic_health import (
    BrokerStatus,
    SlotCounts,
    TopicHealth,
    degradations,
    degraded_condition,
)
from delayq.queue import TopicStats

READY = BrokerStatus(0, "Ready", "orders-redis-0-0", 1, 1, 4)
ELECTING = BrokerStatus(1, "MasterMissing", "", 0, 1, 4, last_failover_time="t1", paused=False)


def test_a_broker_entry_names_only_what_it_knows() -> None:
    assert READY.to_status() == {
        "index": 0,
        "state": "Ready",
        "masterPod": "orders-redis-0-0",
        "replicasReady": 1,
        "replicasDesired": 1,
        "slots": 4,
    }
    entry = ELECTING.with_slots(8).to_status()
    assert (entry["slots"], entry["lastFailoverTime"], entry["paused"]) == (8, "t1", False)
    assert "lastSwitchoverTime" not in entry
    assert READY.serving
    assert not ELECTING.serving


def test_fields_set_resharding_and_the_routing_copy_only_when_the_pass_reports_them() -> None:
    health = TopicHealth(8, (READY, ELECTING), TopicStats([]), ())
    fields = health.fields()
    assert fields["paused"] is False
    assert fields["depths"] == {"scheduled": 0, "prepared": 0, "dead": 0}
    assert not {"resharding", RECORD_FIELD, "slots"} & fields.keys()
    # a doubling reports a condition without progress: the old progress is removed (null)
    told = TopicHealth(8, (READY,), TopicStats([]), (), resharding_reported=True)
    assert told.fields()["resharding"] is None
    moved = TopicHealth(
        8,
        (dataclasses.replace(READY, paused=True),),
        TopicStats([]),
        (),
        resharding_reported=True,
        resharding={"moved": 2, "total": 4},
        routing_record={"slots": "0-7:0"},
        slots=SlotCounts(8, 6),
    )
    fields = moved.fields()
    assert fields["resharding"] == {"moved": 2, "total": 4}
    assert fields[RECORD_FIELD] == {"slots": "0-7:0"}
    assert fields["slots"] == {"total": 8, "owned": 6, "unowned": 2}
    assert fields["paused"] is True


def test_degradations_name_each_shortfall() -> None:
    problems = degradations([READY, ELECTING], 1, 2, SlotCounts(8, 6))
    assert problems == [
        "broker 1 has 0/1 replicas ready",
        "1/2 delay-service pods ready",
        "2 of 8 slots have no owner",
    ]
    assert degraded_condition(problems, zookeeper_unreachable=False) == Condition(
        DEGRADED, TRUE, "Degraded", "; ".join(problems) + "."
    )
    assert degraded_condition([], zookeeper_unreachable=False).status == FALSE
