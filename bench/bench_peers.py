"""Peers benchmark: delayq as users run it next to BullMQ, one throw-away redis-server, JSON out.

    python bench/bench_peers.py [--quick] [--workloads burst,herd,steady,memory] [--slots N]
                                [--output FILE] [--markdown]

Both systems run the same workloads against the same server, one after the other (the order
alternates per workload, Redis is flushed before each run), each as its users run it:

* delayq: `AsyncQueue.schedule_many` in batches of 1,000 with 2 calls in flight, requests built
  inside the timed loop; a `Consumer` with the documented defaults (`ConsumerSettings()`) and a
  no-op handler, in a second process started before the producer; the topic has the default 16
  slots, or `--slots N` (the shapes users pick: 64, 1024). BullMQ has no slots.
* BullMQ (bench/peers/bullmq.mjs, versions pinned in bench/peers/package-lock.json; `npm ci`
  runs when node_modules is missing): `Queue.addBulk` of 1,000 delayed jobs with 2 calls in
  flight; a `Worker` with concurrency 50 and a no-op processor, in its own Node process.

Workloads: burst (messages due uniformly over a window: enqueue rate and lateness), herd (all
due at one instant: drain rate and lateness), steady (single schedules at a fixed rate, each due
0.5-1.5 s later, producer and consumer running together: lateness) and the Redis memory one
pending message takes (`used_memory` before and after, a fixed-keys warm-up excluded).

Lateness is processing start minus due time on this host's wall clock, which Redis, Python and
Node share. Each figure comes with the delayq/BullMQ ratio from the same run: above 1 is delayq
faster for rates, below 1 is delayq better for lateness and memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import redis

import delayq
from bench_engine import chosen_workloads, consume_until, fresh_topic, now_ms, percentiles
from delayq.local.redis_server import RedisServer
from delayq.queue import AsyncQueue, ConsumerSettings, ScheduleRequest, Topic

PEERS_DIR = Path(__file__).resolve().parent / "peers"
BULLMQ_SCRIPT = PEERS_DIR / "bullmq.mjs"
TOPIC = "peers"
PAYLOAD_BYTES = 40
BATCH = 1_000
CALLS_IN_FLIGHT = 2
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0  # past the last due time, before a consumer gives up waiting
PENDING_LEAD_MS = 3_600_000  # the memory workload's messages stay pending for the measurement


@dataclass(frozen=True)
class Workload:
    """One workload, the same for both systems; `asdict` of it (plus the run's `start_ms` and
    the server URL) is the spec bullmq.mjs reads, so the field names are shared with it."""

    name: str
    kind: str  # "batch": `count` dues spread over `window_ms` from start; "steady": see module
    count: int
    lead_ms: int  # from the producer's start to the first due instant
    window_ms: int = 0
    rate_per_s: int = 0
    duration_s: float = 0.0
    delay_min_ms: int = 500
    delay_max_ms: int = 1_500
    payload_bytes: int = PAYLOAD_BYTES
    batch: int = BATCH
    in_flight: int = CALLS_IN_FLIGHT
    id_prefix: str = "msg-"  # delayq ids: 12 bytes with the 8 digits; BullMQ numbers its jobs

    @property
    def timeout_s(self) -> float:
        return (self.lead_ms + self.window_ms) / 1000 + self.duration_s + DRAIN_TIMEOUT_S


def workloads(quick: bool) -> list[Workload]:
    """The issue's sizes (#17), or a tenth of them for a smoke run. Leads leave the slower
    producer time to finish before the first due instant (herd reports whether it did)."""
    scale = 0.1 if quick else 1.0
    return [
        Workload("burst", "batch", int(50_000 * scale), lead_ms=3_000, window_ms=10_000),
        Workload("herd", "batch", int(20_000 * scale), lead_ms=int(6_000 * max(scale, 0.5))),
        Workload(
            "steady",
            "steady",
            int(2_000 * 20 * max(scale, 0.25)),
            lead_ms=0,
            rate_per_s=2_000,
            duration_s=20 * max(scale, 0.25),
        ),
    ]


@dataclass
class Delivered:
    lateness_ms: list[float]
    last_ms: float


class Peer(Protocol):
    """A system under test: a consumer started first, then a producer."""

    name: str

    def start_consumer(self, url: str, workload: Workload) -> Callable[[], Delivered]:
        """Start consuming; return once ready, with a call that waits for the deliveries."""
        ...

    def produce(self, url: str, workload: Workload, start_ms: int) -> float:
        """Send the workload's messages (dues from `start_ms`); the seconds it took."""
        ...


# --- delayq ------------------------------------------------------------------------------------


def delayq_consumer(
    url: str, slots: int, expected: int, timeout_s: float, conn: Connection
) -> None:
    """The consumer process: `consume_until` with the documented defaults."""
    recorder = asyncio.run(
        consume_until(
            url,
            fresh_topic(TOPIC, slots),
            expected,
            timeout_s,
            ConsumerSettings(),
            on_ready=lambda: conn.send("ready"),
        )
    )
    conn.send((recorder.lateness_ms, recorder.last_ms))


async def delayq_batches(queue: AsyncQueue, workload: Workload, start_ms: int) -> None:
    payload = b"x" * workload.payload_bytes
    spread_ms = (random.random() * workload.window_ms for _ in range(workload.count))
    dues = sorted(round(start_ms + offset_ms) for offset_ms in spread_ms)
    bases = iter(range(0, len(dues), workload.batch))

    async def sender() -> None:
        for base in bases:
            await queue.schedule_many(
                [
                    ScheduleRequest(f"{workload.id_prefix}{i:08d}", payload, at_ms=dues[i])
                    for i in range(base, min(len(dues), base + workload.batch))
                ]
            )

    await asyncio.gather(*(sender() for _ in range(workload.in_flight)))


async def delayq_steady(queue: AsyncQueue, workload: Workload) -> None:
    """Single schedules at `rate_per_s`, one awaited after the other: every 1 ms tick sends
    what the rate owes so far."""
    payload = b"x" * workload.payload_bytes
    rng = random.Random(7)
    sent = 0
    start = time.monotonic()
    while sent < workload.count:
        owed = min(workload.count, int((time.monotonic() - start) * workload.rate_per_s))
        for i in range(sent, owed):
            delay_ms = rng.randint(workload.delay_min_ms, workload.delay_max_ms)
            await queue.schedule(f"{workload.id_prefix}{i:08d}", payload, delay_ms=delay_ms)
        sent = max(sent, owed)
        await asyncio.sleep(0.001)


class Delayq:
    name = "delayq"

    def __init__(self, slots: int) -> None:
        self.slots = slots

    def start_consumer(self, url: str, workload: Workload) -> Callable[[], Delivered]:
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(  # a daemon: a failed run does not wait on it at exit
            target=delayq_consumer,
            args=(url, self.slots, workload.count, workload.timeout_s, sender),
            daemon=True,
        )
        process.start()
        if not receiver.poll(READY_TIMEOUT_S) or receiver.recv() != "ready":
            process.kill()
            raise RuntimeError("the delayq consumer did not start")

        def wait() -> Delivered:
            lateness_ms, last_ms = receiver.recv()
            process.join()
            return Delivered(lateness_ms, last_ms)

        return wait

    def produce(self, url: str, workload: Workload, start_ms: int) -> float:
        async def run() -> float:
            queue = AsyncQueue.from_url(url, fresh_topic(TOPIC, self.slots))
            start = time.perf_counter()
            if workload.kind == "steady":
                await delayq_steady(queue, workload)
            else:
                await delayq_batches(queue, workload, start_ms)
            elapsed_s = time.perf_counter() - start
            await queue.close()
            return elapsed_s

        return asyncio.run(run())


# --- BullMQ ------------------------------------------------------------------------------------


def ensure_node_modules() -> None:
    """`npm ci` from the lock file, once: the pinned BullMQ and ioredis."""
    if (PEERS_DIR / "node_modules").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise FileNotFoundError("node and npm are needed for the BullMQ side")
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=PEERS_DIR, check=True, stdout=sys.stderr
    )


def node_command(role: str, url: str, workload: Workload, start_ms: int = 0) -> list[str]:
    spec = {**asdict(workload), "url": url, "start_ms": start_ms, "expected": workload.count}
    return ["node", str(BULLMQ_SCRIPT), role, json.dumps({**spec, "timeout_s": workload.timeout_s})]


def last_json_line(text: str) -> Any:
    return json.loads(text.strip().splitlines()[-1])


class BullMQ:
    name = "bullmq"

    def start_consumer(self, url: str, workload: Workload) -> Callable[[], Delivered]:
        worker = subprocess.Popen(
            node_command("worker", url, workload), cwd=PEERS_DIR, stdout=subprocess.PIPE, text=True
        )
        assert worker.stdout is not None
        if json.loads(worker.stdout.readline() or "{}").get("ready") is not True:
            worker.kill()
            raise RuntimeError("the BullMQ worker did not start")

        def wait() -> Delivered:
            out, _ = worker.communicate(timeout=workload.timeout_s + READY_TIMEOUT_S)
            if worker.returncode != 0:
                raise RuntimeError(f"the BullMQ worker exited with {worker.returncode}")
            delivered = last_json_line(out)
            return Delivered(delivered["lateness_ms"], delivered["last_ms"])

        return wait

    def produce(self, url: str, workload: Workload, start_ms: int) -> float:
        done = subprocess.run(
            node_command("produce", url, workload, start_ms),
            cwd=PEERS_DIR,
            check=True,
            capture_output=True,
            text=True,
        )
        return float(last_json_line(done.stdout)["enqueue_s"])


# --- runs --------------------------------------------------------------------------------------


def run(peer: Peer, url: str, workload: Workload) -> dict[str, Any]:
    wait = peer.start_consumer(url, workload)
    start_ms = round(now_ms()) + workload.lead_ms
    enqueue_s = peer.produce(url, workload, start_ms)
    enqueue_end_ms = now_ms()
    delivered = wait()
    figures: dict[str, Any] = {
        "messages": workload.count,
        "delivered": len(delivered.lateness_ms),
        "enqueue_msg_per_s": round(workload.count / enqueue_s),
        "lateness": percentiles(delivered.lateness_ms),
    }
    if workload.kind == "batch" and workload.window_ms == 0:
        drain_s = (delivered.last_ms - start_ms) / 1000
        figures["drain_s"] = round(drain_s, 3)
        figures["drain_msg_per_s"] = round(len(delivered.lateness_ms) / max(drain_s, 1e-3))
        figures["enqueue_done_before_due"] = enqueue_end_ms <= start_ms
    return figures


def bytes_per_pending(peer: Peer, client: redis.Redis, url: str, count: int) -> float:
    """Memory `count` pending messages add, after one warm-up message has created the fixed
    keys and loaded the scripts (neither grows with the queue)."""
    client.flushall()
    pending = Workload("memory", "batch", count, lead_ms=PENDING_LEAD_MS)
    start_ms = round(now_ms()) + PENDING_LEAD_MS
    peer.produce(url, replace(pending, count=1, id_prefix="wrm-"), start_ms)
    before = int(client.info("memory")["used_memory"])
    peer.produce(url, pending, start_ms)
    after = int(client.info("memory")["used_memory"])
    return round((after - before) / count, 1)


WORKLOADS = ("burst", "herd", "steady", "memory")
# (workload, figure path, label, unit) in the order of the docs' table
FIGURES = [
    ("burst", "enqueue_msg_per_s", "burst: enqueue", "msg/s"),
    ("burst", "lateness.p99_ms", "burst: lateness p99", "ms"),
    ("burst", "lateness.max_ms", "burst: lateness max", "ms"),
    ("herd", "drain_msg_per_s", "herd: drain", "msg/s"),
    ("herd", "lateness.p99_ms", "herd: lateness p99", "ms"),
    ("steady", "lateness.p50_ms", "steady: lateness p50", "ms"),
    ("steady", "lateness.p99_ms", "steady: lateness p99", "ms"),
    ("memory", "bytes_per_pending_message", "Redis bytes per pending message", "B"),
]


def figure(results: dict[str, Any], workload: str, system: str, path: str) -> float:
    value: Any = results[workload][system]
    for key in path.split("."):
        value = value[key]
    return float(value)


def add_ratios(results: dict[str, Any]) -> None:
    for workload, path, _, _ in FIGURES:
        if workload not in results:
            continue
        bullmq = figure(results, workload, "bullmq", path)
        ratio = figure(results, workload, "delayq", path) / bullmq if bullmq else None
        ratios = results[workload].setdefault("ratio_delayq_to_bullmq", {})
        ratios[path] = None if ratio is None else round(ratio, 3)


def shown(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def markdown(results: dict[str, Any]) -> str:
    rows = ["| figure | BullMQ | delayq | delayq ÷ BullMQ |", "|---|---:|---:|---:|"]
    for workload, path, label, unit in FIGURES:
        if workload not in results:
            continue
        bullmq, ours = (figure(results, workload, s, path) for s in ("bullmq", "delayq"))
        ratio = results[workload]["ratio_delayq_to_bullmq"][path]
        quotient = "—" if ratio is None else f"{ratio:.2f}"
        rows.append(f"| {label} ({unit}) | {shown(bullmq)} | {shown(ours)} | {quotient} |")
    return "\n".join(rows)


def versions(client: redis.Redis) -> dict[str, str]:
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    found = {
        "delayq": delayq.__version__,
        "redis": str(client.info("server")["redis_version"]),
        "node": node.stdout.strip(),
    }
    for package in ("bullmq", "ioredis"):
        manifest = PEERS_DIR / "node_modules" / package / "package.json"
        found[package] = json.loads(manifest.read_text())["version"]
    return found


def in_turn(peers: list[Peer], index: int) -> list[Peer]:
    """Who goes first alternates from one workload to the next."""
    return peers if index % 2 == 0 else peers[::-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes: a smoke run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--markdown", action="store_true", help="the docs' table on stderr")
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="comma-separated subset to run (default: all), e.g. burst for its tail alone",
    )
    parser.add_argument(
        "--slots", type=int, default=Topic.slot_amount, help="the delayq topic's slot amount"
    )
    args = parser.parse_args()
    chosen = chosen_workloads(parser, args.workloads, WORKLOADS)
    ensure_node_modules()
    peers: list[Peer] = [Delayq(args.slots), BullMQ()]
    plan = [workload for workload in workloads(args.quick) if workload.name in chosen]

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        results: dict[str, Any] = {
            "quick": args.quick,
            "delayq_slots": args.slots,
            "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_start": os.getloadavg()[0]},
            "versions": versions(client),
        }
        for index, workload in enumerate(plan):
            results[workload.name] = {"workload": asdict(workload)}
            for peer in in_turn(peers, index):
                client.flushall()
                results[workload.name][peer.name] = run(peer, server.url, workload)
        if "memory" in chosen:
            memory_count = workloads(args.quick)[0].count  # as many as the burst
            results["memory"] = {"messages": memory_count, "payload_bytes": PAYLOAD_BYTES}
            for peer in in_turn(peers, len(plan)):
                count = bytes_per_pending(peer, client, server.url, memory_count)
                results["memory"][peer.name] = {"bytes_per_pending_message": count}
        results["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
        client.close()

    add_ratios(results)
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    if args.markdown:
        print(markdown(results), file=sys.stderr)


if __name__ == "__main__":
    main()
