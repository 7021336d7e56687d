"""The operator's roll of a topic's brokers onto their StatefulSets' new spec, one pod per
health pass (the rules: kube/rolling.py): observe, decide, then switch over (switchover.py)
and delete the pod; the StatefulSet controller (updateStrategy OnDelete) makes it again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.kube import naming
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.events import NORMAL, TopicEvent
from delayq.kube.failover import Decision
from delayq.kube.handlers.broker_pods import BrokerPods, observe_pods
from delayq.kube.handlers.switchover import switch_over
from delayq.kube.master_endpoint import publish_master, recorded_masters
from delayq.kube.rolling import RollPod, next_step
from delayq.kube.spec import TopicSpec

# How long updated replicas may take to get in sync with an outdated master before it is
# rolled anyway (kube/rolling.py rule 4): a full sync of a large broker takes this long at most.
SYNC_WAIT_S = 120.0


async def roll_step(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    password: str,
    logger: Logger,
) -> list[TopicEvent]:
    """Take the topic's next roll step, if any; the Events of what was done. Reads only the
    StatefulSets while none has a pod to roll (their status counts the updated pods)."""
    key = (spec.namespace, spec.name)
    events = await _masters_back(ctx, owner, spec, password, logger)
    revisions = [await _rolling_revision(ctx, spec, broker) for broker in range(spec.brokers)]
    if not any(revisions):
        ctx.roll_waiting_since.pop(key, None)
        return events
    masters = await recorded_masters(ctx, spec)  # after this pass's failovers and switchovers
    observed = [
        await _broker(ctx, spec, broker, revision, masters, password)
        for broker, revision in enumerate(revisions)
    ]
    step = next_step(
        [rolls for _, rolls in observed],
        spec.redis_pods_per_broker,
        ctx.clock(),
        ctx.roll_waiting_since.get(key),
        SYNC_WAIT_S,
    )
    if step.waiting_since is None:
        ctx.roll_waiting_since.pop(key, None)
    else:
        ctx.roll_waiting_since[key] = step.waiting_since
    if step.held:
        logger.info("roll held: %s", step.held)
    if step.delete is None or step.broker is None:
        return events
    pods = observed[step.broker][0]
    return events + await _take(
        ctx, owner, spec, step.broker, step.delete, step.switch_to, pods, password, logger
    )


async def _masters_back(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    password: str,
    logger: Logger,
) -> list[TopicEvent]:
    """Record a master this leader restarted in place as master again once its pod is back
    Ready on its volume (it started as a replica: a new uid is not the recorded master), so
    the roll costs its restart, not a failover grace."""
    events = []
    for broker in range(spec.brokers):
        key = (spec.namespace, spec.name, broker)
        name = ctx.rolled_in_place.get(key)
        if name is None:
            continue
        masters = await recorded_masters(ctx, spec)
        pods = await observe_pods(
            ctx, spec, broker, password, masters.get(naming.master_key(broker))
        )
        back = next((pod for pod in pods.pods if pod.name == name), None)
        if back is None or back.named_master:
            ctx.rolled_in_place.pop(key, None)  # recorded meanwhile (a failover decision)
            continue
        address = pods.addresses.get(name)
        if not (back.master_volume and back.ready and back.reachable and address):
            continue  # still restarting
        await ctx.redis.promote(address, password)
        await publish_master(ctx, owner, spec, broker, name, pods.uids[name], address, ready=True)
        ctx.rolled_in_place.pop(key, None)
        logger.warning("broker %d: %s is back from its roll and master again", broker, name)
        events.append(
            TopicEvent(
                NORMAL,
                "MasterRestarted",
                f"Broker {broker}: {name} is back on the new spec with its data and is master "
                "again.",
            )
        )
    return events


async def _rolling_revision(ctx: OperatorContext, spec: TopicSpec, broker: int) -> str | None:
    """The broker StatefulSet's updateRevision while some of its pods run another; else None.
    Only a StatefulSet the operator rolls (updateStrategy OnDelete): one still rolled by its
    controller (an earlier version's, in a namespace the operator may not update) is left to
    it."""
    statefulset = await ctx.kube.get(
        "apps/v1", "StatefulSet", spec.namespace, naming.redis_statefulset(spec.name, broker)
    )
    strategy = ((statefulset or {}).get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type") != "OnDelete":
        return None
    status = (statefulset or {}).get("status") or {}
    revision = status.get("updateRevision")
    replicas = ((statefulset or {}).get("spec") or {}).get("replicas", 1)
    rolled = status.get("currentRevision") == revision and status.get("updatedReplicas") == replicas
    return None if not revision or rolled else str(revision)


async def _broker(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    revision: str | None,
    masters: Mapping[str, str],
    password: str,
) -> tuple[BrokerPods, list[RollPod]]:
    """A broker's pods as a roll sees them: a pod is outdated when its revision label is not
    its StatefulSet's updateRevision (a StatefulSet with nothing to roll: none is)."""
    recorded = masters.get(naming.master_key(broker))
    pods = await observe_pods(ctx, spec, broker, password, recorded)
    rolls = []
    for pod in pods.pods:
        running = pods.revisions.get(pod.name)
        outdated = bool(revision and running and running != revision)
        legacy = outdated and pod.ready and not pod.reachable and bool(pods.addresses[pod.name])
        master = pod.named_master and pod.ready and (pod.role == "master" or legacy)
        rolls.append(
            RollPod(
                name=pod.name,
                ordinal=pod.ordinal,
                master=master,
                ready=pod.ready,
                terminating=pod.terminating,
                in_sync=master or legacy or (pod.role == "slave" and pod.link_up),
                outdated=outdated,
                offset=pod.offset,
                legacy=legacy,
            )
        )
    return pods, rolls


async def _take(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    name: str,
    switch_to: str | None,
    pods: BrokerPods,
    password: str,
    logger: Logger,
) -> list[TopicEvent]:
    """Switch over to `switch_to` when set, then delete pod `name`: only that incarnation of
    it (a precondition on its uid)."""
    events = []
    how = "as a replica"
    if switch_to is not None:
        decision = Decision(
            master=switch_to,
            switch_from=name,
            reason="SwitchedOver",
            message=f"{name} is rolled: switching over to {switch_to}",
        )
        names = tuple(pod.name for pod in pods.pods)
        done, told = await switch_over(
            ctx, owner, spec, broker, decision, pods.addresses, pods.uids, names, password, logger
        )
        events.append(told)
        if done.master != switch_to:  # the replica did not catch up: tried next pass
            return events
        how = f"after switching over to {switch_to}"
    elif any(pod.name == name and pod.named_master for pod in pods.pods):
        how = "in place, as master with its data"
        ctx.rolled_in_place[(spec.namespace, spec.name, broker)] = name
    await ctx.kube.delete("v1", "Pod", spec.namespace, name, {"uid": pods.uids[name]})
    logger.warning("broker %d: restarting %s onto the new spec %s", broker, name, how)
    events.append(
        TopicEvent(
            NORMAL,
            "BrokerPodRolled",
            f"Broker {broker}: {name} restarts onto the StatefulSet's new spec {how}.",
        )
    )
    return events
