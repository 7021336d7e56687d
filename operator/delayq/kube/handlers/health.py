"""The periodic health pass: observe brokers, act on failover decisions, move slots onto added
brokers (resharding.py), refresh status.

Runs from the leader's health loop (healthloop.py) for every provisioned, unpaused topic (not
on a kopf timer: see healthloop.py). It reads the Redis pods of each broker, lets
failover.decide() pick the master, applies that decision (REPLICAOF commands and the master's
record and EndpointSlice: master_endpoint.py, or the planned switchover of a stopping master:
switchover.py), then reports per-broker state,
slot ownership, depths and the copy of the routing (`status.routing`, published again when
ZooKeeper lost the node: restore.py). The status is patched only when it changed
(status.status_patch).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from delayq.coordination.routing import Routing, initial_routing
from delayq.coordination.splitting import routed_topic
from delayq.kube import naming
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError
from delayq.kube.conditions import broker_full_condition, slots_unowned_condition
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.ensembles import EnsembleRefused
from delayq.kube.errors import TRANSIENT_ERRORS, TopicFailure
from delayq.kube.events import WARNING, TopicEvent
from delayq.kube.failover import Decision, RedisPod, decide
from delayq.kube.handlers.restore import read_or_restore
from delayq.kube.handlers.switchover import switch_over
from delayq.kube.master_endpoint import publish_master, recorded_masters
from delayq.kube.redisctl import BrokerMemory
from delayq.kube.resharding import MOVE_ERRORS, moving, reshard, services_rolled
from delayq.kube.routing_ahead import status_writer
from delayq.kube.routing_record import RECORD_FIELD, RoutingRecordInvalid, routing_record
from delayq.kube.settings_record import publish_settings
from delayq.kube.spec import SpecError, TopicSpec
from delayq.kube.status import (
    DEGRADED,
    FALSE,
    PROVISIONED,
    SLOTS_UNOWNED,
    TRUE,
    Condition,
    current_condition,
    find_condition,
    ready_condition,
)
from delayq.kube.topics import now_iso, parse_body, with_conditions
from delayq.queue import SlotStats, Topic, TopicStats


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_ordinal(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


HEALTH_RETRY_S = 15.0


async def refresh(ctx: OperatorContext, body: Mapping[str, Any], logger: Logger) -> dict[str, Any]:
    """One health pass; returns the status patch (empty when nothing changed).

    API, network and Redis command failures end the pass as a transient TopicFailure (kopf
    retries the timer after a backoff); the next pass starts from fresh observations.
    """
    try:
        return await health_pass(ctx, body, logger)
    except (KubeApiError, redis.RedisError, *TRANSIENT_ERRORS) as error:
        message = f"health pass failed: {error!r}"
        raise TopicFailure(message, {}, permanent=False, delay_s=HEALTH_RETRY_S) from None


async def health_pass(
    ctx: OperatorContext, body: Mapping[str, Any], logger: Logger
) -> dict[str, Any]:
    """Observe every broker, act on failover decisions, and compute the new status."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    if naming.is_paused(meta.get("annotations")) or not status.get("appliedSlotAmount"):
        return {}
    try:
        spec = parse_body(body)
        zookeeper_connect(spec, ctx.build)  # an ensemble the platform allows, or none
    except (SpecError, EnsembleRefused):
        return {}  # reconcile() already reported it; nothing here is safe to touch
    applied = int(status["appliedSlotAmount"])
    # a move of an abandoned pass may switch after this pass reads the routing: its copy in
    # status, patched before that switch, must not be overwritten by this pass's older read
    abandoned = moving(spec)
    secret = await topic_secret(ctx, spec)
    password = secret.get(naming.SECRET_REDIS_ADMIN_PASSWORD, "")
    zk_password = secret.get(naming.SECRET_ZOOKEEPER_PASSWORD, "")
    # known None: no routing in ZooKeeper nor in status, or ZooKeeper down (then owned is None)
    known, owned = await slot_view(ctx, body, spec, zk_password, logger)
    routing = known or initial_routing(applied, min(spec.brokers, applied))
    previous = {entry.get("index"): entry for entry in status.get("brokers") or []}
    masters = await recorded_masters(ctx, spec)
    brokers: list[dict[str, Any]] = []
    slot_stats: list[SlotStats] = []
    memory: dict[int, BrokerMemory] = {}  # of the brokers whose master answered
    actions: list[TopicEvent] = []
    for broker in range(spec.brokers):
        seen = await observe_broker(
            ctx,
            body,
            spec,
            broker,
            password,
            routing,
            previous.get(broker) or {},
            masters.get(naming.master_key(broker)),
            logger,
        )
        brokers.append(seen.entry)
        slot_stats += seen.stats.slots
        actions += seen.events
        if seen.memory is not None:
            memory[broker] = seen.memory
    serving = all(entry["state"] == "Ready" for entry in brokers)
    resharding = None
    rolled = serving and services_rolled(
        await ctx.kube.get(
            "apps/v1", "StatefulSet", spec.namespace, naming.service_statefulset(spec.name)
        )
    )
    # every master ready, every service on the spec, ZooKeeper up with a routing (none: its
    # data lost with no copy to restore, and moves or a doubling planned on the first routing
    # would strand messages)
    record = known is not None and not abandoned  # follows ZooKeeper, never the fallback
    if rolled and owned is not None and known is not None:
        try:
            write = status_writer(ctx, spec)
            resharding = await reshard(ctx, spec, routing, password, status, logger, write)
        except MOVE_ERRORS as error:  # reading the moves failed: the next pass tries again
            logger.warning("resharding skipped this pass: %r", error)
            record = False  # its movers may have patched the copy ahead of `routing`: kept
    if resharding is not None:
        actions += resharding.events
        routing = resharding.routing  # read again from ZooKeeper after its moves
        for entry in brokers:
            entry["slots"] = len(routing.slots_of(entry["index"]))
    applied = routing.slot_amount  # the routing's (a doubling changes it), else the status's
    # What the pass did that the status does not show (a demotion, moves): told now, once.
    await ctx.recorder.post(ctx.kube, body, actions)
    depths = TopicStats(slot_stats)
    service_pods = await ctx.kube.list(
        "v1", "Pod", spec.namespace, naming.service_selector(spec.name)
    )
    services_ready = sum(1 for pod in service_pods if pod_ready(pod))
    problems = degradations(
        spec, brokers, services_ready, applied if owned is None else owned, applied
    )
    if owned is None:
        connect = zookeeper_connect(spec, ctx.build)
        problems.insert(0, f"ZooKeeper {connect} is unreachable: slot ownership is unknown")
    degraded = (
        Condition(
            DEGRADED,
            TRUE,
            "ZooKeeperUnreachable" if owned is None else "Degraded",
            "; ".join(problems) + ".",
        )
        if problems
        else Condition(DEGRADED, FALSE, "AllReplicasReady", "Every pod is ready.")
    )
    ready = ready_condition(current_condition(status, PROVISIONED), degraded, serving)
    conditions = [degraded, ready]
    if (full := broker_full_condition(memory)) is not None:
        conditions.append(full)
    fields: dict[str, Any] = {
        "appliedSlotAmount": applied,
        "paused": any(entry.get("paused") for entry in brokers),
        "brokers": brokers,
        "depths": {"scheduled": depths.scheduled, "prepared": depths.prepared, "dead": depths.dead},
    }
    if resharding is not None and resharding.condition is not None:
        conditions.append(resharding.condition)
        fields["resharding"] = resharding.progress
    if record:
        fields[RECORD_FIELD] = routing_record(routing)
    ctx.metrics.observe_topic(
        (spec.namespace, spec.name), memory, None if owned is None else max(applied - owned, 0)
    )
    if owned is not None:  # unknown: the last known ownership stays, and so does its condition
        unowned = max(applied - owned, 0)
        conditions.append(slots_condition(ctx, spec, status, unowned, applied))
        fields["slots"] = {"total": applied, "owned": owned, "unowned": unowned}
    patch = with_conditions(ctx, body, conditions, **fields)
    if record and resharding is not None and resharding.recorded:
        # patched ahead of a switch meanwhile: the diff against the status the pass started
        # from would leave it ahead when a switch failed
        patch[RECORD_FIELD] = fields[RECORD_FIELD]
    return patch


def slots_condition(
    ctx: OperatorContext, spec: TopicSpec, status: Mapping[str, Any], unowned: int, total: int
) -> Condition:
    """SlotsUnowned, timed from when this leader first saw a slot without an owner."""
    key = (spec.namespace, spec.name)
    if unowned:
        since = ctx.unowned_since.setdefault(key, ctx.clock())
    else:
        ctx.unowned_since.pop(key, None)
        since = ctx.clock()
    previous = find_condition(status, SLOTS_UNOWNED)
    return slots_unowned_condition(previous, unowned, total, ctx.clock() - since)


def degradations(
    spec: TopicSpec, brokers: list[dict[str, Any]], services_ready: int, owned: int, slots: int
) -> list[str]:
    problems = [
        f"broker {entry['index']} has {entry['replicasReady']}/{entry['replicasDesired']} "
        "replicas ready"
        for entry in brokers
        if entry["replicasReady"] < entry["replicasDesired"]
    ]
    if services_ready < spec.brokers:
        problems.append(f"{services_ready}/{spec.brokers} delay-service pods ready")
    if owned < slots:
        problems.append(f"{slots - owned} of {slots} slots have no owner")
    return problems


async def topic_secret(ctx: OperatorContext, spec: TopicSpec) -> dict[str, str]:
    """The topic Secret's values, decoded: the password of the operator's Redis user
    (delayq.queue.acl.ADMIN_USER) and the topic's ZooKeeper password among them."""
    secret = await ctx.kube.get(
        "v1", "Secret", spec.namespace, naming.credentials_secret(spec.name)
    )
    data = (secret or {}).get("data") or {}
    return {key: base64.b64decode(value).decode() for key, value in data.items() if value}


async def slot_view(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    spec: TopicSpec,
    zk_password: str,
    logger: Logger,
) -> tuple[Routing | None, int | None]:
    """The published routing (restored from the status copy when ZooKeeper lost it; None when
    unknown) and the owned-slot count (None: ZooKeeper unreachable, not a failure: the brokers
    still get their health pass and failovers)."""
    connect = zookeeper_connect(spec, ctx.build)
    routing: Routing | None
    try:
        try:
            routing = await read_or_restore(ctx, body, spec, zk_password, logger)
        except RoutingRecordInvalid as error:  # reconcile reports it (Provisioned False)
            logger.warning("routing not restored: %s", error)
            routing = None
        owned = await ctx.store.owned_slots(connect, spec.namespace, spec.name)
    except TRANSIENT_ERRORS as error:
        logger.warning("ZooKeeper unavailable for the health pass: %r", error)
        return None, None
    return routing, owned


@dataclass(frozen=True)
class BrokerObservation:
    """One broker after its pass: status entry, its slots' stats, its master's memory (None
    without a serving master or when the read failed), Events for what was done to it."""

    entry: dict[str, Any]
    stats: TopicStats
    memory: BrokerMemory | None
    events: list[TopicEvent]


async def observe_broker(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    password: str,
    routing: Routing,
    previous: Mapping[str, Any],
    recorded: str | None,
    logger: Logger,
) -> BrokerObservation:
    """Observe, decide, act for one broker whose master record is `recorded`
    (naming.master_record: a pod made again under the master's name is not the master).

    Without a record (a topic from a version that labelled its master pod instead), the pod
    carrying that label is the master: the label was on that incarnation too."""
    raw_pods = await ctx.kube.list(
        "v1", "Pod", spec.namespace, naming.redis_selector(spec.name, broker)
    )
    pods, addresses, uids = [], {}, {}
    for pod in raw_pods:
        name = pod["metadata"]["name"]
        address = (pod.get("status") or {}).get("podIP")
        addresses[name] = address
        uids[name] = str(pod["metadata"].get("uid") or "")
        labels = pod["metadata"].get("labels") or {}
        if recorded is None:
            named = labels.get(naming.LEGACY_LABEL_ROLE) == naming.LEGACY_ROLE_MASTER
        else:
            named = naming.master_record(name, uids[name]) == recorded
        info = await ctx.redis.inspect(address, password) if address else None
        pods.append(
            RedisPod(
                name=name,
                ordinal=pod_ordinal(name),
                ready=pod_ready(pod),
                named_master=named,
                role=info.role if info else None,
                offset=info.offset if info else 0,
                keys=info.keys if info else 0,
                terminating=bool(pod["metadata"].get("deletionTimestamp")),
                link_up=bool(info and info.link_up),
            )
        )
    key = (spec.namespace, spec.name, broker)
    had_master = (
        recorded is not None
        or bool(previous.get("masterPod"))
        or any(pod.named_master for pod in pods)
    )
    decision = decide(
        pods, ctx.clock(), ctx.failover_grace_s, ctx.master_missing_since.get(key), had_master
    )
    if decision.missing_since is None:
        ctx.master_missing_since.pop(key, None)
    else:
        ctx.master_missing_since[key] = decision.missing_since
    events: list[TopicEvent] = []
    if decision.switch_from is not None:
        names = tuple(pod.name for pod in pods)
        decision, told = await switch_over(
            ctx, owner, spec, broker, decision, addresses, uids, names, password, logger
        )
        events.append(told)
    ready_pods = {pod.name for pod in pods if pod.ready}
    events += await apply_decision(
        ctx, owner, spec, broker, decision, addresses, uids, ready_pods, password, logger
    )

    serving = decision.master is not None and decision.master in ready_pods
    # While a lost master is awaited (or no replica can replace it yet), keep naming it: the
    # status is what tells the next pass (and a restarted operator) that there was a master,
    # so that it keeps the grace and reports the promotion as a failover.
    lost_master = previous.get("masterPod") if decision.missing_since is not None else None
    entry: dict[str, Any] = {
        "index": broker,
        "state": "Ready" if serving else decision.reason,
        "masterPod": decision.master or lost_master or "",
        "replicasReady": len(ready_pods - {decision.master}),
        "replicasDesired": spec.replicas_per_broker,
        "slots": len(routing.slots_of(broker)) if broker < routing.broker_count else 0,
    }
    last = now_iso(ctx) if decision.failover else previous.get("lastFailoverTime")
    if last:
        entry["lastFailoverTime"] = last
    switched = now_iso(ctx) if decision.switch_from else previous.get("lastSwitchoverTime")
    if switched:
        entry["lastSwitchoverTime"] = switched
    stats = TopicStats([])
    master_address = addresses.get(decision.master or "")
    if serving and master_address:
        await load_functions(ctx, broker, master_address, password, logger)
        await publish_settings(ctx, owner, spec, routing, broker, master_address, password, logger)
    if serving and master_address and broker < routing.broker_count:
        # The routing's slot amount and key generation are the served ones (a doubling
        # changes both); taking them from the routing keeps every slot in range.
        topic = routed_topic(Topic(spec.name, namespace=spec.namespace), routing)
        try:
            stats = await ctx.redis.depths(
                master_address, password, topic, routing.slots_of(broker)
            )
        except (redis.RedisError, *TRANSIENT_ERRORS) as error:
            # depths are informative: a master dying under the read must not fail the pass
            # (which would hold back its status, failover included, by a retry delay)
            logger.warning("depths of broker %d unavailable: %r", broker, error)
    memory = None
    if serving and master_address:
        try:
            memory = await ctx.redis.memory(master_address, password)
        except (redis.RedisError, *TRANSIENT_ERRORS) as error:  # informative, as depths
            logger.warning("memory of broker %d unavailable: %r", broker, error)
        paused = await enforce_pause(ctx, spec, broker, master_address, password, logger)
        if paused is not None:
            entry["paused"] = paused
    return BrokerObservation(entry, stats, memory, events)


async def load_functions(
    ctx: OperatorContext, broker: int, master_address: str, password: str, logger: Logger
) -> None:
    """Make sure the master has the engine's functions library of this version (the delay
    services may only call it): a new broker, one restarted without its data or emptied by
    FUNCTION FLUSH gets it on this pass. A failure is logged and tried again next pass (the
    services report not-ready meanwhile); FUNCTION LOAD is a write, so a master held by
    minReplicasToWrite without a replica in sync refuses it (NOREPLICAS) as it refuses the
    services' writes, until one is."""
    try:
        if await ctx.redis.load_functions(master_address, password):
            logger.info("loaded the functions library on broker %d", broker)
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:
        logger.warning("functions library of broker %d not loaded: %r", broker, error)


async def enforce_pause(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    master_address: str,
    password: str,
    logger: Logger,
) -> bool | None:
    """Hold the master to `spec.delivery.paused` (unset: whatever the API set) and return
    whether its delivery is paused; None when the master did not answer (the next pass
    tries again: setting the key is idempotent)."""
    topic = Topic(spec.name, namespace=spec.namespace, slot_amount=spec.slot_amount)
    try:
        return await ctx.redis.pause(master_address, password, topic, spec.delivery.paused)
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:
        logger.warning("pause state of broker %d unavailable: %r", broker, error)
        return None


async def apply_decision(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    decision: Decision,
    addresses: Mapping[str, str | None],
    uids: Mapping[str, str],
    ready_pods: set[str],
    password: str,
    logger: Logger,
) -> list[TopicEvent]:
    """Promote, then publish the master (its record and the Service's endpoint: clients move
    to it at once), then demote.

    The master is published on every pass, not only on a change: its readiness reaches the
    Service's EndpointSlice within a pass (no write when nothing changed).
    Returns the Events of the actions the status does not show: a stray master demoted, a
    recorded master found running as a replica and promoted again (failovers and elections
    are told from the status, events.broker_events)."""
    events: list[TopicEvent] = []
    if decision.promote:
        address = addresses.get(decision.promote)
        if address:
            await ctx.redis.promote(address, password)
        if decision.failover:
            ctx.metrics.failovers.labels(spec.namespace, spec.name).inc()
        elif decision.reason == "MasterRepaired":
            events.append(
                TopicEvent(
                    WARNING,
                    "MasterRepaired",
                    f"Broker {broker}: {decision.promote} is the recorded master but ran as a "
                    "replica; it was made master again.",
                )
            )
        logger.warning("broker %d: %s (%s)", broker, decision.reason, decision.message)
    if decision.master is not None:
        master = decision.master
        ready = master in ready_pods
        address = addresses.get(master)
        await publish_master(ctx, owner, spec, broker, master, uids[master], address, ready)
    master_host = naming.redis_master_host(spec.name, spec.namespace, broker)
    for name in decision.demote:
        address = addresses.get(name)
        if address:
            await ctx.redis.demote(address, password, master_host)
            logger.warning("broker %d: demoted stray master %s", broker, name)
            events.append(
                TopicEvent(
                    WARNING,
                    "StrayMasterDemoted",
                    f"Broker {broker}: {name} still acted as a master; it now replicates from "
                    f"{decision.master} and drops what it wrote since it lost the role.",
                )
            )
    return events
