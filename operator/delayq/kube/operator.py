"""kopf registration: which handler runs when; the work itself lives in handlers/.

Everything is registered on a registry built here (not kopf's global one), so tests build their own
operator against the in-memory API (kmock) with a real ZooKeeper and real redis-servers, and the
CLI builds the real one. Handler outcomes map to kopf as follows: a returned status patch is
written; a permanent failure writes its status and raises kopf.PermanentError (no retry loop); a
transient one writes its status and raises kopf.TemporaryError with a backoff delay. Status is
written by the operator itself, serialized per topic (see `serialized`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from delayq.kube import naming
from delayq.kube.client import KubeClient
from delayq.kube.config import OperatorConfig
from delayq.kube.handlers.deletion import finalize, release_finalizers
from delayq.kube.handlers.deps import Deps, Logger
from delayq.kube.handlers.errors import TopicFailure
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.redisctl import RedisCommands, RedisControl
from delayq.kube.zk import KazooTopicStore, TopicStore

Login = Callable[[], kopf.ConnectionInfo]
RESOURCE = (naming.GROUP, naming.VERSION, naming.PLURAL)
API_VERSION = f"{naming.GROUP}/{naming.VERSION}"


def default_login() -> kopf.ConnectionInfo:
    """In-cluster service account first, then a kubeconfig (for running outside the cluster)."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("no service account and no kubeconfig: cannot reach Kubernetes")
    return info


@dataclass
class Runtime:
    """The pieces the handlers share; `deps` exists from operator startup to cleanup."""

    config: OperatorConfig
    login: Login = default_login
    store: TopicStore = field(default_factory=KazooTopicStore)
    redis: RedisControl = field(default_factory=RedisCommands)
    deps: Deps | None = None

    def require(self) -> Deps:
        if self.deps is None:
            raise kopf.TemporaryError("operator is still starting", delay=1)
        return self.deps


def configure(settings: kopf.OperatorSettings) -> None:
    """Finalizer and bookkeeping under delayq.io, so nothing collides with other operators."""
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # events for warnings and errors only
    # Bounded watches: a silently dropped connection is noticed within minutes, not never.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30


Work = Callable[[Deps, Mapping[str, Any], Logger], Awaitable[dict[str, Any]]]


async def serialized(runtime: Runtime, body: kopf.Body, logger: Logger, work: Work) -> None:
    """Run `work` on a fresh copy of the topic, one at a time per topic, and write its status.

    kopf runs timers concurrently with change handlers, and both compute the whole condition
    list from the body they were given; without the lock and the fresh read, a health pass that
    started before a reconcile could write back the reconcile's old Provisioned condition.
    The status is patched inside the lock (not through kopf's patch, which lands later).
    """
    deps = runtime.require()
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    async with deps.lock(namespace, name):
        fresh = await deps.kube.get(API_VERSION, naming.KIND, namespace, name)
        if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
            return  # deleted meanwhile: nothing left to reconcile or report
        try:
            status = await work(deps, fresh, logger)
        except TopicFailure as failure:
            await write_status(deps, namespace, name, failure.status)
            if failure.permanent:
                raise kopf.PermanentError(str(failure)) from None
            raise kopf.TemporaryError(str(failure), delay=failure.delay_s) from None
        await write_status(deps, namespace, name, status)


async def write_status(deps: Deps, namespace: str, name: str, status: dict[str, Any]) -> None:
    if status:
        await deps.kube.patch_status(API_VERSION, naming.KIND, namespace, name, {"status": status})


def build_registry(runtime: Runtime) -> kopf.OperatorRegistry:
    """All handlers of the operator on a fresh registry."""
    registry = kopf.OperatorRegistry()
    config = runtime.config

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        runtime.deps = Deps(
            kube=KubeClient(runtime.login()),
            store=runtime.store,
            redis=runtime.redis,
            ctx=config.build,
            failover_grace_s=config.failover_grace_s,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(logger: Logger, **_: Any) -> None:
        if runtime.deps is not None:
            kube, runtime.deps = runtime.deps.kube, None
            try:
                # No finalizer may outlive the operator: with none running, a namespace
                # deletion would hang on it (see handlers/deletion.py).
                released = await release_finalizers(kube, config.namespaces, logger)
                if released:
                    logger.info("released the finalizer of %d topics", released)
            finally:
                await kube.close()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return runtime.login()

    @kopf.on.create(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.update(*RESOURCE, registry=registry, id="reconcile")
    @kopf.on.resume(*RESOURCE, registry=registry, id="reconcile")
    async def on_change(body: kopf.Body, logger: Logger, **_: Any) -> None:
        await serialized(runtime, body, logger, reconcile)

    @kopf.on.timer(*RESOURCE, registry=registry, id="health", interval=config.health_interval_s)
    async def on_timer(body: kopf.Body, logger: Logger, **_: Any) -> None:
        await serialized(runtime, body, logger, refresh)

    @kopf.on.delete(*RESOURCE, registry=registry, id="finalize", optional=config.optional_finalizer)
    async def on_delete(body: kopf.Body, logger: Logger, **_: Any) -> None:
        await finalize(runtime.require(), body, logger)

    return registry


async def run(
    config: OperatorConfig,
    stop_flag: asyncio.Event | None = None,
    runtime: Runtime | None = None,
) -> None:
    """Run the operator until stopped (the `delayq operator` command; tests pass a runtime).

    A peering name makes kopf's peering mandatory, which pauses every watch of a standalone
    operator (no peering resources are ever found), so it is passed only when peering is on.
    """
    runtime = runtime or Runtime(config)
    await kopf.operator(
        registry=build_registry(runtime),
        clusterwide=config.clusterwide,
        namespaces=config.namespaces,
        standalone=config.standalone,
        peering_name=None if config.standalone else config.peering,
        liveness_endpoint=config.liveness_endpoint or None,
        stop_flag=stop_flag,
    )
