"""What remembered outcomes, expiry and the retry window cost: a throw-away redis-server, JSON.

    python bench/bench_semantics.py [--count 100000] [--rounds 3]

Each variant runs the whole life of `count` messages through the engine API as a consumer
would (schedule_many in batches of 1000 due now, claim 1000 per call, ack each batch) on a
topic of 16 slots, and reports messages per second and the ratio to the plain topic measured
in the same run (the best of `rounds`, variants interleaved so machine noise hits all alike):

- `plain`: the defaults (no outcome retention, no expiry, no retry window);
- `outcomes`: outcomeRetention 1 h (each ack also remembers the id);
- `expiry`: every message carries ttlMs (the claim checks it);
- `retry_for`: retry.for 1 h (the first claim records the attempt's time).

`pending_bytes`: what one pending message costs in Redis with and without an expiry (payload
32 bytes, 12-byte ids), from INFO memory before and after scheduling `count` of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue import Queue, ScheduleRequest, Topic

BATCH = 1000
HOUR_MS = 3_600_000
BASE = Topic("semantics", namespace="bench", slot_amount=16)
VARIANTS: dict[str, tuple[Topic, int | None]] = {
    "plain": (BASE, None),
    "outcomes": (dataclasses.replace(BASE, outcome_retention_ms=HOUR_MS), None),
    "expiry": (BASE, HOUR_MS),
    "retry_for": (dataclasses.replace(BASE, retry_for_ms=HOUR_MS), None),
}


def life_cycle(client: redis.Redis, topic: Topic, ttl_ms: int | None, count: int) -> float:
    """Messages per second through schedule, claim and ack."""
    client.flushall()
    queue = Queue(client, topic)
    epochs = {slot: queue.take_over(slot) for slot in topic.slots}
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        queue.schedule_many(
            [
                ScheduleRequest(f"{i:012d}", b"x" * 32, delay_ms=0, ttl_ms=ttl_ms)
                for i in range(start, min(start + BATCH, count))
            ]
        )
    done = 0
    while done < count:
        for slot in topic.slots:
            messages = queue.claim(slot, epochs[slot], BATCH, 60_000).messages
            if messages:
                queue.ack_many(messages)
                done += len(messages)
    return count / (time.perf_counter() - started)


def pending_bytes(client: redis.Redis, ttl_ms: int | None, count: int) -> float:
    client.flushall()
    before = int(client.info("memory")["used_memory"])
    queue = Queue(client, BASE)
    for start in range(0, count, BATCH):
        queue.schedule_many(
            [
                ScheduleRequest(f"{i:012d}", b"x" * 32, delay_ms=HOUR_MS, ttl_ms=ttl_ms)
                for i in range(start, min(start + BATCH, count))
            ]
        )
    return (int(client.info("memory")["used_memory"]) - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant (best kept)")
    args = parser.parse_args()
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        best: dict[str, float] = dict.fromkeys(VARIANTS, 0.0)
        for _ in range(args.rounds):
            for name, (topic, ttl_ms) in VARIANTS.items():
                best[name] = max(best[name], life_cycle(client, topic, ttl_ms, args.count))
        report: dict[str, Any] = {
            "messages": args.count,
            "slots": BASE.slot_amount,
            "life_cycle_msg_per_s": {name: round(rate) for name, rate in best.items()},
            "ratio_to_plain": {name: round(rate / best["plain"], 3) for name, rate in best.items()},
            "pending_bytes": {
                "plain": round(pending_bytes(client, None, args.count)),
                "with_expiry": round(pending_bytes(client, HOUR_MS, args.count)),
            },
        }
        client.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
