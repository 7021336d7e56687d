"""`delayq serve`: run one delay-service process until SIGTERM or SIGINT, then exit 0.

SIGTERM handling follows the Kubernetes contract: readiness turns false at once, the service
stops claiming, in-flight deliveries get `grace_ms` to finish (pull leases are left to expire or
be acked by their holders), ownership is released, and the HTTP server closes last so probes and
acks keep working during the drain.

With ZooKeeper the routing node decides the slot amount and key generation (the settings'
slotAmount is only the desired one): read at start, and watched; once the slots doubled the
service is stopped the same way and a new one serves the new slots, in the same process (no
pod restart; its HTTP API is down in between, about a second: callers retry a refused
connection like a 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal

import redis
from aiohttp import web

from delayq.coordination.ownership import EmbeddedOwnership, Ownership
from delayq.coordination.routing_watch import RoutingUnreadable, RoutingWatch
from delayq.service import logs
from delayq.service.api import build_app
from delayq.service.config import ServiceConfig
from delayq.service.service import DelayService
from delayq.service.starting import (
    START_RETRY_MAX_S,
    START_RETRY_S,
    StartFailed,
    Waiting,
    stopped_within,
)
from delayq.service.tracing import Tracing, TracingConfigError

log = logging.getLogger(__name__)


def make_ownership(config: ServiceConfig) -> Ownership:
    """Embedded (every slot) without ZooKeeper; ZooKeeper membership and ownership with it."""
    if not config.zookeeper_connect:
        return EmbeddedOwnership(config.slot_amount)
    from delayq.coordination.zookeeper import ZkOwnership, ZkSettings  # kazoo only when used

    return ZkOwnership(
        ZkSettings(
            hosts=config.zookeeper_connect,
            namespace=config.namespace,
            topic=config.topic,
            slot_amount=config.slot_amount,
            member_id=config.member,
            preferred_broker=config.preferred_broker,
            session_timeout_s=config.zookeeper_session_timeout_ms / 1000,
            identity=config.zookeeper_identity,
            admin_acl_id=config.zookeeper_admin_acl,
            tls=config.zookeeper_client_tls,
        )
    )


async def serve(
    config: ServiceConfig, stop: asyncio.Event | None = None, tracing: Tracing | None = None
) -> int:
    """Serve until `stop` is set (by default: on SIGTERM or SIGINT). A broker or ZooKeeper
    unreachable at start exits 1, or with `wait_for_brokers` is waited for (starting.py)."""
    stop = stop or _stop_on_signals()
    waiting = Waiting(config)
    delay_s = START_RETRY_S
    try:
        while True:
            try:
                code, doubled = await _serve_routed(config, stop, tracing, waiting)
            except StartFailed as failure:
                error = {"error": str(failure.__cause__)}
                if not config.wait_for_brokers:
                    log.error(f"cannot start: {failure}", extra=error)
                    return 1  # a pod restarts with backoff until it answers
                log.warning(f"cannot start yet: {failure}; waiting", extra=error)
                await waiting.open(str(failure))
                if await stopped_within(stop, delay_s):
                    return 0
                delay_s = min(2 * delay_s, START_RETRY_MAX_S)
                continue
            delay_s = START_RETRY_S
            if not doubled:
                return code
            log.info("serving the doubled slots")
    finally:
        await waiting.close()


async def _serve_routed(
    config: ServiceConfig, stop: asyncio.Event, tracing: Tracing | None, waiting: Waiting
) -> tuple[int, bool]:
    try:
        routed, generation = await _routed(config)
    except RoutingUnreadable as error:
        raise StartFailed("the routing is unreadable") from error
    return await _serve_once(routed, generation, stop, tracing, waiting)


async def _routed(config: ServiceConfig) -> tuple[ServiceConfig, int]:
    """The settings with the routing node's slot amount, and its key generation."""
    if not config.zookeeper_connect:
        return config, 0
    watch = RoutingWatch(
        config.zookeeper_connect,
        config.namespace,
        config.topic,
        config.slot_amount,
        config.zookeeper_identity,
        config.zookeeper_client_tls,
    )
    routing = await watch.current()
    if routing is None:
        return config, 0
    return dataclasses.replace(config, slot_amount=routing.slot_amount), routing.generation


async def _serve_once(
    config: ServiceConfig,
    generation: int,
    stop: asyncio.Event,
    tracing: Tracing | None,
    waiting: Waiting,
) -> tuple[int, bool]:
    """One service of the slots of `generation`; (exit code, whether the slots doubled and
    a new service must take over). StartFailed: a broker or ZooKeeper did not answer."""
    service = DelayService(config, make_ownership(config), generation, tracing)
    try:
        await service.start()
    except (redis.RedisError, OSError, RoutingUnreadable) as error:
        with contextlib.suppress(redis.RedisError, OSError):
            await service.stop()
        what = "the routing is unreadable" if isinstance(error, RoutingUnreadable) else (
            "a broker is unreachable"
        )
        raise StartFailed(what) from error
    if service.resharded.is_set():  # doubled between the read and the watch
        await service.stop()
        return 0, True
    await waiting.close()  # its port is the service's
    # the keep-alive timer also runs from a connection's start until its request's headers
    # are complete: it is the header read timeout too (json_body bounds the body)
    runner = web.AppRunner(
        build_app(service),
        access_log=None,
        handle_signals=False,
        keepalive_timeout=config.read_timeout_ms / 1000,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info(
        "listening",
        extra={"host": config.host, "port": config.port, "member": config.member},
    )
    events = (stop, service.broken, service.resharded)
    waits = [asyncio.create_task(event.wait()) for event in events]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    log.info("stopping")
    try:
        await service.stop()
    finally:
        await runner.cleanup()
    if service.broken.is_set():
        return 1, False
    return 0, service.resharded.is_set() and not stop.is_set()


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


def run(config: ServiceConfig) -> int:
    logs.configure(config.log_level)
    # What is loaded by now lives as long as the process: gc.freeze() takes it out of the
    # collector's reach, so a full collection scans only what serving allocates. Without it,
    # each full collection paused delivery for ~20 ms (burst p99 lateness 21-24 ms against
    # 5-7 ms; docs/benchmarks.md).
    try:
        tracing = Tracing.from_env(os.environ)
    except TracingConfigError as error:
        log.error("cannot start: %s", error)
        return 2
    gc.freeze()
    return asyncio.run(serve(config, tracing=tracing))
