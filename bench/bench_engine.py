"""Engine benchmark: one command, a throw-away redis-server, JSON on stdout.

    python bench/bench_engine.py [--quick] [--slots 16] [--workloads enqueue,memory,...]
                                 [--output bench/results/engine.json]

Every figure is measured in the same run as its baseline (a raw floor of pipelined ZADD+HSET
from redis-py with hiredis), so ratios stay meaningful on a noisy machine. Lateness is delivery
time minus the requested due instant; producer, Redis and consumer share this host, so the
Redis clock (TIME) and the consumer's wall clock are the same clock.

`--slots N` gives every topic N slots (default 16); `--workloads` picks a subset of enqueue,
memory, delivery, herd, burst and steady: `--slots 1024 --workloads herd,burst` then `--slots 16
--workloads herd,burst` compares two topic sizes back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.queue import (
    AsyncQueue,
    Consumer,
    ConsumerSettings,
    Message,
    Queue,
    ScheduleRequest,
    Topic,
)
from delayq.queue.packing import use_hiredis_packing

PAYLOAD = b"x" * 32
SLOTS = 16
CONCURRENT_CALLS = 2  # batch calls in flight in the asyncio enqueue figure (one encodes, one runs)
# hand-picked for the engine figures; bench_peers.py runs the documented defaults instead
# batch_size 500, worker_concurrency 5000; by position, which a --baseline tree from before the
# max_in_flight rename takes too (bench_hot_paths.py imports this module into it)
ENGINE_CONSUMER_SETTINGS = ConsumerSettings(500, 5000)


def now_ms() -> float:
    return time.time() * 1000


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "count": len(ordered),
        "p50_ms": pick(0.50),
        "p95_ms": pick(0.95),
        "p99_ms": pick(0.99),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }


def fresh_topic(name: str, slots: int = SLOTS) -> Topic:
    return Topic(name, slot_amount=slots)


# --- enqueue -----------------------------------------------------------------------------------


def raw_floor(client: redis.Redis, count: int, chunk: int) -> float:
    """Pipelined ZADD + HSET per message: what a hand-rolled Redis delay queue costs."""
    start = time.perf_counter()
    for base in range(0, count, chunk):
        pipe = client.pipeline(transaction=False)
        for i in range(base, min(count, base + chunk)):
            member = f"raw-{i:08d}"
            pipe.zadd("raw:store", {member: 1_000})
            pipe.hset("raw:msg", member, PAYLOAD)
        pipe.execute()
    return count / (time.perf_counter() - start)


def raw_floor_concurrent(url: str, count: int, chunk: int, concurrency: int) -> float:
    """The raw floor from asyncio with `concurrency` pipelines in flight: the fair baseline of
    the concurrent batch figure (same client library, same overlap)."""

    async def produce() -> float:
        client = use_hiredis_packing(redis.asyncio.Redis.from_url(url))
        bases = iter(range(0, count, chunk))

        async def producer() -> None:
            for base in bases:
                pipe = client.pipeline(transaction=False)
                for i in range(base, min(count, base + chunk)):
                    member = f"rawc-{i:08d}"
                    pipe.zadd("rawc:store", {member: 1_000})
                    pipe.hset("rawc:msg", member, PAYLOAD)
                await pipe.execute()

        start = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(concurrency)))
        rate = count / (time.perf_counter() - start)
        await client.aclose()
        return rate

    return asyncio.run(produce())


def batch_enqueue(queue: Queue, count: int, chunk: int) -> float:
    start = time.perf_counter()
    for base in range(0, count, chunk):
        queue.schedule_many(
            [
                ScheduleRequest(f"b-{i:08d}", PAYLOAD, delay_ms=3_600_000)
                for i in range(base, min(count, base + chunk))
            ]
        )
    return count / (time.perf_counter() - start)


def concurrent_batch_enqueue(
    url: str, count: int, chunk: int, concurrency: int, slots: int = SLOTS
) -> float:
    """`schedule_many` from asyncio with `concurrency` calls in flight, as a producer service
    does: one call's encoding overlaps another's execution in Redis (the sync figure above
    waits for each call, so Python and Redis take turns on the two cores)."""

    async def produce() -> float:
        queue = AsyncQueue.from_url(url, fresh_topic(f"concurrent-{concurrency}", slots))
        bases = iter(range(0, count, chunk))

        async def producer() -> None:
            for base in bases:
                await queue.schedule_many(
                    [
                        ScheduleRequest(f"c-{i:08d}", PAYLOAD, delay_ms=3_600_000)
                        for i in range(base, min(count, base + chunk))
                    ]
                )

        start = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(concurrency)))
        rate = count / (time.perf_counter() - start)
        await queue.close()
        return rate

    return asyncio.run(produce())


def single_enqueue(queue: Queue, count: int) -> float:
    start = time.perf_counter()
    for i in range(count):
        queue.schedule(f"s-{i:08d}", PAYLOAD, delay_ms=3_600_000)
    return count / (time.perf_counter() - start)


def memory_per_message(client: redis.Redis, topic: Topic, count: int, id_format: str) -> float:
    client.flushall()
    queue = Queue(client, topic)
    queue.schedule_many([ScheduleRequest("warm", PAYLOAD, delay_ms=1)])
    before = int(client.info("memory")["used_memory"])
    for base in range(0, count, 5_000):
        queue.schedule_many(
            [
                ScheduleRequest(id_format.format(i), PAYLOAD, delay_ms=3_600_000)
                for i in range(base, min(count, base + 5_000))
            ]
        )
    after = int(client.info("memory")["used_memory"])
    return round((after - before) / count, 1)


# --- delivery ----------------------------------------------------------------------------------


@dataclass
class Recorder:
    lateness_ms: list[float] = field(default_factory=list)
    delivered: int = 0
    first_ms: float = 0.0
    last_ms: float = 0.0

    async def handle(self, message: Message) -> None:
        now = now_ms()
        if self.delivered == 0:
            self.first_ms = now
        self.delivered += 1
        self.last_ms = now
        self.lateness_ms.append(now - message.due_ms)


async def consume_until(
    url: str,
    topic: Topic,
    expected: int,
    timeout_s: float,
    settings: ConsumerSettings = ENGINE_CONSUMER_SETTINGS,
    on_ready: Callable[[], None] | None = None,
) -> Recorder:
    """Consume `topic` until `expected` messages arrived or `timeout_s` passed; `on_ready` is
    called once the slots are owned, so that a producer elsewhere can start then."""
    gc.freeze()  # as `delayq serve` does at start (see service/serve.py)
    queue = AsyncQueue.from_url(url, topic)
    recorder = Recorder()
    consumer = Consumer(queue, recorder.handle, settings)
    await consumer.own(topic.slots)
    if on_ready is not None:
        on_ready()
    task = asyncio.create_task(consumer.run())
    deadline = time.monotonic() + timeout_s
    while recorder.delivered < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    consumer.stop()
    await task
    await queue.close()
    return recorder


def schedule_at(url: str, topic: Topic, dues: list[int], prefix: str) -> None:
    queue = Queue.from_url(url, topic)
    for base in range(0, len(dues), 5_000):
        queue.schedule_many(
            [
                ScheduleRequest(f"{prefix}-{i:08d}", PAYLOAD, at_ms=dues[i])
                for i in range(base, min(len(dues), base + 5_000))
            ]
        )
    queue.close()


def delivery_throughput(url: str, count: int, slots: int = SLOTS) -> float:
    topic = fresh_topic("throughput", slots)
    schedule_at(url, topic, [1_000] * count, "t")
    recorder = asyncio.run(consume_until(url, topic, count, 120))
    return recorder.delivered / max(1e-9, (recorder.last_ms - recorder.first_ms) / 1000)


def herd(url: str, count: int, slots: int = SLOTS) -> dict[str, Any]:
    topic = fresh_topic("herd", slots)
    at = int(now_ms()) + 2_000
    schedule_at(url, topic, [at] * count, "h")
    recorder = asyncio.run(consume_until(url, topic, count, 120))
    return {
        "messages": count,
        "drain_s": round((recorder.last_ms - at) / 1000, 3),
        "lateness": percentiles(recorder.lateness_ms),
    }


def burst(url: str, count: int, window_s: float, slots: int = SLOTS) -> dict[str, Any]:
    topic = fresh_topic("burst", slots)
    start = int(now_ms()) + 2_000
    dues = sorted(start + int(random.random() * window_s * 1000) for _ in range(count))
    schedule_at(url, topic, dues, "u")
    recorder = asyncio.run(consume_until(url, topic, count, window_s + 60))
    return {"messages": count, "window_s": window_s, "lateness": percentiles(recorder.lateness_ms)}


def steady_producer(url: str, rate: int, duration_s: float, slots: int = SLOTS) -> None:
    """A separate process, as real producers are: `rate` single schedules per second."""
    topic = fresh_topic("steady", slots)
    queue = Queue.from_url(url, topic)
    rng = random.Random(7)
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < duration_s:
        target = int(elapsed * rate)
        while sent < target:
            queue.schedule(f"st-{sent:08d}", PAYLOAD, delay_ms=rng.randint(500, 1500))
            sent += 1
        time.sleep(0.001)
    queue.close()


def steady(url: str, rate: int, duration_s: float, slots: int = SLOTS) -> dict[str, Any]:
    producer = multiprocessing.get_context("spawn").Process(
        target=steady_producer, args=(url, rate, duration_s, slots)
    )
    producer.start()
    expected = int(rate * duration_s)
    topic = fresh_topic("steady", slots)
    recorder = asyncio.run(consume_until(url, topic, expected, duration_s + 10))
    producer.join()
    return {
        "rate_per_s": rate,
        "duration_s": duration_s,
        "lateness": percentiles(recorder.lateness_ms),
    }


WORKLOADS = ("enqueue", "memory", "delivery", "herd", "burst", "steady")


def chosen_workloads(
    parser: argparse.ArgumentParser, text: str, known: tuple[str, ...]
) -> list[str]:
    """The comma-separated `--workloads` of a bench, each one of `known` (else a usage error)."""
    chosen = text.split(",")
    if unknown := set(chosen) - set(known):
        parser.error(f"unknown workloads {sorted(unknown)}: choose from {', '.join(known)}")
    return chosen


def enqueue_figures(client: redis.Redis, url: str, count: int, slots: int) -> dict[str, Any]:
    floor = raw_floor(client, count, 1_000)
    client.flushall()
    batch = batch_enqueue(Queue(client, fresh_topic("batch", slots)), count, 1_000)
    client.flushall()
    concurrent_floor = raw_floor_concurrent(url, count, 1_000, CONCURRENT_CALLS)
    client.flushall()
    concurrent = concurrent_batch_enqueue(url, count, 1_000, CONCURRENT_CALLS, slots)
    client.flushall()
    single = single_enqueue(Queue(client, fresh_topic("single", slots)), count // 10)
    client.flushall()
    journaled_topic = Topic("journaled", slot_amount=slots, journal_max_len=10 * count)
    journaled = batch_enqueue(Queue(client, journaled_topic), count, 1_000)
    client.flushall()
    return {
        "raw_floor_zadd_hset_pipelined_msg_per_s": round(floor),
        "batch_api_msg_per_s": round(batch),
        "batch_ratio_to_raw_floor": round(batch / floor, 2),
        f"batch_api_async_{CONCURRENT_CALLS}_calls_in_flight_msg_per_s": round(concurrent),
        f"raw_floor_async_{CONCURRENT_CALLS}_pipelines_in_flight_msg_per_s": round(
            concurrent_floor
        ),
        "batch_async_ratio_to_async_raw_floor": round(concurrent / concurrent_floor, 2),
        "single_api_msg_per_s": round(single),
        "single_ratio_to_raw_floor": round(single / floor, 3),
        "batch_api_with_journal_msg_per_s": round(journaled),
        "journal_cost_ratio": round(journaled / batch, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--slots", type=int, default=SLOTS, help="every topic's slot amount")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated subset to run (default: all), e.g. herd,burst",
    )
    args = parser.parse_args()
    chosen = chosen_workloads(parser, args.workloads, WORKLOADS)
    if args.slots < 1:
        parser.error(f"--slots must be at least 1, got {args.slots}")
    slots = args.slots
    scale = 0.1 if args.quick else 1.0
    n_enqueue = int(200_000 * scale)

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        results: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_start": os.getloadavg()[0]},
            "redis_version": client.info("server")["redis_version"],
            "slots": slots,
        }
        if "enqueue" in chosen:
            results["enqueue"] = enqueue_figures(client, server.url, n_enqueue, slots)
        if "memory" in chosen:
            results["memory_bytes_per_pending_message"] = {
                "ids_12_bytes": memory_per_message(
                    client, fresh_topic("mem", slots), n_enqueue, "msg-{:08d}"
                ),
                "ids_36_bytes_uuid_like": memory_per_message(
                    client,
                    fresh_topic("mem", slots),
                    n_enqueue,
                    "{:08d}-aaaa-bbbb-cccc-dddddddddddd",
                ),
                "messages": n_enqueue,
                "payload_bytes": len(PAYLOAD),
                "slots": slots,
            }
            client.flushall()
        if "delivery" in chosen:
            results["delivery_claim_noop_ack_msg_per_s"] = round(
                delivery_throughput(server.url, int(100_000 * scale), slots)
            )
            client.flushall()
        if "herd" in chosen:
            results["herd"] = herd(server.url, int(20_000 * scale), slots)
            client.flushall()
        if "burst" in chosen:
            window_s = 10.0 * max(scale, 0.2)
            results["burst"] = burst(server.url, int(50_000 * scale), window_s, slots)
            client.flushall()
        if "steady" in chosen:
            results["steady"] = steady(server.url, 2_000, 20.0 * max(scale, 0.25), slots)
        results["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
        client.close()

    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
