"""Failover decisions (pure): who is master, when to promote, whom to fence."""

from __future__ import annotations

from delayq.kube.failover import RedisPod, decide

NOW = 1000.0
GRACE = 30.0


def pod(
    ordinal: int,
    *,
    ready: bool = True,
    master: bool = False,
    role: str | None = "slave",
    offset: int = 0,
    keys: int = 0,
    terminating: bool = False,
    link_up: bool = True,
    synced: bool = True,
    beside: bool = False,
) -> RedisPod:
    return RedisPod(
        f"t-redis-0-{ordinal}",
        ordinal,
        ready,
        master,
        role,
        offset,
        keys,
        terminating,
        link_up,
        synced,
        beside_service=beside,
    )


def test_healthy_master_stays_and_nothing_happens() -> None:
    decision = decide([pod(0, master=True, role="master"), pod(1)], NOW, GRACE, None, True)
    assert decision.master == "t-redis-0-0"
    assert (decision.promote, decision.demote) == (None, ())
    assert decision.reason == "MasterReady"
    assert decision.missing_since is None


def test_fresh_broker_elects_at_once_without_grace() -> None:
    decision = decide([pod(0), pod(1)], NOW, GRACE, None, had_master=False)
    assert decision.promote == "t-redis-0-0"  # equal offsets: the lowest ordinal
    assert decision.reason == "MasterElected"
    assert not decision.failover


def test_a_fresh_broker_elects_the_pod_beside_its_service_pod() -> None:
    """The scheduler may put either pod on the service pod's node (one template, started
    together): the election, not the ordinal, makes that one the master."""
    decision = decide([pod(0), pod(1, beside=True), pod(2)], NOW, GRACE, None, had_master=False)
    assert (decision.promote, decision.reason) == ("t-redis-0-1", "MasterElected")


def test_a_fresh_broker_waits_for_the_pod_beside_its_service_pod_at_most_the_grace() -> None:
    pods = [pod(0), pod(1, beside=True, ready=False)]
    first = decide(pods, NOW, GRACE, None, had_master=False)
    assert (first.master, first.promote) == (None, None)
    assert (first.reason, first.missing_since) == ("WaitingForPodBesideService", NOW)
    assert "t-redis-0-1" in first.message
    # ready but not answering yet: still awaited
    answering = [pod(0), pod(1, beside=True, role=None)]
    assert decide(answering, NOW + 1, GRACE, NOW, False).promote is None
    ready = decide([pod(0), pod(1, beside=True)], NOW + 1, GRACE, NOW, False)
    assert (ready.promote, ready.missing_since) == ("t-redis-0-1", None)
    # the wait is bounded: then any ready pod
    late = decide(pods, NOW + GRACE, GRACE, NOW, had_master=False)
    assert (late.promote, late.reason) == ("t-redis-0-0", "MasterElected")
    # a stopping pod beside the service pod is not awaited
    stopping = [pod(0), pod(1, beside=True, ready=False, terminating=True)]
    assert decide(stopping, NOW, GRACE, None, had_master=False).promote == "t-redis-0-0"


def test_a_failover_puts_data_before_the_pod_beside_the_service_pod() -> None:
    lost = pod(0, master=True, ready=False, role=None)
    ahead = decide(
        [lost, pod(1, offset=10, beside=True), pod(2, offset=20)], NOW + GRACE, GRACE, NOW, True
    )
    assert ahead.promote == "t-redis-0-2"
    even = decide(
        [lost, pod(1, offset=20), pod(2, offset=20, beside=True)], NOW + GRACE, GRACE, NOW, True
    )
    assert even.promote == "t-redis-0-2"
    # a failover never waits for the pod beside the service pod
    waiting = [lost, pod(1, offset=20), pod(2, offset=20, beside=True, ready=False)]
    assert decide(waiting, NOW + GRACE, GRACE, NOW, True).promote == "t-redis-0-1"


def test_missing_master_waits_for_the_grace_period() -> None:
    pods = [pod(0, master=True, ready=False, role=None), pod(1, offset=10)]
    first = decide(pods, NOW, GRACE, None, True)
    assert first.promote is None
    assert first.missing_since == NOW
    assert first.reason == "MasterMissing"
    later = decide(pods, NOW + GRACE - 1, GRACE, first.missing_since, True)
    assert later.promote is None


def test_after_grace_the_replica_with_the_highest_offset_is_promoted() -> None:
    pods = [
        pod(0, master=True, ready=False, role=None),
        pod(1, offset=100, keys=5),
        pod(2, offset=250, keys=1),
        pod(3, offset=900, ready=False),  # not ready: never promoted
    ]
    decision = decide(pods, NOW + GRACE, GRACE, NOW, True)
    assert decision.promote == "t-redis-0-2"
    assert decision.master == "t-redis-0-2"
    assert decision.failover
    assert decision.reason == "FailedOver"
    assert decision.missing_since is None


def test_ties_break_on_keys_then_lowest_ordinal() -> None:
    pods = [pod(1, offset=5, keys=1), pod(2, offset=5, keys=9), pod(3, offset=5, keys=9)]
    assert decide(pods, NOW, GRACE, None, False).promote == "t-redis-0-2"


def test_returning_old_master_is_demoted_never_promoted() -> None:
    # pod 1 was promoted; pod 0 came back still believing it is master (partition healed).
    pods = [pod(0, role="master", offset=999), pod(1, master=True, role="master", offset=500)]
    decision = decide(pods, NOW, GRACE, None, True)
    assert decision.master == "t-redis-0-1"
    assert decision.demote == ("t-redis-0-0",)
    assert decision.promote is None
    assert decision.reason == "MasterRepaired"


def test_recorded_master_running_as_replica_is_promoted_again() -> None:
    decision = decide([pod(0, master=True, role="slave"), pod(1)], NOW, GRACE, None, True)
    assert decision.promote == "t-redis-0-0"


def test_nothing_promotable_reports_and_waits() -> None:
    pods = [pod(0, master=True, ready=False, role=None), pod(1, ready=False)]
    decision = decide(pods, NOW + 100, GRACE, NOW, True)
    assert decision.promote is None
    assert decision.reason == "NoPromotableReplica"
    assert decision.missing_since == NOW


def test_a_replica_that_never_synced_is_never_promoted() -> None:
    """Regression: the highest offset won even from a replica that never synced since it
    started (it restarted from its own files while the master ran on, or could not
    authenticate): promoting it lost every write since."""
    pods = [
        pod(0, master=True, ready=False, role=None),
        pod(1, offset=900, link_up=False, synced=False),
        pod(2, offset=100, link_up=False),
    ]
    assert decide(pods, NOW + GRACE, GRACE, NOW, True).promote == "t-redis-0-2"
    stale = [pods[0], pods[1]]
    decision = decide(stale, NOW + GRACE, GRACE, NOW, True)
    assert decision.promote is None
    assert (decision.master, decision.reason) == ("t-redis-0-0", "NoSyncedReplica")
    assert decision.missing_since == NOW
    # the recorded master's pod made again mounts its volume: it may be promoted
    again = RedisPod("t-redis-0-0", 0, True, False, "slave", master_volume=True)
    assert decide([again, pods[1]], NOW + GRACE, GRACE, NOW, True).promote == "t-redis-0-0"
    # a fresh broker has nothing to lose: it elects at once
    assert decide([pod(1, synced=False)], NOW, GRACE, None, False).promote == "t-redis-0-1"


# --- planned switchover ---------------------------------------------------------------------


def test_a_terminating_master_switches_over_to_the_most_advanced_linked_replica() -> None:
    pods = [
        pod(0, master=True, role="master", offset=900, terminating=True),
        pod(1, offset=800),
        pod(2, offset=850),
        pod(3, offset=899, link_up=False),  # resyncing: its catch-up would be long
        pod(4, offset=899, terminating=True),  # stopping too
    ]
    decision = decide(pods, NOW, GRACE, None, True)
    assert (decision.switch_from, decision.master) == ("t-redis-0-0", "t-redis-0-2")
    assert (decision.promote, decision.demote) == (None, ())
    assert decision.reason == "SwitchedOver"
    assert not decision.failover
    assert decision.missing_since is None


def test_a_terminating_master_without_a_replica_to_take_over_stays_until_it_is_gone() -> None:
    alone = decide([pod(0, master=True, role="master", terminating=True)], NOW, GRACE, None, True)
    assert (alone.master, alone.switch_from, alone.reason) == ("t-redis-0-0", None, "MasterReady")
    unlinked = [pod(0, master=True, role="master", terminating=True), pod(1, link_up=False)]
    assert decide(unlinked, NOW, GRACE, None, True).switch_from is None


def test_a_stray_master_is_demoted_before_any_switchover() -> None:
    pods = [pod(0, master=True, role="master", terminating=True), pod(1, role="master"), pod(2)]
    decision = decide(pods, NOW, GRACE, None, True)
    assert decision.switch_from is None
    assert decision.demote == ("t-redis-0-1",)


def test_a_terminating_pod_is_never_promoted_by_a_failover() -> None:
    pods = [
        pod(0, master=True, ready=False, role=None),
        pod(1, offset=900, terminating=True),
        pod(2, offset=100),
    ]
    assert decide(pods, NOW + GRACE, GRACE, NOW, True).promote == "t-redis-0-2"
