"""kopf registration and the leader's run: which handler runs when; the work lives in handlers/.

kopf handles the changes of DelayTopics (create, update, resume); the periodic health pass runs
in the leader's own loop (healthloop.py), not on a kopf timer, and there is no deletion handler:
either would make kopf put a finalizer on every topic (see zk_gc.py for why none).
Everything is registered on a registry built here (not kopf's global one), so tests build their own
operator against the in-memory API (kmock) with a real ZooKeeper and real redis-servers, and the
CLI builds the real one. Handler outcomes map to kopf as follows: a returned status patch is
written; a permanent failure writes its status and raises kopf.PermanentError (no retry loop); a
transient one writes its status and raises kopf.TemporaryError with a backoff delay. Status is
written by the operator itself, serialized per topic (see `serialized`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

import kopf

from delayq.kube import naming
from delayq.kube.client import KubeClient
from delayq.kube.config import OperatorConfig
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TopicFailure
from delayq.kube.events import WARNING, TopicEvent, status_events
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.healthloop import HealthLoop
from delayq.kube.leader_election import LeaderElector, LeadershipLost
from delayq.kube.liveness import liveness_server
from delayq.kube.metrics_server import metrics_server
from delayq.kube.resharding import movers_stopped
from delayq.kube.status import patched
from delayq.kube.topics import API_VERSION

LOGGER = logging.getLogger(__name__)
STOP_GRACE_S = 3.0  # how long a replica that lost the leader Lease lets kopf wind down
KOPF_STOP_TIMEOUT_S = 30.0  # how long a clean stop waits for kopf (cleanup handlers included)
RESOURCE = (naming.GROUP, naming.VERSION, naming.PLURAL)


def configure(settings: kopf.OperatorSettings) -> None:
    """Bookkeeping under delayq.io, so nothing collides with other operators."""
    # Migration: older versions put this finalizer on every topic. Naming it kopf's finalizer
    # makes kopf remove it from each topic it sees (resume included), as no handler needs one.
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.GROUP, key="last-handled-configuration"
    )
    # The operator posts its own Events on status transitions (events.py, recorder.py); kopf's
    # would add one per failed retry of a handler (every 15-60 s while a topic is stuck).
    settings.posting.enabled = False
    # Bounded watches: a silently dropped connection is noticed within minutes, not never.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30


Work = Callable[[OperatorContext, Mapping[str, Any], Logger], Awaitable[dict[str, Any]]]


async def serialized(
    ctx: OperatorContext, body: Mapping[str, Any], logger: Logger, work: Work
) -> None:
    """Run `work` on a fresh copy of the topic, one at a time per topic, and write its status.

    The health loop runs concurrently with kopf's change handlers, and both compute the whole
    condition list from the body they were given; without the lock and the fresh read, a health
    pass that started before a reconcile could write back the reconcile's old Provisioned
    condition.
    The status is patched inside the lock (not through kopf's patch, which lands later).
    """
    kube = ctx.kube  # raises kopf.TemporaryError while this replica does not lead
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    async with ctx.lock(namespace, name):
        fresh = await kube.get(API_VERSION, naming.KIND, namespace, name)
        if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted meanwhile: nothing left to reconcile or report
        try:
            status = await work(ctx, fresh, logger)
        except TopicFailure as failure:
            await write_status(ctx, fresh, failure.status)
            if failure.permanent:
                raise kopf.PermanentError(str(failure)) from None
            raise kopf.TemporaryError(str(failure), delay=failure.delay_s) from None
        except Exception as error:  # a bug or an unforeseen answer: say so on the topic too
            event = TopicEvent(WARNING, "OperatorError", f"{type(error).__name__}: {error}")
            await ctx.recorder.post(kube, fresh, [event])
            raise
        await write_status(ctx, fresh, status)


async def write_status(
    ctx: OperatorContext, topic: Mapping[str, Any], status: dict[str, Any]
) -> None:
    """Patch the topic's status, then post the Events its transitions mean (events.py)."""
    if not status:
        return
    meta = topic["metadata"]
    await ctx.kube.patch_status(
        API_VERSION, naming.KIND, meta["namespace"], meta["name"], {"status": status}
    )
    old = topic.get("status") or {}
    await ctx.recorder.post(ctx.kube, topic, status_events(old, patched(old, status)))


async def counted_reconcile(ctx: OperatorContext, body: Mapping[str, Any], logger: Logger) -> None:
    """One run of the change handler, counted in the operator's metrics by outcome."""
    metrics = ctx.metrics
    metrics.reconciles.inc()
    try:
        await serialized(ctx, body, logger, reconcile)
    except kopf.TemporaryError:
        metrics.reconcile_errors.labels("transient").inc()
        raise
    except kopf.PermanentError:
        metrics.reconcile_errors.labels("permanent").inc()
        raise
    except Exception:
        metrics.reconcile_errors.labels("unexpected").inc()
        raise


def build_registry(ctx: OperatorContext) -> kopf.OperatorRegistry:
    """All handlers of the operator on a fresh registry."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return ctx.login()

    @kopf.on.create(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.update(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.resume(*RESOURCE, registry=registry, id="reconcile")
    async def on_change(body: kopf.Body, logger: Logger, **_: Any) -> None:
        await counted_reconcile(ctx, body, logger)

    return registry


async def run(
    config: OperatorConfig,
    stop_flag: asyncio.Event | None = None,
    ctx: OperatorContext | None = None,
) -> None:
    """Run the operator until stopped (the `delayq operator` command; tests pass a context).

    Every replica campaigns for the leader Lease (leader_election.py); only the holder runs kopf,
    which therefore never needs its own peering. Raises LeadershipLost when the Lease is lost: the
    caller must stop acting at once (the CLI exits non-zero). Without `stop_flag`, SIGTERM and
    SIGINT stop it (a leader then releases the Lease so that a standby takes over at once, once
    this process's slot moves ended: resharding.movers_stopped).
    """
    ctx = ctx or OperatorContext.from_config(config)
    stop = stop_flag or stop_on_signals()
    async with contextlib.AsyncExitStack() as stack:
        if config.liveness_endpoint:
            await stack.enter_async_context(liveness_server(config.liveness_endpoint))
        if config.metrics_endpoint:
            await stack.enter_async_context(metrics_server(config.metrics_endpoint, ctx.metrics))
        if config.standalone:
            await lead(ctx, stop)
            return
        kube = KubeClient(ctx.login())
        stack.push_async_callback(kube.close)
        elector = LeaderElector(
            kube,
            config.build.operator_namespace,
            config.leader_lease_name,
            ctx.identity,
            config.leader_lease,
        )
        if not await elector.acquire(stop):
            return
        try:
            await lead(ctx, stop, elector.hold())
        except LeadershipLost:
            raise  # exit without touching the Lease again: it may be someone else's already
        except BaseException:
            if await movers_stopped():
                await elector.release()  # kopf failed: let a standby take over at once
            raise
        if await movers_stopped():  # else the Lease runs out: no standby beside our moves
            await elector.release()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM/SIGINT (kopf installs its own handlers while it runs)."""
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, stop.set)
    return stop


async def lead(
    ctx: OperatorContext, stop: asyncio.Event, holding: Coroutine[Any, Any, None] | None = None
) -> None:
    """Act as the leader: run kopf until `stop`, a signal (kopf returns) or the end of `holding`.

    `holding` is the leader Lease renewal loop; when it raises LeadershipLost, kopf is told to stop,
    given a moment (STOP_GRACE_S, well inside the leader Lease's safety margin), and the loss is
    raised without waiting longer.
    """
    config = ctx.config
    ctx.start_leading()
    kopf_stop = asyncio.Event()
    # Created before kopf starts, so that kopf's shutdown never counts them as its own tasks.
    stopped = asyncio.create_task(stop.wait(), name="delayq stop")
    health = asyncio.create_task(health_loop(ctx).run(), name="delayq health loop")
    renewal: asyncio.Task[None] | None = None
    if holding is not None:
        renewal = asyncio.create_task(holding, name="delayq leader lease renewal")
    operator = asyncio.create_task(
        kopf.operator(
            registry=build_registry(ctx),
            clusterwide=config.clusterwide,
            namespaces=config.namespaces,
            standalone=True,  # the Lease elects the leader; kopf's peering stays off
            stop_flag=kopf_stop,
        ),
        name="delayq kopf",
    )
    watched: list[asyncio.Task[Any]] = [operator, stopped, health, *([renewal] if renewal else [])]
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        kopf_stop.set()
        stopped.cancel()
        health.cancel()
        lost = renewal is not None and renewal.done() and not renewal.cancelled()
        if renewal is not None and not lost:
            renewal.cancel()
        try:
            await asyncio.wait_for(
                asyncio.shield(operator), STOP_GRACE_S if lost else KOPF_STOP_TIMEOUT_S
            )
        except TimeoutError:
            operator.cancel()
        finally:
            await asyncio.wait([health])  # its passes end before the clients they use close
            client = ctx.stop_leading()
            if client is not None:
                await client.close()
    if renewal is not None and renewal.done() and not renewal.cancelled():
        await renewal  # raises LeadershipLost
    if health.done() and not health.cancelled():
        await health  # it only ends by a bug: never hide it


def health_loop(ctx: OperatorContext) -> HealthLoop:
    """The leader's health passes (serialized with the change handlers per topic) and ZK GC."""

    async def run_pass(topic: Mapping[str, Any], logger: Logger) -> None:
        with ctx.metrics.health_pass_seconds.time():
            await serialized(ctx, topic, logger, refresh)

    config = ctx.config
    return HealthLoop(
        ctx, config.namespaces, config.health_interval_s, run_pass, LOGGER,
        clients_policy="" if config.namespaces else config.zookeeper_clients_policy,
    )  # fmt: skip
