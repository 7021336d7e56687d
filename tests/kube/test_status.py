"""Status patches: minimal, stable condition order, honest transition times and summary."""

from __future__ import annotations

from delayq.kube.status import (
    DEGRADED,
    FALSE,
    PROVISIONED,
    READY,
    TRUE,
    Condition,
    merge_conditions,
    observed_ready,
    ready_condition,
    status_patch,
)


def test_status_patch_is_empty_when_unchanged_and_minimal_otherwise() -> None:
    old = {"observedGeneration": 1, "depths": {"scheduled": 3}, "gone": 1}
    assert status_patch(old, dict(old)) == {}
    new = {"observedGeneration": 2, "depths": {"scheduled": 3}}
    assert status_patch(old, new) == {"observedGeneration": 2, "gone": None}


def test_transition_time_moves_only_when_status_flips() -> None:
    first = merge_conditions([], [Condition(READY, FALSE, "WaitingForBrokers", "m")], "t1", 1)
    same = merge_conditions(first, [Condition(READY, FALSE, "Other", "m2")], "t2", 1)
    assert same[0]["lastTransitionTime"] == "t1"
    assert same[0]["reason"] == "Other"
    flipped = merge_conditions(same, [Condition(READY, TRUE, "Serving", "m3")], "t3", 2)
    assert flipped[0]["lastTransitionTime"] == "t3"
    assert flipped[0]["observedGeneration"] == 2


def test_conditions_keep_a_stable_order() -> None:
    conditions = merge_conditions(
        [],
        [Condition(DEGRADED, FALSE, "A", "a"), Condition(READY, TRUE, "B", "b")],
        "t",
        None,
    )
    assert [c["type"] for c in conditions] == [READY, DEGRADED]
    assert "observedGeneration" not in conditions[0]


def test_ready_summary() -> None:
    ok = Condition(PROVISIONED, TRUE, "ResourcesApplied", "ok")
    healthy = Condition(DEGRADED, FALSE, "AllReplicasReady", "ok")
    sick = Condition(DEGRADED, TRUE, "Degraded", "broker 0 has 0/1 replicas ready.")
    assert ready_condition(ok, healthy, True).reason == "Serving"
    assert ready_condition(ok, healthy, False).status == FALSE
    assert ready_condition(ok, sick, True).reason == "ServingDegraded"
    invalid = Condition(PROVISIONED, FALSE, "InvalidSpec", "bad")
    assert ready_condition(invalid, healthy, True).reason == "InvalidSpec"
    refused = Condition(PROVISIONED, FALSE, "SlotAmountShrinkRejected", "not yet")
    summary = ready_condition(refused, healthy, True)
    assert (summary.status, summary.reason) == (TRUE, "ServingDegraded")
    assert "not yet" in summary.message


def test_ready_from_the_last_health_pass_observations() -> None:
    ok = Condition(PROVISIONED, TRUE, "ResourcesApplied", "ok")
    assert observed_ready({}, ok, 1).reason == "WaitingForBrokers"  # no pass has run yet
    degraded = {"type": DEGRADED, "status": TRUE, "reason": "Degraded", "message": "1/2 ready."}
    seen = {"brokers": [{"index": 0, "state": "Ready"}], "conditions": [degraded]}
    ready = observed_ready(seen, ok, 1)
    assert (ready.status, ready.reason) == (TRUE, "ServingDegraded")
    assert "1/2 ready." in ready.message
    # a broker the last pass did not see yet (brokers grew) has no master yet
    assert observed_ready(seen, ok, 2).reason == "BrokersUnavailable"
    down = {"brokers": [{"index": 0, "state": "Ready"}, {"index": 1, "state": "NoMaster"}]}
    assert observed_ready(down, ok, 2).reason == "BrokersUnavailable"


def test_a_null_inside_an_object_is_no_change_once_stored() -> None:
    """A merge patch's None deletes a nested key (status.routing's `doubledSlots` after a
    doubling): the stored status lacks it, and writing the same None again is no change."""
    stored = {"routing": {"slots": "0-15:0"}}
    assert status_patch(stored, {"routing": {"slots": "0-15:0", "doubledSlots": None}}) == {}
    changed = {"routing": {"slots": "0-15:0", "doubledSlots": "0-3"}}
    assert status_patch(stored, changed) == changed
