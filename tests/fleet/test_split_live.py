"""The slots doubled live, 16 -> 32, while two real `delayq serve` processes deliver a steady
load of schedules, cancels and reschedules sent by a RoutedQueue: the real `delayq routing
split` process is killed with SIGKILL inside each step (or a doubling is rolled back), a second
run completes it, both services restart on the new slots, and a counting checker finds nothing
lost, nothing early and no message delivered that was cancelled before its due. Likewise with
one of the two serve processes killed with SIGKILL inside each step instead: the splitter
completes, the killed process is started again, and no message is later than a bound
(`SPLIT_STALL_BOUND_S`).

What holds the splitter in its step, with no hook in the product (as test_mover_kill.py): it
reaches ZooKeeper through a ZkHold proxy that passes none of its requests after the write
recording that step (copy: 3 of 16 old slots split; freeze, switch, clean: all copied): it waits
on the check of its lock, which comes before each of its writes. Held (and killed) in its copy,
the splitter leaves no slot frozen: both services go on delivering and the producer writing.
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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import cast

import pytest
import redis
import redis.asyncio
from kazoo.exceptions import NoNodeError

from delayq.coordination.layout import TopicPaths
from delayq.coordination.migration import Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing import Routing, initial_routing
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SlotSplitter, Split
from delayq.local.processes import config_env
from delayq.local.waiting import eventually
from delayq.queue import Code, NotFoundError, Queue, ScheduleRequest
from delayq.queue.keys import Part, slot_keys

from .conftest import (
    ACK_TIMEOUT_MS,
    DELAY_MS,
    NAMESPACE,
    RATE_PER_S,
    SESSION_TIMEOUT_S,
    SLOTS,
    ProcessFleet,
)
from .test_mover_kill import finished
from .test_slot_move import MEMBERS, MOVE_BOUND_S, deliveries
from .zk_hold import ZkHold

pytestmark = pytest.mark.slow
HOLD_TIMEOUT_S = 30.0
LONG_DELAY_MS = 5_000  # the messages that are cancelled or rescheduled while still waiting
#: No message is delivered later than this after its due time when a serve process is killed
#: in a step of the doubling: the hold (a splitter process starting, a few seconds), the killed
#: process's session running out (SESSION_TIMEOUT_S) before its slots are taken, a lease of a
#: message it had claimed running out (ACK_TIMEOUT_MS), the survivor's restart on the new
#: slots, and room for a loaded machine.
SPLIT_STALL_BOUND_S = 3.0 + SESSION_TIMEOUT_S + ACK_TIMEOUT_MS / 1000 + 6.0


@dataclass
class Producer:
    """Schedules, cancels and reschedules through a RoutedQueue (which follows the doubling),
    in a thread of its own; records each message's latest due time and what was cancelled.

    A cancel answered CANCELLED before the message's due time must keep it from any delivery;
    one answered later (a cancel the frozen slot held back) may have found it leased, which a
    cancel ends too, while its delivery goes on (cancel-13): it is owed none, and may get one."""

    fleet: ProcessFleet
    client: RoutedQueue
    due_ms: dict[str, int] = field(default_factory=dict)
    #: id -> when its cancel was answered CANCELLED (ms, the brokers' clock): owed no delivery
    cancelled_at_ms: dict[str, int] = field(default_factory=dict)
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
                self.cancelled_at_ms[message_id] = int(time.time() * 1000)
            return
        outcome = self.client.reschedule(message_id, delay_ms=DELAY_MS)
        if outcome.code is Code.RESCHEDULED and outcome.at_ms is not None:
            # sooner, unless its slot stayed frozen past its first due: it is never early
            # against the earlier of the two (a delivery at either is on time)
            self.due_ms[message_id] = min(self.due_ms[message_id], outcome.at_ms)

    @property
    def cancelled(self) -> set[str]:
        """The cancelled messages (one C-level copy: safe while the thread adds more)."""
        return set(self.cancelled_at_ms)

    def cancelled_before_due(self) -> set[str]:
        """The cancelled messages that must never be delivered."""
        return {i for i, at_ms in self.cancelled_at_ms.items() if at_ms < self.due_ms[i]}


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
    """The doubling recorded now, None when none is (its node may go at any moment)."""
    try:
        payload, _ = fleet.observer().get(TopicPaths(NAMESPACE, fleet.topic.name).split)
    except NoNodeError:
        return None
    return Split.decode(payload)


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


def held(step: Step) -> tuple[Step, int]:
    """The recorded (step, copied slots) the splitter is held after."""
    return (step, 3 if step is Step.COPY else SLOTS)


def frozen_old_slots(load: DoublingLoad) -> list[int]:
    """The old (generation 0) slots whose epoch is frozen on their broker."""
    brokers = initial_routing(SLOTS, 2).broker_of_slot
    epochs = [
        cast(
            "bytes | None",
            load.admins[brokers[slot]].get(slot_keys(load.fleet.topic, slot).key(Part.EPOCH)),
        )
        for slot in range(SLOTS)
    ]
    return [slot for slot, epoch in enumerate(epochs) if (epoch or b"").startswith(b"moving:")]


async def writes_and_deliveries_go_on(load: DoublingLoad, count: int = 100) -> None:
    """`count` more messages scheduled and `count` more delivered, within a few seconds."""
    scheduled, delivered = len(load.fleet.scheduled), len(load.fleet.deliveries)
    await load.delivered(
        lambda: (
            load.producer.going()
            and len(load.fleet.scheduled) > scheduled + count
            and len(load.fleet.deliveries) > delivered + count
        ),
        timeout_s=DELAY_MS / 1000 + 5.0,
    )


@dataclass
class DoublingLoad:
    """Two serve processes on two brokers (8 slots each) delivering the Producer's stream;
    `admins[b]` pauses broker b's Redis, `hold` is the proxy the first splitter reaches
    ZooKeeper through (it holds it after recording `step`)."""

    fleet: ProcessFleet
    step: Step
    admins: list[redis.Redis]
    reader: redis.asyncio.Redis
    client: RoutedQueue
    hold: ZkHold
    producer: Producer
    producing: threading.Thread

    async def delivered(self, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
        await deliveries(self.fleet, self.reader, condition, timeout_s)

    async def more_scheduled(self, count: int = 200) -> set[str]:
        """The ids scheduled so far, once `count` more were scheduled after them."""
        before = set(self.fleet.scheduled)
        await self.delivered(
            lambda: self.producer.going() and len(self.fleet.scheduled) > len(before) + count
        )
        return before


@contextlib.asynccontextmanager
async def doubling_load(
    spread_fleet: tuple[ProcessFleet, list[str]], step: Step
) -> AsyncIterator[DoublingLoad]:
    """Both serve processes started, the producer running (stopped and joined on the way out)
    and 100 messages delivered."""
    fleet, urls = spread_fleet
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
                path == split_path
                and (Split.decode(data).step, Split.decode(data).copied_slots) == held(step)
            ),
        )
        cleanup.callback(hold.close)
        producer = Producer(fleet, client)
        producing = threading.Thread(target=producer.run)
        producing.start()
        cleanup.push_async_callback(asyncio.to_thread, producing.join)
        cleanup.callback(producer.stop.set)
        load = DoublingLoad(fleet, step, admins, reader, client, hold, producer, producing)
        await load.delivered(lambda: len(fleet.deliveries) >= 100)
        yield load


@contextlib.asynccontextmanager
async def splitter_held_in(load: DoublingLoad) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`delayq routing split` started and held inside `load.step` (module docstring) for the
    body; then the proxy passes again, so a splitter still alive goes on. A body that fails
    kills it."""
    try:
        process = splitter(load.fleet, load.hold.hosts)
        try:
            await eventually(
                lambda: (
                    (s := shown(load.fleet)) is not None
                    and (s.step, s.copied_slots) == held(load.step)
                ),
                HOLD_TIMEOUT_S,
                f"the splitter held in {load.step}",
            )
            yield process
        except BaseException:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            raise
    finally:
        load.hold.release()


async def settled(load: DoublingLoad, bound_s: float) -> tuple[set[str], list[str], int]:
    """Once every message not cancelled is delivered (within `bound_s`), the producer
    stopped: no message cancelled before its due time delivered. Returns the lost ids, the
    early ones and the greatest lateness of a first delivery (ms, against the earlier due
    time of a rescheduled message)."""
    fleet, producer = load.fleet, load.producer
    producer.stop.set()
    await asyncio.to_thread(load.producing.join)
    expected = fleet.scheduled - producer.cancelled
    with contextlib.suppress(TimeoutError):  # reported as lost below
        await load.delivered(
            lambda: not expected - {d.message_id for d in fleet.deliveries}, bound_s
        )
    assert producer.error is None, producer.error
    delivered = {d.message_id for d in fleet.deliveries}
    resurrected = producer.cancelled_before_due() & delivered
    assert not resurrected, [
        (
            i,
            fleet.topic.slot_of(i),
            producer.due_ms[i],
            producer.cancelled_at_ms[i],
            [d.at_ms for d in fleet.deliveries if d.message_id == i],
        )
        for i in resurrected
    ]  # id, slot, due ms, cancel answered ms, delivered at ms
    late = producer.cancelled - producer.cancelled_before_due()
    print(f"\ncancels answered after the due time: {len(late)}, delivered {len(late & delivered)}")
    early = [d.message_id for d in fleet.deliveries if d.at_ms < producer.due_ms[d.message_id]]
    first: dict[str, int] = {}
    for delivery in fleet.deliveries:
        first.setdefault(delivery.message_id, delivery.at_ms - producer.due_ms[delivery.message_id])
    return expected - delivered, early, max(first.values())


CASES = [*Step, "abort"]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"killed-in-{c}" if c != "abort" else "aborted" for c in CASES]
)
async def test_a_doubling_under_load_killed_in_each_step_loses_nothing(
    spread_fleet: tuple[ProcessFleet, list[str]], case: Step | str
) -> None:
    fleet = spread_fleet[0]
    step = Step.COPY if case == "abort" else Step(case)
    async with doubling_load(spread_fleet, step) as load:
        async with splitter_held_in(load) as first:
            if step is Step.COPY:  # held in the copy: the topic takes writes and delivers
                assert frozen_old_slots(load) == []
                await writes_and_deliveries_go_on(load)
            os.kill(first.pid, signal.SIGKILL)  # in the step
            first.wait()
        assert first.returncode == -signal.SIGKILL
        if step is Step.COPY:  # and so it does with the splitter dead
            assert frozen_old_slots(load) == []
            await writes_and_deliveries_go_on(load)
        assert (routing(fleet).generation == 1) is (step is Step.CLEAN)
        lock = TopicPaths(NAMESPACE, fleet.topic.name).splitter
        await eventually(
            lambda: not fleet.observer().exists(lock), SESSION_TIMEOUT_S + 5.0, "the lock gone"
        )
        second = splitter(fleet, fleet.zookeeper.hosts, *(["--abort"] if case == "abort" else []))
        if await asyncio.to_thread(second.wait) != 0:
            # killed with every old slot frozen: past `move_stall_s` their owners complete the
            # doubling (test_stopped_split.py) and may have taken its lock first
            assert step is Step.SWITCH
            assert "the split is being run by" in (fleet.log_dir / "splitter.log").read_text()
            await eventually(lambda: shown(fleet) is None, 30.0, "the doubling completed")
        assert shown(fleet) is None
        amount = SLOTS if case == "abort" else 2 * SLOTS
        assert (routing(fleet).slot_amount, routing(fleet).generation) == (
            amount,
            int(amount > SLOTS),
        )
        await eventually(lambda: len(fleet.owners()) == amount, 60.0, f"all {amount} slots owned")
        before_end = await load.more_scheduled()
        lost, early, late_ms = await settled(load, MOVE_BOUND_S + LONG_DELAY_MS / 1000)
        assert not lost
        assert not early
        assert fleet.scheduled - before_end  # and written after the doubling
        if case != "abort":
            logs = [(fleet.log_dir / f"{member}.log").read_text() for member in MEMBERS]
            assert all("the slots doubled" in log for log in logs)
            assert load.client.topic.slot_amount == 2 * SLOTS
        print(
            f"doubling, splitter {'aborted' if case == 'abort' else f'killed -9 in {case}'}: "
            f"{len(fleet.scheduled)} messages, {len(load.producer.cancelled)} cancelled, lost "
            f"{len(lost)}, early {len(early)}, {fleet.duplicates()} duplicates, "
            f"latest {late_ms} ms late"
        )


@pytest.mark.parametrize("step", list(Step), ids=[f"owner-killed-in-{s}" for s in Step])
async def test_a_serve_process_killed_in_each_step_of_a_doubling_loses_nothing(
    spread_fleet: tuple[ProcessFleet, list[str]], step: Step
) -> None:
    """The owner of slot 0 (and of about half the slots) dies with SIGKILL while the
    splitter is held in `step` (in `clean`: once both serve the new slots, after the
    switch); the splitter then completes, the other process restarts on
    the 32 slots and takes them all once the dead one's session ran out, and the killed one,
    started again as its pod would be, serves the 32 slots too: lost 0, early 0, no
    cancelled message delivered, no message later than SPLIT_STALL_BOUND_S."""
    fleet = spread_fleet[0]
    async with doubling_load(spread_fleet, step) as load:
        async with splitter_held_in(load) as process:
            if step is Step.CLEAN:  # switched: killed once serving the new slots
                await eventually(
                    lambda: (
                        len(owners := fleet.owners()) == 2 * SLOTS
                        and set(owners.values()) == set(MEMBERS)
                    ),
                    HOLD_TIMEOUT_S,
                    "both owning some of the 32 slots",
                )
            victim = fleet.owners()[0]
            fleet.processes[victim].kill()
        assert await finished(process) == 0  # the doubling completed
        assert shown(fleet) is None
        assert (routing(fleet).slot_amount, routing(fleet).generation) == (2 * SLOTS, 1)
        survivor = next(m for m in MEMBERS if m != victim)
        await eventually(
            lambda: set(fleet.owners().values()) == {survivor} and len(fleet.owners()) == 2 * SLOTS,
            SESSION_TIMEOUT_S + 30.0,
            "the survivor owning all 32 slots",
        )
        fleet.start(victim)  # as its pod would be: its settings still say 16 slots
        await eventually(
            lambda: (
                len(owners := fleet.owners()) == 2 * SLOTS
                and set(owners.values()) == set(MEMBERS)
                and any(slot >= SLOTS for slot, member in owners.items() if member == victim)
            ),
            SESSION_TIMEOUT_S + 30.0,
            "both owning some of the 32 slots, the restarted one some of the new ones",
        )
        before_end = await load.more_scheduled()
        lost, early, late_ms = await settled(load, SPLIT_STALL_BOUND_S + LONG_DELAY_MS / 1000)
        assert not lost
        assert not early
        assert late_ms <= SPLIT_STALL_BOUND_S * 1000
        assert fleet.scheduled - before_end  # and written after the doubling
        assert "the slots doubled" in (fleet.log_dir / f"{survivor}.log").read_text()
        assert load.client.topic.slot_amount == 2 * SLOTS
        print(
            f"owner of slot 0 killed -9 in the doubling's {step}: {len(fleet.scheduled)} "
            f"messages, {len(load.producer.cancelled)} cancelled, lost {len(lost)}, early "
            f"{len(early)}, {fleet.duplicates()} duplicates, latest {late_ms} ms late"
        )


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
