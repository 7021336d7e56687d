"""Leader election on a coordination.k8s.io/v1 Lease: the pure decisions (no I/O).

The pattern is client-go's (controller-runtime's) leader election. Every operator replica is a
candidate; the one named in `spec.holderIdentity` is the leader and the only one running kopf.
Expiry is judged on the candidate's own monotonic clock: the Lease counts as expired when the
record has not changed for `leaseDurationSeconds` since this candidate first saw it, so clock
skew between nodes never shortens a term (the `renewTime` written into it is informative only).

Split brain is excluded by the timing: the leader stops acting once `renew_deadline_s` has passed
since it last *sent* a successful renewal, and nobody else may take over before
`lease_duration_s` has passed since they *saw* that renewal, which is later; the difference
(`lease_duration_s - renew_deadline_s`) is the margin for stopping kopf.
"""

from __future__ import annotations

import datetime
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LEADER_LEASE_API_VERSION = "coordination.k8s.io/v1"
LEADER_LEASE_KIND = "Lease"


@dataclass(frozen=True)
class LeaderLeaseTiming:
    """client-go's defaults; `renew_deadline_s` must stay below `lease_duration_s`."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    renew_interval_s: float = 5.0
    retry_interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_interval_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need 0 < renew_interval_s < renew_deadline_s < lease_duration_s")


@dataclass(frozen=True)
class LeaderLeaseRecord:
    """The fields of a Lease that the election reads."""

    holder: str
    duration_s: float
    transitions: int
    renew_time: str
    resource_version: str | None

    @classmethod
    def from_object(cls, lease: Mapping[str, Any]) -> LeaderLeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            renew_time=str(spec.get("renewTime") or ""),
            resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
        )


@dataclass(frozen=True)
class Observation:
    """A record and when (monotonic seconds) this candidate first saw it unchanged."""

    record: LeaderLeaseRecord
    seen_at_s: float


def observe(previous: Observation | None, record: LeaderLeaseRecord, now_s: float) -> Observation:
    """Keep the first-seen time while the record stays the same; restart it on any change."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now_s)


class Action(enum.Enum):
    ACQUIRE = "acquire"  # write ourselves as holder (create the Lease when it is missing)
    RENEW = "renew"  # we hold it: refresh renewTime
    WAIT = "wait"  # someone else holds the Lease and it has not expired


def decide(observation: Observation | None, identity: str, now_s: float) -> Action:
    """What a candidate does with the Lease as it last observed it (None: no Lease exists)."""
    if observation is None:
        return Action.ACQUIRE
    record = observation.record
    if record.holder == identity:
        return Action.RENEW
    if not record.holder:  # released by a leader that shut down cleanly
        return Action.ACQUIRE
    if now_s - observation.seen_at_s >= record.duration_s:
        return Action.ACQUIRE
    return Action.WAIT


def still_leading(renewed_at_s: float, now_s: float, timing: LeaderLeaseTiming) -> bool:
    """Whether a leader may keep acting: its last successful renewal is within the deadline."""
    return now_s - renewed_at_s < timing.renew_deadline_s


def micro_time(now: datetime.datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_leader_lease(
    namespace: str, name: str, identity: str, timing: LeaderLeaseTiming, now: datetime.datetime
) -> dict[str, Any]:
    """The Lease a candidate creates when none exists (it is the first leader)."""
    return {
        "apiVersion": LEADER_LEASE_API_VERSION,
        "kind": LEADER_LEASE_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": holder_spec(identity, timing, now, transitions=0, acquired=True),
    }


def write_patch(
    action: Action,
    record: LeaderLeaseRecord,
    identity: str,
    timing: LeaderLeaseTiming,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The merge patch for ACQUIRE or RENEW, fenced by the resourceVersion it was decided on.

    With `metadata.resourceVersion` in the patch the API server rejects it with 409 Conflict if
    anyone wrote the Lease since it was read: a compare-and-swap.
    """
    acquired = action is Action.ACQUIRE
    transitions = record.transitions + (1 if acquired else 0)
    patch: dict[str, Any] = {"spec": holder_spec(identity, timing, now, transitions, acquired)}
    if record.resource_version:
        patch["metadata"] = {"resourceVersion": record.resource_version}
    return patch


def release_patch(record: LeaderLeaseRecord, now: datetime.datetime) -> dict[str, Any]:
    """Clear the holder (client-go's ReleaseOnCancel) so that a standby acquires at once."""
    patch: dict[str, Any] = {
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(now)}
    }
    if record.resource_version:
        patch["metadata"] = {"resourceVersion": record.resource_version}
    return patch


def holder_spec(
    identity: str,
    timing: LeaderLeaseTiming,
    now: datetime.datetime,
    transitions: int,
    acquired: bool,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "holderIdentity": identity,
        "leaseDurationSeconds": math.ceil(timing.lease_duration_s),  # never shorter
        "renewTime": micro_time(now),
        "leaseTransitions": transitions,
    }
    if acquired:
        spec["acquireTime"] = micro_time(now)
    return spec
