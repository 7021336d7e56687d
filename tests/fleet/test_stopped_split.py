"""A doubling whose splitter was killed in its freeze leaves no slot frozen past a bound (issue 35,
defect 3).

Two `delayq serve` processes deliver the steady load of test_split_live.py on two brokers (old
slots 0-7 on broker 0, 8-15 on broker 1). `delayq routing split --to-slots 32` is held right
after recording `freeze` (ZkHold), broker 1's Redis pauses writes, and the splitter goes on: it
freezes old slots 0-7 on broker 0 and waits on slot 8; it is killed there with SIGKILL. The old
slots 0-7 refuse writes and deliver nothing; before stopped_moves.py completed a doubling, they
stayed so until a person ran the command again. Now their owners, once the slots stayed frozen
past `move_stall_s` (twice the session timeout), complete the recorded doubling themselves (one
wins the split's lock) and both services restart on the 32 slots: the frozen slots' messages
are delivered within that bound and a margin of the kill, nothing lost, nothing early, no
cancelled message delivered, and nobody ran the splitter again.

Meanwhile the old slots 0-7 are switched to their halves (two batches of SWITCH_BATCH), which
take the producer's writes at once; their owners consume the halves at once too, so a message
of theirs due after the kill is delivered on time, not once the doubling is completed (before:
up to `move_stall_s` and the completion late, about 10 s).
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from delayq.coordination.migration import Step
from delayq.coordination.routed_queue import RoutedQueue
from delayq.coordination.routing_watch import ZkConnection
from delayq.coordination.splitting import SWITCH_BATCH
from delayq.queue import SlotMovingError

from .conftest import SESSION_TIMEOUT_S, SLOTS, ProcessFleet
from .test_mover_kill import PAUSE_MS
from .test_slot_move import MEMBERS
from .test_split_live import (
    LONG_DELAY_MS,
    DoublingLoad,
    doubling_load,
    frozen_old_slots,
    routing,
    settled,
    shown,
    splitter_held_in,
    spread_fleet,  # noqa: F401 (the fixture)
)

pytestmark = pytest.mark.slow
#: An owner completes the doubling once its slots stayed frozen 2 session timeouts (the killed
#: splitter's lock is gone after one); then the retry's period (2 s), the freeze of the rest,
#: the catch-up, the switch and both services' restart on the new slots, with room for a
#: loaded machine.
RESUMED_BOUND_S = 2 * SESSION_TIMEOUT_S + 10.0
FROZEN = list(range(SLOTS // 2))  # the old slots on broker 0, frozen before the kill
#: A message written into a switched slot after the kill, due SWITCHED_DELAY_MS later (long
#: before the owners complete the doubling), is delivered this late at most: consumed from its
#: half at once (a loaded machine's room; before, about 10 s: the doubling's completion).
SWITCHED_DELAY_MS = 1_000
SWITCHED_LATE_BOUND_S = 2.0
PER_SLOT = 5


def routed_writes_refused(load: DoublingLoad, urls: list[str]) -> tuple[list[int], set[str]]:
    """PER_SLOT messages due in SWITCHED_DELAY_MS scheduled into each old slot through a
    RoutedQueue waiting 0.3 s at most: the old slots whose writes are refused (SLOT_MOVING),
    and the ids stored (expected like the producer's messages)."""
    fleet, refused, stored = load.fleet, [], set()
    with RoutedQueue.connect(
        urls, fleet.topic, zookeeper=ZkConnection(fleet.zookeeper.hosts), move_wait_ms=300
    ) as client:
        for slot in range(SLOTS):
            fresh = (uuid.uuid4().hex for _ in range(2_000))
            ids = [i for i in fresh if fleet.topic.slot_of(i) == slot]
            try:
                for message_id in ids[:PER_SLOT]:
                    result = client.schedule(message_id, b"x", delay_ms=SWITCHED_DELAY_MS)
                    load.producer.due_ms[message_id] = result.due_ms
                    fleet.scheduled.add(message_id)
                    stored.add(message_id)
            except SlotMovingError:
                refused.append(slot)
    return refused, stored


def first_lateness_ms(load: DoublingLoad, ids: set[str]) -> list[int]:
    """The lateness (ms) of the first delivery of each of `ids` (all delivered)."""
    first: dict[str, int] = {}
    for delivery in load.fleet.deliveries:
        if delivery.message_id in ids:
            first.setdefault(delivery.message_id, delivery.at_ms)
    assert ids
    assert first.keys() == ids
    return [at_ms - load.producer.due_ms[message_id] for message_id, at_ms in first.items()]


async def test_a_doubling_killed_in_its_freeze_is_completed_by_the_slots_owners(
    spread_fleet: tuple[ProcessFleet, list[str]],  # noqa: F811
) -> None:
    fleet = spread_fleet[0]
    async with doubling_load(spread_fleet, Step.FREEZE) as load:
        async with splitter_held_in(load) as first:
            load.admins[1].client_pause(PAUSE_MS, all=False)  # the freeze of slot 8 waits
        try:  # released: it freezes old slots 0-7 on broker 0, then waits on broker 1
            await load.delivered(lambda: frozen_old_slots(load) == FROZEN, 30.0)
        finally:
            os.kill(first.pid, signal.SIGKILL)  # in its freeze
            first.wait()
            load.admins[1].client_unpause()
        seconds, micros = load.admins[0].time()
        killed_ms = int(seconds) * 1000 + int(micros) // 1000
        refused, written = await asyncio.to_thread(routed_writes_refused, load, spread_fleet[1])
        # one batch at most: the old slots switched before the kill take routed writes at once
        assert len(refused) <= SWITCH_BATCH, refused
        print(f"\nold slots refusing a routed write after the kill: {refused}")
        stuck = {i for i in fleet.scheduled if fleet.topic.slot_of(i) in FROZEN}
        first_after: dict[str, int] = {}

        def frozen_ones_delivered() -> bool:
            for delivery in fleet.deliveries:
                if delivery.message_id in stuck and delivery.at_ms > killed_ms:
                    first_after.setdefault(delivery.message_id, delivery.at_ms)
            delivered = {d.message_id for d in fleet.deliveries}
            return load.producer.going() and not stuck - load.producer.cancelled - delivered

        try:
            await load.delivered(frozen_ones_delivered, RESUMED_BOUND_S + 10.0)
        except TimeoutError:
            print(f"doubling still recorded: {shown(fleet)}, frozen: {frozen_old_slots(load)}")
            raise
        gap_s = (max(first_after.values(), default=killed_ms) - killed_ms) / 1000
        switched = {i for i in written if fleet.topic.slot_of(i) in FROZEN}  # taken: switched
        on_time_ms = first_lateness_ms(load, switched)
        print(
            f"\n{len(on_time_ms)} messages written into the switched slots after the kill, due "
            f"{SWITCHED_DELAY_MS} ms later: first delivered at most {max(on_time_ms)} ms late "
            f"(median {sorted(on_time_ms)[len(on_time_ms) // 2]} ms)"
        )
        assert max(on_time_ms) <= SWITCHED_LATE_BOUND_S * 1000
        await load.delivered(lambda: shown(fleet) is None, RESUMED_BOUND_S + 10.0)
        assert shown(fleet) is None  # completed, by nobody running the splitter again
        assert (routing(fleet).slot_amount, routing(fleet).generation) == (2 * SLOTS, 1)
        logs = [(fleet.log_dir / f"{member}.log").read_text() for member in MEMBERS]
        assert any(f"doubling to {2 * SLOTS} slots completed" in log for log in logs)
        before_end = await load.more_scheduled()
        lost, early, late_ms = await settled(load, RESUMED_BOUND_S + LONG_DELAY_MS / 1000)
        assert not lost
        assert not early
        assert fleet.scheduled - before_end  # and written after the doubling
        assert load.client.topic.slot_amount == 2 * SLOTS
        print(
            f"\nsplitter killed -9 in its freeze, old slots {FROZEN[0]}-{FROZEN[-1]} frozen: "
            f"{len(stuck)} of their messages delivered {gap_s:.2f} s after the kill at the "
            f"latest (bound {RESUMED_BOUND_S:.0f} s), the doubling completed by their owners; "
            f"{len(fleet.scheduled)} messages, lost {len(lost)}, early {len(early)}, "
            f"{fleet.duplicates()} duplicates, latest {late_ms} ms late"
        )
        assert gap_s <= RESUMED_BOUND_S
