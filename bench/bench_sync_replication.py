"""What `syncReplicas: 1` costs a producer: a throw-away master + replica, JSON on stdout.

    python bench/bench_sync_replication.py [--singles 2000] [--batches 50]

The same workloads run against the same master with `Topic.redis_sync_replicas` 0 (asynchronous
replication, the baseline) and 1 (every acknowledged write waits for the replica's WAIT): single
`Queue.schedule` calls (latency p50/p99 per call and calls/s) and `schedule_many` batches of 1000
(messages/s). Both replicas are local processes on the same 2 cores, so the figure is the cost of
the extra round of acknowledgements, not of a network; across hosts add one network round trip
per acknowledged call.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue import Queue, ScheduleRequest, Topic

BATCH = 1000
HOUR_MS = 3_600_000


def _replica_online(master: RedisServer) -> bool:
    info = redis.Redis(port=master.port).info("replication")
    return any(
        key.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        for key, v in info.items()
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run(url: str, sync_replicas: int, singles: int, batches: int) -> dict[str, Any]:
    topic = Topic(f"sync-{sync_replicas}", slot_amount=16, redis_sync_replicas=sync_replicas)
    queue = Queue.from_url(url, topic)
    queue.schedule("warm-up", b"p", delay_ms=HOUR_MS)  # scripts loaded, connection open
    latencies_ms: list[float] = []
    started = time.perf_counter()
    for i in range(singles):
        before = time.perf_counter()
        queue.schedule(f"s{i}", b"x" * 40, delay_ms=HOUR_MS)
        latencies_ms.append((time.perf_counter() - before) * 1000)
    singles_s = time.perf_counter() - started
    started = time.perf_counter()
    for b in range(batches):
        queue.schedule_many(
            [ScheduleRequest(f"b{b}-{i}", b"x" * 40, delay_ms=HOUR_MS) for i in range(BATCH)]
        )
    batches_s = time.perf_counter() - started
    queue.close()
    return {
        "redis_sync_replicas": sync_replicas,
        "single_p50_ms": round(_quantile(latencies_ms, 0.5), 3),
        "single_p99_ms": round(_quantile(latencies_ms, 0.99), 3),
        "singles_per_s": round(singles / singles_s),
        "batch_msgs_per_s": round(batches * BATCH / batches_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--singles", type=int, default=2000, help="single schedule calls")
    parser.add_argument("--batches", type=int, default=50, help="batches of 1000 messages")
    args = parser.parse_args()
    with (
        RedisServer() as master,
        RedisServer(extra_config={"replicaof": f"127.0.0.1 {master.port}"}),
    ):
        wait_until(lambda: _replica_online(master), 20, "the replica in sync")
        runs = [_run(master.url, n, args.singles, args.batches) for n in (0, 1, 0, 1)]
    base = [r for r in runs if r["redis_sync_replicas"] == 0][-1]
    sync = [r for r in runs if r["redis_sync_replicas"] == 1][-1]
    print(
        json.dumps(
            {
                "runs": runs,
                "ratio_sync_to_async": {
                    key: round(sync[key] / base[key], 2)
                    for key in (
                        "single_p50_ms",
                        "single_p99_ms",
                        "singles_per_s",
                        "batch_msgs_per_s",
                    )
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
