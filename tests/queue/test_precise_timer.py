"""`PreciseTimer`: one callback at an instant, on a timerfd the loop watches (Linux), else
`call_later`. What a test can assert without timing: never before the instant, once, the latest
`arm` wins, `cancel` holds even for an expiry the loop has not read yet, and `close` releases
the descriptor. How much earlier than asyncio's own timers it fires is a benchmark's figure
(docs/benchmarks.md, "Timers to the tenth of a millisecond")."""

from __future__ import annotations

import asyncio
import os
import select
import time

import pytest

from delayq.queue import precise_timer
from delayq.queue.precise_timer import PreciseTimer

DEADLINE_S = 5.0


class Fires:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.at.append(time.monotonic())
        self.event.set()


async def _after(delay_s: float) -> None:
    """Wait for another timer of the same kind: whatever the first would do by then, it did."""
    sentinel = Fires()
    timer = PreciseTimer(sentinel)
    timer.arm(delay_s)
    try:
        await asyncio.wait_for(sentinel.event.wait(), DEADLINE_S)
    finally:
        timer.close()


def _armed_on_a_timerfd(delay_s: float) -> tuple[Fires, PreciseTimer, int]:
    """A timer armed `delay_s` ahead and its timerfd; skips where there is none."""
    fires = Fires()
    timer = PreciseTimer(fires)
    timer.arm(delay_s)
    if timer._fd is None:
        timer.close()
        pytest.skip("no timerfd here: the fallback is asyncio's call_later")
    return fires, timer, timer._fd


async def test_a_timer_fires_once_and_never_before_its_instant() -> None:
    fires = Fires()
    timer = PreciseTimer(fires)
    armed = time.monotonic()
    timer.arm(0.02)
    await asyncio.wait_for(fires.event.wait(), DEADLINE_S)
    await _after(0.03)
    timer.close()
    assert len(fires.at) == 1
    assert fires.at[0] >= armed + 0.02


async def test_the_latest_arm_decides_the_instant() -> None:
    sooner, later = Fires(), Fires()
    brought_forward, put_off = PreciseTimer(sooner), PreciseTimer(later)
    brought_forward.arm(60)
    brought_forward.arm(0.01)
    put_off.arm(0.01)
    put_off.arm(60)
    await asyncio.wait_for(sooner.event.wait(), DEADLINE_S)
    await _after(0.05)
    brought_forward.close()
    put_off.close()
    assert len(sooner.at) == 1
    assert later.at == []


async def test_a_cancel_holds_for_an_expiry_the_loop_has_not_read() -> None:
    """The kernel has expired the timer, the loop has not run its reader yet (it is busy with
    this coroutine): the cancel must not let that expiry fire later."""
    fires, timer, descriptor = _armed_on_a_timerfd(0.001)
    readable, _, _ = select.select([descriptor], [], [], DEADLINE_S)  # expired, not read
    assert readable
    timer.cancel()
    await _after(0.02)
    timer.close()
    assert fires.at == []


async def test_arming_again_drops_an_expiry_the_loop_has_not_read() -> None:
    fires, timer, descriptor = _armed_on_a_timerfd(0.001)
    readable, _, _ = select.select([descriptor], [], [], DEADLINE_S)  # expired, not read
    assert readable
    timer.arm(60)
    await _after(0.02)
    timer.close()
    assert fires.at == []


async def test_a_cancel_after_the_timer_fired_asks_the_kernel_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer cancels after every sleep, most of them ended by the timer itself: that
    cancel makes no system call, and the timer still arms and cancels as before."""
    fires, timer, _ = _armed_on_a_timerfd(0.001)
    await asyncio.wait_for(fires.event.wait(), DEADLINE_S)
    settings: list[object] = []
    set_time = timer._set

    def counted(at: precise_timer._Timespec) -> None:
        settings.append(at)
        set_time(at)

    monkeypatch.setattr(timer, "_set", counted)
    timer.cancel()
    timer.cancel()
    assert settings == []
    timer.arm(60)
    timer.cancel()
    await _after(0.02)
    timer.close()
    assert len(settings) == 2  # the arm, then the one cancel that had something to disarm
    assert len(fires.at) == 1


async def test_close_releases_the_descriptor_and_a_later_arm_opens_another() -> None:
    fires, timer, descriptor = _armed_on_a_timerfd(60)
    timer.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(descriptor)
    timer.arm(0.01)
    await asyncio.wait_for(fires.event.wait(), DEADLINE_S)
    timer.close()
    assert len(fires.at) == 1


async def test_without_a_timerfd_the_loop_s_own_timer_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precise_timer, "_LIBC", None)
    fires = Fires()
    timer = PreciseTimer(fires)
    armed = time.monotonic()
    timer.arm(0.01)
    assert timer._fd is None
    await asyncio.wait_for(fires.event.wait(), DEADLINE_S)
    timer.arm(0.01)
    timer.cancel()
    await _after(0.03)
    timer.close()
    assert len(fires.at) == 1
    assert fires.at[0] >= armed + 0.01
