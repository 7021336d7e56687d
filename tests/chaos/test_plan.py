"""The seeded fault plan and the checker's explanations (pure, no processes)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from .checker import Evidence, Timing, check
from .faults import KINDS, MAX_CONCURRENT, Window, plan, recovery_s
from .receiver import Arrival
from .test_chaos import FAULT_PHASE_S, SEEDS

TIMING = Timing(session_ms=4000, ack_timeout_ms=5000, webhook_timeout_ms=2000, backoff_max_ms=2000)


@pytest.mark.parametrize("seed", [*SEEDS, 1, 2, 3])
def test_a_plan_has_every_kind_and_never_two_faults_on_one_target(seed: int) -> None:
    specs = plan(seed, FAULT_PHASE_S)
    assert {spec.kind for spec in specs} == set(KINDS)
    assert plan(seed, FAULT_PHASE_S) == specs  # seeded: the same seed, the same plan
    by_target = defaultdict(list)
    for spec in specs:
        by_target[spec.target].append((spec.at_s, spec.at_s + spec.duration_s))
    for spans in by_target.values():
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    for spec in specs:  # at most MAX_CONCURRENT at any fault's start
        active = [
            s
            for s in specs  # start times are rounded to 10 ms
            if s.at_s <= spec.at_s < s.at_s + s.duration_s + recovery_s(s.kind) - 0.01
        ]
        assert len(active) <= MAX_CONCURRENT


def arrival(message_id: str, attempt: int, at_ms: float, status: int = 204) -> Arrival:
    return Arrival(message_id, attempt, "c0", at_ms, int(at_ms), 1000, None, status, at_ms + 1)


def test_a_duplicate_is_explained_only_near_a_lossy_fault() -> None:
    accepted = {"a": 1000, "b": 1000}
    arrivals = [
        arrival("a", 1, 10_000),
        arrival("a", 2, 16_000),  # first copy inside a kill: explained
        arrival("b", 1, 60_000),
        arrival("b", 2, 66_000),  # far from any fault: not explained
    ]
    windows = [Window("serve_kill9", "c0", 9_000, 11_000), Window("receiver_5xx", "r", 0, 70_000)]
    verdict = check(Evidence(accepted, arrivals, windows, {}, [], 0), TIMING)
    rules = {rule.name: rule for rule in verdict.rules}
    assert rules["unexplained_duplicates"].violations == 1
    assert rules["unexplained_duplicates"].examples[0].startswith("b:")
    assert rules["lost"].violations == 0


def test_a_duplicate_whose_first_copy_outlived_the_senders_timeout_is_explained() -> None:
    """The receiver took the first copy from its socket after the sender's POST timeout (the
    sender had counted it failed and retried): at-least-once, not a bug."""
    late = Arrival("c", 1, "c0", 30_000, 30_000 - TIMING.webhook_timeout_ms - 500, 1000, None)
    late.status = 204
    arrivals = [late, arrival("c", 2, 34_000)]
    verdict = check(Evidence({"c": 1000}, arrivals, [], {}, [], 0), TIMING)
    rules = {rule.name: rule for rule in verdict.rules}
    assert rules["unexplained_duplicates"].violations == 0


def test_early_lost_and_after_lease_are_counted() -> None:
    accepted = {"early": 10_000, "lost": 10_000, "late": 10_000}
    arrivals = [
        arrival("early", 1, 9_990),
        arrival("lost", 1, 10_001, status=503),
        Arrival("late", 1, "c1", 20_000, 10_000, 10_000, None, 204, 20_001),
    ]
    verdict = check(Evidence(accepted, arrivals, [], {}, [], 0), TIMING)
    counts = {rule.name: rule.violations for rule in verdict.rules}
    assert counts["early"] == 1
    assert counts["lost"] == 1
    assert counts["after_lease"] == 1  # signed at 10 s, lease 5 s, arrived at 20 s


def test_a_skipped_attempt_is_explained_by_a_lossy_fault_in_the_lookback_before_it() -> None:
    """c0 claimed "s" (attempt 1) and was killed at 10 s before sending it; the new owner's
    fence rolled the lease back at the takeover, and attempt 2 arrived at 16 s: explained by
    the kill 6 s earlier. Nothing explains "t", with no fault in the lookback before it."""
    accepted = {"s": 9_000, "t": 9_000}
    arrivals = [arrival("s", 2, 16_000), arrival("t", 2, 40_000)]
    windows = [Window("serve_kill9", "c0", 10_000, 12_000)]
    verdict = check(Evidence(accepted, arrivals, windows, {}, [], 0), TIMING)
    rules = {rule.name: rule for rule in verdict.rules}
    assert (rules["skipped_attempts"].violations, rules["skipped_attempts"].total) == (1, 2)
    assert rules["skipped_attempts"].examples[0].startswith("t:")
