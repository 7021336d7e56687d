"""The server clock estimate keeps the least delayed claim reply (pure: replies as numbers)."""

from __future__ import annotations

import time

import pytest

from delayq.queue.server_clock import (
    DECAY_MS_PER_S,
    LEAD_RISE_MS_PER_S,
    MAX_LEAD_MS,
    REBASE_MS,
    ServerClock,
)


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


def _claim(clock: ServerClock, server_ms: float, sent_s: float, received_s: float) -> None:
    clock.note(round(server_ms * 1000), received_s, sent_s)


def _lead_ms(clock: ServerClock) -> float:
    return clock.arrival_ms() - clock.now_ms()


def test_claims_teach_the_clock_how_far_ahead_to_send_them():
    """A claim sent at 10.000 s ran on the server 0.8 ms later than the estimate said at its
    sending (offset 5000 ms; its reply came back 0.2 ms after it ran): a claim sent now would
    run 0.8 ms past the estimate, so that is when it is due to be sent. Without a send time
    (the estimate alone) there is no lead."""
    estimated = ServerClock()
    _reply(estimated, 5000 + 10_000.0, 10.0)
    assert _lead_ms(estimated) == pytest.approx(0.0, abs=0.01)
    clock = ServerClock()
    _claim(clock, 5000 + 10_100.8, 10.1, 10.101)
    assert _offset_ms(clock) == pytest.approx(5000 - 0.2, abs=0.01)
    assert _lead_ms(clock) == pytest.approx(1.0, abs=0.01)  # 0.8 to run, 0.2 the estimate lags


def test_the_lead_is_the_quickest_claim_s_and_climbs_back_slowly():
    """An early claim (its message not due yet when it ran) took less than the lead: its own
    is the lead at once, so the next claim is aimed later, never sent again and again. Slower
    claims raise it by LEAD_RISE_MS_PER_S at most, and it never passes MAX_LEAD_MS nor goes
    below zero."""
    clock = ServerClock()
    _claim(clock, 5000 + 10_001.0, 10.0, 10.0012)  # offset 4999.8: lead 1.2
    assert _lead_ms(clock) == pytest.approx(1.2, abs=0.01)
    _claim(clock, 5000 + 10_010.4, 10.01, 10.0106)  # a quick one: 0.6
    assert _lead_ms(clock) == pytest.approx(0.6, abs=0.01)
    _claim(clock, 5000 + 12_011.5, 12.01, 12.0117)  # 2 s later, a slow one
    assert _lead_ms(clock) == pytest.approx(0.6 + 2 * LEAD_RISE_MS_PER_S, abs=0.01)
    _claim(clock, 5000 + 100_000.0 + 30, 100.0, 100.0302)  # 30 ms, much later
    assert _lead_ms(clock) == pytest.approx(MAX_LEAD_MS, abs=0.01)
    _reply(clock, 5000 + 110_000.0, 110.0)  # a prompt reply: the offset 5000 exactly
    _claim(clock, 5000 + 110_010.0 - 0.5, 110.01, 110.0101)  # ran "before" it was sent
    assert _lead_ms(clock) == pytest.approx(0.0, abs=0.01)
