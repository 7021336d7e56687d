"""A receiver's Retry-After header read as the hold it asks for, whatever it holds (pure)."""

from __future__ import annotations

import pytest

from delayq.service.delivery.webhook import retry_after_ms


@pytest.mark.parametrize(
    "value", ["1 Jan 99999999999999999999 00:00:00 GMT", "99999999999999999999 Feb 01 00:00:00"]
)
def test_a_date_past_any_clock_is_no_hold_not_a_crash(value: str) -> None:
    """Regression: the email date parser raised OverflowError on a year past a C long, out of
    the sink: a single POST failed as "OverflowError: ..." without the 5xx's shrink of the
    POSTs in flight, a batch's task died unretrieved (a traceback in the log, every message
    "batch not sent"). Unreadable is no hold: the answer is an ordinary failure."""
    assert retry_after_ms(value, 1_700_000_000.0) is None
