"""Which Kubernetes Events a status change means: pure transitions, and the Event manifest.

Events are derived from what the operator writes to the topic's status (old status vs new), not
from what it did on one pass: the status is stored in the API, so a condition that stays bad
(a broker refused for an hour, ZooKeeper down) yields one Event when it starts and one when it
ends, across health passes, retries, operator restarts and leader changes. recorder.py adds a
time window per message against flapping, and posts them.

A condition's Event fires when its state changes (but Resharding's, whose Events the resharding
pass tells with the slots it moved: kube/resharding.py): its status, or its reason while it is bad
(Ready=False BrokersUnavailable -> Ready=False InvalidSpec is news; Ready=True Serving ->
Ready=True ServingDegraded is not, Degraded says so). A broker's Events follow its status entry:
the master went missing (the failover grace starts), a replica was promoted, nothing can be
promoted, a first master was elected, the missing master came back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.kube.builders.common import Manifest
from delayq.kube.status import (
    BROKER_FULL,
    DEGRADED,
    FALSE,
    OBJECTIVE_MET,
    PROVISIONED,
    READY,
    RESHARDING,
    SLOTS_UNOWNED,
    TRUE,
)

NORMAL = "Normal"
WARNING = "Warning"
COMPONENT = "delayq-operator"
MAX_MESSAGE_CHARS = 1024  # the API server refuses longer Event messages

# The state of each condition type that is good news (Normal); the other is a Warning.
GOOD_STATUS = {
    READY: TRUE,
    PROVISIONED: TRUE,
    DEGRADED: FALSE,
    BROKER_FULL: FALSE,
    SLOTS_UNOWNED: FALSE,
    OBJECTIVE_MET: TRUE,
}
# Bad states that are only a step of creating a topic, not a problem to warn about.
PENDING_REASONS = frozenset({"WaitingForBrokers", "Measuring"})
# Ready's reason while a broker has no master; right after WaitingForBrokers it is the same
# wait (the first masters are being elected: MasterElected tells each), no Warning.
BROKERS_UNAVAILABLE = "BrokersUnavailable"
# Broker states (status.brokers[].state, failover.Decision.reason) worth an Event on entry.
MASTER_MISSING = "MasterMissing"
NO_PROMOTABLE_REPLICA = "NoPromotableReplica"
NO_SYNCED_REPLICA = "NoSyncedReplica"  # failover.py: only replicas that never synced are left


@dataclass(frozen=True)
class TopicEvent:
    """One Event about a DelayTopic: `type` Normal or Warning, `reason` one CamelCase word."""

    type: str
    reason: str
    message: str


def status_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[TopicEvent]:
    """The Events that turning status `old` into `new` means, conditions first."""
    return condition_events(old.get("conditions") or [], new.get("conditions") or []) + (
        broker_events(old.get("brokers") or [], new.get("brokers") or [])
    )


def condition_events(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[TopicEvent]:
    before = {str(item.get("type")): item for item in old}
    events = []
    for item in new:
        kind = str(item.get("type"))
        previous = before.get(kind)
        if kind == RESHARDING:
            continue  # told with its moves by the resharding pass
        if previous is not None and _state(previous) == _state(item):
            continue
        if (
            previous is not None
            and previous.get("reason") in PENDING_REASONS
            and item.get("reason") == BROKERS_UNAVAILABLE
        ):
            continue  # a new topic still waiting for its first masters
        good = item.get("status") == GOOD_STATUS.get(kind, TRUE)
        if previous is None and good and kind != PROVISIONED and kind != READY:
            continue  # "not degraded", "not full" on a new topic is no news
        pending = item.get("reason") in PENDING_REASONS
        events.append(
            TopicEvent(
                NORMAL if good or pending else WARNING,
                str(item.get("reason") or kind),
                str(item.get("message") or ""),
            )
        )
    return events


def _state(condition: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must change for an Event: the status, and the reason while the state is bad."""
    status = condition.get("status")
    good = status == GOOD_STATUS.get(str(condition.get("type")), TRUE)
    return (status,) if good else (status, condition.get("reason"))


def broker_events(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[TopicEvent]:
    before = {item.get("index"): item for item in old}
    events = []
    for entry in new:
        index, previous = entry.get("index"), before.get(entry.get("index")) or {}
        state, was = entry.get("state"), previous.get("state")
        master, old_master = entry.get("masterPod") or "", previous.get("masterPod") or ""
        failed_over = entry.get("lastFailoverTime") != previous.get("lastFailoverTime")
        if failed_over and entry.get("lastFailoverTime"):
            events.append(
                TopicEvent(
                    NORMAL,
                    "FailoverPromoted",
                    f"Broker {index}: promoted {master} to master after "
                    f"{old_master or 'the master'} was gone.",
                )
            )
        elif state == MASTER_MISSING and was != MASTER_MISSING:
            events.append(
                TopicEvent(
                    WARNING,
                    "FailoverStarted",
                    f"Broker {index}: master {master or '(none)'} is not ready; a replica is "
                    "promoted after the failover grace period unless it returns.",
                )
            )
        elif state == NO_PROMOTABLE_REPLICA and not master and not old_master:
            continue  # no master yet on a new broker: nothing failed over, MasterElected follows
        elif state == NO_PROMOTABLE_REPLICA and was != NO_PROMOTABLE_REPLICA:
            events.append(
                TopicEvent(
                    WARNING,
                    "FailoverRefused",
                    f"Broker {index}: no ready, reachable Redis pod to promote; writes to its "
                    "slots fail until one is.",
                )
            )
        elif state == NO_SYNCED_REPLICA and was != NO_SYNCED_REPLICA:
            events.append(
                TopicEvent(
                    WARNING,
                    "FailoverRefused",
                    f"Broker {index}: no replica synced from {master or 'the master'} since it "
                    "started, so none holds its data; waiting for it to return.",
                )
            )
        elif state == "Ready" and master and not old_master:
            events.append(
                TopicEvent(
                    NORMAL, "MasterElected", f"Broker {index}: {master} is the first master."
                )
            )
        elif state == "Ready" and was in (MASTER_MISSING, NO_PROMOTABLE_REPLICA, NO_SYNCED_REPLICA):
            events.append(
                TopicEvent(
                    NORMAL, "MasterReturned", f"Broker {index}: master {master} is ready again."
                )
            )
    return events


def event_manifest(
    topic: Mapping[str, Any], event: TopicEvent, now_iso: str, name: str, instance: str
) -> Manifest:
    """A core/v1 Event about `topic`, as `kubectl describe dt` lists them."""
    meta = topic["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": topic.get("apiVersion", ""),
            "kind": topic.get("kind", ""),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE_CHARS],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now_iso,
        "lastTimestamp": now_iso,
        "count": 1,
    }
