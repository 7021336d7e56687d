"""Kubernetes Events on a DelayTopic: one per transition, never one per pass.

The pure rules (events.py) first, then the handlers as the operator runs them (operator.serialized,
which writes the status and posts the Events) against kmock, real ZooKeeper and real Redis pods.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import kmock
import kopf
import pytest
from kazoo.client import KazooClient

from delayq.kube.context import OperatorContext
from delayq.kube.events import TopicEvent, status_events
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.operator import serialized
from delayq.kube.recorder import EventRecorder, event_name
from tests.kube.conftest import Clock, own_slots
from tests.kube.pods import NAMESPACE, RedisPods, add_service_pods, set_pod_ready
from tests.kube.test_handlers import body, condition, put_topic


def cond(kind: str, status: str, reason: str, message: str = "m") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def reasons(events: list[TopicEvent]) -> list[tuple[str, str]]:
    return [(event.type, event.reason) for event in events]


# --- the pure rules ---------------------------------------------------------------------------


def test_a_condition_yields_an_event_when_its_state_changes_not_while_it_stays() -> None:
    applied = {"conditions": [cond("Provisioned", "True", "ResourcesApplied")]}
    assert reasons(status_events({}, applied)) == [("Normal", "ResourcesApplied")]
    failing = {"conditions": [cond("Provisioned", "False", "ApplyFailed", "403 on secrets")]}
    assert reasons(status_events(applied, failing)) == [("Warning", "ApplyFailed")]
    # stuck: the same state with another message (a retry's error text) is no news
    again = {"conditions": [cond("Provisioned", "False", "ApplyFailed", "403 on services")]}
    assert status_events(failing, again) == []
    # another bad reason is news; back to good is news
    zk = {"conditions": [cond("Provisioned", "False", "ZooKeeperUnavailable")]}
    assert reasons(status_events(again, zk)) == [("Warning", "ZooKeeperUnavailable")]
    assert reasons(status_events(zk, applied)) == [("Normal", "ResourcesApplied")]


def test_good_reasons_that_change_and_good_news_about_nothing_are_quiet() -> None:
    serving = {"conditions": [cond("Ready", "True", "Serving")]}
    degraded = {"conditions": [cond("Ready", "True", "ServingDegraded")]}
    assert status_events(serving, degraded) == []  # Degraded tells it
    # a new topic that is not full and has every slot owned: nothing to say
    quiet = {
        "conditions": [
            cond("BrokerFull", "False", "MemoryAvailable"),
            cond("SlotsUnowned", "False", "AllSlotsOwned"),
        ]
    }
    assert status_events({}, quiet) == []
    waiting = {"conditions": [cond("Ready", "False", "WaitingForBrokers")]}
    assert reasons(status_events({}, waiting)) == [("Normal", "WaitingForBrokers")]
    # a new topic's first health pass, its Redis pods not ready yet: the same wait, no Warning
    # (issue 29: BrokersUnavailable and FailoverRefused warned on every normal start)
    unavailable = {"conditions": [cond("Ready", "False", "BrokersUnavailable")]}
    assert status_events(waiting, unavailable) == []
    serving = {"conditions": [cond("Ready", "True", "Serving")]}
    assert reasons(status_events(serving, unavailable)) == [("Warning", "BrokersUnavailable")]


def test_broker_entries_yield_the_failover_story() -> None:
    def broker(state: str, master: str, failover: str | None = None) -> dict[str, Any]:
        entry = {"index": 0, "state": state, "masterPod": master}
        return {**entry, "lastFailoverTime": failover} if failover else entry

    def step(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
        return reasons(status_events({"brokers": [old]}, {"brokers": [new]}))

    fresh = broker("NoPromotableReplica", "")
    assert reasons(status_events({}, {"brokers": [fresh]})) == []  # no first master yet
    elected = broker("Ready", "r-0")
    missing = broker("MasterMissing", "r-0")
    promoted = broker("Ready", "r-1", "2026-01-01T00:00:00Z")
    assert step(fresh, elected) == [("Normal", "MasterElected")]
    assert step(elected, missing) == [("Warning", "FailoverStarted")]
    assert step(missing, missing) == []
    assert step(missing, promoted) == [("Normal", "FailoverPromoted")]
    assert step(promoted, promoted) == []
    assert step(missing, elected) == [("Normal", "MasterReturned")]
    refused = broker("NoPromotableReplica", "r-0")
    assert step(missing, refused) == [("Warning", "FailoverRefused")]
    assert step(refused, refused) == []


# --- posted by the operator -----------------------------------------------------------------


def posted(api: kmock.KubernetesEmulator, topic: str = "orders") -> list[tuple[str, str]]:
    """The Events on the topic, oldest first, as `kubectl describe dt` lists them."""
    found = []
    for key, obj in api.objects.items():
        if key[0].plural != "events" or obj.deleted:
            continue
        event = obj.raw
        if event["involvedObject"]["name"] == topic and event["involvedObject"]["kind"]:
            found.append((event["type"], event["reason"]))
    return found


async def run(
    ctx: OperatorContext, api: kmock.KubernetesEmulator, logger: logging.Logger, work: Any
) -> None:
    """One handler run as kopf or the health loop runs it; failures are kopf's to retry."""
    with contextlib.suppress(kopf.TemporaryError, kopf.PermanentError):
        await serialized(ctx, body(api), logger, work)


async def test_provisioning_failover_and_return_are_each_told_once(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    put_topic(api, replicasPerBroker=1, slotAmount=4)
    await run(ctx, api, logger, reconcile)
    assert posted(api) == [("Normal", "WaitingForBrokers"), ("Normal", "ResourcesApplied")]
    event = next(o.raw for k, o in api.objects.items() if k[0].plural == "events")
    assert event["involvedObject"] == {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "name": "orders",
        "namespace": NAMESPACE,
        "uid": "uid-orders",
    }
    redis_pods.add(0, 2, master=0)
    add_service_pods(api, 1)
    own_slots(zk, 4)
    await run(ctx, api, logger, refresh)
    assert posted(api)[2:] == [("Normal", "Serving"), ("Normal", "MasterElected")]

    set_pod_ready(api, "orders-redis-0-0", False)
    redis_pods.partition("orders-redis-0-0")
    for _ in range(3):  # passes within the grace: one Event, not one per pass
        await run(ctx, api, logger, refresh)
    assert posted(api)[4:] == [("Warning", "BrokersUnavailable"), ("Warning", "FailoverStarted")]
    clock.now += ctx.failover_grace_s + 1
    for _ in range(2):
        await run(ctx, api, logger, refresh)
    # promoted: serving again, with the old master's pod not ready as a replica
    assert posted(api)[6:] == [
        ("Normal", "ServingDegraded"),
        ("Warning", "Degraded"),
        ("Normal", "FailoverPromoted"),
    ]
    message = [o.raw["message"] for k, o in api.objects.items() if k[0].plural == "events"][-1]
    assert message == (
        "Broker 0: promoted orders-redis-0-1 to master after orders-redis-0-0 was gone."
    )

    # The old master comes back still acting as a master: demoted, told once.
    set_pod_ready(api, "orders-redis-0-0", True)
    redis_pods.heal("orders-redis-0-0")
    for _ in range(2):
        await run(ctx, api, logger, refresh)
    assert redis_pods.replicates_from("orders-redis-0-0", "orders-redis-0-1")
    assert posted(api)[9:] == [("Warning", "StrayMasterDemoted"), ("Normal", "AllReplicasReady")]


async def test_a_stuck_reconcile_error_is_told_once_and_its_end_too(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    dead_zookeeper: str,
    zk_connect: str,
    logger: logging.Logger,
) -> None:
    put_topic(api, zookeeper={"connect": dead_zookeeper})
    for _ in range(3):  # kopf retries a transient failure
        await run(ctx, api, logger, reconcile)
    assert posted(api) == [("Warning", "ZooKeeperUnavailable")]
    api.objects["delayq.io/v1alpha1/delaytopics", NAMESPACE, "orders"].patch(
        {"spec": {"zookeeper": {"connect": zk_connect}}}
    )
    await run(ctx, api, logger, reconcile)
    assert posted(api)[1:] == [("Normal", "WaitingForBrokers"), ("Normal", "ResourcesApplied")]


async def test_an_unexpected_error_is_posted_as_a_warning(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)

    async def broken(*_: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        await serialized(ctx, body(api), logger, broken)
    assert posted(api) == [("Warning", "OperatorError")]


async def test_slots_unowned_for_long_and_zookeeper_unreachable(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    clock: Clock,
    dead_zookeeper: str,
    logger: logging.Logger,
) -> None:
    put_topic(api, slotAmount=4)
    await run(ctx, api, logger, reconcile)
    redis_pods.add(0, 1, master=0)
    add_service_pods(api, 1)
    own_slots(zk, 2)  # slots 2 and 3 have no owner
    await run(ctx, api, logger, refresh)
    assert condition(api, "SlotsUnowned")["status"] == "False"  # a moment is normal
    assert ("Warning", "SlotsUnowned") not in posted(api)
    clock.now += 61
    await run(ctx, api, logger, refresh)
    unowned = condition(api, "SlotsUnowned")
    assert (unowned["status"], unowned["reason"]) == ("True", "SlotsUnowned")
    assert unowned["message"].startswith("2 of 4 slots have had no owner for over 60 s")
    assert posted(api).count(("Warning", "SlotsUnowned")) == 1

    # A new leader (its timer starts afresh) keeps the condition: no False/True flap.
    ctx.unowned_since.clear()
    ctx.recorder = EventRecorder("new-leader", ctx.clock)
    await run(ctx, api, logger, refresh)
    assert condition(api, "SlotsUnowned")["status"] == "True"
    assert posted(api).count(("Warning", "SlotsUnowned")) == 1

    # ZooKeeper cannot be reached: said once, the last known ownership stays.
    api.objects["delayq.io/v1alpha1/delaytopics", NAMESPACE, "orders"].patch(
        {"spec": {"zookeeper": {"connect": dead_zookeeper}}}
    )
    for _ in range(2):
        await run(ctx, api, logger, refresh)
    degraded = condition(api, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ZooKeeperUnreachable")
    assert f"ZooKeeper {dead_zookeeper} is unreachable" in degraded["message"]
    assert posted(api).count(("Warning", "ZooKeeperUnreachable")) == 1
    assert body(api)["status"]["slots"]["unowned"] == 2
    assert condition(api, "SlotsUnowned")["status"] == "True"


async def test_the_recorder_drops_a_repeat_within_its_window(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, clock: Clock
) -> None:
    put_topic(api)
    recorder = EventRecorder("me", clock, repeat_after_s=60)
    flap = [TopicEvent("Warning", "Degraded", "broker 0 has 0/1 replicas ready.")]
    assert await recorder.post(ctx.kube, body(api), flap) == 1
    assert await recorder.post(ctx.kube, body(api), flap) == 0
    clock.now += 61
    assert await recorder.post(ctx.kube, body(api), flap) == 1
    assert posted(api) == [("Warning", "Degraded"), ("Warning", "Degraded")]


async def test_a_recorded_master_found_as_a_replica_is_repaired_and_told(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api, replicasPerBroker=1, slotAmount=4)
    await run(ctx, api, logger, reconcile)
    redis_pods.add(0, 2, master=0)
    add_service_pods(api, 1)
    own_slots(zk, 4)
    await run(ctx, api, logger, refresh)
    redis_pods.cut_from_master("orders-redis-0-0")  # e.g. restarted by hand as a replica
    for _ in range(2):
        await run(ctx, api, logger, refresh)
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"
    assert posted(api).count(("Warning", "MasterRepaired")) == 1


def test_events_named_at_one_instant_do_not_collide() -> None:
    """A thousand Events at one clock reading (the tests' clock stands still; a pass posts
    several at once) get a thousand names: the API refuses a second object of one name."""
    names = {event_name("orders", 1_700_000_000.0) for _ in range(1_000)}
    assert len(names) == 1_000
