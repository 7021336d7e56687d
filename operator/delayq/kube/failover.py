"""Which Redis pod of a broker should be master: pure decisions, applied by handlers/health.py.

Rules, in order:
1. At most one pod is the recorded master (kube/master_endpoint.py: the name the master
   Service's EndpointSlice points at). If it is ready, it stays master; any other pod
   that still acts as a master (an old master that kept running through a partition) is demoted
   to a replica of it, so it resyncs and can never overwrite the new master's data.
2. When the recorded master is gone or not ready, wait `grace_s` (a restarting pod keeps its
   data and role), then promote the ready, reachable pod with the highest replication offset
   (ties: more keys, then the pod beside the delay-service pod, then the lowest ordinal) and
   record it as master. Only a replica that synced from the master since it started may be
   promoted (`synced`: redisctl._synced), or the recorded master's pod made again (its volume
   holds the master's data): a replica that never synced (restarted from its own files while
   the master ran on, unable to authenticate, mid full sync) holds an old copy, and promoting
   it would lose every write since; the broker waits for its master instead (NoSyncedReplica).
3. A broker that never had a master (fresh topic) promotes at once: there is nothing to lose.
   Among equals (a fresh broker's pods all hold nothing) the pod on the node of the broker's
   delay-service pod comes first, so that the service reaches its master without a hop between
   nodes: the scheduler may put either pod there (both share a template and start together,
   kube/pairing.py). While that pod is not ready yet and another one is, the broker waits for
   it (WaitingForPodBesideService), at most `grace_s` from the first pass that saw the broker
   without a master; then any ready pod is elected.
A broker with no promotable pod waits and is reported unavailable.

Planned stops come first: when the recorded master is terminating (its pod has a
deletionTimestamp: a rollout, a drain, an eviction, `kubectl delete pod`) while it still runs
as master, and a replica is ready, linked and not terminating itself, the master is switched
over to that replica before it stops (handlers/switchover.py: writes paused, the
replica caught up to the master's offset, then promoted). The pod's preStop hook
(builders/redis.py) keeps the old master serving until then. Without such a replica the old
rules apply once the master is gone. A terminating pod is never promoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RedisPod:
    """What the operator observed about one Redis pod of a broker."""

    name: str
    ordinal: int
    ready: bool
    named_master: bool  # the recorded master (kube/master_endpoint.py)
    role: str | None = None  # "master" / "slave" from INFO replication; None if unreachable
    offset: int = 0  # master_repl_offset (master) or slave_repl_offset (replica)
    keys: int = 0
    terminating: bool = False  # the pod has a deletionTimestamp: it is about to stop
    link_up: bool = False  # a replica whose link to its master is up (master_link_status)
    synced: bool = False  # a replica that synced from its master since it started
    # the recorded master's pod made again (same name, another uid): it mounts the master's volume
    master_volume: bool = False
    beside_service: bool = False  # on the node of the broker's delay-service pod

    @property
    def reachable(self) -> bool:
        return self.role is not None


@dataclass(frozen=True)
class Decision:
    """What to do for one broker now, and the state to remember until the next observation."""

    master: str | None  # the pod recorded as master after this decision
    promote: str | None = None  # make it master: REPLICAOF NO ONE + record it
    demote: tuple[str, ...] = ()  # pods to point at the master (REPLICAOF master)
    missing_since: float | None = None  # when the master was first seen gone (for the grace)
    reason: str = "MasterReady"
    message: str = ""
    failover: bool = False  # True when an existing master was replaced (not bootstrap/repair)
    switch_from: str | None = None  # a planned switchover from this terminating master


def decide(
    pods: Sequence[RedisPod],
    now: float,
    grace_s: float,
    missing_since: float | None,
    had_master: bool,
) -> Decision:
    """The decision for one broker given its pods; see the module docstring for the rules."""
    current = next((pod for pod in pods if pod.named_master), None)
    strays = tuple(pod.name for pod in pods if pod is not current and pod.role == "master")
    if current is not None and current.terminating and current.role == "master":
        target = None if strays else _switch_target(pods)
        if target is not None:
            return Decision(
                master=target.name,
                switch_from=current.name,
                reason="SwitchedOver",
                message=f"{current.name} is stopping: switching over to {target.name}",
            )
    if current is not None and current.ready:
        repair = current.role == "slave"
        return Decision(
            master=current.name,
            promote=current.name if repair else None,
            demote=tuple(sorted(strays)),
            reason="MasterRepaired" if repair or strays else "MasterReady",
            message=f"{current.name} is master",
        )
    since = now if missing_since is None else missing_since
    if had_master and now - since < grace_s:
        left = grace_s - (now - since)
        return Decision(
            master=current.name if current else None,
            missing_since=since,
            reason="MasterMissing",
            message=f"master not ready; failover in {left:.0f}s unless it returns",
        )
    reachable = [p for p in pods if p.ready and p.reachable and not p.terminating]
    # a fresh broker has nothing to lose; after a master, only a copy of its data may replace it
    candidates = sorted(
        (p for p in reachable if not had_master or _holds_master_data(p)),
        key=_rank,
        reverse=True,
    )
    if not candidates:
        return Decision(
            master=current.name if current and reachable else None,
            missing_since=since,
            reason="NoSyncedReplica" if reachable else "NoPromotableReplica",
            message=(
                "no replica synced from the master since it started: waiting for the master"
                if reachable
                else "no ready, reachable Redis pod to promote"
            ),
        )
    chosen = candidates[0]
    awaited = None if had_master or chosen.beside_service else _beside_service_pending(pods)
    if awaited is not None and now - since < grace_s:
        left = grace_s - (now - since)
        return Decision(
            master=None,
            missing_since=since,
            reason="WaitingForPodBesideService",
            message=(
                f"waiting for {awaited.name} (on the delay-service pod's node) to be ready; "
                f"the first master is elected in {left:.0f}s at the latest"
            ),
        )
    return Decision(
        master=chosen.name,
        promote=chosen.name,
        demote=tuple(p.name for p in pods if p is not chosen and p.role == "master"),
        reason="FailedOver" if had_master else "MasterElected",
        message=(
            f"promoted {chosen.name} (replication offset {chosen.offset})"
            + (f" after {current.name if current else 'the master'} was gone" if had_master else "")
        ),
        failover=had_master,
    )


def _switch_target(pods: Sequence[RedisPod]) -> RedisPod | None:
    """The replica a stopping master hands over to: ready, replicating (link up), staying; the
    most advanced one, so that the writes' pause while it catches up is the shortest."""
    targets = [
        pod
        for pod in pods
        if pod.ready and pod.role == "slave" and pod.link_up and not pod.terminating
    ]
    return max(targets, key=_rank, default=None)


def _holds_master_data(pod: RedisPod) -> bool:
    """A pod that may replace a lost master: a replica synced from it, its own pod made again
    (its volume), or a pod still running as a master."""
    return pod.synced or pod.master_volume or pod.role == "master"


def _beside_service_pending(pods: Sequence[RedisPod]) -> RedisPod | None:
    """A pod on the delay-service pod's node that may yet become ready (not ready or not
    answering, not stopping): the one a fresh broker waits for."""
    pending = (
        pod
        for pod in pods
        if pod.beside_service and not pod.terminating and not (pod.ready and pod.reachable)
    )
    return min(pending, key=lambda pod: pod.ordinal, default=None)


def _rank(pod: RedisPod) -> tuple[int, int, bool, int]:
    """Data first (the replication offset, then keys); among equals the pod beside the
    delay-service pod, then the lowest ordinal."""
    return (pod.offset, pod.keys, pod.beside_service, -pod.ordinal)
