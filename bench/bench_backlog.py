"""Cost as the backlog grows: one throw-away redis-server, one topic grown in place, JSON out.

    python bench/bench_backlog.py [--quick] [--slots 16] [--depths 1000000,10000000,50000000]
                                  [--rounds 3] [--record-buckets] [--store-buckets]
                                  [--output FILE] [--markdown]

Issue 30 asks that enqueue, claim -> ack of due messages amid the backlog and get-by-id cost at
10M and 50M pending within 1.25x of what they cost at 1M, and what one pending message costs in
Redis memory. One topic (`--slots`, default 16) is grown in place to each depth in turn (1M,
then 9M more to 10M, ...; never reloaded from zero) with messages due in one to two days (40-byte
payloads, 12-byte ids; loaded with `AsyncQueue.schedule_many`, several calls in flight: loading
speed is not a figure). At each depth, through the user-level API with the documented defaults:

* memory: Redis `used_memory` after the load minus the empty topic's (after a warm-up message
  loaded the functions and the settings record), over the messages pending;
* enqueue: bench_peers.py's producer (`AsyncQueue.schedule_many`, batches of 1,000, 2 calls in
  flight, requests built inside the timed loop) sending `--sample` more messages due a day out:
  they join the backlog (the next depth's load tops it up to the round figure);
* enqueue due soon: the same producer sending `--due` messages due now (with `--store-buckets`
  they stay out of the buckets: `redis.storeBucketsAfter`);
* claim -> ack: those messages, drained by a `Consumer` with `ConsumerSettings()` and a no-op
  handler (bench_engine.py's `consume_until`): messages per second from the first handler call
  to the last;
* get-by-id: `Queue.get` of `--gets` random backlog ids, one call at a time: latency p50/p99;
* with `--store-buckets`, claim -> ack from buckets: as claim -> ack, but the `--due` messages'
  dues are written into buckets (the topic published with storeBucketsAfter 0 for their
  schedule, then as it was), as a message scheduled more than storeBucketsAfter (10 s) ahead
  is claimed when it comes due. The plain claim -> ack's messages, due now, stay out of the
  buckets (`redis.storeBucketsAfter`).

Each figure is the median of `--rounds` rounds and comes with the CPU time per message of this
process and of redis-server (bench_hot_paths.py's `measure`: the machine's load moves the rates,
much less the CPU per message), and with `cost_ratio_to_first_depth`: what a message costs at
this depth over what it cost at the first, from the same run (the first depth's rate over this
one's, this latency over the first's; above 1 is costlier, the issue's bound is 1.25).

`--record-buckets` and `--store-buckets` turn the topic's `redis.recordBuckets` and
`redis.storeBuckets` on (published before the load, as the topic's owner does): the dense
layout, records and dues in buckets that Redis packs as listpacks (docs/contracts.md §1).

Memory: before a step that would add more than 1 GiB, the host must have `--min-available-gib`
(16) available (MemAvailable), or that depth and the deeper ones are skipped, with the reason in
the JSON. The server has no `maxmemory` and no persistence (RedisServer's defaults); it is
flushed and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import hiredis
import redis

import delayq
from bench_engine import now_ms, schedule_at
from bench_hot_paths import as_published, delivered_per_s, measure, summary
from bench_peers import Workload, delayq_batches
from delayq.local.redis_server import RedisServer
from delayq.queue import AsyncQueue, Queue, ScheduleRequest, State, Topic
from delayq.queue.topic_record import SERVE_OWNER

TOPIC = "backlog"
PAYLOAD = b"x" * 40
DAY_MS = 86_400_000
LOAD_BATCH = 1_000
LOAD_IN_FLIGHT = 4
GIB = 1 << 30
MIB = 1 << 20
MAXMEMORY_SHARE = 0.8  # of the container's limit (kube/builders/redis.py)
DEPTHS = "1000000,10000000,50000000"
QUICK_DEPTHS = "100000,200000,500000"
# figure -> (part, key in the part's summary, True when the figure is a rate)
COSTS = {
    "enqueue": ("enqueue", "msg_per_s", True),
    "enqueue_due": ("enqueue_due", "msg_per_s", True),
    "claim_ack": ("claim_ack", "msg_per_s", True),
    "claim_ack_bucketed": ("claim_ack_bucketed", "msg_per_s", True),
    "get_p50": ("get", "p50_us", False),
    "get_p99": ("get", "p99_us", False),
}


def backlog_id(index: int) -> str:
    return f"bl{index:010d}"  # 12 bytes


def used_memory(client: redis.Redis) -> tuple[int, int]:
    info = client.info("memory")
    return int(info["used_memory"]), int(info["used_memory_rss"])


def available_bytes() -> int:
    return meminfo_kib("MemAvailable") * 1024


def meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        if name == field:
            return int(value.split()[0])
    raise KeyError(field)


def load(url: str, topic: Topic, first: int, count: int) -> float:
    """Schedule backlog messages `first`.. `first + count - 1`, due within a day from a day
    out; the seconds it took."""

    async def run() -> float:
        queue = AsyncQueue.from_url(url, topic)
        rng = random.Random(first)
        base_ms = round(now_ms()) + DAY_MS
        end = first + count
        starts = iter(range(first, end, LOAD_BATCH))
        began = time.perf_counter()

        async def sender() -> None:
            for start in starts:
                await queue.schedule_many(
                    [
                        ScheduleRequest(
                            backlog_id(i), PAYLOAD, at_ms=base_ms + rng.randrange(DAY_MS)
                        )
                        for i in range(start, min(end, start + LOAD_BATCH))
                    ]
                )
                if (start - first) % 1_000_000 == 0 and start > first:
                    rate = (start - first) / (time.perf_counter() - began)
                    print(f"  loaded {start:,} ({rate:,.0f} msg/s)", file=sys.stderr, flush=True)

        await asyncio.gather(*(sender() for _ in range(LOAD_IN_FLIGHT)))
        elapsed = time.perf_counter() - began
        await queue.close()
        return elapsed

    return asyncio.run(run())


def enqueue(
    url: str, topic: Topic, count: int, prefix: str, ahead_ms: int = DAY_MS
) -> dict[str, float]:
    """The producer's rate for `count` messages due over a day from `ahead_ms` out (0: all due
    now)."""
    window_ms = DAY_MS if ahead_ms else 0
    workload = Workload("enqueue", "batch", count, lead_ms=0, window_ms=window_ms, id_prefix=prefix)

    def timed() -> float:
        async def produce() -> float:
            queue = AsyncQueue.from_url(url, topic)
            began = time.perf_counter()
            await delayq_batches(queue, workload, round(now_ms()) + ahead_ms)
            elapsed = time.perf_counter() - began
            await queue.close()
            return count / elapsed

        return asyncio.run(produce())

    return measure(url, count, timed)


def claim_ack(url: str, topic: Topic, count: int) -> dict[str, float]:
    """claim -> ack of the `count` messages due now that enqueue(ahead_ms=0) just sent."""
    return measure(url, count, lambda: delivered_per_s(url, topic, count))


def claim_ack_bucketed(
    url: str, topic: Topic, count: int, prefix: str, version: int
) -> dict[str, float]:
    """claim -> ack of messages due now whose dues were written into buckets (storeBucketsAfter
    0 while they are scheduled: versions `version` and `version + 1` of the record)."""
    publish(url, replace(topic, redis_store_buckets_after_ms=0), version)
    schedule_at(url, topic, [round(now_ms())] * count, prefix)
    publish(url, topic, version + 1)
    return measure(url, count, lambda: delivered_per_s(url, topic, count))


def publish(url: str, topic: Topic, version: int) -> None:
    queue = Queue.from_url(url, topic)
    queue.publish_settings(SERVE_OWNER, version)
    queue.close()


def get_by_id(url: str, topic: Topic, count: int, backlog: int, seed: int) -> dict[str, float]:
    queue = Queue.from_url(url, topic)
    rng = random.Random(seed)
    ids = [backlog_id(rng.randrange(backlog)) for _ in range(count)]
    latencies_us: list[float] = []

    def timed() -> float:
        began = time.perf_counter()
        for message_id in ids:
            called = time.perf_counter()
            info = queue.get(message_id)
            latencies_us.append((time.perf_counter() - called) * 1e6)
            if info.state is not State.SCHEDULED:
                raise RuntimeError(f"{message_id} is {info.state}, not scheduled")
        return count / (time.perf_counter() - began)

    figures = measure(url, count, timed)
    queue.close()
    ordered = sorted(latencies_us)
    return figures | {
        "p50_us": round(ordered[len(ordered) // 2], 1),
        "p99_us": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
        "max_us": round(ordered[-1], 1),
    }


def cost_ratios(first: dict[str, Any], row: dict[str, Any]) -> dict[str, float]:
    """What a message costs here over what it cost at the first depth (above 1: costlier)."""
    ratios = {"bytes_per_message": round(row["bytes_per_message"] / first["bytes_per_message"], 3)}
    for figure, (part, key, is_rate) in COSTS.items():
        if part in row:
            here, there = row[part][key], first[part][key]
            ratios[figure] = round(there / here if is_rate else here / there, 3)
    for part in ("enqueue", "enqueue_due", "claim_ack", "claim_ack_bucketed", "get"):
        key = "redis_cpu_us_per_msg"
        if part in row:
            ratios[f"{part}_{key}"] = round(row[part][key] / first[part][key], 3)
    return ratios


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "mem_total_gib": round(meminfo_kib("MemTotal") / (1 << 20), 1),
        "platform": platform.platform(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def markdown(report: dict[str, Any]) -> str:
    rows = [
        "| pending | B / message | enqueue msg/s | enqueue due soon msg/s | claim → ack msg/s "
        "| from buckets: claim → ack msg/s | get p50 / p99 µs "
        "| cost ÷ first: enqueue, due soon, claim → ack, from buckets, get p50 / p99, bytes "
        "| load 1 min |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in report["depths"]:
        if "skipped" in row:
            rows.append(f"| {row['depth']:,} | skipped: {row['skipped']} | | | | | | | |")
            continue
        r = row["cost_ratio_to_first_depth"]
        bucketed = row.get("claim_ack_bucketed")
        from_buckets = f"{bucketed['msg_per_s']:,.0f}" if bucketed else "-"
        bucketed_ratio = f"{r['claim_ack_bucketed']:.2f}" if bucketed else "-"
        rows.append(
            f"| {row['depth']:,} | {row['bytes_per_message']:.0f} "
            f"| {row['enqueue']['msg_per_s']:,.0f} | {row['enqueue_due']['msg_per_s']:,.0f} "
            f"| {row['claim_ack']['msg_per_s']:,.0f} | {from_buckets} "
            f"| {row['get']['p50_us']:.0f} / {row['get']['p99_us']:.0f} "
            f"| {r['enqueue']:.2f}, {r['enqueue_due']:.2f}, {r['claim_ack']:.2f}, "
            f"{bucketed_ratio}, {r['get_p50']:.2f} / "
            f"{r['get_p99']:.2f}, {r['bytes_per_message']:.2f} "
            f"| {row['loadavg_1m_at_start']:.2f} → {row['loadavg_1m_at_end']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small depths and samples: a smoke")
    parser.add_argument("--slots", type=int, default=16, help="the topic's slot amount")
    parser.add_argument("--depths", help=f"pending counts, comma-separated (default {DEPTHS})")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure (median)")
    parser.add_argument("--sample", type=int, help="enqueued per round (default 100,000)")
    parser.add_argument("--due", type=int, help="claimed and acked per round (default 50,000)")
    parser.add_argument("--gets", type=int, help="get-by-id calls per round (default 10,000)")
    parser.add_argument("--min-available-gib", type=float, default=16.0)
    parser.add_argument("--record-buckets", action="store_true", help="redis.recordBuckets on")
    parser.add_argument("--store-buckets", action="store_true", help="redis.storeBuckets on")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--markdown", action="store_true", help="the docs' table on stderr")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    depths = [int(d) for d in (args.depths or (QUICK_DEPTHS if args.quick else DEPTHS)).split(",")]
    sample, due = args.sample or 100_000 // scale, args.due or 50_000 // scale
    gets = args.gets or 10_000 // scale
    if depths != sorted(set(depths)):
        parser.error("--depths: increasing, each once")
    if len(depths) * args.rounds > 99:
        parser.error("at most 99 depths x rounds (the sample ids' prefix)")
    topic = Topic(
        TOPIC,
        slot_amount=args.slots,
        redis_record_buckets=args.record_buckets,
        redis_store_buckets=args.store_buckets,
    )

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        config = client.config_get("maxmemory") | client.config_get("save")
        config |= client.config_get("appendonly")
        as_published(server.url, topic)
        queue = Queue(client, topic)
        queue.schedule("warm-up", b"", delay_ms=DAY_MS)  # loads the functions
        queue.cancel("warm-up")
        empty_used, empty_rss = used_memory(client)
        report: dict[str, Any] = {
            "quick": args.quick,
            "slots": args.slots,
            "record_buckets": args.record_buckets,
            "store_buckets": args.store_buckets,
            "payload_bytes": len(PAYLOAD),
            "id_bytes": len(backlog_id(0)),
            "rounds": args.rounds,
            "sample": {"enqueue": sample, "enqueue_due": due, "claim_ack": due, "gets": gets},
            "machine": machine(),
            "versions": {
                "delayq": delayq.__version__,
                "redis": str(client.info("server")["redis_version"]),
                "redis_py": redis.__version__,
                "hiredis": hiredis.__version__,
                "python": platform.python_version(),
            },
            "redis_config": config,
            "empty_used_memory": empty_used,
            "depths": [],
        }
        backlog = 0  # backlog messages loaded; pending adds the enqueue samples
        pending = 0
        bytes_per_message = 300.0  # a guess until the first depth is measured
        batch_number = 0
        version = 1  # of the settings record, as_published's; claim_ack_bucketed publishes more
        for depth in depths:
            growth = (depth - pending) * bytes_per_message
            if growth > GIB and available_bytes() < args.min_available_gib * GIB:
                report["depths"].append(
                    {
                        "depth": depth,
                        "skipped": f"MemAvailable {available_bytes() / GIB:.1f} GiB < "
                        f"{args.min_available_gib:g} GiB before a step adding "
                        f"≈ {growth / GIB:.1f} GiB",
                    }
                )
                break
            row: dict[str, Any] = {
                "depth": depth,
                "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
                "mem_available_gib_before": round(available_bytes() / GIB, 1),
            }
            added = depth - pending
            print(f"depth {depth:,}: loading {added:,}", file=sys.stderr, flush=True)
            load_s = load(server.url, topic, backlog, added)
            backlog += added
            pending = depth
            if (stored := queue.stats().scheduled) != pending:
                raise RuntimeError(f"{stored} pending, expected {pending}")
            used, rss = used_memory(client)
            bytes_per_message = (used - empty_used) / pending
            row |= {
                "loaded": added,
                "load_s": round(load_s, 1),
                "load_msg_per_s": round(added / load_s),
                "used_memory": used,
                "used_memory_rss": rss,
                "bytes_per_message": round(bytes_per_message, 1),
                "rss_bytes_per_message": round((rss - empty_rss) / pending, 1),
                # the smallest container limit whose maxmemory (80%) holds this server
                "limits_memory_mib_at_least": round(used / MAXMEMORY_SHARE / MIB),
            }
            runs: dict[str, list[dict[str, float]]] = {
                "enqueue": [],
                "enqueue_due": [],
                "claim_ack": [],
                "get": [],
            }
            if args.store_buckets:
                runs["claim_ack_bucketed"] = []
            for _ in range(args.rounds):
                batch_number += 1
                print(f"  round {batch_number}", file=sys.stderr, flush=True)
                runs["enqueue"].append(enqueue(server.url, topic, sample, f"e{batch_number:02d}-"))
                pending += sample
                runs["enqueue_due"].append(
                    enqueue(server.url, topic, due, f"c{batch_number:02d}-", ahead_ms=0)
                )
                runs["claim_ack"].append(claim_ack(server.url, topic, due))
                if args.store_buckets:
                    version += 2
                    runs["claim_ack_bucketed"].append(
                        claim_ack_bucketed(
                            server.url, topic, due, f"b{batch_number:02d}", version - 1
                        )
                    )
                runs["get"].append(get_by_id(server.url, topic, gets, backlog, batch_number))
            row |= {part: summary(results) for part, results in runs.items()}
            row["runs"] = runs
            row["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
            first = report["depths"][0] if report["depths"] else row
            row["cost_ratio_to_first_depth"] = cost_ratios(first, row)
            report["depths"].append(row)
            if args.output:  # a long run's depths survive a failure of the next one
                write(args.output, report)
        report["uptime_at_end"] = machine()["uptime"]
        if args.output:
            write(args.output, report)
        # in the background: a synchronous FLUSHALL of 50M messages outlasts the client's
        # socket timeout
        client.flushall(asynchronous=True)
        client.close()

    print(json.dumps(report, indent=2))
    if args.markdown:
        print(markdown(report), file=sys.stderr)


if __name__ == "__main__":
    main()
