"""What moving one slot between brokers costs: total time and write pause by pending messages.

    python bench/bench_move.py [--messages 10000 100000] [--rounds 3]

Two throw-away redis-servers and a ZooKeeper on this machine; one slot holding `messages`
pending messages (32-byte payloads, due in an hour) is moved from broker 0 to broker 1 with
`SlotMover` and back, step by step, each step timed:

* `move_s`: start to end of the move (record, freeze, copy, switch, clean);
* `write_pause_s`: freeze to routing switch, the time a write into the slot is refused (the
  HTTP API holds such a write that long; a delay service consumes nothing from the slot then);
* `steps_s`: each step on its own;
* `baseline_schedule_s`: scheduling the same messages into the slot (`schedule_many`, batches of
  1000), measured in the same run: `ratio_move_to_schedule` says what a move costs against
  writing the slot once.

Best of `rounds` for each figure (client and servers share the machine: relative figures).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover
from delayq.coordination.routing import Routing
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic

TOPIC = Topic("moves", namespace="bench", slot_amount=1)
PAYLOAD = b"x" * 32
HOUR_MS = 3_600_000
BATCH = 1000


def fill(queue: Queue, count: int, prefix: str) -> float:
    """Schedule `count` messages into the slot; seconds taken (the baseline)."""
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        batch = [
            ScheduleRequest(f"{prefix}-{i:07d}", PAYLOAD, delay_ms=HOUR_MS)
            for i in range(first, min(count, first + BATCH))
        ]
        queue.schedule_many(batch)
    return time.perf_counter() - started


def timed_move(mover: SlotMover, target: int) -> dict[str, Any]:
    """One move, step by step: total, write pause (freeze to switch) and per step."""
    started = time.perf_counter()
    current: tuple[Migration, int] | None = mover.start(0, target)
    steps: dict[str, float] = {}
    frozen_at = switched_at = started
    while current is not None:
        step = current[0].step
        began = time.perf_counter()
        current = mover.step(*current)
        ended = time.perf_counter()
        steps[step.value] = ended - began
        if step.value == "freeze":
            frozen_at = began
        if step.value == "switch":
            switched_at = ended
    return {
        "move_s": time.perf_counter() - started,
        "write_pause_s": switched_at - frozen_at,
        "steps_s": steps,
    }


def measure(messages: int, rounds: int, mover: SlotMover, queues: list[Queue]) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for round_ in range(rounds):
        for queue in queues:
            queue.redis.flushall()
        baseline = fill(queues[0], messages, f"r{round_}")
        moved = timed_move(mover, 1)
        timed_move(mover, 0)  # back, for the next round
        if not best or moved["move_s"] < best["move_s"]:
            best = {**moved, "baseline_schedule_s": baseline}
        best["baseline_schedule_s"] = min(best["baseline_schedule_s"], baseline)
    best["ratio_move_to_schedule"] = best["move_s"] / best["baseline_schedule_s"]
    best["messages"] = messages
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with RedisServer() as first, RedisServer() as second, ZooKeeperServer() as zookeeper:
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        paths = TopicPaths(TOPIC.namespace, TOPIC.name)
        zk.create(paths.routing, Routing(1, 2, (0,)).to_json(), makepath=True)
        queues = [Queue.from_url(server.url, TOPIC) for server in (first, second)]
        try:
            mover = SlotMover(zk, paths, queues)
            results = [measure(count, args.rounds, mover, queues) for count in args.messages]
        finally:
            zk.stop()
            zk.close()
            for queue in queues:
                queue.close()
    print(json.dumps({"bench": "move", "rounds": args.rounds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
