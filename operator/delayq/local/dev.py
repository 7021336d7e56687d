"""`delayq dev`: the quick start — a local cluster of real processes and a live demo.

Brings up a redis-server, a ZooKeeper (when the coordination module and Java are installed;
otherwise a single embedded-ownership process), N `delayq serve` processes sharing the slots of
a webhook topic, and a tiny webhook receiver in this process. The demo schedules messages through
the HTTP API and prints each delivery with its lateness. Ctrl-C or SIGTERM (or --duration) stops
everything it started, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig
from delayq.service.delivery.webhook import wall_ms

READY_TIMEOUT_S = 90.0
# a demo secret (whsec_ + base64 of 32 bytes); a real one comes from /dev/urandom
SECRET = "whsec_z0RszrG6Fb3DoK4kwcW5zZhRT+/Ka+9KdOO2SQea204="
TOKEN = "dev-token"


@dataclass(frozen=True)
class DevOptions:
    duration_s: float = 0.0  # 0: until Ctrl-C
    messages: int = 20
    rate_per_s: float = 10.0
    max_delay_ms: int = 3000
    processes: int = 3


@dataclass
class Deliveries:
    """What the demo receiver saw: lateness per message id (first delivery)."""

    scheduled: int = 0
    lateness_ms: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    bad_signatures: int = 0

    def summary(self) -> str:
        values = sorted(self.lateness_ms.values())
        scheduled = self.scheduled
        if not values:
            return f"delivered 0 of {scheduled}"
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return (
            f"delivered {len(values)} of {scheduled}; lateness ms p50 "
            f"{statistics.median(values):.0f}, p99 {p99}, max {values[-1]}; "
            f"duplicates {self.duplicates}, bad signatures {self.bad_signatures}"
        )


def _say(text: str) -> None:
    print(f"[dev] {text}", flush=True)


def receiver_app(deliveries: Deliveries) -> web.Application:
    """The demo's webhook receiver: verify, print the delivery and its lateness, answer 204."""

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        now = wall_ms()
        try:
            Webhook(SECRET).verify(body, dict(request.headers))
        except WebhookVerificationError:
            deliveries.bad_signatures += 1
            return web.Response(status=401)
        message = json.loads(body)
        lateness = now - int(message["dueMs"])
        if message["id"] in deliveries.lateness_ms:
            deliveries.duplicates += 1
        deliveries.lateness_ms.setdefault(message["id"], lateness)
        member = request.headers.get("X-Delayq-Member", "?")
        _say(
            f"delivered {message['id']:>8} by {member:<6} attempt {message['attempt']} "
            f"lateness {lateness:>4} ms  payload {message['payload']!r}"
        )
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    return app


@contextlib.contextmanager
def _zookeeper(wanted: bool) -> Iterator[str]:
    """ZooKeeper hosts when coordination is available, else "" (embedded ownership)."""
    if not wanted:
        yield ""
        return
    try:
        server = ZooKeeperServer().start()
    except (FileNotFoundError, RuntimeError, TimeoutError) as error:
        _say(f"no ZooKeeper ({error}): one process in embedded mode owns every slot")
        yield ""
        return
    try:
        _say(f"zookeeper on {server.hosts} (pid {server.process.pid if server.process else '?'})")
        yield server.hosts
    finally:
        server.stop()


def serve_configs(
    options: DevOptions, redis_url: str, hook_url: str, zk: str
) -> list[ServiceConfig]:
    """One config per `delayq serve` process of the demo topic (pure apart from free ports)."""
    base = ServiceConfig(
        redis_url=redis_url,
        namespace="dev",
        topic="demo",
        slot_amount=16,
        topic_type=TopicType.WEBHOOK,
        webhook_url=hook_url,
        webhook_secret=SECRET,
        api_token=TOKEN,
        max_retries=3,
        retry_backoff_base_ms=500,
        zookeeper_connect=zk,
        grace_ms=5000,
    )
    count = options.processes if zk else 1
    return [
        dataclasses.replace(
            base, port=free_port(), member_id=f"dev-{i}", preferred_broker=f"broker-{i}"
        )
        for i in range(count)
    ]


async def _ready(session: aiohttp.ClientSession, process: ServeProcess) -> bool:
    if not process.running():
        raise RuntimeError(f"delayq serve (pid {process.pid}) exited; see {process.log_path}")
    try:
        async with session.get(process.url + "/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _wait_ready(session: aiohttp.ClientSession, processes: list[ServeProcess]) -> None:
    async def all_ready() -> bool:
        return all([await _ready(session, p) for p in processes])

    await eventually(all_ready, READY_TIMEOUT_S, "delayq serve ready", interval_s=0.1)


async def _produce(
    session: aiohttp.ClientSession,
    processes: list[ServeProcess],
    options: DevOptions,
    deliveries: Deliveries,
) -> None:
    """Schedule the demo messages at the given rate, round-robin over the processes' APIs."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for number in range(options.messages):
        target = processes[number % len(processes)]
        delay_ms = random.randint(0, options.max_delay_ms)
        body = {"id": f"demo-{number}", "delayMs": delay_ms, "payload": f"hello #{number}"}
        url = f"{target.url}/v1/topics/demo/messages"
        async with session.post(url, json=body, headers=headers) as response:
            if response.status in (200, 201):
                deliveries.scheduled += 1
            else:
                _say(f"schedule failed: {response.status} {await response.text()}")
        await asyncio.sleep(1 / options.rate_per_s)


async def _run(options: DevOptions, stop: asyncio.Event) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="delayq-dev-"))
    deliveries = Deliveries()
    runner = web.AppRunner(receiver_app(deliveries), access_log=None)
    await runner.setup()
    hook_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()
    processes: list[ServeProcess] = []
    with RedisServer() as redis_server, _zookeeper(options.processes > 1) as zk:
        _say(f"redis-server on {redis_server.url}; logs in {workdir}")
        try:
            configs = serve_configs(
                options, redis_server.url, f"http://127.0.0.1:{hook_port}/hook", zk
            )
            processes = [ServeProcess(c, workdir / f"{c.member_id}.log").start() for c in configs]
            for process in processes:
                _say(f"delayq serve {process.config.member_id} pid {process.pid} on {process.url}")
            async with aiohttp.ClientSession() as session:
                await _wait_ready(session, processes)
                _say(
                    f"dashboard: {processes[0].url}/ui (token {TOKEN}; any process serves it); "
                    f"admin: DELAYQ_URL={processes[0].url} DELAYQ_TOPIC=demo "
                    f"DELAYQ_API_TOKEN={TOKEN} delayq topic stats"
                )
                _say(
                    f"ready; scheduling {options.messages} messages (delays up to "
                    f"{options.max_delay_ms} ms) through the HTTP API"
                )
                producing = asyncio.create_task(_produce(session, processes, options, deliveries))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), options.duration_s or None)
                producing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producing
        finally:
            codes = stop_all(processes)
            _say(f"stopped delayq serve processes (exit codes {codes})")
            await runner.cleanup()
    _say(deliveries.summary())
    return 0 if deliveries.lateness_ms and deliveries.bad_signatures == 0 else 1


def run(options: DevOptions) -> int:
    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await _run(options, stop)

    try:
        return asyncio.run(main())
    except (RuntimeError, TimeoutError, FileNotFoundError) as error:
        print(f"delayq dev: {error}", file=sys.stderr)
        return 1
