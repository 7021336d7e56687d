"""The leader's periodic work: a health pass per topic, then the ZooKeeper garbage collection
and that of the operator's copies of deleted topics' credentials (kube/credentials.py).

This replaces a kopf timer on purpose: kopf puts a finalizer on every object that has a timer or
a daemon, even when no deletion handler needs one (nolar/kopf#1074), and the finalizer of an
operator that died without SIGTERM blocks the deletion of the topic, and of its namespace, until
an operator runs again. Here nothing is attached to the topics.

Every `interval_s` the loop lists the topics of the watched namespaces and starts a pass for each
topic that has none in flight and is not backing off, each in its own task: a slow or failing
topic never delays the others, and its errors are logged. The pass itself (`run_pass`) goes
through operator.serialized, so it never overlaps a change handler of the same topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

import kopf

from delayq.kube.client import KubeApiError
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.credentials import collect_copies
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.topics import TopicKey, list_topics, topic_key
from delayq.kube.zk_gc import collect_orphans
from delayq.kube.zookeeper_clients import admit_topic_namespaces

RunPass = Callable[[Mapping[str, Any], Logger], Awaitable[None]]
PASS_TIMEOUT_S = 30.0


class TopicLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes `[namespace/name]`, as kopf's per-object logger does in handlers."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"[{self.extra['topic'] if self.extra else '?'}] {msg}", kwargs


class HealthLoop:
    """Health passes, ZooKeeper GC and the ZooKeeper clients' NetworkPolicy for the topics of
    `namespaces` (all when empty)."""

    def __init__(
        self,
        ctx: OperatorContext,
        namespaces: Sequence[str],
        interval_s: float,
        run_pass: RunPass,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        pass_timeout_s: float = PASS_TIMEOUT_S,
        clients_policy: str = "",
    ) -> None:
        self.ctx, self.namespaces, self.interval_s = ctx, namespaces, interval_s
        self.pass_timeout_s = pass_timeout_s
        self.run_pass, self.logger, self.clock = run_pass, logger, clock
        self.passes: dict[TopicKey, asyncio.Task[None]] = {}
        self.retry_at: dict[TopicKey, float] = {}  # backoff after a transient failure
        self.gc: asyncio.Task[None] | None = None
        self.clients_policy = clients_policy

    async def run(self) -> None:
        """Tick until cancelled; in-flight passes are cancelled with it."""
        try:
            while True:
                await self.tick()
                await asyncio.sleep(self.interval_s)
        finally:
            tasks = [*self.passes.values(), *([self.gc] if self.gc else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def tick(self) -> None:
        """Start the passes that are due and, unless one still runs, a garbage collection."""
        try:
            topics = await list_topics(self.ctx.kube, self.namespaces)
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            self.logger.warning("health loop: cannot list the DelayTopics: %r", error)
            return
        now_s = self.clock()
        listed = set()
        for topic in topics:
            key = topic_key(topic)
            listed.add(key)
            if key not in self.passes and self.retry_at.get(key, now_s) <= now_s:
                self.passes[key] = asyncio.create_task(self.one_pass(key, topic))
        self.retry_at = {key: at for key, at in self.retry_at.items() if key in listed}
        self.ctx.metrics.keep_topics(listed)  # a deleted topic's figures go with it
        windows = self.ctx.lateness_windows  # and its pods' lateness readings
        self.ctx.lateness_windows = {key: kept for key, kept in windows.items() if key in listed}
        await self.admit(topics)
        if self.gc is None or self.gc.done():
            self.gc = asyncio.create_task(self.collect())

    async def one_pass(self, key: TopicKey, topic: Mapping[str, Any]) -> None:
        logger = TopicLogger(self.logger, {"topic": "/".join(key)})
        try:
            # bounded: a pass stuck on an unanswered call must not stop this topic's passes
            # (and with them its failovers) for good
            await asyncio.wait_for(self.run_pass(topic, logger), self.pass_timeout_s)
            self.retry_at.pop(key, None)
        except TimeoutError:
            logger.warning("health pass took over %g s: abandoned", self.pass_timeout_s)
        except kopf.TemporaryError as error:
            delay_s = float(error.delay or 0)
            self.retry_at[key] = self.clock() + delay_s
            logger.warning("health pass failed, next one in %g s: %s", delay_s, error)
        except kopf.PermanentError as error:
            logger.error("health pass failed: %s", error)
        except Exception:  # one broken topic must never stop the others' passes
            logger.exception("health pass failed unexpectedly")
        finally:
            self.passes.pop(key, None)

    async def admit(self, topics: Sequence[Mapping[str, Any]]) -> None:
        """Keep the NetworkPolicy `clients_policy` (set in the cluster-wide mode with the bundled
        ZooKeeper only) admitting the namespaces of `topics` (zookeeper_clients.py)."""
        if not self.clients_policy:
            return
        try:
            await admit_topic_namespaces(
                self.ctx.kube, self.ctx.config.build.operator_namespace, self.clients_policy,
                topics, self.logger,
            )  # fmt: skip
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            self.logger.warning("cannot update the ZooKeeper clients' NetworkPolicy: %r", error)

    async def collect(self) -> None:
        try:
            await collect_orphans(self.ctx, self.namespaces, self.logger)
        except Exception:  # logged; the next tick tries again
            self.logger.exception("ZooKeeper garbage collection failed")
        try:
            await collect_copies(self.ctx, self.namespaces, self.logger)
        except (KubeApiError, *TRANSIENT_ERRORS) as error:  # the next tick tries again
            self.logger.warning("cannot collect the credentials copies: %r", error)
