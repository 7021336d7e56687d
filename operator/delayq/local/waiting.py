"""Waiting for a condition with a deadline: the one way tests, e2e, benchmarks and launchers wait.

Nothing here sleeps and hopes: `wait_until` (blocking) and `eventually` (async) poll a condition
until it returns something truthy, return that value, and raise `TimeoutError` naming `what`
once `timeout_s` has passed. Both take the same arguments in the same order:
`(condition, timeout_s, what)`, then keyword-only tuning.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

#: Default polling interval: short enough to be invisible next to the waits it serves.
INTERVAL_S = 0.01


def wait_until(
    condition: Callable[[], T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = INTERVAL_S,
    abort: Callable[[], str | None] | None = None,
    not_yet: tuple[type[Exception], ...] = (),
) -> T:
    """Poll `condition` until it returns a truthy value and return that value.

    At the deadline raise `TimeoutError` naming `what` (and the last value or error seen).
    `abort`, consulted on every round, returns a reason to give up at once (a crashed server)
    and turns into a `RuntimeError`. Exceptions of the `not_yet` types raised by `condition`
    count as "not yet"; any other exception propagates.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if abort is not None and (reason := abort()) is not None:
            raise RuntimeError(f"gave up waiting for {what}: {reason}")
        try:
            result = condition()
        except not_yet as error:
            last = f"{type(error).__name__}: {error}"
        else:
            if result:
                return result
            last = f"last value: {_short(result)}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what} ({last})")
        time.sleep(interval_s)


@overload
async def eventually(
    condition: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T | None], timeout_s: float, what: str, *, interval_s: float = ...
) -> T: ...


async def eventually(
    condition: Callable[[], object],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = INTERVAL_S,
) -> object:
    """Await until `condition` (plain or async) returns a truthy value and return that value.

    At the deadline raise `TimeoutError` naming `what` (and the last value seen); exceptions
    raised by `condition` propagate.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout_s:.1f}s waiting for {what} "
                f"(last value: {_short(result)})"
            )
        await asyncio.sleep(interval_s)


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
