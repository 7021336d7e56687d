"""The slot movers' thread pool (`kube/fair_pool.py`): no topic fills it."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import pytest

from delayq.kube.fair_pool import FairPool
from delayq.local.waiting import wait_until

DEADLINE_S = 10.0


def test_a_topic_whose_moves_hang_leaves_the_others_their_share():
    """Topic a's moves hang (its tenant paused its Redis: each call waits out its timeout);
    b's move, submitted after a's sixteen, starts at once, and a never runs more than its
    share: half the threads alone, a third beside b. A plain pool (one queue) runs b's move
    only after a's, here never while they hang."""
    pool = FairPool(6, "test")
    hung = threading.Event()
    running = {"a": 0, "most_a": 0}
    count = threading.Lock()

    def a_move() -> None:
        with count:
            running["a"] += 1
            running["most_a"] = max(running["most_a"], running["a"])
        hung.wait(DEADLINE_S)
        with count:
            running["a"] -= 1

    a_moves = [pool.submit("a", a_move) for _ in range(16)]
    b_move = pool.submit("b", lambda: "moved")
    try:
        assert b_move.result(timeout=DEADLINE_S) == "moved"
        wait_until(lambda: running["a"] == 3, DEADLINE_S, "a at its share")
    finally:
        hung.set()
    wait(a_moves, timeout=DEADLINE_S)
    assert all(move.done() and move.exception() is None for move in a_moves)
    assert running["most_a"] == 3  # 6 // (1 + 1) alone, 6 // (2 + 1) beside b

    plain = ThreadPoolExecutor(6)
    hung.clear()
    stuck = [plain.submit(hung.wait, DEADLINE_S) for _ in range(16)]
    late = plain.submit(lambda: "moved")
    assert wait([late], timeout=0.5).not_done  # behind a's: what the fair pool prevents
    hung.set()
    everything: list[Future[Any]] = [*stuck, late]
    wait(everything, timeout=DEADLINE_S)
    plain.shutdown()


def test_results_errors_and_cancellations_go_through_the_futures():
    pool = FairPool(2, "test")
    assert pool.submit("k", pow, 2, 10).result(timeout=DEADLINE_S) == 1024
    with pytest.raises(ZeroDivisionError):
        pool.submit("k", lambda: 1 // 0).result(timeout=DEADLINE_S)
    gate = threading.Event()
    first = pool.submit("k", gate.wait, DEADLINE_S)  # k's share alone: 2 // 2 = 1
    ran: list[int] = []
    queued = pool.submit("k", ran.append, 1)
    assert queued.cancel()  # not started: it never runs
    gate.set()
    assert first.result(timeout=DEADLINE_S)
    assert pool.submit("k", ran.append, 2).result(timeout=DEADLINE_S) is None
    assert ran == [2]
