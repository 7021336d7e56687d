"""Retry backoff after a failed delivery (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: base_ms * factor^(attempt-1), capped at max_ms.

    The nack script adds the result to the Redis server's clock, so the wait is honoured exactly:
    the retry is never claimable before it.
    """

    base_ms: int = 1000
    factor: float = 2.0
    max_ms: int = 3_600_000

    def delay_ms(self, attempt: int) -> int:
        exponent = max(0, attempt - 1)
        # cap the exponent first so huge attempt numbers cannot overflow a float
        if exponent > 64:
            return self.max_ms
        return int(min(self.max_ms, self.base_ms * self.factor**exponent))
