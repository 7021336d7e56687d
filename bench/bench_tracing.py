"""Tracing benchmark: what `delayq serve`'s spans cost, tracing off against on in the same run
(one throw-away redis-server, JSON on stdout).

    python bench/bench_tracing.py [--messages 20000] [--rounds 5] [--pull] [--output FILE]

Each round schedules `--messages` messages due at once (each with a producer's `traceparent`
header, 32-byte payloads, 16 slots), then starts an in-process `DelayService` of a stream topic
(no receiver to wait on) and times from the first message on the stream to the last: messages per
second and the process's CPU µs per message. With `--pull`, a pull topic instead, drained over
its HTTP API in the process (aiohttp's test client): leases of up to 1,000, each carrying the
previous answer's tokens in `ack` (the last answer's in an ack request: a `claim` and an `ack`
span per message), timed from the first lease answer to the last ack. Off and on take turns
(which goes first alternates by round); the report has the median of the rounds, on's ratio
to off (of the medians) and the ratio round by round. On is the SDK's tracer with its batch
processor and an exporter that drops the spans: delayq's and the SDK's cost per message, not
the network's (the OTLP export runs on the processor's thread, in batches of 512).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import redis.asyncio
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from delayq.local.redis_server import RedisServer
from delayq.queue import AsyncQueue, ScheduleRequest
from delayq.queue.topic import TopicType
from delayq.service.api import build_app
from delayq.service.config import ServiceConfig
from delayq.service.service import DelayService
from delayq.service.tracing import Tracing

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SLOTS = 16


class Dropped(SpanExporter):
    """An exporter that drops what it is given: the bench measures making the spans."""

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def tracing() -> Tracing:
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return Tracing(provider.get_tracer("delayq"), provider.force_flush)


async def fill(client: redis.asyncio.Redis, config: ServiceConfig, messages: int) -> None:
    """`messages` due now, each with a producer's context, on an empty Redis."""
    await client.flushall()
    queue = AsyncQueue(client, config.to_topic())
    headers = {"traceparent": TRACEPARENT}
    for start in range(0, messages, 1000):
        await queue.schedule_many(
            [
                ScheduleRequest(f"m-{i:08d}", b"x" * 32, delay_ms=0, headers=headers)
                for i in range(start, min(start + 1000, messages))
            ]
        )


async def drain(url: str, messages: int, traced: Tracing | None) -> dict[str, float]:
    config = ServiceConfig(
        redis_url=url, topic="bench", slot_amount=SLOTS, topic_type=TopicType.STREAM, port=0
    )
    client = redis.asyncio.Redis.from_url(url)
    await fill(client, config, messages)
    service = DelayService(config, tracing=traced)
    await service.start()
    while (first := await client.xlen(config.target_stream)) == 0:  # the start is not timed
        await asyncio.sleep(0.001)
    started, cpu = time.perf_counter(), time.process_time()
    while await client.xlen(config.target_stream) < messages:
        await asyncio.sleep(0.005)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await service.stop()
    await client.aclose()
    timed = messages - first
    return {"per_s": timed / elapsed, "cpu_us_per_msg": cpu / timed * 1e6}


async def drain_pull(url: str, messages: int, traced: Tracing | None) -> dict[str, float]:
    config = ServiceConfig(
        redis_url=url, topic="bench", slot_amount=SLOTS, topic_type=TopicType.PULL, port=0
    )
    client = redis.asyncio.Redis.from_url(url)
    await fill(client, config, messages)
    service = DelayService(config, tracing=traced)
    await service.start()
    http = TestClient(TestServer(build_app(service)))
    await http.start_server()
    path = "/v1/topics/bench/leases"
    tokens: list[str] = []
    leased = 0
    started = cpu = 0.0
    while leased < messages:
        answer = await http.post(path, json={"max": 1000, "waitMs": 1000, "ack": tokens})
        assert answer.status == 200, await answer.text()
        tokens = [lease["token"] for lease in (await answer.json())["leases"]]
        leased += len(tokens)
        if not started and tokens:  # the start is not timed
            started, cpu = time.perf_counter(), time.process_time()
    answer = await http.post(path + "/ack", json={"tokens": tokens})  # no lease to wait for
    assert answer.status == 200, await answer.text()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await http.close()
    await service.stop()
    await client.aclose()
    return {"per_s": messages / elapsed, "cpu_us_per_msg": cpu / messages * 1e6}


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pull", action="store_true", help="a pull topic, leased over HTTP")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    drained = drain_pull if args.pull else drain
    traced = tracing()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with RedisServer() as server:
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for mode in order:
                result = asyncio.run(
                    drained(server.url, args.messages, traced if mode == "on" else None)
                )
                runs[mode].append(result)
    report: dict[str, Any] = {
        "topic_type": "pull" if args.pull else "stream",
        "messages": args.messages,
        "rounds": args.rounds,
        "slots": SLOTS,
    }
    for key in ("per_s", "cpu_us_per_msg"):
        off, on = median(runs["off"], key), median(runs["on"], key)
        per_round = [new[key] / old[key] for new, old in zip(runs["on"], runs["off"], strict=True)]
        report[key] = {
            "off": round(off, 1),
            "on": round(on, 1),
            "on_to_off": round(on / off, 3),
            "per_round": [round(r, 3) for r in per_round],
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
