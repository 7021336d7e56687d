"""What doubling a topic's slots costs: total time and write pause by pending messages.

    python bench/bench_split.py [--messages 100000 1000000] [--rounds 1]

A throw-away redis-server and ZooKeeper on this machine; a 16-slot topic holding `messages`
pending messages (32-byte payloads, due in an hour, ids spread over the slots) is doubled to 32
slots with `SlotSplitter`, step by step, each step timed:

* `split_s`: start to end of the doubling (record, freeze, copy of the 16 slots, switch, clean);
* `write_pause_s`: freeze to routing switch, the time a write into the topic is refused (the
  HTTP API and RoutedQueue hold such a write that long; nothing is delivered meanwhile);
* `steps_s`: each step on its own (`copy`: the 16 slots' splits summed);
* `baseline_schedule_s`: scheduling the same messages (`schedule_many`, batches of 1000), in the
  same run: `ratio_split_to_schedule` says what a doubling costs against writing the topic once.

Best of `rounds` (client and server share the machine: relative figures).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing
from delayq.coordination.splitting import SlotSplitter, Split
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic

SLOTS = 16
PAYLOAD = b"x" * 32
HOUR_MS = 3_600_000
BATCH = 1000


def fill(queue: Queue, count: int) -> float:
    """Schedule `count` messages over the topic's slots; seconds taken (the baseline)."""
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        batch = [
            ScheduleRequest(f"m-{i:08d}", PAYLOAD, delay_ms=HOUR_MS)
            for i in range(first, min(count, first + BATCH))
        ]
        queue.schedule_many(batch)
    return time.perf_counter() - started


def timed_split(splitter: SlotSplitter) -> dict[str, Any]:
    """One doubling, step by step: total, write pause (freeze to switch) and per step."""
    started = time.perf_counter()
    current: tuple[Split, int] | None = splitter.start(2 * SLOTS)
    steps: dict[str, float] = {}
    frozen_at = switched_at = started
    while current is not None:
        step = current[0].step
        began = time.perf_counter()
        current = splitter.step(*current)
        ended = time.perf_counter()
        steps[step.value] = steps.get(step.value, 0.0) + ended - began
        if step.value == "freeze":
            frozen_at = began
        if step.value == "switch":
            switched_at = ended
    splitter.release()
    return {
        "split_s": time.perf_counter() - started,
        "write_pause_s": switched_at - frozen_at,
        "steps_s": steps,
    }


def measure(messages: int, rounds: int, server: RedisServer, zk: KazooClient) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for _ in range(rounds):
        topic = Topic(f"s-{uuid.uuid4().hex[:8]}", namespace="bench", slot_amount=SLOTS)
        paths = TopicPaths(topic.namespace, topic.name)
        zk.create(paths.routing, Routing(SLOTS, 1, (0,) * SLOTS).to_json(), makepath=True)
        queue = Queue.from_url(server.url, topic)
        queue.redis.flushall()
        baseline = fill(queue, messages)
        split = timed_split(SlotSplitter(zk, paths, [queue]))
        queue.close()
        if not best or split["split_s"] < best["split_s"]:
            best = {**split, "baseline_schedule_s": baseline}
        best["baseline_schedule_s"] = min(best["baseline_schedule_s"], baseline)
    best["ratio_split_to_schedule"] = best["split_s"] / best["baseline_schedule_s"]
    best["messages"] = messages
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with RedisServer() as server, ZooKeeperServer() as zookeeper:
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        try:
            results = [measure(count, args.rounds, server, zk) for count in args.messages]
        finally:
            zk.stop()
            zk.close()
    print(json.dumps({"bench": "split", "rounds": args.rounds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
