"""What a health pass reports, typed (pure): each broker's entry and the topic's whole status.

The pass (handlers/health.py) fills these frozen records from what it observed and did, and
turns them into the DelayTopic's status fields only at the end (`TopicHealth.fields`), so no
step reads a value back from a dict by a string key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.kube.routing_record import RECORD_FIELD
from delayq.kube.status import DEGRADED, FALSE, TRUE, Condition
from delayq.queue import TopicStats

#: The state of a broker whose master is elected and ready.
SERVING = "Ready"


@dataclass(frozen=True)
class BrokerStatus:
    """One entry of `status.brokers`."""

    index: int
    state: str  # SERVING, else why not (failover.Decision.reason)
    master_pod: str  # "" while none
    replicas_ready: int
    replicas_desired: int
    slots: int  # routed to this broker
    last_failover_time: str | None = None
    last_switchover_time: str | None = None
    paused: bool | None = None  # None: its master did not say

    @property
    def serving(self) -> bool:
        return self.state == SERVING

    def with_slots(self, slots: int) -> BrokerStatus:
        return dataclasses.replace(self, slots=slots)

    def to_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "index": self.index,
            "state": self.state,
            "masterPod": self.master_pod,
            "replicasReady": self.replicas_ready,
            "replicasDesired": self.replicas_desired,
            "slots": self.slots,
        }
        if self.last_failover_time:
            entry["lastFailoverTime"] = self.last_failover_time
        if self.last_switchover_time:
            entry["lastSwitchoverTime"] = self.last_switchover_time
        if self.paused is not None:
            entry["paused"] = self.paused
        return entry


@dataclass(frozen=True)
class SlotCounts:
    """`status.slots`: how many slots have an owner in ZooKeeper."""

    total: int
    owned: int

    @property
    def unowned(self) -> int:
        return max(self.total - self.owned, 0)

    def to_status(self) -> dict[str, int]:
        return {"total": self.total, "owned": self.owned, "unowned": self.unowned}


@dataclass(frozen=True)
class TopicHealth:
    """The status one health pass computed: its fields and the conditions it sets."""

    applied_slot_amount: int
    brokers: tuple[BrokerStatus, ...]
    depths: TopicStats
    conditions: tuple[Condition, ...]
    # status.resharding ({moved, total}, or None to remove it), only when resharding reported
    resharding_reported: bool = False
    resharding: Mapping[str, int] | None = None
    routing_record: Mapping[str, Any] | None = None  # status.routing, when it is recorded
    slots: SlotCounts | None = None  # None: ownership unknown (ZooKeeper unreachable)

    @property
    def paused(self) -> bool:
        return any(broker.paused for broker in self.brokers)

    def fields(self) -> dict[str, Any]:
        """The status fields (besides conditions)."""
        fields: dict[str, Any] = {
            "appliedSlotAmount": self.applied_slot_amount,
            "paused": self.paused,
            "brokers": [broker.to_status() for broker in self.brokers],
            "depths": {
                "scheduled": self.depths.scheduled,
                "prepared": self.depths.prepared,
                "dead": self.depths.dead,
            },
        }
        if self.resharding_reported:
            fields["resharding"] = None if self.resharding is None else dict(self.resharding)
        if self.routing_record is not None:
            fields[RECORD_FIELD] = dict(self.routing_record)
        if self.slots is not None:
            fields["slots"] = self.slots.to_status()
        return fields


def degradations(
    brokers: Sequence[BrokerStatus], services_ready: int, service_pods: int, slots: SlotCounts
) -> list[str]:
    """What keeps the topic from full strength, one phrase each."""
    problems = [
        f"broker {broker.index} has {broker.replicas_ready}/{broker.replicas_desired} "
        "replicas ready"
        for broker in brokers
        if broker.replicas_ready < broker.replicas_desired
    ]
    if services_ready < service_pods:
        problems.append(f"{services_ready}/{service_pods} delay-service pods ready")
    if slots.owned < slots.total:
        problems.append(f"{slots.total - slots.owned} of {slots.total} slots have no owner")
    return problems


def degraded_condition(problems: Sequence[str], zookeeper_unreachable: bool) -> Condition:
    if not problems:
        return Condition(DEGRADED, FALSE, "AllReplicasReady", "Every pod is ready.")
    reason = "ZooKeeperUnreachable" if zookeeper_unreachable else "Degraded"
    return Condition(DEGRADED, TRUE, reason, "; ".join(problems) + ".")
