"""End-to-end benchmark of `delayq serve`: three processes, webhook and pull delivery, failover.

    python3 bench/bench_service.py --rate 2000 --duration 20 > result.json

Brings up a redis-server, a ZooKeeper and three `delayq serve` processes sharing one topic's
slots, then for each mode schedules `rate` messages per second through the HTTP batch API (due
`--delay-ms` later) and measures, per delivered message, lateness = arrival at the consumer minus
due time (same host, same wall clock). Modes:

- webhook: the services POST to a receiver process, one message per POST;
- webhook_batch: the same with `--webhook-max-batch` (messages that wait for a POST slot go
  out together; the receiver answers each), for a same-run ratio to `webhook`;
- pull: consumers in this process lease (long poll) over HTTP, `--pull-consumers` per service
  (more of them waiting at once is what a wake-up must not pay for per poll), each lease
  carrying the previous answer's tokens in `ack` (the documented consumer: one request per
  batch); with `--pull-baseline` (the default) first the same load with a separate ack request
  per lease, the path before acks on leases, on the same fleet, for the same-run ratio;
- batch: throughput of the HTTP batch paths, no clock: `--batch-total` messages already due
  scheduled through POST /messages/batch of 1000 (2 requests in flight, round-robin over the
  services: msg/s), then that backlog drained by `--pull-consumers` per service leasing up to
  1000 per request and acking each lease's tokens in one request (msg/s); with the serve
  processes' CPU time per message of each phase, which a loaded machine moves far less;
- failover: webhook at a lower rate; kill -9 one service and measure the gap from the kill to
  the first delivery (and to the last slot's first delivery) from the slots it owned, and check
  every scheduled message arrives.

Prints one JSON object. The producer, receiver and consumers share this process and the
machine's cores with the services: figures from a loaded machine are lower bounds. So the
webhook and pull phases also report `scheduler`: per role (the serve processes, this process,
redis-server, ZooKeeper, the receiver) the CPUs it kept busy and how long its wake-ups waited
for a CPU, from the kernel's schedstat — the part of a lateness figure that is the machine's
cores, not delayq's work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.client import AsyncQueue
from delayq.queue.topic import TopicType, slot_of
from delayq.service.config import ServiceConfig
from delayq.service.delivery.webhook import wall_ms

SLOTS = 64
TICK_S = 0.02
MAX_POST_BATCH = 1000  # POST /messages/batch refuses more (parsing.MAX_BATCH)
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Servers:
    """The redis-server and the ZooKeeper every mode's fleet uses, and their process ids for
    the scheduler's counts (`scheduler`)."""

    redis_url: str
    zookeeper_hosts: str
    pids: dict[str, int]  # role -> pid


@dataclass(frozen=True)
class Sched:
    """What the kernel's scheduler counted for a thread (/proc/<pid>/task/<tid>/schedstat):
    time on a CPU, time runnable but waiting for one, and the slices run. On a machine with
    fewer cores than busy processes, the wait is what a message's way through them pays on top
    of the work: a wake-up that finds both cores busy waits for a slice to end."""

    cpu_s: float = 0.0
    waited_s: float = 0.0
    slices: int = 0

    def __add__(self, other: Sched) -> Sched:
        return Sched(
            self.cpu_s + other.cpu_s, self.waited_s + other.waited_s, self.slices + other.slices
        )

    def __sub__(self, other: Sched) -> Sched:
        return Sched(
            self.cpu_s - other.cpu_s, self.waited_s - other.waited_s, self.slices - other.slices
        )


Threads = dict[tuple[str, int], Sched]  # (role, tid) -> its counts


def sched_by_thread(pids: dict[str, list[int]]) -> Threads:
    """Every thread of the processes of each role (a JVM starts and ends threads: a phase
    counts those alive at its end, from zero for one started during it)."""
    threads: Threads = {}
    for role, group in pids.items():
        for pid in group:
            for task in Path(f"/proc/{pid}/task").iterdir():
                try:
                    cpu_ns, waited_ns, slices = (task / "schedstat").read_text().split()
                except (FileNotFoundError, ProcessLookupError):
                    continue  # a thread that ended meanwhile
                threads[role, int(task.name)] = Sched(
                    int(cpu_ns) / 1e9, int(waited_ns) / 1e9, int(slices)
                )
    return threads


def scheduler(before: Threads, after: Threads, wall_s: float) -> dict[str, dict[str, float]]:
    """Per role over a phase of `wall_s`: the CPUs it kept busy (1.0: one core), the share of
    the wall time its threads spent runnable but waiting for a CPU, and the mean wait a slice
    (how late a wake-up ran)."""
    used: dict[str, Sched] = {}
    for (role, tid), end in after.items():
        used[role] = used.get(role, Sched()) + (end - before.get((role, tid), Sched()))
    return {
        role: {
            "cpus": round(total.cpu_s / wall_s, 3),
            "waited_share": round(total.waited_s / wall_s, 3),
            "waited_ms_per_slice": round(total.waited_s * 1000 / total.slices, 3)
            if total.slices
            else 0.0,
        }
        for role, total in used.items()
    }


@dataclass
class Tally:
    """Arrivals seen by the receiver or the pull consumers."""

    scheduled: int = 0
    schedule_errors: dict[str, int] = field(default_factory=dict)  # kind -> messages
    first_arrival: dict[str, float] = field(default_factory=dict)  # id -> monotonic
    lateness_ms: list[int] = field(default_factory=list)
    duplicates: int = 0
    by_slot_member: dict[int, str] = field(default_factory=dict)  # last deliverer per slot
    arrivals: list[tuple[float, int, str]] = field(default_factory=list)  # (t, slot, member)
    keep_ids: bool = False  # remember every scheduled id (to name lost ones)
    ids: list[str] = field(default_factory=list)

    def arrive(self, message_id: str, member: str, at: float, lateness_ms: int) -> None:
        """One arrival: `at` is time.monotonic() (system-wide, so comparable across processes)."""
        if message_id in self.first_arrival:
            self.duplicates += 1
            return
        self.first_arrival[message_id] = at
        self.lateness_ms.append(lateness_ms)
        slot = slot_of(message_id, SLOTS)
        self.by_slot_member[slot] = member
        self.arrivals.append((at, slot, member))

    def report(self, rate: float, duration_s: float) -> dict[str, Any]:
        values = sorted(self.lateness_ms)
        times = sorted(self.first_arrival.values())
        span = (times[-1] - times[0]) if len(times) > 1 else 0.0
        return {
            "target_rate_per_s": rate,
            "duration_s": duration_s,
            "scheduled": self.scheduled,
            "schedule_errors": self.schedule_errors,
            "delivered": len(values),
            "duplicates": self.duplicates,
            "delivered_per_s": round(len(values) / span, 1) if span else None,
            "lateness_ms": _percentiles(values),
        }


def _percentiles(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None

    def at(q: float) -> float:
        return float(values[min(len(values) - 1, int(len(values) * q))])

    return {
        "p50": statistics.median(values),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": float(values[-1]),
    }


def receiver_app() -> web.Application:
    """The webhook receiver (run in its own process so it does not share a core with the
    producer): records (id, member, monotonic time, lateness) and serves them incrementally."""
    records: list[tuple[str, str, float, int]] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.json()
        member = request.headers.get("X-Delayq-Member", "?")
        for message in body.get("messages", [body]):  # a batch, or one message
            lateness = wall_ms() - int(message["dueMs"])
            records.append((message["id"], member, time.monotonic(), lateness))
        if "messages" not in body:
            return web.Response(status=204)
        return web.json_response(
            {"results": [{"id": message["id"], "status": 200} for message in body["messages"]]}
        )

    async def since(request: web.Request) -> web.Response:
        return web.json_response(records[int(request.query.get("from", "0")) :])

    app = web.Application()
    app.router.add_post("/hook", receive)
    app.router.add_get("/arrivals", since)
    return app


@contextlib.asynccontextmanager
async def receiver(tally: Tally, workdir: Path) -> AsyncIterator[tuple[str, int]]:
    """A receiver process, and a task copying its arrivals into `tally` every 50 ms: its URL
    and its pid."""
    port = free_port()
    log = (workdir / "receiver.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, __file__, "--receiver-port", str(port)], stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"

    async def copy(session: aiohttp.ClientSession) -> None:
        seen = 0
        while True:
            try:
                async with session.get(f"{base}/arrivals?from={seen}") as response:
                    for message_id, member, at, lateness in await response.json():
                        tally.arrive(message_id, member, at, lateness)
                        seen += 1
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as session:
        copying = asyncio.create_task(copy(session))
        try:
            yield f"{base}/hook", process.pid
        finally:
            copying.cancel()
            process.terminate()
            process.wait()
            log.close()


@contextlib.contextmanager
def fleet(
    args: argparse.Namespace,
    servers: Servers,
    topic_type: TopicType,
    webhook_url: str,
    workdir: Path,
    webhook_max_batch: int = 1,
) -> Iterator[list[ServeProcess]]:
    base = ServiceConfig(
        redis_url=servers.redis_url,
        namespace="bench",
        topic=f"{topic_type.value}{free_port()}",
        slot_amount=SLOTS,
        topic_type=topic_type,
        webhook_url=webhook_url,
        webhook_max_in_flight=128,
        webhook_max_batch=webhook_max_batch,
        webhook_timeout_ms=2000,
        ack_timeout_ms=args.ack_timeout_ms,
        zookeeper_connect=servers.zookeeper_hosts,
        zookeeper_session_timeout_ms=4000,
        log_level=args.log_level,
        grace_ms=5000,
    )
    processes = [
        ServeProcess(
            dataclasses.replace(
                base, port=free_port(), member_id=f"s{i}", preferred_broker=f"broker-{i}"
            ),
            workdir / f"{base.topic}-s{i}.log",
        ).start()
        for i in range(3)
    ]
    try:
        yield processes
    finally:
        stop_all(processes)


async def wait_ready(session: aiohttp.ClientSession, processes: list[ServeProcess]) -> None:
    states: list[int] = []

    async def every_slot_owned() -> bool:
        states.clear()
        for process in processes:
            if not process.running():
                raise RuntimeError(f"serve exited: {process.log_path.read_text()[-2000:]}")
            try:
                async with session.get(process.url + "/readyz") as response:
                    states.append((await response.json())["ownedSlots"])
            except aiohttp.ClientError:
                states.append(0)
        return all(states) and sum(states) == SLOTS

    try:
        await eventually(
            every_slot_owned, READY_TIMEOUT_S, "the fleet to own every slot", interval_s=0.2
        )
    except TimeoutError as error:
        raise TimeoutError(f"fleet not ready: owned slots {states}") from error


async def produce(
    session: aiohttp.ClientSession,
    processes: list[ServeProcess],
    tally: Tally,
    rate: float,
    duration_s: float,
    delay_ms: int,
    prefix: str,
) -> None:
    """Schedule `rate` messages per second in ticks of TICK_S, batches round-robin."""
    started = time.monotonic()
    number = 0
    tick = 0
    pending: set[asyncio.Task[None]] = set()
    while (elapsed := time.monotonic() - started) < duration_s:
        target = int(elapsed * rate) + 1
        batch = [
            {"id": f"{prefix}-{i}", "delayMs": delay_ms, "payload": "x" * 64}
            for i in range(number, target)
        ]
        number = target
        # a late tick (a busy loop) can owe more than the API's batch limit: split it
        for start in range(0, len(batch), MAX_POST_BATCH):
            process = processes[tick % len(processes)]
            chunk = batch[start : start + MAX_POST_BATCH]
            task = asyncio.create_task(_post_batch(session, process, chunk, tally))
            pending.add(task)
            task.add_done_callback(pending.discard)
        tick += 1
        await asyncio.sleep(TICK_S)
    await asyncio.gather(*pending)


async def _post_batch(
    session: aiohttp.ClientSession,
    process: ServeProcess,
    batch: list[dict[str, Any]],
    tally: Tally,
) -> None:
    url = f"{process.url}/v1/topics/{process.config.topic}/messages/batch"
    try:
        async with session.post(url, json={"messages": batch}) as response:
            if response.status == 200:
                tally.scheduled += len(batch)
                if tally.keep_ids:
                    tally.ids.extend(m["id"] for m in batch)
                return
            kind = f"HTTP {response.status}"
    except aiohttp.ClientError as error:
        kind = type(error).__name__
    tally.schedule_errors[kind] = tally.schedule_errors.get(kind, 0) + len(batch)


@dataclass
class PullCounts:
    """HTTP requests the pull consumers sent (leases and separate acks)."""

    leases: int = 0
    acks: int = 0


async def pull_consumer(
    session: aiohttp.ClientSession,
    process: ServeProcess,
    tally: Tally,
    stop: asyncio.Event,
    counts: PullCounts,
    acks_on_lease: bool,
) -> None:
    """Lease (long poll) and ack until `stop`: the tokens of each answer go in the next lease's
    `ack`, or (`acks_on_lease` false, the baseline) in an ack request of their own."""
    base = f"{process.url}/v1/topics/{process.config.topic}/leases"
    tokens: list[str] = []
    while not stop.is_set():
        body: dict[str, Any] = {"max": 200, "waitMs": 500}
        if acks_on_lease:
            body["ack"] = tokens
        async with session.post(base, json=body) as response:
            leases = (await response.json())["leases"]
        counts.leases += 1
        for message in leases:
            lateness = wall_ms() - int(message["dueMs"])
            tally.arrive(message["id"], process.config.member, time.monotonic(), lateness)
        tokens = [m["token"] for m in leases]
        if tokens and not acks_on_lease:
            await _ack(session, base, tokens, counts)
    if tokens and acks_on_lease:
        await _ack(session, base, tokens, counts)  # the last answer's, with no lease to carry them


async def _ack(
    session: aiohttp.ClientSession, base: str, tokens: list[str], counts: PullCounts
) -> None:
    async with session.post(base + "/ack", json={"tokens": tokens}) as response:
        await response.read()
    counts.acks += 1


async def drain(tally: Tally, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(tally.first_arrival) < tally.scheduled and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


async def run_webhook(
    args: argparse.Namespace, servers: Servers, workdir: Path, max_batch: int = 1
) -> dict[str, Any]:
    tally = Tally()
    async with (
        receiver(tally, workdir) as (url, receiver_pid),
        aiohttp.ClientSession() as session,
    ):
        with fleet(args, servers, TopicType.WEBHOOK, url, workdir, max_batch) as processes:
            await wait_ready(session, processes)
            served_before = await served_lateness(session, processes)
            pids = roles(servers, processes, receiver=[receiver_pid])
            sched_before, started = sched_by_thread(pids), time.monotonic()
            await produce(session, processes, tally, args.rate, args.duration, args.delay_ms, "w")
            await drain(tally, args.delay_ms / 1000 + 30)
            sched = scheduler(sched_before, sched_by_thread(pids), time.monotonic() - started)
            served = await served_lateness(session, processes)
    # the serve processes' own view: the handler's start, before the sink sends the POST
    return {
        **tally.report(args.rate, args.duration),
        "handed_within_ms": served_within(served_before, served),
        "scheduler": sched,
    }


async def run_webhook_batch(
    args: argparse.Namespace, servers: Servers, workdir: Path
) -> dict[str, Any]:
    """The webhook run with batched POSTs (`--webhook-max-batch`), for the same-run ratio."""
    report = await run_webhook(args, servers, workdir, args.webhook_max_batch)
    return {**report, "webhook_max_batch": args.webhook_max_batch}


async def run_pull(args: argparse.Namespace, servers: Servers, workdir: Path) -> dict[str, Any]:
    """Acks on leases, after the baseline of separate ack requests (`--pull-baseline`) on the
    same fleet: one fleet start, and the two phases a minute apart at most."""
    result: dict[str, Any] = {"consumers_per_service": args.pull_consumers}
    async with aiohttp.ClientSession() as session:
        with fleet(args, servers, TopicType.PULL, "", workdir) as processes:
            await wait_ready(session, processes)
            phases = [("ack_requests", False)] if args.pull_baseline else []
            for name, acks_on_lease in [*phases, ("acks_on_lease", True)]:
                print(f"bench: pull, {name} ...", file=sys.stderr, flush=True)
                result[name] = await _pull_phase(
                    args, servers, session, processes, name, acks_on_lease
                )
    if args.pull_baseline:
        before, after = (result[n]["lateness_ms"] for n in ("ack_requests", "acks_on_lease"))
        if before and after and after["p99"]:
            result["p99_ratio_before_to_after"] = round(before["p99"] / after["p99"], 2)
    return result


async def _pull_phase(
    args: argparse.Namespace,
    servers: Servers,
    session: aiohttp.ClientSession,
    processes: list[ServeProcess],
    prefix: str,
    acks_on_lease: bool,
) -> dict[str, Any]:
    tally, counts, stop = Tally(), PullCounts(), asyncio.Event()
    served_before = await served_lateness(session, processes)
    consumers = [
        asyncio.create_task(pull_consumer(session, p, tally, stop, counts, acks_on_lease))
        for p in processes
        for _ in range(args.pull_consumers)
    ]
    pids = roles(servers, processes)
    sched_before, started = sched_by_thread(pids), time.monotonic()
    await produce(session, processes, tally, args.rate, args.duration, args.delay_ms, prefix)
    await drain(tally, args.delay_ms / 1000 + 30)
    sched = scheduler(sched_before, sched_by_thread(pids), time.monotonic() - started)
    stop.set()
    await asyncio.gather(*consumers)
    report = tally.report(args.rate, args.duration)
    report["scheduler"] = sched
    delivered = report["delivered"]
    report["http_requests"] = {"leases": counts.leases, "acks": counts.acks}
    if delivered:
        report["http_requests_per_message"] = round((counts.leases + counts.acks) / delivered, 3)
    # the serve processes' own view: at the claim, before HTTP
    report["leased_within_ms"] = served_within(
        served_before, await served_lateness(session, processes)
    )
    return report


def roles(
    servers: Servers, processes: list[ServeProcess], **others: list[int]
) -> dict[str, list[int]]:
    """The pids of a phase by role: the serve processes, this process (the producer and any
    pull consumers), the servers and `others` (the receiver)."""
    return {
        "serve": [process.pid for process in processes],
        "bench": [os.getpid()],
        **{role: [pid] for role, pid in servers.pids.items()},
        **others,
    }


def served_within(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The share of the messages served between two `served_lateness` reads that a serve
    process leased (pull) or handed to its sender (webhook) within 1, 2, 5 and 10 ms of due."""
    total = after["+Inf"] - before["+Inf"]
    return {
        f"{float(le) * 1000:g}": round((after[le] - before[le]) / total, 4) if total else 0.0
        for le in ("0.001", "0.002", "0.005", "0.01")
    }


async def served_lateness(
    session: aiohttp.ClientSession, processes: list[ServeProcess]
) -> dict[str, float]:
    """The serve processes' lateness histograms summed: messages leased within each bucket's
    bound (`le` -> count, "+Inf" the total), read from their /metrics."""
    counts: dict[str, float] = {}
    for process in processes:
        async with session.get(process.url + "/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "delayq_delivery_lateness_seconds_bucket":
                    le = sample.labels["le"]
                    counts[le] = counts.get(le, 0.0) + sample.value
    return counts


async def run_batch(args: argparse.Namespace, servers: Servers, workdir: Path) -> dict[str, Any]:
    """Schedule then lease throughput over HTTP with full batches (see the module docstring)."""
    total, size = args.batch_total, 1000
    async with aiohttp.ClientSession() as session:
        with fleet(args, servers, TopicType.PULL, "", workdir) as processes:
            await wait_ready(session, processes)
            started, cpu = time.monotonic(), serve_cpu_s(processes)
            await _schedule_backlog(session, processes, total, size)
            scheduled_s = time.monotonic() - started
            schedule_cpu_s = serve_cpu_s(processes) - cpu
            seen: set[str] = set()
            started, cpu = time.monotonic(), serve_cpu_s(processes)
            await asyncio.gather(
                *(
                    _lease_until(session, p, seen, total)
                    for p in processes
                    for _ in range(args.pull_consumers)
                )
            )
            leased_s = time.monotonic() - started
            lease_cpu_s = serve_cpu_s(processes) - cpu
    return {
        "messages": total,
        "schedule_batch_per_s": round(total / scheduled_s),
        "lease_and_ack_per_s": round(total / leased_s),
        "serve_cpu_us_per_message": {
            "schedule_batch": round(schedule_cpu_s / total * 1e6, 1),
            "lease_and_ack": round(lease_cpu_s / total * 1e6, 1),
        },
        "consumers_per_service": args.pull_consumers,
    }


def serve_cpu_s(processes: list[ServeProcess]) -> float:
    """CPU seconds (user + system) the serve processes have used so far, from /proc: on a
    shared machine their cost per message holds where a rate moves with the neighbours' load."""
    ticks = 0
    for process in processes:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


async def _schedule_backlog(
    session: aiohttp.ClientSession, processes: list[ServeProcess], total: int, size: int
) -> None:
    """`total` messages due now, in POSTs of `size`, two in flight."""
    starts = iter(range(0, total, size))

    async def sender() -> None:
        for start in starts:
            process = processes[start // size % len(processes)]
            url = f"{process.url}/v1/topics/{process.config.topic}/messages/batch"
            batch = [
                {"id": f"b-{i}", "delayMs": 0, "payload": "x" * 64}
                for i in range(start, min(total, start + size))
            ]
            async with session.post(url, json={"messages": batch}) as response:
                if response.status != 200:
                    raise RuntimeError(f"batch refused: {response.status} {await response.text()}")

    await asyncio.gather(sender(), sender())


async def _lease_until(
    session: aiohttp.ClientSession, process: ServeProcess, seen: set[str], total: int
) -> None:
    """Lease up to 1000 at a time and ack them in one request, until `total` were seen."""
    base = f"{process.url}/v1/topics/{process.config.topic}/leases"
    while len(seen) < total:
        async with session.post(base, json={"max": 1000, "waitMs": 100}) as response:
            leases = (await response.json())["leases"]
        if leases:
            seen.update(m["id"] for m in leases)
            tokens = [m["token"] for m in leases]
            async with session.post(base + "/ack", json={"tokens": tokens}) as response:
                await response.read()


async def run_failover(args: argparse.Namespace, servers: Servers, workdir: Path) -> dict[str, Any]:
    """kill -9 one of three services mid-run: gap until its slots deliver again elsewhere."""
    tally = Tally()
    tally.keep_ids = True
    rate, duration = args.failover_rate, args.failover_duration
    async with receiver(tally, workdir) as (url, _), aiohttp.ClientSession() as session:
        with fleet(args, servers, TopicType.WEBHOOK, url, workdir) as processes:
            await wait_ready(session, processes)
            producing = asyncio.create_task(
                produce(session, processes, tally, rate, duration, 200, "f")
            )
            await asyncio.sleep(duration / 3)
            victim = processes[0]
            moved = {s for s, member in tally.by_slot_member.items() if member == "s0"}
            killed_at = time.monotonic()
            victim.kill()
            processes.remove(victim)  # the producer goes on with the living ones
            await producing
            await drain(tally, 60)
            leftover = await remaining(servers.redis_url, processes[0].config)
    after = [
        (t - killed_at, slot)
        for t, slot, member in tally.arrivals
        if t > killed_at and slot in moved and member != "s0"
    ]
    firsts: dict[int, float] = {}
    for gap, slot in after:
        firsts.setdefault(slot, gap)
    report = tally.report(rate, duration)
    report.update(
        {
            "zk_session_timeout_s": 4.0,
            "ack_timeout_s": args.ack_timeout_ms / 1000,
            "moved_slots": len(moved),
            "gap_to_first_delivery_s": round(min(firsts.values()), 3) if firsts else None,
            "gap_to_all_moved_slots_s": round(max(firsts.values()), 3)
            if len(firsts) == len(moved)
            else None,
            "lost": tally.scheduled - len(tally.first_arrival),
            "left_in_redis": leftover,
            "lost_sample": sorted(set(tally.ids) - set(tally.first_arrival))[:10],
        }
    )
    return report


async def remaining(redis_url: str, config: ServiceConfig) -> dict[str, Any]:
    """What is still in the topic after the drain: depth by state and the slots holding it."""
    queue = AsyncQueue.from_url(redis_url, config.to_topic())
    try:
        stats = await queue.stats()
    finally:
        await queue.close()
    busy = [s.slot for s in stats.slots if s.scheduled + s.prepared + s.dead]
    return {
        "scheduled": stats.scheduled,
        "prepared": stats.prepared,
        "dead": stats.dead,
        "slots": busy,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="delayq-bench-"))
    print(f"bench: logs in {workdir}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
        "slots": SLOTS,
        "processes": 3,
        "delay_ms": args.delay_ms,
    }
    runners = {
        "webhook": run_webhook,
        "webhook_batch": run_webhook_batch,
        "pull": run_pull,
        "batch": run_batch,
        "failover": run_failover,
    }
    with RedisServer() as redis_server, ZooKeeperServer() as zookeeper:
        assert redis_server.process is not None  # both started: they have their processes
        assert zookeeper.process is not None
        servers = Servers(
            redis_server.url,
            zookeeper.hosts,
            {"redis-server": redis_server.process.pid, "zookeeper": zookeeper.process.pid},
        )
        for mode in args.modes.split(","):
            print(f"bench: {mode} ...", file=sys.stderr, flush=True)
            result[mode] = await runners[mode](args, servers, workdir)
    result["machine"]["loadavg_after"] = os.getloadavg()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="messages scheduled per s")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of scheduling")
    parser.add_argument("--delay-ms", type=int, default=1000, help="delay of every message")
    parser.add_argument("--modes", default="webhook,webhook_batch,pull,failover")
    parser.add_argument(
        "--webhook-max-batch", type=int, default=100, help="messages per POST in webhook_batch"
    )
    parser.add_argument("--pull-consumers", type=int, default=2, help="long polls per service")
    parser.add_argument(
        "--pull-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pull mode: first a run with a separate ack request per lease, for the ratio",
    )
    parser.add_argument(
        "--batch-total", type=int, default=100_000, help="backlog of the batch mode"
    )
    parser.add_argument("--failover-rate", type=float, default=300.0)
    parser.add_argument("--failover-duration", type=float, default=30.0)
    parser.add_argument("--ack-timeout-ms", type=int, default=10_000, help="lease length")
    parser.add_argument("--log-level", default="WARNING", help="of the serve processes")
    parser.add_argument("--receiver-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver_port:
        web.run_app(receiver_app(), host="127.0.0.1", port=args.receiver_port, print=None)
        return 0
    print(json.dumps(asyncio.run(main_async(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
