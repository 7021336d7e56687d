"""A thread pool shared by every topic's slot moves that no topic can fill.

The operator moves slots in threads (a move is blocking Redis and ZooKeeper calls), a fixed
number of them for the whole process: each move holds a page of a tenant's slot in memory, so
their number bounds the operator's memory. A plain pool serves tasks in the order they came:
a topic whose moves hang (its tenant paused its own Redis, which its Secret lets it do: each
call then waits out its 10 s timeout) held every thread whenever it had submitted first, and
every other topic's resharding waited behind it, pass after pass.

Here each topic (`key`) has a queue of its own, and a topic runs at most its share of the
threads at once: `workers // (topics with work + 1)`, at least one. The `+ 1` keeps room for a
topic that comes next, so a lone topic takes at most half the threads and a newcomer starts at
once; a topic's queued tasks wait for its own running ones, never for another's. The threads
take the topics in turn. `concurrent.futures` has no such pool: its executors keep one queue.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class FairPool:
    """`workers` threads (started on first use, daemons: a move cannot be cancelled once it
    runs, as with ThreadPoolExecutor) that run each key's tasks, the keys in turn, no key past
    its share."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._lock = threading.Condition()
        self._queued: dict[Hashable, collections.deque[tuple[Future[Any], Callable[[], Any]]]] = {}
        self._running: collections.Counter[Hashable] = collections.Counter()
        self._turn: collections.deque[Hashable] = collections.deque()
        self._threads: list[threading.Thread] = []

    def submit(self, key: Hashable, task: Callable[..., T], *args: Any) -> Future[T]:
        """Queue `task(*args)` under `key`; its Future is done when it ran (or was cancelled
        before it started: then it never runs)."""
        future: Future[T] = Future()
        with self._lock:
            if key not in self._queued:
                self._queued[key] = collections.deque()
                self._turn.append(key)
            self._queued[key].append((future, lambda: task(*args)))
            if len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._lock.notify()
        return future

    def share(self) -> int:
        """The most tasks of one key that run at once now (under the lock)."""
        busy = len(set(self._queued) | {key for key, n in self._running.items() if n})
        return max(1, self.workers // (busy + 1))

    def _next(self) -> tuple[Hashable, Future[Any], Callable[[], Any]] | None:
        """The first key in turn with a queued task and room under its share (under the lock);
        it goes to the end of the turn."""
        share = self.share()
        for _ in range(len(self._turn)):
            key = self._turn[0]
            self._turn.rotate(-1)
            if self._running[key] < share:
                future, task = self._queued[key].popleft()
                if not self._queued[key]:
                    del self._queued[key]
                    self._turn.remove(key)
                return key, future, task
        return None

    def _work(self) -> None:
        while True:
            with self._lock:
                picked = self._next()
                while picked is None:
                    self._lock.wait()
                    picked = self._next()
                key, future, task = picked
                self._running[key] += 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(task())
                    except BaseException as error:  # the caller reads it from the Future
                        future.set_exception(error)
            finally:
                with self._lock:
                    self._running[key] -= 1
                    self._lock.notify_all()
