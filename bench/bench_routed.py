"""What routing by slot costs a producer: `RoutedQueue` against the engine's `Queue`.

    python bench/bench_routed.py [--messages 100000] [--singles 5000] [--rounds 3]

Two throw-away redis-servers and a ZooKeeper on this machine, a 64-slot topic, 32-byte payloads
due in an hour. Each round schedules `messages` with `schedule_many` (batches of 1000) and
`singles` with `schedule`, through:

* `queue`: the engine's single-broker `Queue` on broker 0 (the same-run baseline);
* `routed_one_broker`: `RoutedQueue` with one URL (no routing to follow);
* `routed_two_brokers`: `RoutedQueue` over both brokers, routed by the watched ZooKeeper node
  (slots 0-31 on broker 0, 32-63 on broker 1): each batch is split into one call per broker.

Messages per second, best of `rounds`, and each client's ratio to the baseline (client and
servers share the machine: relative figures).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import initial_routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic

TOPIC = Topic("routed", namespace="bench", slot_amount=64)
PAYLOAD = b"x" * 32
HOUR_MS = 3_600_000
BATCH = 1000
Client = Queue | RoutedQueue


def batches(client: Client, count: int, prefix: str) -> float:
    """Messages per second scheduled with schedule_many."""
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        client.schedule_many(
            [
                ScheduleRequest(f"{prefix}-{i:07d}", PAYLOAD, delay_ms=HOUR_MS)
                for i in range(first, min(count, first + BATCH))
            ]
        )
    return count / (time.perf_counter() - started)


def singles(client: Client, count: int, prefix: str) -> float:
    """Messages per second scheduled one `schedule` call each."""
    started = time.perf_counter()
    for i in range(count):
        client.schedule(f"{prefix}-{i:07d}", PAYLOAD, delay_ms=HOUR_MS)
    return count / (time.perf_counter() - started)


def measure(
    clients: dict[str, Client], flush: Callable[[], None], args: argparse.Namespace
) -> dict[str, Any]:
    best: dict[str, dict[str, float]] = {name: {} for name in clients}
    for round_ in range(args.rounds):
        for name, client in clients.items():
            flush()
            figures = {
                "batch_msg_per_s": batches(client, args.messages, f"b{round_}"),
                "single_msg_per_s": singles(client, args.singles, f"s{round_}"),
            }
            for key, value in figures.items():
                best[name][key] = max(best[name].get(key, 0.0), value)
    baseline = best["queue"]
    for figures in best.values():
        for key in list(figures):
            figures[f"ratio_{key.removesuffix('_msg_per_s')}_to_queue"] = (
                figures[key] / baseline[key]
            )
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--singles", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with RedisServer() as first, RedisServer() as second, ZooKeeperServer() as zookeeper:
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        routing = initial_routing(TOPIC.slot_amount, 2).to_json()
        zk.create(TopicPaths(TOPIC.namespace, TOPIC.name).routing, routing, makepath=True)
        urls = [first.url, second.url]
        clients: dict[str, Client] = {
            "queue": Queue.from_url(urls[0], TOPIC),
            "routed_one_broker": RoutedQueue.connect(urls[:1], TOPIC),
            "routed_two_brokers": RoutedQueue.connect(
                urls, TOPIC, zookeeper=ZkConnection(zookeeper.hosts)
            ),
        }

        def flush() -> None:
            for url in urls:
                with Queue.from_url(url, TOPIC).redis as client:
                    client.flushall()

        try:
            results = measure(clients, flush, args)
        finally:
            zk.stop()
            zk.close()
            for client in clients.values():
                client.close()
    document = {"bench": "routed", "messages": args.messages, "singles": args.singles}
    print(json.dumps({**document, "rounds": args.rounds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
