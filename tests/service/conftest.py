"""Service fixtures: in-process delay services on the session's real redis-server, a real
`delayq serve` process of a pull topic, a real local webhook receiver (tests wait with
`delayq.local.waiting.eventually`, never sleep-and-hope)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.topic import TopicType
from delayq.service.api import build_app
from delayq.service.config import ServiceConfig
from delayq.service.service import DelayService

NAMESPACE, TOPIC = "shop", "orders"


class GrantedLater:
    """An Ownership that grants slots when the test says so (a failover's takeover)."""

    def __init__(self) -> None:
        self.on_change: Any = None
        self.owned: frozenset[int] = frozenset()

    async def start(self, on_change: Any) -> None:
        self.on_change = on_change
        await on_change(frozenset())

    async def grant(self, slots: frozenset[int]) -> None:
        self.owned = slots
        await self.on_change(slots)

    async def stop(self) -> None:
        self.owned = frozenset()
        await self.on_change(frozenset())

    async def holds(self, slot: int) -> bool:
        return slot in self.owned

    @property
    def ready(self) -> bool:
        return self.on_change is not None


@dataclass
class Running:
    service: DelayService
    client: TestClient[web.Request, web.Application]

    @property
    def base(self) -> str:
        return f"/v1/topics/{TOPIC}"


StartService = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_service(
    redis_server: RedisServer, async_redis_client: redis.asyncio.Redis
) -> AsyncIterator[StartService]:
    """Start services (config overrides as keywords); all are stopped at the end of the test."""
    started: list[Running] = []

    async def start(**overrides: Any) -> Running:
        settings: dict[str, Any] = {
            "redis_url": redis_server.url,
            "namespace": NAMESPACE,
            "topic": TOPIC,
            "slot_amount": 4,
            "port": 0,
            "retry_backoff_base_ms": 50,
            **overrides,
        }
        service = DelayService(ServiceConfig(**settings))
        await service.start()
        client = TestClient(TestServer(build_app(service)))
        await client.start_server()
        running = Running(service, client)
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        if not running.service.closing:
            await running.service.stop()
        await running.client.close()


PULL_SLOTS = 64


@pytest.fixture
async def pull_process(
    redis_server: RedisServer, async_redis_client: redis.asyncio.Redis, tmp_path: Path
) -> AsyncIterator[ServeProcess]:
    """A ready `delayq serve` of a pull topic of PULL_SLOTS slots, stopped by SIGTERM at the
    end unless the test stopped it. Started after the flush of `async_redis_client`: a flush
    under a running process would wipe the fencing epochs its ownership drew."""
    config = ServiceConfig(
        redis_url=redis_server.url,
        namespace="pull",
        topic="orders",
        slot_amount=PULL_SLOTS,
        topic_type=TopicType.PULL,
        port=free_port(),
    )
    process = ServeProcess(config, tmp_path / "serve.log").start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: _ready(session, process), 30, "delayq serve ready")
        yield process
    finally:
        process.terminate()  # a no-op when the test stopped it
        process.wait()


async def _ready(session: aiohttp.ClientSession, process: ServeProcess) -> bool:
    assert process.running(), process.log_path.read_text()
    try:
        async with session.get(process.url + "/readyz") as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False


@dataclass
class Receiver:
    """A real HTTP server on loopback that records webhook calls and answers as told."""

    url: str = ""
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answer: Callable[[int], Awaitable[int]] | None = None  # call number -> status
    reply: Callable[[bytes], bytes] | None = None  # request body -> response body

    def bodies(self) -> list[bytes]:
        return [body for _, body in self.requests]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recorded = Receiver()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        recorded.requests.append((dict(request.headers), body))
        status = 200 if recorded.answer is None else await recorded.answer(len(recorded.requests))
        reply = b"" if recorded.reply is None else recorded.reply(body)
        return web.Response(status=status, body=reply)

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recorded.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield recorded
    finally:
        await runner.cleanup()
