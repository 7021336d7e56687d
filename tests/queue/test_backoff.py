"""The retry policy: exponential, capped, and with full jitter spread between 0 and the cap."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from delayq.queue.backoff import Backoff, Jitter


def test_exponential_and_capped() -> None:
    backoff = Backoff(base_ms=100, multiplier=3.0, max_ms=1000)
    assert [backoff.delay_ms(n) for n in range(1, 6)] == [100, 300, 900, 1000, 1000]
    assert Backoff(base_ms=250, multiplier=1.0).delay_ms(40) == 250  # a fixed delay
    assert backoff.delay_ms(10**9) == 1000  # no float overflow


@given(attempt=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_full_jitter_stays_between_zero_and_the_ceiling(attempt: int, seed: int) -> None:
    backoff = Backoff(base_ms=50, multiplier=2.0, max_ms=60_000, jitter=Jitter.FULL)
    assert 0 <= backoff.delay_ms(attempt, random.Random(seed)) <= backoff.ceiling_ms(attempt)


def test_full_jitter_spreads_a_herd() -> None:
    backoff = Backoff(base_ms=10_000, jitter=Jitter.FULL)
    rng = random.Random(7)
    delays = [backoff.delay_ms(1, rng) for _ in range(1000)]
    # uniform over [0, 10 s]: every tenth of the range gets a share, none gets the herd
    shares = [sum(1 for d in delays if k * 1000 <= d < (k + 1) * 1000) for k in range(10)]
    assert min(shares) > 50
    assert max(shares) < 150
