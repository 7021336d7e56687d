"""Pipeline ingest benchmark: a Parquet file into a throw-away redis-server, JSON on stdout.

    python bench/bench_pipeline.py [--rows 1000000] [--engine-rows 200000] [--master local[2]]

Target (issue 17): 1,000,000 rows in <= 20 s of job time with local[2] on a 2-core machine. The
baseline, measured in the same run on the same server, is the engine's own batch enqueue
(`Queue.schedule_many`, one process, batches of 5000) over a subset of the same rows: the
pipeline adds file reading, validation and routing in Spark and the Arrow transfer to the Python
writers, and parallelises the writes over two cores. The load average before and after the run
is in the JSON: the machine is shared, and the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.pipeline.ingest import ingest, stderr_report
from delayq.pipeline.io_redis import DEFAULT_BATCH_ROWS, RedisTarget
from delayq.pipeline.spark import session
from delayq.queue.client import Queue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import Mode, ScheduleRequest
from delayq.queue.topic import DEFAULT_MAX_PAYLOAD_BYTES, Topic

SLOTS = 16
PAYLOAD_BYTES = 32
TARGET_SECONDS = 20


def write_input(spark: Any, rows: int, path: Path) -> None:
    """Rows like a producer's export: id, a 32-byte payload, a delay of up to one day."""
    spark.range(rows).selectExpr(
        "concat('order-', id) as id",
        f"repeat('x', {PAYLOAD_BYTES}) as payload",
        "(id * 7919) % 86400000 as delay",
    ).write.parquet(str(path))


def engine_rate(url: str, rows: int) -> dict[str, Any]:
    """The engine alone: schedule_many in batches, the same shape of rows, its own topic."""
    topic = Topic("engine", namespace="bench", slot_amount=SLOTS)
    queue = Queue.from_url(url, topic)
    payload = "x" * PAYLOAD_BYTES
    started = time.perf_counter()
    for start in range(0, rows, DEFAULT_BATCH_ROWS):
        batch = [
            ScheduleRequest(f"order-{i}", payload, delay_ms=(i * 7919) % 86_400_000)
            for i in range(start, min(rows, start + DEFAULT_BATCH_ROWS))
        ]
        queue.schedule_many(batch, Mode.CREATE)
    seconds = time.perf_counter() - started
    queue.close()
    return {"rows": rows, "seconds": round(seconds, 2), "rate_msg_per_s": round(rows / seconds)}


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and its descendants, by kind: the
    JVM, redis-server, the Python workers (pyspark forks them), this driver. Linux /proc.

    Job time moves with the load of a shared machine; CPU time much less, so a change to the
    pipeline is judged by both."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    spent: dict[int, tuple[float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue  # self, thread-self, and the kernel's files
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue  # it ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        parent[int(entry.name)] = int(fields[1])
        spent[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / tick, command)
    family, grown = {os.getpid()}, True
    while grown:
        before = len(family)
        family |= {pid for pid, ppid in parent.items() if ppid in family}
        grown = len(family) > before
    totals: dict[str, float] = {}
    for pid in family:
        seconds, command = spent[pid]
        kind = (
            "driver"
            if pid == os.getpid()
            else "jvm"
            if "java" in command
            else "redis_server"
            if "redis-server" in command
            else "python_workers"
        )
        totals[kind] = totals.get(kind, 0.0) + seconds
    return totals


def stored(url: str, topic: Topic) -> int:
    client = redis.Redis.from_url(url)
    try:
        return sum(int(client.zcard(slot_keys(topic, s).key(Part.STORE))) for s in topic.slots)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--engine-rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="delayq-bench-pipeline-"))
    server = RedisServer().start()
    wall = time.perf_counter()
    spark = session(args.master, "delayq-bench-pipeline", shuffle_partitions=4)
    try:
        write_input(spark, args.rows, work / "input")
        baseline = engine_rate(server.url, args.engine_rows)
        target = RedisTarget((server.url,), "bench", "orders", SLOTS, DEFAULT_MAX_PAYLOAD_BYTES)
        source = spark.read.parquet(str(work / "input"))
        cpu_before = cpu_seconds()
        summary = ingest(spark, source, target, str(work / "rejects"), report=stderr_report)
        cpu_after = cpu_seconds()
        wall = time.perf_counter() - wall
        in_redis = stored(server.url, target.to_topic())
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "rows": args.rows,
        "master": args.master,
        "pipeline": summary.as_dict(),
        "target_seconds": TARGET_SECONDS,
        "pipeline_meets_target": summary.seconds <= TARGET_SECONDS,
        "wall_seconds_with_spark_start_and_input_write": round(wall, 1),
        "stored_in_redis": in_redis,
        "engine_schedule_many": baseline,
        "pipeline_vs_engine": round(summary.rate / baseline["rate_msg_per_s"], 2),
        "pipeline_cpu_seconds": {
            kind: round(seconds - cpu_before.get(kind, 0.0), 1)
            for kind, seconds in sorted(cpu_after.items())
        },
        "load_average_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
