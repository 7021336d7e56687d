"""Backup and restore benchmark: N pending messages through `delayq pipeline backup | restore`.

    python bench/bench_backup.py [--messages 100000] [--slots 16] [--master local[2]]

A throw-away redis-server holds a topic of `--messages` waiting messages (32-byte payloads, due
within a day); the backup writes them to Parquet, the restore writes them into a second topic of
the same server (create-only, as a DR restore into a wiped broker would). Reported: each job's
time (from its start to its summary, Spark already running; the first job of a JVM pays its
warm-up, so the backup runs a second time after the restore), and the longest single-slot read
of the backup, measured alone after the jobs: the time one slot's MULTI of reads holds its
broker, the only pause delivery sees (`queue/backup.py`). The 1-minute load average before and
after is in the JSON: the machine is shared, and the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from delayq.local.redis_server import RedisServer
from delayq.pipeline.backup import backup, restore
from delayq.pipeline.io_redis import RedisTarget
from delayq.pipeline.spark import session
from delayq.queue.backup import snapshot
from delayq.queue.client import Queue
from delayq.queue.keys import slot_keys
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import DEFAULT_MAX_PAYLOAD_BYTES, Topic

PAYLOAD = "x" * 32
BATCH = 5000


def fill(queue: Queue, messages: int) -> None:
    for start in range(0, messages, BATCH):
        queue.schedule_many(
            [
                ScheduleRequest(f"order-{i}", PAYLOAD, delay_ms=60_000 + (i * 7919) % 86_400_000)
                for i in range(start, min(messages, start + BATCH))
            ],
            Mode.CREATE,
        )


def slot_read_ms(queue: Queue, slot: int) -> float:
    """The broker's own time for one slot's snapshot: the usec Redis counts for the reads of
    its MULTI (INFO commandstats, reset first), not the transfer or the client's decoding."""
    queue.redis.config_resetstat()
    snapshot(queue.redis, slot_keys(queue.topic, slot))
    stats = queue.redis.info("commandstats")
    reads = ("cmdstat_zrange", "cmdstat_hgetall", "cmdstat_get")
    return sum(int(stats.get(name, {}).get("usec", 0)) for name in reads) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    work = tempfile.mkdtemp(prefix="delayq-bench-backup-")
    source = Topic("orders", namespace="bench", slot_amount=args.slots)
    with RedisServer() as server:
        queue = Queue.from_url(server.url, source)
        fill(queue, args.messages)

        def target(topic: str) -> RedisTarget:
            return RedisTarget(
                (server.url,), "bench", topic, args.slots, DEFAULT_MAX_PAYLOAD_BYTES
            )

        spark = session(args.master, "delayq-bench-backup")
        try:
            taken = backup(spark, target("orders"), f"{work}/backup")
            restored = restore(spark, f"{work}/backup", target("restored"), 0)
            again = backup(spark, target("orders"), f"{work}/again")  # a warm JVM and workers
        finally:
            spark.stop()
        slot_reads_ms = [slot_read_ms(queue, slot) for slot in source.slots]
        queue.close()
    shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]
    print(
        json.dumps(
            {
                "messages": args.messages,
                "slots": args.slots,
                "master": args.master,
                "backup_s": round(taken.seconds, 2),
                "backup_again_s": round(again.seconds, 2),
                "restore_s": round(restored.seconds, 2),
                "restored": restored.counts,
                "longest_slot_read_ms": round(max(slot_reads_ms), 2),
                "load_average_1m_before_after": [round(load_before, 2), round(load_after, 2)],
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
