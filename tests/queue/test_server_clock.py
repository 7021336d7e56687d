"""The server clock estimate keeps the least delayed claim reply (pure: replies as numbers)."""

from __future__ import annotations

import time

import pytest

from delayq.queue.server_clock import DECAY_MS_PER_S, REBASE_MS, ServerClock


def _offset_ms(clock: ServerClock) -> float:
    """The estimate minus this host's monotonic clock, in ms."""
    return clock.now_ms() - time.monotonic() * 1000


def _reply(clock: ServerClock, server_ms: float, received_s: float) -> None:
    clock.note(round(server_ms * 1000), received_s)


def test_a_late_stamped_reply_does_not_pull_the_estimate_back():
    """Three replies of one server clock (offset 5000 ms), received 0.1, 1.6 and 0.05 ms after
    their scripts ran: after the second the estimate is the first's, aged a little, not the
    second's; the third, the promptest, is taken."""
    clock = ServerClock()
    _reply(clock, 5000 + 10_000.0, 10.0001)
    assert _offset_ms(clock) == pytest.approx(5000 - 0.1, abs=0.01)
    _reply(clock, 5000 + 10_010.0, 10.0116)  # waited 1.6 ms before Python stamped it
    assert _offset_ms(clock) == pytest.approx(5000 - 0.1 - 0.0116 * DECAY_MS_PER_S, abs=0.01)
    _reply(clock, 5000 + 10_020.0, 10.02005)
    assert _offset_ms(clock) == pytest.approx(5000 - 0.05, abs=0.01)  # never ahead of it


def test_the_estimate_ages_so_a_slower_server_clock_is_followed():
    clock = ServerClock()
    _reply(clock, 5000 + 10_000.0, 10.0)
    _reply(clock, 5000 + 20_000.0 - 3.0, 20.0)  # 10 s later, the server's clock 3 ms behind
    assert _offset_ms(clock) == pytest.approx(5000 - 3.0, abs=0.01)


def test_a_server_clock_set_back_is_taken_at_the_next_reply():
    """The first reply a second behind may be a stalled one; the next, received later, says
    the clock was set back: taken then (one claim aimed early in between, which finds nothing
    not due: the scripts decide on the server's own clock)."""
    clock = ServerClock()
    _reply(clock, 5000 + 10_000.0, 10.0)
    _reply(clock, 5000 + 10_010.0 - 1000, 10.01)  # set back a second
    _reply(clock, 5000 + 10_011.0 - 1000, 10.011)
    assert _offset_ms(clock) == pytest.approx(4000, abs=0.01)
    assert REBASE_MS < 1000


def test_one_stalled_reply_does_not_make_the_next_timer_late():
    """Regression: a reply stamped 30 ms late (the event loop busy with a batch) was taken as
    a clock set back, so the estimate fell 30 ms behind and the next timer aimed at a due time
    fired 30 ms late, though the server's clock never moved. Replies of one stalled pipeline
    (several slots, one receipt time) confirm nothing; the next prompt one keeps the
    estimate."""
    clock = ServerClock()
    _reply(clock, 5000 + 10_000.0, 10.0)
    for slot_ms in (0.0, 0.1, 0.2):  # one pipelined claim of three slots, stamped late
        _reply(clock, 5000 + 10_100.0 + slot_ms - 30, 10.1)
    assert _offset_ms(clock) == pytest.approx(5000 - 0.1 * DECAY_MS_PER_S, abs=0.01)
    _reply(clock, 5000 + 10_200.0, 10.2)
    assert _offset_ms(clock) == pytest.approx(5000, abs=0.01)


def test_replies_noted_out_of_order_do_not_age_the_estimate_forward():
    clock = ServerClock()
    _reply(clock, 5000 + 10_000.0, 10.0)
    _reply(clock, 5000 + 9_990.0 - 0.5, 9.99)  # an older reply of another broker, noted last
    assert _offset_ms(clock) == pytest.approx(5000, abs=0.01)
