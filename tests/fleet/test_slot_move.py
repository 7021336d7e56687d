"""Slots moved live from broker 0 to broker 1 while two real `delayq serve` processes deliver a
steady load: nothing lost, nothing early, every moved slot delivering again from its new
broker, also when the mover is stopped after any step and a second run completes the move."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis
import redis.asyncio

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Migration, SlotMover, Step
from delayq.coordination.routing import Routing
from delayq.local.waiting import eventually
from delayq.queue import (
    AsyncQueue,
    PartlyStoredError,
    Queue,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    SlotMovingError,
)
from delayq.queue.keys import Part, slot_keys

from .conftest import ACK_TIMEOUT_MS, DELAY_MS, NAMESPACE, RATE_PER_S, SLOTS, ProcessFleet

pytestmark = pytest.mark.slow
MEMBERS = ("move-0", "move-1")
MOVED = (1, 6, 11)  # slots moved from broker 0 to broker 1
MOVE_BOUND_S = ACK_TIMEOUT_MS / 1000 + 10  # a moved slot delivers again within this


@dataclass
class RoutedProducer:
    """A producer that routes by the ZooKeeper routing, as every routing client must: a batch
    refused with SLOT_MOVING (or partly) is sent again, only its refused items, on the routing
    read afresh. Records each message's due time (server ms) for the never-early check."""

    fleet: ProcessFleet
    queues: list[AsyncQueue]
    due_ms: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        tick_s = 0.05
        per_tick = int(RATE_PER_S * tick_s)
        pending: list[ScheduleRequest] = []
        started, ticks = time.monotonic(), 0
        while not stop.is_set() or pending:
            if not stop.is_set():
                pending += [
                    ScheduleRequest(uuid.uuid4().hex, b"x", delay_ms=DELAY_MS)
                    for _ in range(per_tick)
                ]
            pending = await self._send(pending)
            ticks += 1
            await asyncio.sleep(max(0.0, started + ticks * tick_s - time.monotonic()))

    async def _send(self, requests: list[ScheduleRequest]) -> list[ScheduleRequest]:
        """Send each request to its slot's broker; returns those to send again."""
        routing = await asyncio.to_thread(self._routing)
        by_broker: dict[int, list[ScheduleRequest]] = {}
        for request in requests:
            slot = self.fleet.topic.slot_of(request.id.encode())
            by_broker.setdefault(routing[slot], []).append(request)
        again: list[ScheduleRequest] = []
        for broker, batch in by_broker.items():
            try:
                results: list[ScheduleResult | ScheduleFailure] = list(
                    await self.queues[broker].schedule_many(batch)
                )
            except SlotMovingError:
                self.refused += len(batch)
                again += batch
                continue
            except PartlyStoredError as error:
                results = error.results
            for request, result in zip(batch, results, strict=True):
                if isinstance(result, ScheduleFailure):
                    assert isinstance(result.error, SlotMovingError), result.error
                    self.refused += 1
                    again.append(request)
                else:
                    self.due_ms[request.id] = result.due_ms
                    self.fleet.scheduled.add(request.id)
        return again

    def _routing(self) -> tuple[int, ...]:
        observer = self.fleet.observer()
        payload, _ = observer.get(TopicPaths(NAMESPACE, self.fleet.topic.name).routing)
        return Routing.from_json(payload).broker_of_slot


async def stopped_after(
    fleet: ProcessFleet, queues: list[Queue], producer: RoutedProducer, slot: int, steps: int
) -> None:
    """A mover that does `steps` steps and dies; once the producer has seen the slot refuse a
    write (when it was left frozen and still routed to the source), a second run completes the
    move."""
    paths = TopicPaths(NAMESPACE, fleet.topic.name)

    def first_run() -> None:
        mover = SlotMover(fleet.observer(), paths, queues)
        current: tuple[Migration, int] | None = mover.start(slot, 1)
        for _ in range(steps):
            assert current is not None
            current = mover.step(*current)
        mover.release(slot)  # its lock goes with its session

    refused_before = producer.refused
    await asyncio.to_thread(first_run)
    if list(Step)[steps] in (Step.COPY, Step.SWITCH):
        await eventually(lambda: producer.refused > refused_before, 10.0, "a write refused")
    await asyncio.to_thread(SlotMover(fleet.observer(), paths, queues).move, slot, 1)


@pytest.mark.parametrize("steps", range(len(Step)), ids=[f"stopped-before-{s}" for s in Step])
async def test_slots_move_under_load_with_nothing_lost_or_early(
    two_broker_fleet: tuple[ProcessFleet, list[str]], steps: int
):
    fleet, urls = two_broker_fleet
    for member in MEMBERS:
        fleet.start(member)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    async_clients = [redis.asyncio.Redis.from_url(url) for url in urls]
    sync_queues = [Queue.from_url(url, fleet.topic) for url in urls]
    producer = RoutedProducer(fleet, [AsyncQueue(c, fleet.topic) for c in async_clients])
    stop = asyncio.Event()
    producing = asyncio.create_task(producer.run(stop))
    try:
        await deliveries(fleet, async_clients[0], lambda: len(fleet.deliveries) >= 100, 30.0)
        for slot in MOVED:
            await stopped_after(fleet, sync_queues, producer, slot, steps)
        before_moves = set(fleet.scheduled)
        await deliveries(
            fleet, async_clients[0], lambda: len(fleet.scheduled) > len(before_moves) + 200
        )
    finally:
        stop.set()
        await producing
    try:
        await deliveries(fleet, async_clients[0], lambda: not fleet.missing(), MOVE_BOUND_S)
        early = [d for d in fleet.deliveries if d.at_ms < producer.due_ms[d.message_id]]
        assert not early
        after = {fleet.topic.slot_of(i.encode()) for i in fleet.scheduled - before_moves}
        assert set(MOVED) <= after  # scheduled on broker 1 after the moves, and delivered
        source = redis.Redis.from_url(urls[0])
        for slot in MOVED:  # only the tombstone is left on the source
            keys = slot_keys(fleet.topic, slot)
            assert source.exists(*keys.keys(*Part)) == 1
            assert str(source.get(keys.key(Part.EPOCH))).startswith("b'moving:")
        source.close()
        logs = [(fleet.log_dir / f"{member}.log").read_text() for member in MEMBERS]
        assert all("routing changed" in log for log in logs)  # both followed the watch
        print(
            f"moved {len(MOVED)} slots under load: {len(fleet.scheduled)} messages, "
            f"{fleet.duplicates()} duplicates, {producer.refused} writes refused and resent"
        )
    finally:
        for client in async_clients:
            await client.aclose()
        for queue in sync_queues:
            queue.close()


async def deliveries(
    fleet: ProcessFleet,
    client: redis.asyncio.Redis,
    condition: Callable[[], bool],
    timeout_s: float = 30.0,
) -> None:
    async def read_then_check() -> bool:
        await fleet.read_deliveries(client)
        return condition()

    await eventually(read_then_check, timeout_s, "deliveries", interval_s=0.05)
