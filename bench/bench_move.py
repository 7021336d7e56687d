"""What moving one slot between brokers costs: total time and write pause by pending messages.

    python bench/bench_move.py [--messages 10000 100000] [--rounds 3]
    python bench/bench_move.py --reshard [--messages 100000] [--concurrency 2]

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

`--reshard`: brokers 1 -> 2 as the operator does it (`kube/resharding.py` `reshard`, its own
ZooKeeper store and Redis commands, `--concurrency` moves at a time) on a 16-slot topic holding
`messages` pending messages spread over the slots: `reshard_s` is the whole resharding (8 slot
moves), against `baseline_schedule_s`, scheduling the same messages once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

import redis
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover
from delayq.coordination.routing import Routing
from delayq.kube import naming, resharding
from delayq.kube.builders.common import BuildContext
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.redisctl import RedisCommands
from delayq.kube.spec import TopicSpec
from delayq.kube.zk import KazooTopicStore
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic, acl

TOPIC = Topic("moves", namespace="bench", slot_amount=1)
PAYLOAD = b"x" * 32
HOUR_MS = 3_600_000
BATCH = 1000
LOGGER = logging.getLogger("bench.move")


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
    mover.release(0)
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


async def unrecorded(routing: Routing) -> None:
    """Where the operator patches status.routing before each switch: one API call per move,
    not part of this figure (no API server here)."""


def reshard(messages: int, concurrency: int) -> dict[str, Any]:
    """Brokers 1 -> 2 by the operator's resharding, timed against scheduling the messages."""
    topic = Topic("grow", namespace="bench", slot_amount=16)
    with RedisServer() as first, RedisServer() as second, ZooKeeperServer() as zookeeper:
        addresses = {}
        for broker, server in enumerate((first, second)):
            admin = redis.Redis.from_url(server.url)
            rules = (acl.ADMIN_USER, *acl.ADMIN_RULES, ">bench")  # the operator's Redis user
            admin.execute_command("ACL", "SETUSER", *rules)  # type: ignore[no-untyped-call]
            admin.close()
            host = naming.redis_master_host(topic.name, topic.namespace, broker)
            addresses[host] = ("127.0.0.1", server.port)
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        paths = TopicPaths(topic.namespace, topic.name)
        routing = Routing(16, 2, (0,) * 16)
        zk.create(paths.routing, routing.to_json(), makepath=True)
        queue = Queue.from_url(first.url, topic)
        baseline = fill(queue, messages, "m")
        queue.close()
        store = KazooTopicStore([zookeeper.hosts])
        config = OperatorConfig(build=BuildContext(default_zookeeper=zookeeper.hosts))
        ctx = OperatorContext(config, store=store, redis=RedisCommands(addresses=addresses))
        spec = TopicSpec(
            topic.name,
            topic.namespace,
            slot_amount=16,
            brokers=2,
            zookeeper_connect=zookeeper.hosts,
            resharding_max_concurrent_moves=concurrency,
        )
        resharding.MOVES_BUDGET_S = float("inf")  # one pass does it all: the time is the figure
        started = time.perf_counter()
        done = asyncio.run(resharding.reshard(ctx, spec, routing, "bench", {}, LOGGER, unrecorded))
        elapsed = time.perf_counter() - started
        store.close()
        zk.stop()
        zk.close()
    assert done.routing.slots_per_broker() == {0: 8, 1: 8}, done.routing
    return {
        "messages": messages,
        "concurrency": concurrency,
        "reshard_s": elapsed,
        "moves": (done.progress or {}).get("moved"),
        "baseline_schedule_s": baseline,
        "ratio_reshard_to_schedule": elapsed / baseline,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reshard", action="store_true", help="time brokers 1 -> 2 instead")
    parser.add_argument("--concurrency", type=int, default=2, help="moves at a time (--reshard)")
    args = parser.parse_args()
    if args.reshard:
        results = [reshard(count, args.concurrency) for count in args.messages]
        print(json.dumps({"bench": "reshard", "results": results}, indent=2))
        return
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
