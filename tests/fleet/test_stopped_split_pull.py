"""A pull topic's switched halves are leased at once after a splitter killed in its freeze (issue
35, defect 3), as test_stopped_split.py shows for push topics.

Two `delayq serve` processes serve a pull topic on two brokers (old slots 0-7 on broker 0, 8-15
on broker 1). `delayq routing split --to-slots 32` is held right after recording `freeze`
(ZkHold), broker 1's Redis pauses writes, and the splitter goes on: it switches old slots 0-7
(two batches of broker 0) to their halves and waits on slot 8; it is killed there with SIGKILL.
A pull consumer polls both processes (`POST .../leases` with `waitMs`, acking each batch with
the next request). Messages written into the switched slots right after the kill are leased
from their halves when due; before, only once the slots' owners completed the doubling past
`move_stall_s` (twice the session timeout) and restarted on the new slots. Their tokens name
the halves' key generation, so the acks sent with the next request act there; a token leased
from a switched old slot before the doubling is answered `stale_epoch` at once, never a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest
import redis

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import Split
from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.waiting import eventually
from delayq.queue.model import ScheduleRequest
from delayq.queue.topic import TopicType

from .conftest import NAMESPACE, SLOTS, ProcessFleet
from .test_mover_kill import PAUSE_MS
from .test_split_live import (
    HOLD_TIMEOUT_S,
    routing,
    shown,
    splitter,
    spread_fleet,  # noqa: F401 (the fixture)
)
from .zk_hold import ZkHold

pytestmark = pytest.mark.slow
MEMBERS = ("pull-0", "pull-1")
SWITCHED = frozenset(range(SLOTS // 2))  # the old slots of broker 0: switched before the kill
PER_SLOT = 5
#: Messages written into the switched slots after the kill are due this much later (long
#: before their owners could complete the doubling, 2 session timeouts after the kill) ...
SWITCHED_DELAY_MS = 1_000
#: ... and leased this late at most (a loaded machine's room; before: about 10 s).
SWITCHED_LATE_BOUND_S = 2.0
WAIT_MS = 200  # the consumer's long poll


@dataclass
class PullConsumer:
    """Polls every process of the topic for leases, acking each batch with its next request
    (`ack`); records when each id was first leased (this host's clock, which is the local
    Redis server's) and the result of each ack."""

    urls: list[str]
    topic: str
    leased_ms: dict[str, float] = field(default_factory=dict)
    acks: dict[str, str] = field(default_factory=dict)  # id -> result of its latest ack
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, session: aiohttp.ClientSession, url: str) -> None:
        ack: list[str] = []
        while not self.stop.is_set():
            body = {"max": 100, "waitMs": WAIT_MS, "ack": ack}
            try:
                async with session.post(f"{url}/v1/topics/{self.topic}/leases", json=body) as got:
                    answer: dict[str, Any] = await got.json()
                    assert got.status < 500, answer
                    assert got.status == 200, answer
            except aiohttp.ClientError:  # a process restarting on the new slots: ask again
                await asyncio.sleep(0.05)
                continue
            now_ms = time.time() * 1000
            self.acks.update({a["id"]: a["result"] for a in answer.get("acks", [])})
            for lease in answer["leases"]:
                self.leased_ms.setdefault(lease["id"], now_ms)
            ack = [lease["token"] for lease in answer["leases"]]


@contextlib.asynccontextmanager
async def consuming(consumer: PullConsumer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        polls = [asyncio.create_task(consumer.run(session, url)) for url in consumer.urls]
        try:
            yield session
        finally:
            consumer.stop.set()
            await asyncio.gather(*polls)


def start_pull_fleet(fleet: ProcessFleet) -> list[str]:
    """Both processes on the pull topic, each on a port of its own; their base URLs."""
    for member in MEMBERS:
        config = replace(fleet.config(member), topic_type=TopicType.PULL, port=free_port())
        fleet.processes[member] = ServeProcess(config, fleet.log_dir / f"{member}.log").start()
    return [fleet.processes[member].url for member in MEMBERS]


def ids_in(fleet: ProcessFleet, slots: frozenset[int], per_slot: int) -> list[str]:
    """`per_slot` fresh ids of each old slot of `slots`."""
    fresh = [uuid.uuid4().hex for _ in range(400 * per_slot)]
    by_slot = {slot: [i for i in fresh if fleet.topic.slot_of(i) == slot] for slot in slots}
    return [i for ids in by_slot.values() for i in ids[:per_slot]]


def schedule(fleet: ProcessFleet, urls: list[str], ids: list[str], delay_ms: int) -> dict[str, int]:
    """The ids scheduled through a RoutedQueue (which writes a switched slot's messages into
    its halves); their due times (server ms)."""
    with RoutedQueue.connect(
        urls, fleet.topic, zookeeper=ZkConnection(fleet.zookeeper.hosts), move_wait_ms=300
    ) as client:
        requests = [ScheduleRequest(i, b"x", delay_ms=delay_ms) for i in ids]
        results = client.schedule_many(requests)
    return {r.id: result.due_ms for r, result in zip(requests, results, strict=True)}


async def test_a_pull_topics_switched_halves_are_leased_at_once_after_a_killed_splitter(
    spread_fleet: tuple[ProcessFleet, list[str]],  # noqa: F811
) -> None:
    fleet, broker_urls = spread_fleet
    urls = start_pull_fleet(fleet)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    admins = [redis.Redis.from_url(url) for url in broker_urls]
    split_path = TopicPaths(NAMESPACE, fleet.topic.name).split
    hold = ZkHold(
        ("127.0.0.1", fleet.zookeeper.port),
        lambda path, data: path == split_path and Split.decode(data).step is Step.FREEZE,
    )
    consumer = PullConsumer(urls, fleet.topic.name)
    try:
        # leases of the switched slots taken before the doubling, held by the consumer
        before = await asyncio.to_thread(
            schedule, fleet, broker_urls, ids_in(fleet, SWITCHED, 2), 0
        )
        old_tokens: dict[str, str] = {}
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                for url in urls:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"{url}/readyz") as got:
                            if got.status == 200:
                                continue
                    return False
                return True

            await eventually(ready, 30.0, "both processes ready")

            async def leased_before() -> bool:
                for url in urls:
                    body = {"max": 100, "waitMs": WAIT_MS}
                    async with session.post(
                        f"{url}/v1/topics/{fleet.topic.name}/leases", json=body
                    ) as got:
                        old_tokens.update(
                            {m["id"]: m["token"] for m in (await got.json())["leases"]}
                        )
                return old_tokens.keys() >= before.keys()

            await eventually(leased_before, 10.0, "the messages of the old slots leased")
        first = splitter(fleet, hold.hosts)
        try:
            await eventually(
                lambda: (s := shown(fleet)) is not None and s.step is Step.FREEZE,
                HOLD_TIMEOUT_S,
                "the splitter held in its freeze",
            )
            admins[1].client_pause(PAUSE_MS, all=False)  # the freeze of slot 8 waits
            hold.release()  # it switches old slots 0-7 on broker 0, then waits on broker 1
            await eventually(
                lambda: routing(fleet).doubled_slots == SWITCHED, 30.0, "slots 0-7 switched"
            )
        finally:
            os.kill(first.pid, signal.SIGKILL)  # in its freeze
            first.wait()
            admins[1].client_unpause()
        async with consuming(consumer) as session:
            # a lease of a switched slot from before the doubling: refused at once, as fenced
            started = time.monotonic()
            tokens = {"tokens": [old_tokens[i] for i in before]}  # a nack reads the attempt
            async with session.post(
                f"{urls[0]}/v1/topics/{fleet.topic.name}/leases/nack", json=tokens
            ) as got:
                refused = await got.json()
                assert got.status == 409, refused
            assert {r["result"] for r in refused["results"]} == {"stale_epoch"}
            assert time.monotonic() - started < 2.0  # not after a SLOT_MOVING wait
            written = await asyncio.to_thread(
                schedule, fleet, broker_urls, ids_in(fleet, SWITCHED, PER_SLOT), SWITCHED_DELAY_MS
            )
            try:
                await eventually(
                    lambda: consumer.leased_ms.keys() >= written.keys(),
                    SWITCHED_DELAY_MS / 1000 + SWITCHED_LATE_BOUND_S + 3.0,
                    "the messages written into the switched halves leased",
                )
            finally:
                late = [consumer.leased_ms.get(i, 0) - due for i, due in written.items()]
                print(
                    f"\n{len(written)} messages written into the switched slots after the kill, "
                    f"due {SWITCHED_DELAY_MS} ms later: leased at most {max(late):.0f} ms late "
                    f"(median {sorted(late)[len(late) // 2]:.0f} ms); doubling still recorded: "
                    f"{shown(fleet) is not None}"
                )
            await eventually(
                lambda: {consumer.acks.get(i) for i in written} == {"acked"},
                5.0,
                "the halves' leases acked with the next request",
            )
        assert max(late) <= SWITCHED_LATE_BOUND_S * 1000
        assert shown(fleet) is not None  # still in its freeze: leased before it completed
    finally:
        hold.close()
        for admin in admins:
            admin.close()
