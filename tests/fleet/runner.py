"""A minimal delay-service process for the fleet tests: `ZkOwnership` + the engine's `Consumer`.

`python -m tests.fleet.runner --redis-url ... --zookeeper ... --member fleet-0`

It delivers like a `stream` topic (XADD of `stream_fields` plus the delivering member to
`fleet-out:<topic>`), and shuts down on SIGTERM in the service's order: stop claiming, let
in-flight deliveries finish and ack under the current fencing epoch, and only then release the
owner nodes — so a graceful handoff redelivers nothing. Used because `delayq serve` did not yet
wire ZooKeeper ownership when these tests were written; it exercises the same two components.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import redis.asyncio

from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
from delayq.queue.client import AsyncQueue
from delayq.queue.consumer import Consumer, ConsumerSettings
from delayq.queue.model import Message
from delayq.queue.topic import Topic
from delayq.service.delivery.stream import stream_fields


def output_stream(topic: str) -> str:
    return f"fleet-out:{topic}"


async def run(args: argparse.Namespace) -> int:
    topic = Topic(args.topic, namespace=args.namespace, slot_amount=args.slots,
                  ack_timeout_ms=args.ack_timeout_ms)
    # blocking pool: a batch of deliveries waits for a connection instead of failing with
    # MaxConnectionsError past redis-py's default of 100 connections
    pool = redis.asyncio.BlockingConnectionPool.from_url(args.redis_url, max_connections=64)
    client = redis.asyncio.Redis(connection_pool=pool)
    queue = AsyncQueue(client, topic)
    out = output_stream(args.topic)

    async def deliver(message: Message) -> None:
        await client.xadd(out, {**stream_fields(topic, message), "member": args.member})

    consumer = Consumer(queue, deliver, ConsumerSettings(batch_size=100, max_in_flight=500))
    ownership = ZkOwnership(
        ZkSettings(
            hosts=args.zookeeper,
            namespace=args.namespace,
            topic=args.topic,
            slot_amount=args.slots,
            member_id=args.member,
            session_timeout_s=args.session_timeout_s,
        )
    )
    changes = asyncio.Lock()
    stopping = False

    async def on_change(slots: frozenset[int]) -> None:
        async with changes:
            wanted = frozenset() if stopping else slots
            owned = frozenset(consumer.owned_slots)
            await consumer.release(owned - wanted)
            await consumer.own(wanted - owned)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    consuming = asyncio.create_task(consumer.run())
    await ownership.start(on_change)
    await stop.wait()
    stopping = True
    await on_change(frozenset())  # stop claiming
    consumer.stop()
    await consuming  # in-flight deliveries ack under our epoch
    await ownership.stop()  # only now may a new owner fence us out
    await client.aclose()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--zookeeper", required=True)
    parser.add_argument("--namespace", default="fleet")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--member", required=True)
    parser.add_argument("--session-timeout-s", type=float, default=4.0)
    parser.add_argument("--ack-timeout-ms", type=int, default=2000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
