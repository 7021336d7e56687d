"""The slots doubled live, 16 -> 32, while two real `delayq serve` processes deliver a steady
load of schedules, cancels and reschedules sent by a RoutedQueue: the real `delayq routing
split` process is killed with SIGKILL inside each step (or a doubling is rolled back), a second
run completes it, both services restart on the new slots, and a counting checker finds nothing
lost, nothing early and no cancelled message delivered.

What holds the splitter in its step, with no hook in the product (as test_mover_kill.py):
* freeze: broker 0's Redis pauses writes (CLIENT PAUSE WRITE), the freeze script waits;
* copy (3 of 16 old slots split), switch, clean: the splitter reaches ZooKeeper through a ZkHold
  proxy that passes none of its requests after the write recording that step: it waits on the
  check of its lock, which comes before each of its writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

import pytest
import redis
import redis.asyncio

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing, initial_routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SlotSplitter, Split, SplitStep
from delayq.local.processes import config_env
from delayq.local.waiting import eventually
from delayq.queue import Code, NotFoundError, Queue, ScheduleRequest

from .conftest import DELAY_MS, NAMESPACE, RATE_PER_S, SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_slot_move import MEMBERS, MOVE_BOUND_S, deliveries, second_broker, two_broker_fleet
from .zk_hold import ZkHold

__all__ = ["second_broker", "two_broker_fleet"]  # fixtures shared with test_slot_move

pytestmark = pytest.mark.slow
PAUSE_MS = 30_000  # a paused Redis resumes by itself after this, should the test die
HOLD_TIMEOUT_S = 30.0
LONG_DELAY_MS = 5_000  # the messages that are cancelled or rescheduled while still waiting


@dataclass
class Producer:
    """Schedules, cancels and reschedules through a RoutedQueue (which follows the doubling),
    in a thread of its own; records each message's latest due time and what was cancelled."""

    fleet: ProcessFleet
    client: RoutedQueue
    due_ms: dict[str, int] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    waiting: list[str] = field(default_factory=list)  # long-delay ids not touched yet
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def going(self) -> bool:
        """For conditions waited on: raises what stopped the producer's thread."""
        if self.error is not None:
            raise AssertionError(f"the producer stopped: {self.error!r}") from self.error
        return True

    def run(self) -> None:
        tick_s = 0.05
        per_tick = int(RATE_PER_S * tick_s)
        started, ticks = time.monotonic(), 0
        try:
            while not self.stop.is_set():
                self._tick(per_tick, ticks)
                ticks += 1
                time.sleep(max(0.0, started + ticks * tick_s - time.monotonic()))
        except BaseException as error:  # the test fails on it
            self.error = error

    def _tick(self, per_tick: int, tick: int) -> None:
        requests = [
            ScheduleRequest(uuid.uuid4().hex, b"x", delay_ms=DELAY_MS) for _ in range(per_tick)
        ]
        long = ScheduleRequest(uuid.uuid4().hex, b"x", delay_ms=LONG_DELAY_MS)
        for request, result in zip(
            [*requests, long], self.client.schedule_many([*requests, long]), strict=True
        ):
            self.due_ms[request.id] = result.due_ms
            self.fleet.scheduled.add(request.id)
        self.waiting.append(long.id)
        if len(self.waiting) > 4:
            with contextlib.suppress(NotFoundError):  # delivered already (its slot was frozen)
                self._touch(self.waiting.pop(0), cancel=bool(tick % 2))

    def _touch(self, message_id: str, cancel: bool) -> None:
        if cancel:
            if self.client.cancel(message_id).code is Code.CANCELLED:
                self.cancelled.add(message_id)
            return
        outcome = self.client.reschedule(message_id, delay_ms=DELAY_MS)
        if outcome.code is Code.RESCHEDULED and outcome.at_ms is not None:
            # sooner, unless its slot stayed frozen past its first due: it is never early
            # against the earlier of the two (a delivery at either is on time)
            self.due_ms[message_id] = min(self.due_ms[message_id], outcome.at_ms)


@pytest.fixture
def spread_fleet(
    two_broker_fleet: tuple[ProcessFleet, list[str]],
) -> tuple[ProcessFleet, list[str]]:
    """Two brokers, 8 slots each (the first routing)."""
    fleet, urls = two_broker_fleet
    paths = TopicPaths(NAMESPACE, fleet.topic.name)
    fleet.observer().set(paths.routing, initial_routing(SLOTS, 2).to_json())
    return fleet, urls


def shown(fleet: ProcessFleet) -> Split | None:
    path = TopicPaths(NAMESPACE, fleet.topic.name).split
    found = fleet.observer().exists(path)
    return Split.decode(fleet.observer().get(path)[0]) if found else None


def routing(fleet: ProcessFleet) -> Routing:
    payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).routing)
    return Routing.from_json(payload)


def splitter(fleet: ProcessFleet, zookeeper_connect: str, *extra: str) -> subprocess.Popen[bytes]:
    """`delayq routing split --to-slots 32` with the fleet's settings."""
    config = replace(fleet.config("splitter"), zookeeper_connect=zookeeper_connect)
    command = ["routing", "split", "--to-slots", str(2 * SLOTS), *extra]
    with (fleet.log_dir / "splitter.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *command],
            env={**os.environ, **config_env(config)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def held(step: SplitStep) -> tuple[SplitStep, int]:
    """The recorded (step, copied slots) the splitter is held after."""
    return (
        (step, 3)
        if step is SplitStep.COPY
        else (step, SLOTS if step is not SplitStep.FREEZE else 0)
    )


CASES = [*SplitStep, "abort"]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"killed-in-{c}" if c != "abort" else "aborted" for c in CASES]
)
async def test_a_doubling_under_load_killed_in_each_step_loses_nothing(
    spread_fleet: tuple[ProcessFleet, list[str]], case: SplitStep | str
) -> None:
    fleet, urls = spread_fleet
    step = SplitStep.COPY if case == "abort" else SplitStep(case)
    for member in MEMBERS:
        fleet.start(member)
    await eventually(lambda: len(fleet.owners()) == SLOTS, 60.0, "every slot owned")
    async with contextlib.AsyncExitStack() as cleanup:
        admins = [redis.Redis.from_url(url) for url in urls]
        for admin in admins:
            cleanup.callback(admin.close)
        reader = redis.asyncio.Redis.from_url(urls[0])  # the output stream is on broker 0
        cleanup.push_async_callback(reader.aclose)
        client = RoutedQueue.connect(  # waits out a killed splitter's lock and the second run
            urls, fleet.topic, zookeeper=ZkConnection(fleet.zookeeper.hosts), move_wait_ms=60_000
        )
        cleanup.callback(client.close)
        split_path = TopicPaths(NAMESPACE, fleet.topic.name).split
        hold = ZkHold(
            ("127.0.0.1", fleet.zookeeper.port),
            lambda path, data: (
                step is not SplitStep.FREEZE
                and path == split_path
                and (Split.decode(data).step, Split.decode(data).copied_slots) == held(step)
            ),
        )
        cleanup.callback(hold.close)
        producer = Producer(fleet, client)
        producing = threading.Thread(target=producer.run)
        producing.start()
        cleanup.push_async_callback(asyncio.to_thread, producing.join)
        cleanup.callback(producer.stop.set)
        before_end = await doubled_under_load(fleet, case, step, admins, reader, hold, producer)
        producer.stop.set()
        await asyncio.to_thread(producing.join)
        assert producer.error is None, producer.error
        expected = fleet.scheduled - producer.cancelled
        await deliveries(
            fleet,
            reader,
            lambda: not expected - {d.message_id for d in fleet.deliveries},
            MOVE_BOUND_S + LONG_DELAY_MS / 1000,
        )
        early = [d for d in fleet.deliveries if d.at_ms < producer.due_ms[d.message_id]]
        assert not early
        assert not producer.cancelled & {d.message_id for d in fleet.deliveries}
        assert fleet.scheduled - before_end  # and written after the doubling
        if case != "abort":
            logs = [(fleet.log_dir / f"{member}.log").read_text() for member in MEMBERS]
            assert all("the slots doubled" in log for log in logs)
            assert client.topic.slot_amount == 2 * SLOTS
        print(
            f"doubling, splitter {'aborted' if case == 'abort' else f'killed -9 in {case}'}: "
            f"{len(fleet.scheduled)} messages, "
            f"{len(producer.cancelled)} cancelled, lost "
            f"{len(expected - {d.message_id for d in fleet.deliveries})}, early {len(early)}, "
            f"{fleet.duplicates()} duplicates"
        )


async def doubled_under_load(
    fleet: ProcessFleet,
    case: SplitStep | str,
    step: SplitStep,
    admins: list[redis.Redis],
    reader: redis.asyncio.Redis,
    hold: ZkHold,
    producer: Producer,
) -> set[str]:
    """The splitter killed in `step`, then run again (or `--abort`ed); returns the messages
    scheduled before the end, once 200 more were scheduled."""
    await deliveries(fleet, reader, lambda: len(fleet.deliveries) >= 100, 30.0)
    if step is SplitStep.FREEZE:
        admins[0].client_pause(PAUSE_MS, all=False)
    try:
        first = splitter(fleet, hold.hosts)
        try:
            await eventually(
                lambda: (s := shown(fleet)) is not None and (s.step, s.copied_slots) == held(step),
                HOLD_TIMEOUT_S,
                f"the splitter held in {step}",
            )
        finally:
            os.kill(first.pid, signal.SIGKILL)  # in the step (the test failing: to stop it)
            first.wait()
    finally:
        admins[0].client_unpause()
    assert first.returncode == -signal.SIGKILL
    assert (routing(fleet).generation == 1) is (step is SplitStep.CLEAN)
    lock = TopicPaths(NAMESPACE, fleet.topic.name).splitter
    await eventually(
        lambda: not fleet.observer().exists(lock), SESSION_TIMEOUT_S + 5.0, "the lock gone"
    )
    second = splitter(fleet, fleet.zookeeper.hosts, *(["--abort"] if case == "abort" else []))
    assert await asyncio.to_thread(second.wait) == 0
    assert shown(fleet) is None
    amount = SLOTS if case == "abort" else 2 * SLOTS
    assert (routing(fleet).slot_amount, routing(fleet).generation) == (amount, int(amount > SLOTS))
    await eventually(lambda: len(fleet.owners()) == amount, 60.0, f"all {amount} slots owned")
    before_end = set(fleet.scheduled)
    await deliveries(
        fleet, reader, lambda: producer.going() and len(fleet.scheduled) > len(before_end) + 200
    )
    return before_end


async def test_a_service_started_after_a_doubling_serves_the_routing_slots(
    spread_fleet: tuple[ProcessFleet, list[str]],
) -> None:
    """Its settings still say 16 slots: the routing node's 32 and generation 1 win."""
    fleet, urls = spread_fleet
    paths = TopicPaths(NAMESPACE, fleet.topic.name)
    queues = [Queue.from_url(url, fleet.topic) for url in urls]
    await asyncio.to_thread(SlotSplitter(fleet.observer(), paths, queues).split, 2 * SLOTS)
    for queue in queues:
        queue.close()
    fleet.start(MEMBERS[0])
    await eventually(lambda: len(fleet.owners()) == 2 * SLOTS, 60.0, "all 32 slots owned")
    reader = redis.asyncio.Redis.from_url(urls[0])
    with RoutedQueue.connect(
        urls, fleet.topic, zookeeper=ZkConnection(fleet.zookeeper.hosts)
    ) as client:
        assert client.topic.slot_amount == 2 * SLOTS
        ids = [uuid.uuid4().hex for _ in range(200)]
        client.schedule_many([ScheduleRequest(i, b"x", delay_ms=DELAY_MS) for i in ids])
    fleet.scheduled.update(ids)
    try:
        await deliveries(fleet, reader, lambda: not fleet.missing(), 30.0)
    finally:
        await reader.aclose()
