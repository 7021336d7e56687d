"""DelayTopic status: Kubernetes-shaped conditions and a minimal diff to patch.

Pure functions only. The handlers compute the whole desired status, then `status_patch` turns
old vs new into a merge patch that is empty when nothing changed, so a periodic refresh does not
write (and wake every watcher) on every tick. `lastTransitionTime` moves only when a condition's
status flips, as the Kubernetes API conventions require.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READY = "Ready"
PROVISIONED = "Provisioned"
DEGRADED = "Degraded"
BROKER_FULL = "BrokerFull"  # a broker's master near or at its maxmemory (kube/conditions.py)
SLOTS_UNOWNED = "SlotsUnowned"  # slots without an owner for longer than a moment
RESHARDING = "Resharding"  # slots moving onto added brokers (kube/resharding.py)
OBJECTIVE_MET = "ObjectiveMet"  # spec.objectives held (kube/objectives.py)
CONDITION_TYPES = (
    READY,
    PROVISIONED,
    DEGRADED,
    BROKER_FULL,
    SLOTS_UNOWNED,
    RESHARDING,
    OBJECTIVE_MET,
)

TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Condition:
    """One condition as the user sees it; `reason` is CamelCase, `message` a full sentence."""

    type: str
    status: str
    reason: str
    message: str


def find_condition(status: Mapping[str, Any], kind: str) -> Condition | None:
    for item in status.get("conditions") or []:
        if item.get("type") == kind:
            return Condition(kind, item["status"], item["reason"], item["message"])
    return None


def current_condition(status: Mapping[str, Any], kind: str) -> Condition:
    found = find_condition(status, kind)
    return found or Condition(kind, UNKNOWN, "Unknown", "Not reconciled yet.")


def merge_conditions(
    old: Sequence[Mapping[str, Any]],
    updates: Sequence[Condition],
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The condition list after `updates`; untouched types are kept, order is stable."""
    by_type = {str(item.get("type")): dict(item) for item in old}
    for update in updates:
        previous = by_type.get(update.type, {})
        changed = previous.get("status") != update.status
        entry: dict[str, Any] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        by_type[update.type] = entry
    known = [by_type.pop(kind) for kind in CONDITION_TYPES if kind in by_type]
    return known + [by_type[kind] for kind in sorted(by_type)]


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` at the top level of status.

    Keys equal in both (a None inside an object counting as absent) are left out; keys gone
    from `new` become None (deleted). Nested values are replaced whole: conditions and broker
    lists are small, and replacing avoids merge-patch ambiguity on lists.
    """
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if _stored(old.get(key)) != _stored(value):
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def _stored(value: Any) -> Any:
    """`value` as the API server keeps it after a merge patch: a None inside an object deletes
    its key (status.routing's `doubledSlots` once a doubling ended), so it is no change."""
    if isinstance(value, Mapping):
        return {key: _stored(item) for key, item in value.items() if item is not None}
    return value


def patched(old: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`old` after the top-level merge patch `patch` (the inverse of status_patch)."""
    new = {**old, **patch}
    return {key: value for key, value in new.items() if value is not None}


# A refused change leaves the topic serving its previous shape: not a reason to be un-Ready.
NON_BLOCKING_REASONS = frozenset({"SlotAmountShrinkRejected"})


def ready_condition(
    provisioned: Condition, degraded: Condition, all_brokers_serving: bool
) -> Condition:
    """Ready summarises the others: provisioned, every broker has a master, not blocked."""
    refused = provisioned.status != TRUE and provisioned.reason in NON_BLOCKING_REASONS
    if provisioned.status != TRUE and not refused:
        return Condition(READY, FALSE, provisioned.reason, provisioned.message)
    if not all_brokers_serving:
        return Condition(
            READY, FALSE, "BrokersUnavailable", "At least one broker has no ready Redis master."
        )
    notes = [degraded.message] if degraded.status == TRUE else []
    if refused:
        notes.append(provisioned.message)
    if notes:
        return Condition(READY, TRUE, "ServingDegraded", "Serving, but: " + " ".join(notes))
    return Condition(READY, TRUE, "Serving", "All brokers have a ready master; slots are routed.")


def observed_ready(
    status: Mapping[str, Any], provisioned: Condition, brokers_desired: int
) -> Condition:
    """Ready for a new Provisioned, from what the last health pass saw (its broker entries and
    Degraded), so that the reconcile that clears a refusal also clears the refusal's Ready at
    once, not a health interval later; WaitingForBrokers before any pass has seen a broker."""
    brokers = status.get("brokers") or []
    if not brokers:
        return Condition(READY, FALSE, "WaitingForBrokers", "Waiting for Redis masters.")
    serving = len(brokers) >= brokers_desired and all(b.get("state") == "Ready" for b in brokers)
    return ready_condition(provisioned, current_condition(status, DEGRADED), serving)
