"""One call in flight per consumer for acks (and one for nacks), carrying all that is ready.

Every claimed batch used to send its own acks. In a burst (5,000 deliveries a second over 16
slots) most claims bring one or two messages, so that was a call per message and, at the start
of a burst, dozens of calls at once: each opened a new pooled Redis connection, and the
handshakes of ~45 of them kept the event loop busy for ~40 ms, during which due slots were not
claimed (measured: the burst's worst lateness, 16-23 ms, all in its first 50 ms). `Coalescer`
sends one call at a time with everything submitted while the previous call was out: under load
the calls grow instead of multiplying, and a quiet consumer still sends each ack at once.

Sending twice is safe for every call this carries (acks and nacks name their lease), so a
failed call fails each of its submitters, who handle it as their own call's failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """`await submit(items)` returns `send`'s results for `items`, in their order; `send` runs
    with the items of every submitter waiting meanwhile and returns one result per item, or
    none at all (`Consumer._settled` when replicas did not confirm a refused call)."""

    def __init__(self, send: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._send = send
        self._waiting: list[tuple[Sequence[T], asyncio.Future[list[R]]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def submit(self, items: Sequence[T]) -> list[R]:
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._waiting.append((items, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                taken, self._waiting = self._waiting, []
                try:
                    results = await self._send([item for items, _ in taken for item in items])
                except Exception as error:  # each submitter handles it as its own call's
                    for _, future in taken:
                        if not future.done():
                            future.set_exception(error)
                    continue
                except BaseException:  # cancelled (the loop is closing): nobody waits in vain
                    for _, future in [*taken, *self._waiting]:
                        future.cancel()
                    raise
                start = 0
                for items, future in taken:
                    if not future.done():  # a submitter cancelled meanwhile is not answered
                        future.set_result(results[start : start + len(items)])
                    start += len(items)
        finally:
            self._flushing = None
