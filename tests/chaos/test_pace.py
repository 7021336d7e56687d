"""The chaos tier's flow-control test (issue 31): the topic's rate limit and a receiver's
Retry-After hold through kill -9 of a serve process and a restart of the bucket's redis-server.

The chaos fleet (`cluster.py`: two brokers with AOF, fsync always; ZooKeeper; three serves,
two with skewed wall clocks) with `delivery.rateLimit` 200/s, burst 50. A herd due at one
instant drains while (a) a serve process is killed -9 and restarted and (b) broker 0 — which
keeps the bucket and the hold (`pace_key`) — is killed -9 and restarted from its AOF. Then the
receiver answers 429 + `Retry-After` for a while, and during one of those holds a serve process
is killed -9 and broker 0 too; the restarted process knows the hold only from Redis.

Judged on the receiver's arrivals: no 1 s window holds more than the limit plus the burst
(`SLACK`: tokens drawn just before a window and POSTed in it), no POST inside a hold, nothing
lost, none early, none dead, and a message only ever answered 429 is delivered at attempt 1.
Every window of the run is judged, those across the faults included: with the AOF the bucket
survives the restart, and a killed process only loses the tokens it drew. Excused, as the
design says: a 429 answered while the broker is down holds its own process only, and a message
whose process is killed -9 holding it comes back at its next attempt. It found four defects:
tokens given back late were a second burst per process (`Pacer._returnable`); a give-back during
the restart failed for good, and a 429 whose hold Redis refused was failed, each an attempt
spent on a 429; a process's first hold after the restart failed on a closed pooled connection,
holding it alone. About 35-40 s on a loaded host (load 9-21).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio

from delayq.local.waiting import eventually
from delayq.queue.keys import pace_key
from tests.herd_support import schedule_herd

from .cluster import TOPIC, Cluster, Member
from .faults import FaultSpec, Injector, Window, wall_ms
from .probes import _readyz, fleet_ready
from .receiver import Arrival, Behaviour, Receiver
from .run import READY_TIMEOUT_S, left_in_redis

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

LIMIT, BURST = 200, 50
HERD = 3000
HOLD_S = 3  # each 429's Retry-After
#: POSTs a window may hold above LIMIT + BURST: the bucket bounds the tokens drawn in any second
#: (on the Redis clock); a POST arrives after its draw, by one claim round and the POSTs queued
#: before it (webhook.maxInFlight per process): 0.1 s of the limit.
SLACK = LIMIT // 10
#: POSTs already on their way when a 429 is answered arrive after it: a process asks Redis
#: whether a hold lasts before each POST at most every 250 ms (`Pacer.held`).
IN_FLIGHT_MS = 500


@pytest.mark.timeout(240)
async def test_the_rate_limit_and_a_hold_survive_kill_9_and_a_redis_restart() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="delayq-pace-"))
    receiver = await Receiver().start()
    cluster = Cluster(
        workdir,
        receiver.url,
        settings={"rate_limit_per_second": LIMIT, "rate_limit_burst": BURST},
    )
    windows: list[Window] = []
    notes: list[str] = []
    injector = Injector(cluster, receiver, windows, notes)
    marks: dict[str, float] = {}
    try:
        await cluster.start()
        async with aiohttp.ClientSession() as session:
            await eventually(
                lambda: fleet_ready(cluster, session), READY_TIMEOUT_S, "the fleet ready"
            )
            control = redis.asyncio.Redis(port=cluster.redis.port)
            try:
                due_ms = await schedule_herd(control, cluster.members[0].serve, TOPIC, HERD)
            finally:
                await control.aclose()
            delivered = _delivered(receiver)
            await eventually(lambda: len(delivered()) >= 400, 60, "the drain under way")
            await injector.run([FaultSpec(0, "serve_kill9", "c1", 0.5)])
            await eventually(lambda: len(delivered()) >= 1000, 60, "the drain going on")
            await injector.run([FaultSpec(0, "redis_kill9", "redis", 0.5)])
            resumed = len(delivered())
            await eventually(lambda: len(delivered()) >= resumed + 300, 60, "the drain resumed")
            await _hold_phase(cluster, injector, receiver, session, marks)
            await eventually(lambda: len(delivered()) >= HERD, 60, "the herd delivered")

            async def nothing_left() -> bool:
                left = await left_in_redis(cluster)
                return left is not None and left["scheduled"] + left["prepared"] == 0

            await eventually(nothing_left, 30, "an empty topic")
            left = await left_in_redis(cluster)
    finally:
        await cluster.stop()
        await receiver.stop()
    arrivals = sorted(receiver.arrivals, key=lambda a: a.at_ms)
    busiest = _busiest_second(arrivals)
    refused = sum(1 for a in arrivals if a.status == 429)
    faults = [(w.kind, w.target, round(w.start_ms - due_ms), round(w.end_ms - due_ms))
              for w in windows]  # fmt: skip
    print(
        f"\npace chaos: {len(arrivals)} POSTs ({refused} answered 429), busiest 1 s "
        f"{busiest} (limit {LIMIT} + burst {BURST}); ms after the due time: faults {faults}, "
        f"phases { {k: round(v - due_ms) for k, v in marks.items()} }; logs in {workdir}"
    )
    assert not notes, notes
    assert delivered() == {f"h{i}" for i in range(HERD)}  # nothing lost
    assert left is not None
    assert left["dead"] == 0
    assert [a for a in arrivals if a.at_ms < due_ms] == []  # none early
    assert busiest <= LIMIT + BURST + SLACK, busiest
    during = _posted_in_a_hold(arrivals, windows)
    assert during == [], during[:5]
    spent = _attempts_spent_on_429(arrivals, windows)
    assert spent == [], spent[:3]  # a 429 cost an attempt
    shutil.rmtree(workdir, ignore_errors=True)


async def _hold_phase(
    cluster: Cluster,
    injector: Injector,
    receiver: Receiver,
    session: aiohttp.ClientSession,
    marks: dict[str, float],
) -> None:
    """The receiver answers 429 + Retry-After: HOLD_S until c2, killed -9 with broker 0 during
    the first hold and restarted, consumes again and a hold began after that."""
    topic = cluster.members[0].serve.config.to_topic()
    receiver.behaviour = Behaviour(retry_after_s=HOLD_S)
    marks["holding_ms"] = wall_ms()

    async def held_in_redis() -> bool:
        client = redis.asyncio.Redis(port=cluster.redis.port)
        try:
            until = await client.hget(pace_key(topic), "until")
            now_s, now_us = await client.time()
        finally:
            await client.aclose()
        return until is not None and int(until) > int(now_s) * 1000 + int(now_us) // 1000

    await eventually(held_in_redis, 20, "a hold in Redis")
    marks["held_ms"] = wall_ms()
    await injector.run(
        [FaultSpec(0, "serve_kill9", "c2", 0.3), FaultSpec(0, "redis_kill9", "redis", 0.3)]
    )
    restarted = cluster.member("c2")

    async def consuming(member: Member) -> bool:
        answer = await _readyz(session, member)
        return answer is not None and bool(answer.consumed)

    await eventually(lambda: consuming(restarted), 60, "c2 consuming again")
    marks["c2_consuming_ms"] = since_ms = wall_ms()

    def held_since() -> bool:
        return any(a.status == 429 and a.answered_ms > since_ms for a in receiver.arrivals)

    await eventually(held_since, 30, "a hold while c2 consumes")
    await asyncio.sleep(HOLD_S)  # let the pods meet the hold (nothing ought to arrive)
    receiver.behaviour = Behaviour()
    marks["accepting_ms"] = wall_ms()


def _delivered(receiver: Receiver) -> Callable[[], set[str]]:
    def ids() -> set[str]:
        return {a.message_id for a in receiver.arrivals if 200 <= a.status < 300}

    return ids


def _busiest_second(arrivals: list[Arrival]) -> int:
    """The most POSTs (any answer: each drew a token) in any 1 s window."""
    times = [a.at_ms for a in arrivals]
    return max(bisect.bisect_left(times, t + 1000) - i for i, t in enumerate(times))


def _posted_in_a_hold(arrivals: list[Arrival], windows: list[Window]) -> list[Arrival]:
    """POSTs arriving while a 429 holds the topic: from IN_FLIGHT_MS after it was answered to
    the end of its Retry-After (Redis starts the hold later still). A 429 answered while the
    bucket's broker was down (from IN_FLIGHT_MS before its kill to its restart) holds its own
    process only: the hold cannot reach Redis, so the others cannot know it."""
    down = [(w.start_ms - IN_FLIGHT_MS, w.end_ms) for w in windows if w.kind == "redis_kill9"]
    holds = [
        (
            a.answered_ms + IN_FLIGHT_MS,
            a.answered_ms + HOLD_S * 1000,
            a.member if any(start <= a.answered_ms <= end for start, end in down) else None,
        )
        for a in arrivals
        if a.status == 429
    ]
    return [
        a
        for a in arrivals
        if any(start <= a.at_ms < end and whose in (None, a.member) for start, end, whose in holds)
    ]


def _attempts_spent_on_429(
    arrivals: list[Arrival], windows: list[Window]
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Messages answered only 429 before their first 2xx whose attempt went up meanwhile.
    Excused: a 429 whose process was down (killed -9) at some time before the message came
    again: it died holding the message, whose lease then ran out (an attempt counted, as for
    any delivery a kill -9 interrupts)."""
    kills = [w for w in windows if w.kind == "serve_kill9"]
    posts: dict[str, list[Arrival]] = {}
    for arrival in arrivals:
        posts.setdefault(arrival.message_id, []).append(arrival)
    wrong = []
    for message_id, seen in posts.items():
        first_ok = next((i for i, a in enumerate(seen) if 200 <= a.status < 300), None)
        if first_ok is None or not seen[:first_ok]:
            continue
        if any(a.status != 429 for a in seen[:first_ok]):
            continue
        if all(a.attempt == 1 for a in seen[: first_ok + 1]):
            continue
        if not any(
            refused.member == kill.target
            and kill.start_ms <= again.at_ms
            and refused.answered_ms <= kill.end_ms
            for refused, again in itertools.pairwise(seen)
            for kill in kills
        ):
            wrong.append((message_id, [(a.status, a.attempt) for a in seen]))
    return wrong
