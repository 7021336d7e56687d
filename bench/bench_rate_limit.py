"""The topic rate limit's accuracy on real processes (issue 31's proof), as JSON.

Brings up a redis-server, a ZooKeeper, a webhook receiver that accepts `--receiver-rate`
messages a second (a token bucket of `--receiver-burst`) and answers 429 with `Retry-After: 1`
beyond it, and `--pods` `delayq serve` processes of one webhook topic with
`delivery.rateLimit.perSecond` = `--limit`. Schedules `--messages` messages due at one instant
(through the HTTP API, 1,000 per call) and waits until the receiver accepted each.

Reports the drain rate against the limit (accepted messages over the time from the first to the
last acceptance; and per whole second, p5..p95), messages lost (never accepted), dead, accepted
at an attempt above 1, the 429s answered, each pod's peak resident memory (VmHWM) and the load
average before and after. Run it on a quiet machine; with the defaults it takes about 220 s.

    python3 bench/bench_rate_limit.py [--messages 100000] [--limit 500] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess, stop_all
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.client import AsyncQueue
from delayq.queue.topic import TopicType
from delayq.service.config import ServiceConfig

SLOTS = 16


class Receiver:
    """Accepts `per_second` (bursts of `burst`), 429 + Retry-After: 1 beyond; records each POST."""

    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second, self.burst = per_second, burst
        self.tokens, self.at_s = float(burst), time.monotonic()
        self.accepted: dict[str, tuple[float, int]] = {}  # id -> (monotonic s, attempt)
        self.refused = 0
        self.duplicates = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        now_s = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now_s - self.at_s) * self.per_second)
        self.at_s = now_s
        if self.tokens < 1:
            self.refused += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.tokens -= 1
        if body["id"] in self.accepted:
            self.duplicates += 1
        self.accepted[body["id"]] = (now_s, int(request.headers["X-Delayq-Attempt"]))
        return web.Response(status=204)


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    receiver = Receiver(args.receiver_rate, args.receiver_burst)
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    workdir = Path(tempfile.mkdtemp(prefix="bench-rate-"))
    pods: list[ServeProcess] = []
    try:
        with RedisServer() as redis_server, ZooKeeperServer() as zookeeper:
            configs = [
                ServiceConfig(
                    redis_url=redis_server.url,
                    namespace="bench",
                    topic="paced",
                    slot_amount=SLOTS,
                    topic_type=TopicType.WEBHOOK,
                    webhook_url=f"http://127.0.0.1:{port}/hook",
                    rate_limit_per_second=args.limit,
                    rate_limit_burst=args.burst,
                    zookeeper_connect=zookeeper.hosts,
                    member_id=f"pod{i}",
                    port=free_port(),
                )
                for i in range(args.pods)
            ]
            pods = [
                ServeProcess(c, workdir / f"serve-{i}.log").start()
                for i, c in enumerate(configs)
            ]
            async with aiohttp.ClientSession() as session:
                await eventually(lambda: _sharing(session, pods), 90, "pods sharing the slots")
                queue = AsyncQueue.from_url(redis_server.url, configs[0].to_topic())
                seconds, micros = await queue.redis.time()
                # due once every message is stored: about 1 s per 20,000 over HTTP
                at_ms = seconds * 1000 + micros // 1000 + 5000 + args.messages // 20
                url = f"{pods[0].url}/v1/topics/paced/messages/batch"
                for start in range(0, args.messages, 1000):
                    stop = min(args.messages, start + 1000)
                    batch = [{"id": f"m{i}", "atMs": at_ms} for i in range(start, stop)]
                    async with session.post(url, json={"messages": batch}) as reply:
                        assert reply.status == 200, await reply.text()
                started_s = time.monotonic()
                await eventually(
                    lambda: len(receiver.accepted) >= args.messages,
                    args.messages / args.limit * 3 + 120,
                    "every message accepted",
                    interval_s=0.5,
                )
                drained_s = time.monotonic() - started_s
                peaks = [peak_rss_mb(pod.pid) for pod in pods]
                stats = await queue.stats()
                await queue.close()
    finally:
        stop_all(pods)
        await runner.cleanup()
    times = sorted(at for at, _ in receiver.accepted.values())
    span_s = times[-1] - times[0]
    per_second = Counter(int(at - times[0]) for at in times[:-1])
    whole = sorted(per_second[s] for s in range(int(span_s)))  # complete seconds only
    attempts = Counter(attempt for _, attempt in receiver.accepted.values())
    rate = (len(times) - 1) / span_s if span_s else None
    return {
        "messages": args.messages,
        "pods": args.pods,
        "limit_per_s": args.limit,
        "burst": args.burst,
        "receiver_per_s": args.receiver_rate,
        "drain_rate_per_s": round(rate, 1) if rate else None,
        "drain_rate_error_pct": round((rate / args.limit - 1) * 100, 2) if rate else None,
        "per_second": {
            "p5": whole[int(len(whole) * 0.05)] if whole else None,
            "median": statistics.median(whole) if whole else None,
            "p95": whole[min(len(whole) - 1, int(len(whole) * 0.95))] if whole else None,
        },
        "drain_s": round(span_s, 1),
        "until_all_accepted_s": round(drained_s, 1),
        "lost": args.messages - len(receiver.accepted),
        "dead": stats.dead,
        "left_in_store": stats.scheduled + stats.due + stats.prepared,
        "accepted_at_attempt_above_1": sum(n for a, n in attempts.items() if a > 1),
        "answered_429": receiver.refused,
        "duplicates": receiver.duplicates,
        "pod_peak_rss_mib": peaks,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }


async def _sharing(session: aiohttp.ClientSession, pods: list[ServeProcess]) -> bool:
    owned = 0
    for pod in pods:
        try:
            async with session.get(pod.url + "/readyz") as answer:
                owned += (await answer.json())["ownedSlots"]
        except aiohttp.ClientError:
            return False
    return owned == SLOTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--limit", type=float, default=500.0)
    parser.add_argument("--burst", type=int, default=0, help="0: a tenth of a second's worth")
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--receiver-rate", type=float, default=500.0)
    parser.add_argument("--receiver-burst", type=int, default=100)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    result = json.dumps(asyncio.run(run(args)), indent=2)
    if args.output:
        args.output.write_text(result + "\n")
    print(result)


if __name__ == "__main__":
    main()
