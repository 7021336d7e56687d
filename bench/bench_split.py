"""What doubling a topic's slots costs: total time, and how long its slots are frozen, by pending
messages.

    python bench/bench_split.py [--messages 100000 1000000] [--rounds 1] [--writes-per-s 0]
        [--slots 16[,64,...]]

A throw-away redis-server and ZooKeeper on this machine; a topic of `--slots` slots (16; a
comma-separated list measures each amount in turn) holding
`messages` pending messages (32-byte payloads, due in an hour, ids spread over the slots) is
doubled with `SlotSplitter`, step by step, each step timed:

* `split_s`: start to end of the doubling (record, copy of the slots and its rounds, freeze
  with the catch-up, switch, clean);
* `copy_s`: the copy before the freeze (the slots take writes and deliver meanwhile);
* `write_pause_s`: the topic's pause, from the freeze of the first old slot to the routing's
  last switch: how long a writer that does not read the routing's `doubledSlots` (a process of
  an earlier version) is refused, and a pull topic delivers nothing;
* `slot_pause_max_s`, `slot_pause_median_s`: each old slot's pause, from its freeze to its
  listing in the routing's `doubledSlots`: how long a writer that reads it (RoutedQueue, the
  HTTP API) is refused in that slot, and its owner delivers nothing of it;
* `frozen_at_once_max`: the most old slots frozen and not listed at any time: what a splitter
  killed there leaves refusing every writer;
* `steps_s`: each step on its own (`copy`: the slots' splits and the rounds summed);
* `writes_during_copy`: with `--writes-per-s`, messages scheduled into the old slots by another
  client while the copy runs (stopped at the freeze); `catch_up`: how many changes the
  freeze copied again (all slots);
* `baseline_schedule_s`: scheduling the same messages (`schedule_many`, batches of 1000), in the
  same run: `ratio_split_to_schedule` says what a doubling costs against writing the topic once.

Best of `rounds` (client and server share the machine: relative figures); `machine` says on
what and under which load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import threading
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
from delayq.queue.keys import Part, slot_keys

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


class Writer:
    """Schedules `per_s` messages a second into the topic (batches of 100, its old slot amount)
    in a thread of its own until stopped; counts what it stored."""

    def __init__(self, queue: Queue, per_s: int) -> None:
        self.queue, self.per_s = queue, per_s
        self.stored = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        started, sent = time.perf_counter(), 0
        while not self.stop.is_set():
            batch = [
                ScheduleRequest(f"w-{uuid.uuid4().hex}", PAYLOAD, delay_ms=HOUR_MS)
                for _ in range(100)
            ]
            self.queue.schedule_many(batch)
            self.stored += len(batch)
            sent += len(batch)
            time.sleep(max(0.0, started + sent / self.per_s - time.perf_counter()))


class TimedSplitter(SlotSplitter):
    """Notes when each old slot is frozen (its catch-up begins) and switched (it is in the
    routing's doubled slots)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.frozen_at: dict[int, float] = {}
        self.switched_at: dict[int, float] = {}

    def _catch_up(self, split: Split, old: Topic, new: Topic, slot: int) -> None:
        self.frozen_at[slot] = time.perf_counter()
        super()._catch_up(split, old, new, slot)

    def _switch_slot(self, split: Split, slot: int, read: Any) -> tuple[Routing, int]:
        written = super()._switch_slot(split, slot, read)
        self.switched_at[slot] = time.perf_counter()
        return written

    def frozen_at_once_max(self) -> int:
        """The most old slots frozen and not yet switched at one time."""
        events = sorted(
            [(at, 1) for at in self.frozen_at.values()]
            + [(at, -1) for at in self.switched_at.values()]
        )
        frozen = most = 0
        for _, change in events:
            frozen += change
            most = max(most, frozen)
        return most


def timed_split(splitter: TimedSplitter, writer: Writer | None) -> dict[str, Any]:
    """One doubling, step by step: total, write pause (freeze to switch) and per step."""
    started = time.perf_counter()
    current: tuple[Split, int] | None = splitter.start(2 * splitter.topic.slot_amount)
    steps: dict[str, float] = {}
    switched_at = started
    stored_at_freeze = catch_up = 0
    while current is not None:
        step = current[0].step
        began = time.perf_counter()
        if step.value == "freeze" and writer:  # from here on its writes would be refused
            writer.stop.set()
            writer.thread.join()
            stored_at_freeze = writer.stored
        if step.value == "freeze":
            catch_up = pending_changes(splitter)
        current = splitter.step(*current)
        ended = time.perf_counter()
        steps[step.value] = steps.get(step.value, 0.0) + ended - began
        if step.value == "switch":
            switched_at = ended
    splitter.release()
    frozen_at = min(splitter.frozen_at.values())
    pauses = sorted(splitter.switched_at[s] - splitter.frozen_at[s] for s in splitter.frozen_at)
    return {
        "split_s": time.perf_counter() - started,
        "copy_s": steps.get("copy", 0.0),
        "write_pause_s": switched_at - frozen_at,
        "slot_pause_max_s": pauses[-1],
        "slot_pause_median_s": pauses[len(pauses) // 2],
        "frozen_at_once_max": splitter.frozen_at_once_max(),
        "steps_s": steps,
        "writes_during_copy": stored_at_freeze,
        "catch_up": catch_up,
    }


def pending_changes(splitter: SlotSplitter) -> int:
    """The changes the catch-up under the freeze will copy again (all old slots)."""
    topic, client = splitter.topic, splitter.queues[0].redis
    read = client.pipeline(transaction=False)
    for slot in range(topic.slot_amount):
        keys = slot_keys(topic, slot)
        read.scard(keys.key(Part.CHANGES))
        read.scard(keys.key(Part.RECOPY))
    counts = read.execute()
    return int(sum(counts)) - topic.slot_amount  # each changes set holds '' while tracking is on


def measure(
    messages: int,
    slots: int,
    rounds: int,
    writes_per_s: int,
    server: RedisServer,
    zk: KazooClient,
) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for _ in range(rounds):
        topic = Topic(f"s-{uuid.uuid4().hex[:8]}", namespace="bench", slot_amount=slots)
        paths = TopicPaths(topic.namespace, topic.name)
        zk.create(paths.routing, Routing(slots, 1, (0,) * slots).to_json(), makepath=True)
        queue = Queue.from_url(server.url, topic)
        queue.redis.flushall()
        baseline = fill(queue, messages)
        writer = Writer(Queue.from_url(server.url, topic), writes_per_s) if writes_per_s else None
        if writer:
            writer.thread.start()
        try:
            split = timed_split(TimedSplitter(zk, paths, [queue]), writer)
        finally:
            if writer:
                writer.stop.set()
                writer.thread.join()
                writer.queue.close()
        split["redis_used_memory_peak"] = queue.redis.info("memory")["used_memory_peak_human"]
        queue.close()
        if not best or split["split_s"] < best["split_s"]:
            best = {**split, "baseline_schedule_s": baseline}
        best["baseline_schedule_s"] = min(best["baseline_schedule_s"], baseline)
    best["ratio_split_to_schedule"] = best["split_s"] / best["baseline_schedule_s"]
    best["messages"] = messages
    best["slots"] = slots
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--writes-per-s", type=int, default=0)
    parser.add_argument(
        "--slots",
        type=lambda text: [int(amount) for amount in text.split(",")],
        default=[16],
        help="the slot amount before (comma-separated: each in turn)",
    )
    args = parser.parse_args()
    with RedisServer() as server, ZooKeeperServer() as zookeeper:
        zk = KazooClient(hosts=zookeeper.hosts)
        zk.start(timeout=30)
        try:
            results = [
                measure(count, slots, args.rounds, args.writes_per_s, server, zk)
                for slots in args.slots
                for count in args.messages
            ]
        finally:
            zk.stop()
            zk.close()
    report = {
        "bench": "split",
        "command": " ".join(["python", *sys.argv]),
        "rounds": args.rounds,
        "writes_per_s": args.writes_per_s,
        "machine": machine(),
        "results": results,
    }
    print(json.dumps(report, indent=2))


def machine() -> dict[str, Any]:
    """Where and when it ran, and how loaded the machine was (others share it)."""
    return {
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


if __name__ == "__main__":
    main()
