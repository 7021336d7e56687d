"""What recurring schedules cost: claims with and without them, memory per schedule. JSON out.

    python bench/bench_schedules.py [--messages 20000] [--schedules 2000] [--rounds 3]

On a throw-away redis-server, one slot, a consumer's claim → ack loop (batches of 500, the
default) measured as claimed messages per second of wall time (client and server on the same
machine, so the figures are relative, not absolute):

* `plain`: `messages` ordinary messages due now, the slot holding no schedule: the baseline;
* `plain_with_schedules`: the same, with `schedules` recurring schedules defined in the slot
  (hourly, none due): what every claim of a slot with schedules pays (one HLEN per claim and a
  pattern match per claimed id);
* `occurrences`: `schedules` occurrences due now, each claim materialising the next one (the
  claim path of a series), then the background top-up of all of them.

Ratios are against `plain` measured in the same run (best of `rounds` each). `memory`: used_memory
over an empty server per defined schedule (its hash field, its waiting occurrence with the
occurrence's store entry), with a 32-byte payload and a 12-byte id.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import Queue, Recurrence, Schedule, ScheduleRequest, Topic

TOPIC = Topic("schedules", namespace="bench", slot_amount=1)
HOUR_MS = 3_600_000
PAYLOAD = b"x" * 32


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def define(queue: Queue, count: int, start_ms: int | None) -> None:
    for i in range(count):
        recurrence = Recurrence(every_ms=HOUR_MS, start_ms=start_ms)
        queue.put_schedule(Schedule(f"sched-{i:06d}", recurrence, payload=PAYLOAD))


def claim_all(queue: Queue, epoch: int) -> tuple[int, float]:
    """Claim and ack until the slot has nothing due: (claimed, seconds)."""
    claimed, started = 0, time.perf_counter()
    while True:
        batch = queue.claim(0, epoch)
        if not batch.messages:
            return claimed, time.perf_counter() - started
        claimed += len(batch.messages)
        queue.ack_many(batch.messages)


def run(client: redis.Redis, messages: int, schedules: int, case: str) -> float:
    """Claimed messages per second for one case, on a flushed server."""
    client.flushall()
    queue = Queue(client, TOPIC)
    epoch = queue.take_over(0)
    if case == "occurrences":
        start = server_ms(client) + 2_000
        define(queue, schedules, start)
        wait_until(lambda: server_ms(client) > start, 10, "the occurrences to fall due")
    else:
        if case == "plain_with_schedules":
            define(queue, schedules, None)
        requests = [ScheduleRequest(f"m-{i:08d}", PAYLOAD, delay_ms=0) for i in range(messages)]
        for at in range(0, messages, 1000):
            queue.schedule_many(requests[at : at + 1000])
    claimed, seconds = claim_all(queue, epoch)
    expected = schedules if case == "occurrences" else messages
    assert claimed == expected, (case, claimed, expected)
    if case == "occurrences":
        assert queue.top_up_schedules(0) == schedules
    return claimed / seconds


def memory_per_schedule(client: redis.Redis, schedules: int) -> float:
    client.flushall()
    before = int(client.info("memory")["used_memory"])
    define(Queue(client, TOPIC), schedules, None)
    return (int(client.info("memory")["used_memory"]) - before) / schedules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--schedules", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, Any] = {"messages": args.messages, "schedules": args.schedules}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        rates = {
            case: max(run(client, args.messages, args.schedules, case) for _ in range(args.rounds))
            for case in ("plain", "plain_with_schedules", "occurrences")
        }
        results["claims_per_s"] = {case: round(rate) for case, rate in rates.items()}
        results["ratio_to_plain"] = {
            case: round(rate / rates["plain"], 3) for case, rate in rates.items()
        }
        results["memory_bytes_per_schedule"] = round(memory_per_schedule(client, args.schedules))
        client.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
