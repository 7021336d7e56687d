"""Real `delayq serve` and `delayq dev` processes: graceful SIGTERM, JSON logs, ZooKeeper
sharing of slots, and the quick start run briefly."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.settings import SETTINGS
from delayq.service.config import ServiceConfig
from delayq.service.topic_file import TopicFile
from tests.service.conftest import Receiver

TOPIC = "procs"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def config_for(redis_server: RedisServer, **overrides: Any) -> ServiceConfig:
    base = ServiceConfig(
        redis_url=redis_server.url, topic=TOPIC, slot_amount=8, port=free_port(), grace_ms=20_000
    )
    return dataclasses.replace(base, **overrides)


async def readiness(session: aiohttp.ClientSession, process: ServeProcess) -> dict[str, Any]:
    try:
        async with session.get(process.url + "/readyz") as response:
            body: dict[str, Any] = await response.json()
            return body
    except aiohttp.ClientError:
        return {"ready": False, "ownedSlots": 0}


async def ready(session: aiohttp.ClientSession, process: ServeProcess) -> bool:
    assert process.running(), process.log_path.read_text()
    return bool((await readiness(session, process))["ready"])


async def exit_code(process: ServeProcess, timeout_s: float = 30) -> int:
    return await asyncio.to_thread(process.wait, timeout_s)


@pytest.fixture
async def serving() -> AsyncIterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for process in started:
        process.kill()


def start(started: list[ServeProcess], config: ServiceConfig, tmp_path: Path) -> ServeProcess:
    process = ServeProcess(config, tmp_path / f"serve-{len(started)}.log").start()
    started.append(process)
    return process


async def test_sigterm_finishes_the_in_flight_delivery_then_exits_0(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    release = asyncio.Event()

    async def held(call: int) -> int:
        await release.wait()
        return 200

    receiver.answer = held
    config = config_for(redis_server, topic_type="webhook", webhook_url=receiver.url)
    process = start(serving, config, tmp_path)
    await eventually(lambda: ready(session, process), 30, "delayq serve ready")
    url = f"{process.url}/v1/topics/{TOPIC}/messages"
    async with session.post(url, json={"id": "a", "delayMs": 0}) as response:
        assert response.status == 201
    await eventually(lambda: len(receiver.requests) == 1, 10, "the delivery to start")

    process.terminate()

    async def draining() -> bool:
        return (await readiness(session, process))["ownedSlots"] == 0

    await eventually(draining, 10, "claiming to stop and readiness to drop")
    assert process.running()  # still finishing the held delivery
    release.set()
    assert await exit_code(process) == 0
    assert len(receiver.requests) == 1
    assert await async_redis_client.exists(f"dq:{{default/{TOPIC}/0}}:prepare") == 0
    logged = [json.loads(line) for line in process.log_path.read_text().splitlines()]
    assert {"listening", "stopping", "service stopped"} <= {line["msg"] for line in logged}


async def test_pull_over_real_http_and_sigterm_exit_0(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    process = start(serving, config_for(redis_server, api_token="secret"), tmp_path)
    await eventually(lambda: ready(session, process), 30, "delayq serve ready")
    auth = {"Authorization": "Bearer secret"}
    base = f"{process.url}/v1/topics/{TOPIC}"
    async with session.post(f"{base}/messages", json={"id": "x", "delayMs": 0}) as response:
        assert response.status == 401
    async with session.post(
        f"{base}/messages", json={"id": "x", "delayMs": 0}, headers=auth
    ) as response:
        assert response.status == 201
    async with session.post(f"{base}/leases", json={"waitMs": 5000}, headers=auth) as response:
        [leased] = (await response.json())["leases"]
    async with session.post(
        f"{base}/leases/ack", json={"tokens": [leased["token"]]}, headers=auth
    ) as response:
        assert response.status == 200
    process.terminate()
    assert await exit_code(process) == 0


@pytest.mark.slow
async def test_zookeeper_fleet_shares_then_hands_over_without_redelivery(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    zookeeper_server: Any,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    topic = f"zkshare{free_port()}"
    configs = [
        config_for(
            redis_server,
            topic=topic,
            topic_type="webhook",
            webhook_url=receiver.url,
            zookeeper_connect=zookeeper_server.hosts,
            member_id=f"m{i}",
            port=free_port(),
            zookeeper_session_timeout_ms=4000,
        )
        for i in range(2)
    ]
    first, second = (start(serving, config, tmp_path) for config in configs)

    async def shared() -> bool:
        owned = [(await readiness(session, p))["ownedSlots"] for p in (first, second)]
        return owned[0] > 0 and owned[1] > 0 and sum(owned) == 8

    await eventually(shared, 60, "two members sharing the 8 slots")
    messages: list[dict[str, Any]] = [{"id": f"g{i}", "delayMs": i * 10} for i in range(300)]
    url = f"{second.url}/v1/topics/{topic}/messages/batch"
    async with session.post(url, json={"messages": messages}) as response:
        assert response.status == 200
    await eventually(lambda: len(receiver.requests) >= 30, 10, "deliveries under way")
    first.terminate()  # graceful: finish in flight, ack, then release the slots
    assert await exit_code(first) == 0

    async def all_moved() -> bool:
        return (await readiness(session, second))["ownedSlots"] == 8

    await eventually(all_moved, 30, "the survivor to own every slot")
    await eventually(lambda: len(receiver.requests) >= 300, 30, "every message")
    ids = [json.loads(body)["id"] for body in receiver.bodies()]
    assert sorted(ids) == sorted(m["id"] for m in messages)  # each exactly once


@pytest.mark.slow
async def test_kill_9_of_one_of_three_loses_nothing(
    redis_server: RedisServer,
    async_redis_client: redis.asyncio.Redis,
    zookeeper_server: Any,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    topic = f"zkkill{free_port()}"
    processes = [
        start(
            serving,
            config_for(
                redis_server,
                topic=topic,
                topic_type="webhook",
                webhook_url=receiver.url,
                webhook_timeout_ms=1000,
                ack_timeout_ms=3000,
                zookeeper_connect=zookeeper_server.hosts,
                zookeeper_session_timeout_ms=2000,
                member_id=f"k{i}",
                port=free_port(),
            ),
            tmp_path,
        )
        for i in range(3)
    ]

    async def all_sharing() -> bool:
        owned = [(await readiness(session, p))["ownedSlots"] for p in processes]
        return all(owned) and sum(owned) == 8

    await eventually(all_sharing, 60, "three members sharing the 8 slots")
    messages = [{"id": f"k{i}", "delayMs": i * 20} for i in range(200)]
    url = f"{processes[1].url}/v1/topics/{topic}/messages/batch"
    async with session.post(url, json={"messages": messages}) as response:
        assert response.status == 200
    await eventually(lambda: len(receiver.requests) >= 20, 10, "deliveries under way")
    processes[0].kill()

    def delivered() -> set[str]:
        return {json.loads(body)["id"] for body in receiver.bodies()}

    await eventually(lambda: len(delivered()) == 200, 60, "every message after the kill")
    members = {headers["X-Delayq-Member"] for headers, _ in receiver.requests[-20:]}
    assert "k0" not in members


@pytest.mark.slow
def test_dev_quick_start_runs_and_delivers(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "delayq.cli",
            "dev",
            "--duration",
            "12",
            "--messages",
            "10",
            "--rate",
            "20",
            "--max-delay-ms",
            "500",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "delivered 10 of 10" in result.stdout
    assert "exit codes [0, 0, 0]" in result.stdout
    assert "/ui (token dev-token" in result.stdout  # the dashboard's URL


async def test_serve_with_the_operators_topic_file(
    redis_server: RedisServer, session: aiohttp.ClientSession, tmp_path: Path
):
    """The pod's command line: `delayq serve --config topic.json`, secrets and name in env."""
    port = free_port()
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    settings = {row.name: row.default for row in SETTINGS if row.serve}
    settings.update(slot_amount=4, max_retries=3, ack_timeout_ms=5000, max_payload_bytes=1024)
    settings.update(pull_max_lease_batch=10, worker_concurrency=16)
    document = TopicFile(
        namespace="shop",
        topic="filed",
        brokers=1,
        settings=settings,
        webhook_url="",
        webhook_allowed_cidrs="",
        stream_key="",
        stream_allowed_cidrs="",
        zookeeper_connect="",
        zookeeper_admin_acl="",
        zookeeper_tls=False,
        zookeeper_tls_ca_file="",
        zookeeper_tls_verify_certs=True,
        redis_master_host_template="127.0.0.1",
        redis_port=redis_port,
        http_port=port,
    )
    path = tmp_path / "topic.json"
    path.write_text(document.to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    env.update(
        {"POD_NAME": "filed-service-0", "DELAYQ_API_TOKEN": "tok", "DELAYQ_HOST": "127.0.0.1"}
    )
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "serve", "--config", str(path)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                async with session.get(url + "/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, 30, "delayq serve --config ready")
        headers = {"Authorization": "Bearer tok"}
        async with session.post(
            f"{url}/v1/topics/filed/leases", json={"max": 11}, headers=headers
        ) as response:
            assert response.status == 400  # pull_max_lease_batch from the file
        process.terminate()
        assert await asyncio.to_thread(process.wait, 30) == 0
        lines = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines()]
        assert any(line.get("member") == "filed-service-0" for line in lines)
    finally:
        if process.poll() is None:
            process.kill()
        log.close()


def serve_once(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    """`delayq serve` with only `env` among the DELAYQ_* variables, expected to exit by itself."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", "serve", *flags],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_exits_1_with_a_clear_error_when_its_broker_is_down(tmp_path: Path):
    result = serve_once(
        {"DELAYQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "DELAYQ_PORT": "0"}
    )
    assert result.returncode == 1
    errors = [json.loads(line) for line in result.stderr.splitlines() if '"ERROR"' in line]
    assert errors[0]["msg"] == "cannot start: a broker is unreachable"


async def test_serve_asked_to_wait_for_its_broker_answers_probes_then_starts(
    session: aiohttp.ClientSession, serving: list[ServeProcess], tmp_path: Path
):
    """`--wait-for-brokers` (the operator's pods): a broker down at start keeps the process up,
    alive for the kubelet and unready with the reason, and it starts as soon as the broker
    answers (exiting instead, a pod waits out a growing restart back-off after its broker is
    back: minutes during an upgrade)."""
    broker = RedisServer(port=free_port(), directory=tmp_path / "broker")
    broker.directory.mkdir()  # type: ignore[union-attr]
    config = ServiceConfig(
        redis_url=broker.url, topic=TOPIC, slot_amount=8, port=free_port(), wait_for_brokers=True
    )
    process = start(serving, config, tmp_path)

    async def waiting() -> bool:
        assert process.running(), process.log_path.read_text()
        try:
            async with (
                session.get(process.url + "/healthz") as alive,
                session.get(process.url + "/readyz") as readyz,
            ):
                reason = (await readyz.json())["reason"]
                return alive.status == 200 and readyz.status == 503 and "broker" in reason
        except aiohttp.ClientError:
            return False

    await eventually(waiting, 30, "alive and unready while its broker is down")
    broker.start()
    try:
        await eventually(lambda: ready(session, process), 30, "ready once its broker answers")
        async with session.post(
            f"{process.url}/v1/topics/{TOPIC}/messages", json={"id": "m1", "delayMs": 60_000}
        ) as response:
            assert response.status in (200, 201), await response.text()
        process.terminate()
        assert await exit_code(process) == 0
    finally:
        broker.stop()


def test_serve_refuses_a_non_loopback_host_without_a_token_in_one_line(tmp_path: Path):
    result = serve_once({"DELAYQ_HOST": "0.0.0.0"}, "--port", str(free_port()))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("delayq serve: --host (DELAYQ_HOST) is '0.0.0.0', not loopback")
    assert "--insecure-no-auth" in line


async def test_serve_with_insecure_no_auth_listens_beyond_loopback_without_a_token(
    redis_server: RedisServer,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    config = config_for(redis_server, host="0.0.0.0", insecure_no_auth=True)
    process = start(serving, config, tmp_path)
    url = f"http://127.0.0.1:{config.port}"

    async def listening() -> bool:
        assert process.running(), process.log_path.read_text()
        try:
            async with session.get(url + "/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(listening, 30, "delayq serve --insecure-no-auth ready")
    async with session.get(f"{url}/v1/topics/{TOPIC}/stats") as response:
        assert response.status == 200  # open, as asked
    process.terminate()
    assert await exit_code(process) == 0


def test_serve_of_several_brokers_exits_1_when_zookeeper_is_unreachable(
    redis_server: RedisServer,
):
    """Without the routing a multi-broker service would write by the first routing (wrong
    once a slot moved) and never learn of a move: it exits, its pod restarts."""
    unreachable = f"127.0.0.1:{free_port()}"
    result = serve_once(
        {
            "DELAYQ_REDIS_URL": redis_server.url,
            "DELAYQ_BROKER_URLS": f"{redis_server.url},{redis_server.url}",
            "DELAYQ_ZOOKEEPER_CONNECT": unreachable,
            "DELAYQ_PORT": "0",
        }
    )
    assert result.returncode == 1
    errors = [json.loads(line) for line in result.stderr.splitlines() if '"ERROR"' in line]
    assert errors[0]["msg"] == "cannot start: the routing is unreadable"
    assert errors[0]["error"] == f"ZooKeeper {unreachable}: KazooTimeoutError"


async def test_a_serve_process_logs_no_secret_it_was_given(
    redis_server: RedisServer,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    serving: list[ServeProcess],
    tmp_path: Path,
):
    """A real process with a planted secret in every secret setting (the webhook URL's password
    and query token, its extra headers, the signing secret, the API, read and /metrics tokens,
    the lease-token key),
    taking requests and failing deliveries: its whole log holds none of them."""
    planted = "pl4nted-s3cret"

    async def always_500(call: int) -> int:
        return 500

    receiver.answer = always_500
    config = config_for(
        redis_server,
        topic_type="webhook",
        webhook_url=receiver.url.replace("//", f"//shop:{planted}-pw@") + f"?t={planted}-q",
        webhook_extra_headers=f"X-Api-Key: {planted}-header",
        webhook_secret="whsec_" + base64.b64encode(planted.encode() * 2).decode(),
        api_token=f"{planted}-api",
        read_token=f"{planted}-read",
        metrics_token=f"{planted}-metrics",
        operator_metrics_token=f"{planted}-operator-metrics",
        lease_token_key=f"{planted}-lease",
        max_retries=1,
        retry_backoff_base_ms=50,
    )
    process = start(serving, config, tmp_path)
    await eventually(lambda: ready(session, process), 30, "delayq serve ready")
    auth = {"Authorization": f"Bearer {planted}-api"}
    url = f"{process.url}/v1/topics/{TOPIC}/messages"
    async with session.post(url, json={"id": "a", "delayMs": 0}, headers=auth) as response:
        assert response.status == 201
    wrong = {"Authorization": f"Bearer {planted}-wrong"}
    async with session.post(url, json={"id": "b", "delayMs": 0}, headers=wrong) as response:
        assert response.status == 401
    scrape = {"Authorization": f"Bearer {planted}-metrics"}
    async with session.get(f"{process.url}/metrics", headers=scrape) as response:
        assert response.status == 200
    async with session.get(f"{process.url}/metrics") as response:
        assert response.status == 401

    async def dead() -> bool:
        async with session.get(f"{url}/a", headers=auth) as response:
            return bool((await response.json())["state"] == "dead")

    await eventually(dead, 10, "the failing delivery to die after its retry")
    process.terminate()
    assert await exit_code(process) == 0
    log = process.log_path.read_text()
    assert "delivery failed" in log  # the failures were logged, naming the receiver
    assert "HTTP 500" in log
    assert planted not in log
