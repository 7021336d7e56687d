"""A webhook POST's CPU: the webhook sink's client (`http_post.PostClient`) against aiohttp's
`ClientSession` as the sink used it before, in the same run (JSON on stdout).

    python bench/bench_webhook_post.py [--posts 6000] [--concurrency 8] [--rounds 5] [--output FILE]

A receiver in a second process answers every POST `200` with a two-byte body at once (raw
asyncio, so its cost stays out of the figure); this process sends `--posts` POSTs with
`--concurrency` in flight, each with the headers a signed single-message delivery carries and a
~200-byte body, and reads the process's CPU time (`time.process_time`) across them: CPU µs a
POST, client side, keep-alive connections warm. The two clients take turns (which goes first
alternates by round); the report has the medians, the new client's ratio to aiohttp's (of the
medians) and the ratio round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from delayq.service.delivery.http_post import PostClient
from delayq.service.delivery.targets import TargetPolicy

RECEIVER = """
import asyncio, sys
class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\\r\\n\\r\\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            size = int(head[at + 15:].split(b"\\r\\n")[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + size:
                return
            self.buffer = self.buffer[end + 4 + size:]
            self.transport.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
async def main():
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""
BODY = (
    b'{"id":"order-000123","topic":"orders","payload":"' + b"x" * 120 + b'","dueMs":1,"attempt":1}'
)
HEADERS = {
    "Authorization": "Bearer receiver-token",
    "Content-Type": "application/json",
    "X-Delayq-Id": "order-000123",
    "X-Delayq-Attempt": "1",
    "X-Delayq-Member": "delayq-orders-0",
    "X-Delayq-Lease-Deadline": "1764800000000",
    "webhook-id": "order-000123",
    "webhook-timestamp": "1764800000",
    "webhook-signature": "v1," + "a" * 44,
}
Post = Callable[[], Awaitable[int]]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def cpu_us_per_post(post: Post, posts: int, concurrency: int) -> float:
    """Client CPU µs a POST over `posts` POSTs, `concurrency` in flight, after a warm-up."""
    turns = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with turns:
            assert await post() == 200

    await asyncio.gather(*(one() for _ in range(concurrency * 20)))
    started = time.process_time()
    await asyncio.gather(*(one() for _ in range(posts)))
    return (time.process_time() - started) / posts * 1e6


async def aiohttp_round(url: str, posts: int, concurrency: int) -> float:
    """aiohttp's client as the sink used it: one session, no cookies, a total timeout."""
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10),
        connector=aiohttp.TCPConnector(limit=concurrency),
        cookie_jar=aiohttp.DummyCookieJar(),
    )

    async def post() -> int:
        async with session.post(url, data=BODY, headers=dict(HEADERS), allow_redirects=False) as r:
            await r.read()
            return r.status

    try:
        return await cpu_us_per_post(post, posts, concurrency)
    finally:
        await session.close()


async def post_client_round(url: str, posts: int, concurrency: int) -> float:
    client = PostClient(url, TargetPolicy(allow_private=True), 10_000)

    async def post() -> int:
        return (await client.post(BODY, dict(HEADERS), 64 * 1024)).status

    try:
        return await cpu_us_per_post(post, posts, concurrency)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=6_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    runs: dict[str, list[float]] = {"aiohttp": [], "post_client": []}
    rounds = {"aiohttp": aiohttp_round, "post_client": post_client_round}
    load_before = os.getloadavg()[0]
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/hook"
        for round_ in range(args.rounds):
            order = ("aiohttp", "post_client") if round_ % 2 == 0 else ("post_client", "aiohttp")
            for name in order:
                runs[name].append(asyncio.run(rounds[name](url, args.posts, args.concurrency)))
    finally:
        receiver.kill()
        receiver.wait()
    old, new = statistics.median(runs["aiohttp"]), statistics.median(runs["post_client"])
    report: dict[str, Any] = {
        "posts": args.posts,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpu_us_per_post": {
            "aiohttp": round(old, 1),
            "post_client": round(new, 1),
            "post_client_to_aiohttp": round(new / old, 3),
            "per_round": [
                round(n / o, 3) for n, o in zip(runs["post_client"], runs["aiohttp"], strict=True)
            ],
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
