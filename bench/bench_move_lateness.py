"""Lateness of messages due while slots move between brokers, against the same stream unmoved.

    python bench/bench_move_lateness.py [--rate 400] [--seconds 10] [--pending 160000]
                                        [--gap-ms 0]

Two throw-away redis-servers, a ZooKeeper and two `delayq serve` processes sharing a `stream`
topic of 16 slots over 2 brokers (every slot routed to broker 0 at first, deliveries XADDed to
broker 0's output stream). A producer (`RoutedQueue`, watched routing: a write refused with
SLOT_MOVING is sent again on the new routing) schedules `rate` messages a second, ids spread
over every slot, each due `--delay-ms` later, in two phases of `seconds` each, one after the
other in the same run:

* `quiet`: nothing moves (the baseline);
* `moving`: a `SlotMover` moves slots 8..15 to broker 1, then back, one slot after the other,
  `--gap-ms` between two moves (none by default: a stress, far more moves than a resharding's
  one per slot), for the whole phase; every slot also holds `pending` / 16 messages due in an
  hour, so each move copies that many.

Lateness is the delivery's stream entry id (Redis server ms) minus the message's due ms (the
broker's server ms; both servers share this host's clock). Reported per phase: every message
due in it, and in `moving` also the messages of the moved slots alone (the others never paused);
`ratio_*` divides a `moving` p99 by the `quiet` p99. Every scheduled message must be delivered
(`lost`) and none before its due time (`early`). One run; the machine's 2 cores are shared by
the servers, the services and this process: relative figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import redis
from kazoo.client import KazooClient

from bench_engine import percentiles
from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import SlotMover
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, ScheduleRequest, Topic
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig

SLOTS = 16
MOVED = range(SLOTS // 2, SLOTS)  # the slots moved to broker 1 and back in the `moving` phase
TICK_S = 0.02
HOUR_MS = 3_600_000
BATCH = 1000
READY_TIMEOUT_S = 120.0


class Producer:
    """`rate` messages a second, paced by the clock (a batch held by a move is caught up)."""

    def __init__(self, routed: RoutedQueue, rate: int, delay_ms: int) -> None:
        self.routed = routed
        self.rate = rate
        self.delay_ms = delay_ms
        self.due_ms: dict[str, int] = {}  # message id -> due ms (server clock)
        self.phase_of: dict[str, str] = {}

    def run(self, phase: str, seconds: float) -> None:
        per_tick = max(1, int(self.rate * TICK_S))
        started = time.monotonic()
        ticks = 0
        while time.monotonic() - started < seconds:
            batch = [
                ScheduleRequest(uuid.uuid4().hex, b"x" * 32, delay_ms=self.delay_ms)
                for _ in range(per_tick)
            ]
            for request, result in zip(batch, self.routed.schedule_many(batch), strict=True):
                self.due_ms[request.id] = result.due_ms
                self.phase_of[request.id] = phase
            ticks += 1
            time.sleep(max(0.0, started + ticks * TICK_S - time.monotonic()))


def keep_moving(mover: SlotMover, stop: threading.Event, gap_s: float, moves: list[float]) -> None:
    """Slots MOVED to broker 1 and back, one at a time, `gap_s` between two moves, until
    `stop` (a move under way ends)."""
    target = 1
    while not stop.is_set():
        for slot in MOVED:
            began = time.perf_counter()
            mover.move(slot, target)
            moves.append(time.perf_counter() - began)
            stop.wait(gap_s)
        target = 1 - target
    for slot in MOVED:  # leave them where the phase found them: on broker 0
        if mover.routing()[0].broker_of_slot[slot] != 0:
            mover.move(slot, 0)


def preload(queue: Queue, pending: int) -> None:
    """`pending` messages due in an hour, over every slot (what each move copies)."""
    for first in range(0, pending, BATCH):
        queue.schedule_many(
            [
                ScheduleRequest(f"pending-{i:07d}", b"x" * 32, delay_ms=HOUR_MS)
                for i in range(first, min(pending, first + BATCH))
            ]
        )


def owned(zk: KazooClient, paths: TopicPaths) -> int:
    """How many slots have an owner node now (the services are ready when all do)."""
    return len(zk.get_children(paths.owners)) if zk.exists(paths.owners) else 0


def delivered(client: redis.Redis, stream: str) -> dict[str, int]:
    """message id -> stream entry ms of its first delivery."""
    first: dict[str, int] = {}
    low = "-"
    while True:
        answer = client.xrange(stream, low, "+", count=10_000)
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], answer)
        if not entries:
            return first
        for entry_id, fields in entries:
            first.setdefault(fields[b"id"].decode(), int(entry_id.split(b"-")[0]))
        low = f"({entries[-1][0].decode()}"


def measure(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    topic = Topic(f"late-{uuid.uuid4().hex[:6]}", namespace="bench", slot_amount=SLOTS)
    with RedisServer() as first, RedisServer() as second, ZooKeeperServer() as zookeeper:
        urls = [first.url, second.url]
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        paths = TopicPaths(topic.namespace, topic.name)
        zk.create(paths.routing, Routing(SLOTS, 2, (0,) * SLOTS).to_json(), makepath=True)
        queues = [Queue.from_url(url, topic) for url in urls]
        preload(queues[0], args.pending)
        config = ServiceConfig(
            redis_url=first.url,
            broker_urls=",".join(urls),
            namespace=topic.namespace,
            topic=topic.name,
            slot_amount=SLOTS,
            topic_type=TopicType.STREAM,
            port=0,
            zookeeper_connect=zookeeper.hosts,
        )
        services = [
            ServeProcess(replace(config, member_id=f"late-{i}"), log_dir / f"late-{i}.log").start()
            for i in range(2)
        ]
        routed = RoutedQueue.connect(urls, topic, zookeeper=ZkConnection(zookeeper.hosts))
        output = redis.Redis.from_url(first.url)
        try:
            wait_until(lambda: owned(zk, paths) == SLOTS or None, READY_TIMEOUT_S, "slots owned")
            producer = Producer(routed, args.rate, args.delay_ms)
            producer.run("quiet", args.seconds)
            stop, moves = threading.Event(), list[float]()
            mover = threading.Thread(
                target=keep_moving,
                args=(SlotMover(zk, paths, queues), stop, args.gap_ms / 1000, moves),
            )
            mover.start()
            producer.run("moving", args.seconds)
            stop.set()
            mover.join()
            deadline_s = args.delay_ms / 1000 + 30
            wait_until(
                lambda: (
                    len(delivered(output, config.target_stream)) >= len(producer.due_ms) or None
                ),
                deadline_s,
                "every message delivered",
            )
            arrivals = delivered(output, config.target_stream)
        finally:
            stop_all(services)
            routed.close()
            output.close()
            for queue in queues:
                queue.close()
            zk.stop()
            zk.close()
    return report(producer, arrivals, moves, topic)


def report(
    producer: Producer, arrivals: dict[str, int], moves: list[float], topic: Topic
) -> dict[str, Any]:
    lateness: dict[str, list[float]] = {"quiet": [], "moving": [], "moving_moved_slots": []}
    early = lost = 0
    for message_id, due_ms in producer.due_ms.items():
        at_ms = arrivals.get(message_id)
        if at_ms is None:
            lost += 1
            continue
        early += at_ms < due_ms
        phase = producer.phase_of[message_id]
        lateness[phase].append(at_ms - due_ms)
        if phase == "moving" and topic.slot_of(message_id.encode()) in MOVED:
            lateness["moving_moved_slots"].append(at_ms - due_ms)
    figures = {phase: percentiles(values) for phase, values in lateness.items()}
    quiet_p99 = max(figures["quiet"]["p99_ms"], 1.0)  # ms resolution: never divide by 0
    return {
        "messages": len(producer.due_ms),
        "lost": lost,
        "early": early,
        "moves": len(moves),
        "move_s": percentiles([m * 1000 for m in moves]),  # per move, in ms
        "lateness_ms": figures,
        "ratio_moving_p99_to_quiet": figures["moving"]["p99_ms"] / quiet_p99,
        "ratio_moved_slots_p99_to_quiet": figures["moving_moved_slots"]["p99_ms"] / quiet_p99,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=400, help="messages scheduled a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--delay-ms", type=int, default=500, help="each message due this later")
    parser.add_argument("--pending", type=int, default=160_000, help="far messages, all slots")
    parser.add_argument("--gap-ms", type=int, default=0, help="between two moves (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-move-lateness-") as log_dir:
        result = measure(args, Path(log_dir))
    print(json.dumps({"bench": "move_lateness", **vars(args), **result}, indent=2))


if __name__ == "__main__":
    main()
