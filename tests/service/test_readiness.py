"""Readiness with hysteresis: the pure verdict (`Readiness`), and a real service whose Redis
stalls for less than the bound (`CLIENT PAUSE`) staying ready while `/readyz` answers at once."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.service.readiness import PROBE_INTERVAL_S, READY_AFTER, UNREADY_AFTER_S, Readiness
from tests.service.conftest import StartService

BROKEN = "a broker does not answer"


def started() -> Readiness:
    """A readiness that has been ready once (hysteresis applies from here on)."""
    readiness = Readiness()
    assert readiness.observe(None, 0.0)
    return readiness


def test_starts_unready_and_the_first_success_makes_it_ready():
    readiness = Readiness()
    assert (readiness.ready, readiness.reason) == (False, "starting")
    assert readiness.observe(None, 0.0)
    assert readiness.reason == "ready"


def test_before_the_first_success_a_failure_is_unready_at_once_with_its_reason():
    readiness = Readiness()
    assert not readiness.observe(BROKEN, 0.0)
    assert readiness.reason == BROKEN
    assert readiness.observe(None, 0.1)  # still nothing to flap from: one success is enough


def test_a_failure_shorter_than_the_bound_keeps_it_ready():
    readiness = started()
    for now in (1.0, 2.0, 1.0 + UNREADY_AFTER_S - 0.01):
        assert readiness.observe(BROKEN, now), now
        assert readiness.reason == "ready"
    assert readiness.observe(None, 1.0 + UNREADY_AFTER_S)
    # the failing time restarts after a success: a new failure gets the whole bound again
    assert readiness.observe(BROKEN, 10.0)
    assert readiness.observe(BROKEN, 10.0 + UNREADY_AFTER_S - 0.01)


def test_a_failure_lasting_the_bound_makes_it_unready_with_the_reason():
    readiness = started()
    assert readiness.observe(BROKEN, 1.0)
    assert not readiness.observe("granted slots not consumed", 1.0 + UNREADY_AFTER_S)
    assert readiness.reason == "granted slots not consumed"  # the latest failure is the reason
    assert not readiness.observe(BROKEN, 2.0 + UNREADY_AFTER_S)
    assert readiness.reason == BROKEN


def test_recovery_needs_ready_after_successes_in_a_row():
    assert READY_AFTER >= 2  # else there is no hysteresis on the way back to test
    readiness = started()
    readiness.observe(BROKEN, 1.0)
    assert not readiness.observe(BROKEN, 1.0 + UNREADY_AFTER_S)
    now = 10.0
    for _ in range(READY_AFTER - 1):
        now += 1
        assert not readiness.observe(None, now)
        assert readiness.reason == BROKEN
    # a failure in between starts the count again
    now += 1
    assert not readiness.observe(BROKEN, now)
    for _ in range(READY_AFTER - 1):
        now += 1
        assert not readiness.observe(None, now)
    now += 1
    assert readiness.observe(None, now)
    assert readiness.reason == "ready"


def test_fail_now_is_unready_at_once_and_recovers_only_after_ready_after_successes():
    readiness = started()
    readiness.observe(None, 1.0)
    readiness.fail_now("stopping")
    assert (readiness.ready, readiness.reason) == (False, "stopping")
    for step in range(READY_AFTER - 1):
        assert not readiness.observe(None, 2.0 + step)
    assert readiness.observe(None, 2.0 + READY_AFTER)


def test_custom_bounds_are_honoured():
    readiness = Readiness(unready_after_s=0.5, ready_after=3)
    assert readiness.observe(None, 0.0)
    assert readiness.observe(BROKEN, 1.0)
    assert not readiness.observe(BROKEN, 1.5)
    assert not readiness.observe(None, 2.0)
    assert not readiness.observe(None, 3.0)
    assert readiness.observe(None, 4.0)


async def ping_time(client: redis.asyncio.Redis) -> float:
    """How long one PING takes to be answered."""
    started = time.monotonic()
    await client.ping()
    return time.monotonic() - started


PAUSE_MS = 1500
READYZ_MAX_S = 0.5  # each /readyz answer: the cached verdict, never a wait on the stalled Redis
POLL_S = 0.05


async def test_a_redis_stall_shorter_than_the_bound_keeps_readyz_200_and_fast(
    start_service: StartService,
):
    assert PAUSE_MS / 1000 + 1.0 < UNREADY_AFTER_S  # the stall (plus a ping timeout) is short
    own_redis = RedisServer().start()
    pauser = redis.asyncio.Redis.from_url(own_redis.url)
    stalled = redis.asyncio.Redis.from_url(own_redis.url)  # proves the server really stalled
    try:
        running = await start_service(redis_url=own_redis.url)
        service = running.service
        assert (await running.client.get("/readyz")).status == 200
        await stalled.ping()  # connected before the pause

        # record what the background probe sees (the real observe still decides)
        probes: list[tuple[float, str | None]] = []
        observe = service.readiness.observe

        def recording(failure: str | None, now_s: float) -> bool:
            probes.append((now_s, failure))
            return observe(failure, now_s)

        service.readiness.observe = recording  # type: ignore[method-assign]
        # start the pause a little before the next probe so that probe hangs on it (its ping
        # times out inside the pause): the stall is then seen, and must not flip readiness
        await eventually(lambda: len(probes) >= 1, 3 * PROBE_INTERVAL_S, "a background probe")
        await asyncio.sleep(max(0.0, probes[-1][0] + PROBE_INTERVAL_S - 0.25 - time.monotonic()))

        assert await pauser.client_pause(PAUSE_MS, all=True)
        paused_at = time.monotonic()
        stalled_ping = asyncio.create_task(ping_time(stalled))
        answers: list[tuple[float, int, float]] = []  # (s since the pause, status, s taken)
        until = paused_at + PAUSE_MS / 1000 + 1.0
        while time.monotonic() < until:
            asked = time.monotonic()
            status = (await running.client.get("/readyz")).status
            answers.append((asked - paused_at, status, time.monotonic() - asked))
            await asyncio.sleep(POLL_S)
        stall_seen_s = await stalled_ping

        unready = [answer for answer in answers if answer[1] != 200]
        assert not unready, f"a {PAUSE_MS} ms stall flipped /readyz: {unready}"
        slow = [answer for answer in answers if answer[2] >= READYZ_MAX_S]
        assert not slow, f"/readyz waited on the stalled Redis: {slow}"
        assert stall_seen_s >= PAUSE_MS / 1000 - 0.2, "CLIENT PAUSE did not stall the server"
        during = [answer for answer in answers if answer[0] < PAUSE_MS / 1000]
        assert len(during) >= 10, answers  # /readyz was really asked while Redis stalled
        failed = [probe for probe in probes if probe[1] is not None and probe[0] >= paused_at]
        assert failed, f"the background probe never saw the stall: {probes}"
        assert service.readiness.ready
        assert not service.broken.is_set()
    finally:
        await pauser.aclose()
        await stalled.aclose()
        own_redis.stop()
