"""Which broker pod the operator restarts next to roll a topic onto its StatefulSets' new spec:
a pure decision, carried out by handlers/rolling.py.

The broker StatefulSets use `updateStrategy: OnDelete` (builders/redis.py), so the StatefulSet
controller restarts nothing by itself; the operator deletes one pod at a time (the controller
makes it again from the new spec), so that nothing is lost and the write pause is a switchover:

1. Hold while any broker of the topic is unhealthy: a pod missing, not Ready or stopping, no serving
   master, a replica out of sync (its link to the master down). The roll observes the pods
   afresh after the pass's other actions (a failover, a switchover, a demotion): a replica
   resyncing after one holds it.
2. Outdated replicas first, the highest ordinal first, one pod per pass for the whole topic;
   each must be back, Ready and in sync before the next (rule 1).
3. Then the master: switched over first to an updated replica in sync (the most advanced), then
   deleted as the replica it now is. So the operator never deletes a master that has a replica
   in sync, and no failover follows its own roll. A master without replicas
   (replicasPerBroker 0) restarts in place: its pod, made again on its volume, is recorded as
   master again as soon as it is Ready (handlers/rolling.py), without the failover grace.
4. Updated replicas that do not get in sync with the outdated master (they cannot log in to
   it: a credentials or configuration change reached them only) are waited for `sync_wait_s`;
   then the master is switched over to one in sync if any, else restarted in place as above
   (failover.py never promotes a replica that did not sync): it comes back as master and the
   replicas sync from it with the login they share now. Writes pause for its restart; nothing
   is lost and nothing is asked of the user. Pods of an older version the operator cannot log
   in to (`legacy`) roll the same way: replicas first, the master in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RollPod:
    """One Redis pod of a broker as a roll sees it."""

    name: str
    ordinal: int
    master: bool  # the broker's serving master (failover.decide's, running as master)
    ready: bool
    terminating: bool
    in_sync: bool  # a replica whose link to its master is up (a master: True)
    outdated: bool  # runs an older revision than its StatefulSet's updateRevision
    offset: int = 0
    # outdated, Ready, and the operator cannot log in to it (an older version's users: 0.1.0's
    # pods have no delayq-operator): its replication cannot be read, so it counts as in sync
    # and is restarted without a switchover
    legacy: bool = False


@dataclass(frozen=True)
class RollStep:
    """What the roll does now: delete `delete` (after switching the master over to `switch_to`
    when set), or wait (`held` says why), or nothing (the topic is rolled)."""

    delete: str | None = None
    broker: int | None = None
    switch_to: str | None = None
    held: str = ""
    waiting_since: float | None = None  # when a master's updated replicas were first awaited


def next_step(
    brokers: Sequence[Sequence[RollPod]],
    desired_pods: int,
    now: float,
    waiting_since: float | None,
    sync_wait_s: float,
) -> RollStep:
    """The roll's next step for a topic whose brokers' pods are `brokers` (by index); see
    the module docstring for the rules."""
    if not any(pod.outdated for pods in brokers for pod in pods):
        return RollStep()
    for index, pods in enumerate(brokers):
        if (why := _unhealthy(pods, desired_pods)) is not None:
            return RollStep(held=f"broker {index}: {why}", waiting_since=waiting_since)
    for index, pods in enumerate(brokers):
        master = next(pod for pod in pods if pod.master)
        replicas = [pod for pod in pods if not pod.master]
        stale = [pod for pod in replicas if pod.outdated]
        if stale:
            return RollStep(delete=max(stale, key=lambda p: p.ordinal).name, broker=index)
        if not master.outdated:
            continue
        unsynced = [pod.name for pod in replicas if not pod.in_sync]
        if unsynced:  # all updated and Ready, some not in sync: waited for
            since = now if waiting_since is None else waiting_since
            if now - since < sync_wait_s:
                left = sync_wait_s - (now - since)
                return RollStep(
                    held=f"broker {index}: {', '.join(unsynced)} not in sync with "
                    f"{master.name}; it is rolled in {left:.0f}s unless they sync",
                    waiting_since=since,
                )
        synced = [pod for pod in replicas if pod.in_sync]
        if synced and not master.legacy:  # a switchover needs to log in to the old master
            target = max(synced, key=lambda p: (p.offset, -p.ordinal))
            return RollStep(delete=master.name, broker=index, switch_to=target.name)
        return RollStep(delete=master.name, broker=index)
    return RollStep()


def _unhealthy(pods: Sequence[RollPod], desired_pods: int) -> str | None:
    """Why a broker's pods hold the whole topic's roll, or None. Replicas out of sync hold it,
    except updated ones of an outdated master when no replica is left to roll (rule 4)."""
    if len(pods) < desired_pods:
        return f"{len(pods)} of its {desired_pods} pods exist"
    master = next((pod for pod in pods if pod.master), None)
    if master is None:
        return "no serving master"
    for pod in pods:
        if pod.terminating:
            return f"{pod.name} is stopping"
        if not pod.ready:
            return f"{pod.name} is not ready"
    last = master.outdated and not any(pod.outdated for pod in pods if pod is not master)
    unsynced = [pod.name for pod in pods if not pod.in_sync]
    if unsynced and not last:
        return f"{', '.join(unsynced)} not in sync with {master.name}"
    return None
