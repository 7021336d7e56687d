"""Retry backoff after a failed delivery (pure but for the jitter's random draw)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class Jitter(enum.StrEnum):
    """How a retry delay is spread: `none` waits exactly the exponential delay; `full` waits a
    uniformly random time between 0 and it, so receivers that failed together (an outage, a
    deploy) are not retried together in one herd at every step."""

    NONE = "none"
    FULL = "full"


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: base_ms * multiplier^(attempt-1), capped at max_ms, then jittered.

    The nack script adds the result to the Redis server's clock, so the wait is honoured exactly:
    the retry is never claimable before it.
    """

    base_ms: int = 1000
    multiplier: float = 2.0
    max_ms: int = 3_600_000
    jitter: Jitter = Jitter.NONE

    def ceiling_ms(self, attempt: int) -> int:
        """The exponential delay before jitter: what `none` waits and `full` waits at most."""
        exponent = max(0, attempt - 1)
        # cap the exponent first so huge attempt numbers cannot overflow a float
        if exponent > 64:
            return self.max_ms
        return int(min(self.max_ms, self.base_ms * self.multiplier**exponent))

    def claim_args(self, rng: random.Random | None = None) -> list[str | int]:
        """The claim script's retry backoff for leases that ran out (claim-13's ARGV 11..14):
        the same policy, with one random fraction per call that it spreads over the messages
        of the call (`full` jitter; '' for none)."""
        spread = repr((rng or _RANDOM).random()) if self.jitter is Jitter.FULL else ""
        return [self.base_ms, repr(float(self.multiplier)), self.max_ms, spread]

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        ceiling = self.ceiling_ms(attempt)
        if self.jitter is Jitter.FULL:
            return (rng or _RANDOM).randint(0, ceiling)
        return ceiling


_RANDOM = random.Random()  # jitter needs spread, not secrecy
