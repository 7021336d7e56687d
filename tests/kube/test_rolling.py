"""The brokers' roll (pure): one pod at a time, replicas first, a switchover before the master
restarts, held while any broker is unhealthy (kube/rolling.py)."""

from __future__ import annotations

from delayq.kube.rolling import RollPod, RollStep, next_step

NOW = 1000.0
WAIT = 120.0


def pod(
    ordinal: int,
    *,
    master: bool = False,
    outdated: bool = True,
    ready: bool = True,
    terminating: bool = False,
    in_sync: bool = True,
    offset: int = 0,
    broker: int = 0,
    legacy: bool = False,
) -> RollPod:
    name = f"t-redis-{broker}-{ordinal}"
    return RollPod(name, ordinal, master, ready, terminating, in_sync, outdated, offset, legacy)


def step(*brokers: list[RollPod], since: float | None = None, now: float = NOW) -> RollStep:
    return next_step(brokers, 3, now, since, WAIT)


def test_replicas_roll_first_highest_ordinal_one_pod_at_a_time() -> None:
    first = step([pod(0, master=True), pod(1), pod(2)])
    assert (first.delete, first.switch_to, first.broker) == ("t-redis-0-2", None, 0)
    second = step([pod(0, master=True), pod(1), pod(2, outdated=False)])
    assert second.delete == "t-redis-0-1"


def test_the_master_is_switched_over_to_an_updated_replica_in_sync_then_deleted() -> None:
    """Never a master deleted while it has a replica in sync: no failover follows the roll."""
    pods = [pod(0, master=True), pod(1, outdated=False, offset=5), pod(2, outdated=False, offset=9)]
    decided = step(pods)
    assert (decided.delete, decided.switch_to) == ("t-redis-0-0", "t-redis-0-2")


def test_a_master_without_replicas_restarts_in_place() -> None:
    assert next_step([[pod(0, master=True)]], 1, NOW, None, WAIT).delete == "t-redis-0-0"


def test_the_roll_holds_while_any_broker_is_unhealthy() -> None:
    """Regression: the StatefulSet controller's RollingUpdate restarted the next pod as soon
    as the last was Ready, whether its replication had caught up or another broker was down."""
    healthy = [pod(0, master=True, broker=1), pod(1, broker=1), pod(2, broker=1)]
    cases = {
        "not ready": [pod(0, master=True), pod(1, outdated=False, ready=False), pod(2)],
        "stopping": [pod(0, master=True), pod(1, terminating=True), pod(2)],
        "not in sync": [pod(0, master=True), pod(1, outdated=False, in_sync=False), pod(2)],
        "no serving master": [pod(0), pod(1), pod(2)],
        "2 of its 3 pods exist": [pod(0, master=True), pod(1)],
    }
    for why, unhealthy in cases.items():
        for brokers in ([unhealthy, healthy], [healthy, unhealthy]):
            held = step(*brokers)
            assert held.delete is None, why
            assert why in held.held


def test_updated_replicas_that_never_sync_are_waited_for_then_the_master_restarts() -> None:
    """A credentials change reached the replicas only: they cannot log in to the outdated
    master. After the wait it restarts in place (its data kept); none of them is promoted."""
    pods = [pod(0, master=True), pod(1, outdated=False, in_sync=False)]
    waiting = next_step([pods], 2, NOW, None, WAIT)
    assert (waiting.delete, waiting.waiting_since) == (None, NOW)
    assert "not in sync" in waiting.held
    later = next_step([pods], 2, NOW + WAIT, NOW, WAIT)
    assert (later.delete, later.switch_to) == ("t-redis-0-0", None)
    # one of them synced meanwhile: switched over to it
    one = [*pods, pod(2, outdated=False)]
    assert step(one, since=NOW, now=NOW + WAIT).switch_to == "t-redis-0-2"


def test_pods_the_operator_cannot_log_in_to_roll_replicas_first_then_the_master_in_place() -> None:
    """0.1.0's pods have no delayq-operator user: their replication cannot be read, and the
    old master cannot be switched over (it would need the operator's login)."""
    old = [pod(0, master=True, legacy=True), pod(1, legacy=True)]
    assert next_step([old], 2, NOW, None, WAIT).delete == "t-redis-0-1"
    updated = [pod(0, master=True, legacy=True), pod(1, outdated=False)]
    decided = next_step([updated], 2, NOW, None, WAIT)
    assert (decided.delete, decided.switch_to) == ("t-redis-0-0", None)


def test_nothing_to_roll() -> None:
    assert step([pod(0, master=True, outdated=False), pod(1, outdated=False)]) == RollStep()
