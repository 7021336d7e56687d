"""The periodic health pass: observe brokers, act on failover decisions, move slots onto added
brokers (resharding.py), refresh status.

Runs from the leader's health loop (healthloop.py) for every provisioned, unpaused topic (not
on a kopf timer: see healthloop.py). `health_pass` runs its steps in order:
1. `observe_topic`: the topic's Secret, routing and slot ownership (ZooKeeper), the recorded
   masters, the functions library each live member calls, the service pods: a `TopicView`;
2. `tend_broker`, per broker: observe its Redis pods (`observe_pods`: which one runs on its
   service pod's node is part of the observation), let failover.decide()
   pick the master (`decide_master`), apply that decision (`act_on_decision`: REPLICAOF
   commands and the master's record and EndpointSlice: master_endpoint.py, or the planned
   switchover of a stopping master: switchover.py), then tend the serving master
   (`tend_master`: load the engine's functions library and delete old ones nobody calls,
   libraries.py; read depths and memory; hold the spec's pause): a `BrokerObservation`;
3. `reshard_step`: slot moves onto added brokers, or a doubling (resharding.py), then
   `roll_step`: the next pod of the operator's roll onto the brokers' new spec (rolling.py);
4. `topic_health`: per-broker state, slot ownership, depths, conditions and the copy of the
   routing (`status.routing`, published again when ZooKeeper lost the node: restore.py), as a
   typed `TopicHealth` (topic_health.py), turned into status fields only at the end. The
   status is patched only when it changed (status.status_patch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from delayq.coordination.routing import Routing, initial_routing
from delayq.coordination.splitting import routed_topic
from delayq.kube import naming
from delayq.kube.backups import observe_backups
from delayq.kube.builders.common import Manifest
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError
from delayq.kube.conditions import broker_full_condition, slots_unowned_condition
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.credentials import operator_credentials
from delayq.kube.ensembles import EnsembleRefused
from delayq.kube.errors import TRANSIENT_ERRORS, TopicFailure
from delayq.kube.events import WARNING, TopicEvent
from delayq.kube.failover import Decision, decide
from delayq.kube.handlers.broker_pods import BrokerPods, observe_pods, pod_ready, service_nodes
from delayq.kube.handlers.restore import read_or_restore
from delayq.kube.handlers.rolling import roll_step
from delayq.kube.handlers.switchover import switch_over
from delayq.kube.libraries import delete_unused_libraries, libraries_in_use
from delayq.kube.master_endpoint import publish_master, recorded_masters
from delayq.kube.objectives import (
    LatenessWindow,
    Silence,
    no_objective,
    objective_condition,
)
from delayq.kube.redisctl import BrokerMemory
from delayq.kube.resharding import MOVE_ERRORS, Resharding, moving, reshard, services_rolled
from delayq.kube.routing_ahead import status_writer
from delayq.kube.routing_record import RECORD_FIELD, RoutingRecordInvalid, routing_record
from delayq.kube.settings_record import publish_settings
from delayq.kube.spec import SpecError, TopicSpec
from delayq.kube.status import (
    OBJECTIVE_MET,
    PROVISIONED,
    SLOTS_UNOWNED,
    Condition,
    current_condition,
    find_condition,
    ready_condition,
)
from delayq.kube.topic_health import (
    SERVING,
    BrokerStatus,
    SlotCounts,
    TopicHealth,
    degradations,
    degraded_condition,
)
from delayq.kube.topics import now_iso, parse_body, with_conditions
from delayq.queue import Topic, TopicStats

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
    """Observe the topic, tend each broker (observe, decide, act), move slots onto added
    brokers, and compute the new status."""
    spec = spec_to_tend(ctx, body)
    if spec is None:
        return {}
    view = await observe_topic(ctx, body, spec, logger)
    if view is None:  # an earlier operator's topic, refused until it has a copy: no login
        return {}
    brokers = [
        await tend_broker(ctx, body, view, broker, logger) for broker in range(spec.brokers)
    ]
    resharding, record = await reshard_step(ctx, view, brokers, logger)
    # read again from ZooKeeper after its moves (a doubling changes the slot amount)
    routing = view.routing if resharding is None else resharding.routing
    actions = [event for seen in brokers for event in seen.events]
    if resharding is not None:
        actions += resharding.events
    actions += await roll_step(ctx, body, spec, view.password, logger)
    # What the pass did that the status does not show (a demotion, moves): told now, once.
    await ctx.recorder.post(ctx.kube, body, actions)
    health = await topic_health(ctx, view, brokers, routing, resharding, record)
    objective = await objective_step(ctx, body, view)  # after every decision: never delays one
    fields = health.fields()
    if spec.backup is not None or "backup" in view.status:
        fields["backup"] = await observe_backups(ctx.kube, spec)
    patch = with_conditions(ctx, body, [*health.conditions, *objective], **fields)
    if record and resharding is not None and resharding.recorded:
        # patched ahead of a switch meanwhile: the diff against the status the pass started
        # from would leave it ahead when a switch failed
        patch[RECORD_FIELD] = fields[RECORD_FIELD]
    return patch


def spec_to_tend(ctx: OperatorContext, body: Mapping[str, Any]) -> TopicSpec | None:
    """The topic's spec when a pass may touch it (provisioned, not paused, valid, on an
    ensemble the platform allows); None otherwise (reconcile() reports why)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    if naming.is_paused(meta.get("annotations")) or not status.get("appliedSlotAmount"):
        return None
    try:
        spec = parse_body(body)
        zookeeper_connect(spec, ctx.build)  # an ensemble the platform allows, or none
    except (SpecError, EnsembleRefused):
        return None  # nothing here is safe to touch
    return spec


@dataclass(frozen=True)
class TopicView:
    """What a pass reads before it touches a broker."""

    spec: TopicSpec
    status: Mapping[str, Any]  # the DelayTopic's status the pass started from
    password: str  # of the operator's Redis user (delayq.queue.acl.ADMIN_USER)
    # the published routing; None: none in ZooKeeper nor in status, or ZooKeeper down
    known: Routing | None
    routing: Routing  # `known`, else the first routing of the applied slot amount
    owned: int | None  # slots with an owner; None: ZooKeeper unreachable
    # a move of an abandoned pass still runs: it may switch after this pass reads the routing,
    # so its copy in status, patched before that switch, must not be overwritten by this read
    abandoned: bool
    previous: Mapping[int, Mapping[str, Any]]  # status.brokers by index
    masters: Mapping[str, str]  # the recorded masters (master_endpoint.recorded_masters)
    libraries: list[str] | None  # the functions library of each live member; None: unknown
    # the pods labelled as the topic's delay-service pods (naming.service_selector), read once
    service_pods: list[Manifest]


async def observe_topic(
    ctx: OperatorContext, body: Mapping[str, Any], spec: TopicSpec, logger: Logger
) -> TopicView | None:
    """The operator's copy of the topic's credentials, its routing and slot ownership,
    recorded masters, the members' functions libraries and the service pods, read once per
    pass (ZooKeeper down: `owned` and `libraries` None; None: no copy of the credentials yet)."""
    status = body.get("status") or {}
    applied = int(status["appliedSlotAmount"])
    abandoned = moving(spec)
    secret = await operator_credentials(ctx, body, spec)  # its copy, not the tenant's
    if not secret:
        return None
    zk_password = secret.get(naming.SECRET_ZOOKEEPER_PASSWORD, "")
    known, owned = await slot_view(ctx, body, spec, zk_password, logger)
    previous = {entry.get("index"): entry for entry in status.get("brokers") or []}
    masters = await recorded_masters(ctx, spec)
    libraries = None if owned is None else await libraries_in_use(ctx, spec, logger)
    return TopicView(
        spec=spec,
        status=status,
        password=secret.get(naming.SECRET_REDIS_ADMIN_PASSWORD, ""),
        known=known,
        routing=known or initial_routing(applied, min(spec.brokers, applied)),
        owned=owned,
        abandoned=abandoned,
        previous=previous,
        masters=masters,
        libraries=libraries,
        service_pods=await ctx.kube.list(
            "v1", "Pod", spec.namespace, naming.service_selector(spec.name)
        ),
    )


async def reshard_step(
    ctx: OperatorContext, view: TopicView, brokers: list[BrokerObservation], logger: Logger
) -> tuple[Resharding | None, bool]:
    """Move slots onto added brokers (or double them) when every master is ready, every
    service pod runs the spec and ZooKeeper is up with a routing (none: its data lost with no
    copy to restore, and moves or a doubling planned on the first routing would strand
    messages). Also whether status.routing records this pass's routing (it follows ZooKeeper,
    never the fallback)."""
    spec = view.spec
    serving = all(seen.entry.serving for seen in brokers)
    rolled = serving and services_rolled(
        await ctx.kube.get(
            "apps/v1", "StatefulSet", spec.namespace, naming.service_statefulset(spec.name)
        )
    )
    record = view.known is not None and not view.abandoned
    if not (rolled and view.owned is not None and view.known is not None):
        return None, record
    try:
        write = status_writer(ctx, spec)
        resharding = await reshard(ctx, spec, view.known, view.password, view.status, logger, write)
    except MOVE_ERRORS as error:  # reading the moves failed: the next pass tries again
        logger.warning("resharding skipped this pass: %r", error)
        return None, False  # its movers may have patched the copy ahead of `routing`: kept
    return resharding, record


async def topic_health(
    ctx: OperatorContext,
    view: TopicView,
    brokers: list[BrokerObservation],
    routing: Routing,
    resharding: Resharding | None,
    record: bool,
) -> TopicHealth:
    """The status of this pass: the brokers' entries (their slots as `routing` routes them),
    depths, slot ownership and the conditions."""
    spec = view.spec
    entries = tuple(seen.entry for seen in brokers)
    if resharding is not None:
        entries = tuple(entry.with_slots(len(routing.slots_of(entry.index))) for entry in entries)
    applied = routing.slot_amount  # the routing's (a doubling changes it), else the status's
    statefulset = naming.service_statefulset(spec.name)
    services_ready = sum(
        1
        for pod in view.service_pods
        if pod_ready(pod) and naming.pod_ordinal(statefulset, pod["metadata"]["name"]) is not None
    )
    owned = view.owned
    counted = SlotCounts(applied, applied if owned is None else owned)
    problems = degradations(entries, services_ready, spec.brokers, counted)
    if owned is None:
        connect = zookeeper_connect(spec, ctx.build)
        problems.insert(0, f"ZooKeeper {connect} is unreachable: slot ownership is unknown")
    degraded = degraded_condition(problems, zookeeper_unreachable=owned is None)
    serving = all(entry.serving for entry in entries)
    ready = ready_condition(current_condition(view.status, PROVISIONED), degraded, serving)
    conditions = [degraded, ready]
    memory = {seen.entry.index: seen.memory for seen in brokers if seen.memory is not None}
    if (full := broker_full_condition(memory)) is not None:
        conditions.append(full)
    told = None if resharding is None else resharding.condition  # None: nothing to report
    if told is not None:
        conditions.append(told)
    ctx.metrics.observe_topic(
        (spec.namespace, spec.name), memory, None if owned is None else max(applied - owned, 0)
    )
    slots = None
    if owned is not None:  # unknown: the last known ownership stays, and so does its condition
        slots = SlotCounts(applied, owned)
        conditions.append(slots_condition(ctx, spec, view.status, slots.unowned, applied))
    return TopicHealth(
        applied_slot_amount=applied,
        brokers=entries,
        depths=TopicStats([stats for seen in brokers for stats in seen.stats.slots]),
        conditions=tuple(conditions),
        resharding_reported=told is not None,
        resharding=None if resharding is None or told is None else resharding.progress,
        routing_record=routing_record(routing) if record else None,
        slots=slots,
    )


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


async def objective_step(
    ctx: OperatorContext, body: Mapping[str, Any], view: TopicView
) -> list[Condition]:
    """ObjectiveMet (objectives.py): the ready service pods' lateness, read at once under one
    deadline (objective_scrape.py), added to the topic's window; none while the topic has no
    objective and never had one."""
    spec = view.spec
    key = (spec.namespace, spec.name)
    objective_ms = spec.objectives_lateness_p99_ms
    ctx.metrics.observe_objective(key, objective_ms)
    if not objective_ms:
        ctx.lateness_windows.pop(key, None)
        return [] if find_condition(view.status, OBJECTIVE_MET) is None else [no_objective()]
    statefulset = naming.service_statefulset(spec.name)
    ready = {  # the service StatefulSet's pods only: anyone may label a pod of their own so
        pod["metadata"]["name"]: (pod["status"]["podIP"], str(pod["metadata"].get("uid") or ""))
        for pod in view.service_pods
        if pod_ready(pod)
        and (pod.get("status") or {}).get("podIP")
        and naming.pod_ordinal(statefulset, pod["metadata"]["name"]) is not None
    }
    # its own token, which the tenant does not rotate (it may rotate metrics-token)
    credentials = await operator_credentials(ctx, body, spec)
    token = credentials.get(naming.SECRET_OPERATOR_METRICS_TOKEN, "")
    read = await ctx.scraper.lateness({n: ip for n, (ip, _) in ready.items()}, token, key)
    answered = {
        f"{n}/{ready[n][1]}": found for n, found in read.items() if not isinstance(found, Silence)
    }
    window = ctx.lateness_windows.setdefault(key, LatenessWindow())
    window.record(ctx.clock(), spec.objectives_window_ms / 1000, answered)
    silent = {name: why for name, why in read.items() if isinstance(why, Silence)}
    return [
        objective_condition(
            objective_ms, spec.objectives_window_ms, window.measure(), silent, len(answered)
        )
    ]


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
    without a serving master or when the read failed), Events for what was done to it, the
    serving master's address (None without one)."""

    entry: BrokerStatus
    stats: TopicStats
    memory: BrokerMemory | None
    events: list[TopicEvent]
    master_address: str | None


@dataclass(frozen=True)
class MasterReport:
    """What a serving master told: its slots' stats, its memory and pause (None: unread)."""

    stats: TopicStats
    memory: BrokerMemory | None
    paused: bool | None


async def tend_broker(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    view: TopicView,
    broker: int,
    logger: Logger,
) -> BrokerObservation:
    """Observe one broker's pods, decide its master, act on the decision, then tend the
    serving master (`tend_master`).

    Its master record (naming.master_record) says which pod is the master: a pod made again
    under the master's name is not. Without a record (a topic from a version that labelled its
    master pod instead), the pod carrying that label is the master: the label was on that
    incarnation too."""
    spec = view.spec
    previous = view.previous.get(broker) or {}
    recorded = view.masters.get(naming.master_key(broker))
    service_node = service_nodes(view.service_pods, spec.name).get(broker, "")
    pods = await observe_pods(ctx, spec, broker, view.password, recorded, service_node)
    decision = decide_master(ctx, spec, broker, pods, recorded, previous)
    decision, events = await act_on_decision(
        ctx, owner, spec, broker, decision, pods, view.password, logger
    )
    serving = decision.master is not None and decision.master in pods.ready
    entry = broker_status(ctx, spec, broker, decision, pods, view.routing, previous, serving)
    master_address = pods.addresses.get(decision.master or "")
    if not (serving and master_address):
        return BrokerObservation(entry, TopicStats([]), None, events, None)
    report = await tend_master(ctx, owner, view, broker, master_address, logger)
    if report.paused is not None:
        entry = dataclasses.replace(entry, paused=report.paused)
    return BrokerObservation(entry, report.stats, report.memory, events, master_address)


def decide_master(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    pods: BrokerPods,
    recorded: str | None,
    previous: Mapping[str, Any],
) -> Decision:
    """failover.decide() with this leader's grace timer of the broker (kept in ctx)."""
    key = (spec.namespace, spec.name, broker)
    had_master = (
        recorded is not None
        or bool(previous.get("masterPod"))
        or any(pod.named_master for pod in pods.pods)
    )
    decision = decide(
        pods.pods, ctx.clock(), ctx.failover_grace_s, ctx.master_missing_since.get(key), had_master
    )
    if decision.missing_since is None:
        ctx.master_missing_since.pop(key, None)
    else:
        ctx.master_missing_since[key] = decision.missing_since
    return decision


async def act_on_decision(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    broker: int,
    decision: Decision,
    pods: BrokerPods,
    password: str,
    logger: Logger,
) -> tuple[Decision, list[TopicEvent]]:
    """The planned switchover of a stopping master (which may change the decision), then
    apply_decision; the decision acted on and the Events of what was done."""
    events: list[TopicEvent] = []
    if decision.switch_from is not None:
        names = tuple(pod.name for pod in pods.pods)
        decision, told = await switch_over(
            ctx, owner, spec, broker, decision, pods.addresses, pods.uids, names, password, logger
        )
        events.append(told)
    events += await apply_decision(
        ctx, owner, spec, broker, decision, pods.addresses, pods.uids, pods.ready, password, logger
    )
    return decision, events


def broker_status(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    decision: Decision,
    pods: BrokerPods,
    routing: Routing,
    previous: Mapping[str, Any],
    serving: bool,
) -> BrokerStatus:
    # While a lost master is awaited (or no replica can replace it yet), keep naming it: the
    # status is what tells the next pass (and a restarted operator) that there was a master,
    # so that it keeps the grace and reports the promotion as a failover.
    lost_master = previous.get("masterPod") if decision.missing_since is not None else None
    last = now_iso(ctx) if decision.failover else previous.get("lastFailoverTime")
    switched = now_iso(ctx) if decision.switch_from else previous.get("lastSwitchoverTime")
    return BrokerStatus(
        index=broker,
        state=SERVING if serving else decision.reason,
        master_pod=decision.master or lost_master or "",
        replicas_ready=len(pods.ready - {decision.master}),
        replicas_desired=spec.replicas_per_broker,
        slots=len(routing.slots_of(broker)) if broker < routing.broker_count else 0,
        last_failover_time=last or None,
        last_switchover_time=switched or None,
    )


async def tend_master(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    view: TopicView,
    broker: int,
    address: str,
    logger: Logger,
) -> MasterReport:
    """What a pass does on a serving master: the engine's functions library (loaded, old ones
    deleted: libraries.py), the topic's settings record (`owner`, the DelayTopic, publishes
    it: settings_record.py), the depths of its slots, its memory, the spec's pause."""
    spec, password, routing = view.spec, view.password, view.routing
    await load_functions(ctx, broker, address, password, logger)
    await publish_settings(ctx, owner, spec, routing, broker, address, password, logger)
    if view.libraries is not None:
        await delete_unused_libraries(ctx, spec, broker, address, password, view.libraries, logger)
    stats = TopicStats([])
    if broker < routing.broker_count:
        # The routing's slot amount and key generation are the served ones (a doubling
        # changes both); taking them from the routing keeps every slot in range.
        topic = routed_topic(Topic(spec.name, namespace=spec.namespace), routing)
        try:
            stats = await ctx.redis.depths(address, password, topic, routing.slots_of(broker))
        except (redis.RedisError, *TRANSIENT_ERRORS) as error:
            # depths are informative: a master dying under the read must not fail the pass
            # (which would hold back its status, failover included, by a retry delay)
            logger.warning("depths of broker %d unavailable: %r", broker, error)
    memory = None
    try:
        memory = await ctx.redis.memory(address, password)
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:  # informative, as depths
        logger.warning("memory of broker %d unavailable: %r", broker, error)
    paused = await enforce_pause(ctx, spec, broker, address, password, logger)
    return MasterReport(stats, memory, paused)


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
            if decision.reason == "MasterRepaired":
                # the recorded master found as a replica may be a switchover's old master the
                # operator left after hand_over, still paused (up to SWITCH_PAUSE_MS): its
                # clients would wait that long for a master that is one again
                await ctx.redis.release(address, password)
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
