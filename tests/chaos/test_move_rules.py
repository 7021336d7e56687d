"""The moves' faults in the plan and in the checker (pure, no processes): a move killed in each
step and a doubling are planned among the overlapping faults, one at a time; past a killed
move's recovery bound an idle slot or a late message is flagged; after a doubling the doubled
slot numbers are the ones judged; a message whose cancel was acknowledged is never delivered."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from delayq.queue.topic import slot_of

from .checker import Evidence, Rule, Timing, check
from .faults import ISOLATED, LOADED, MOVE_KILL, MOVER, SERVES, SPLIT_KILL, Window, plan
from .moves import MOVE_STEPS, SPLIT_STEPS
from .probes import SlotSample
from .receiver import Arrival
from .test_chaos import FAULT_PHASE_S, MOVES, SEEDS

TIMING = Timing(
    session_ms=4000, ack_timeout_ms=10_000, webhook_timeout_ms=2000, backoff_max_ms=2000
)
SLOTS = 4
# a move of slot 1 killed in its copy at 10 s, completed at 20 s (recovered by 26 s); the
# owner of the slot, c1, killed meanwhile
MOVE = [
    Window(MOVE_KILL, MOVER, 10_000, 20_000, "copy"),
    Window("serve_kill9", "c1", 10_100, 13_000),
]


def rules(evidence: Evidence) -> dict[str, Rule]:
    return {rule.name: rule for rule in check(evidence, TIMING).rules}


def evidence(
    samples: Sequence[SlotSample] = (),
    arrivals: Sequence[Arrival] = (),
    cancelled: dict[str, tuple[float, int]] | None = None,
) -> Evidence:
    accepted = {a.message_id: a.due_ms for a in arrivals}
    return Evidence(
        accepted, list(arrivals), MOVE, {}, [], 0, list(samples), [], SLOTS, cancelled or {}
    )


def sample(at_ms: float, amount: int, idle: tuple[int, ...] = ()) -> SlotSample:
    """Every slot of `amount` granted to c(n % 2) and consumed, but `idle`."""
    granted = {slot: f"c{slot % 2}" for slot in range(amount)}
    consumed = {
        member: tuple(s for s, o in granted.items() if o == member and s not in idle)
        for member in ("c0", "c1")
    }
    return SlotSample(at_ms, granted, dict(consumed), amount)


def delivered(message_id: str, due_ms: int, late_ms: float, member: str = "c0") -> Arrival:
    at_ms = due_ms + late_ms
    return Arrival(message_id, 1, member, at_ms, int(at_ms), due_ms, int(at_ms) + 10_000, 204)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_plan_runs_its_moves_then_the_doubling_among_the_overlapping_faults(seed: int) -> None:
    moves, split = MOVES[seed]
    specs = plan(seed, FAULT_PHASE_S, moves=moves, split=split)
    moving = [s for s in specs if s.target == MOVER]  # one lock: one after another
    assert [(s.kind, s.mode) for s in moving] == [(MOVE_KILL, step) for step in moves] + [
        (SPLIT_KILL, split)
    ]
    assert all(s.victim in SERVES for s in moving)
    assert moving[0].at_s < max(s.at_s for s in specs if s.mode != LOADED and s not in moving)
    isolated = specs[-len(ISOLATED) :]  # last: the injector holds each back until QUIET_S
    assert [(s.kind, s.mode) for s in isolated] == [(kind, LOADED) for kind in ISOLATED]


def test_the_seeds_kill_a_mover_in_every_step_and_the_splitter_in_each_of_its_steps() -> None:
    assert {step for moves, _ in MOVES.values() for step in moves} == set(MOVE_STEPS)
    assert {split for _, split in MOVES.values()} == set(SPLIT_STEPS)
    assert set(MOVES) == set(SEEDS)


def test_past_a_killed_moves_recovery_bound_an_idle_slot_or_a_late_message_is_flagged() -> None:
    samples = [sample(12_000, SLOTS, idle=(1,)), sample(25_000, SLOTS, idle=(1,))]
    assert rules(evidence(samples))["unconsumed"].ok  # within [start, 20 s + 4 s + 2 s]
    samples.append(sample(27_000, SLOTS, idle=(1,)))
    unconsumed = rules(evidence(samples))["unconsumed"]
    assert (unconsumed.violations, unconsumed.total) == (1, SLOTS)
    arrivals = [delivered("in", 15_000, 9_000), delivered("after", 27_000, 1_500)]
    stalled = rules(evidence(arrivals=arrivals))["stalled"]
    assert (stalled.violations, stalled.total) == (1, 1)
    assert stalled.examples[0].startswith("after ")


def test_after_a_doubling_its_slot_numbers_are_judged() -> None:
    """The samples carry the routing's slot amount: after the doubling (4 -> 8) a half idle
    past every bound is flagged, and a takeover of a message's half is seen."""
    samples = [sample(30_000, 2 * SLOTS, idle=(6,)), sample(31_500, 2 * SLOTS, idle=(6,))]
    unconsumed = rules(evidence(samples))["unconsumed"]
    assert (unconsumed.violations, unconsumed.total) == (1, 2 * 2 * SLOTS)
    assert "slots [6]" in unconsumed.examples[0]
    message = next(f"m{n}" for n in range(1000) if slot_of(f"m{n}", 2 * SLOTS) == 5)
    held = Arrival(message, 1, "c0", 40_000, 40_000, 39_000, 50_000, -1, 40_100)
    again = Arrival(message, 2, "c1", 50_100, 50_100, 39_000, 60_100, 204)
    taken = [sample(42_000, 2 * SLOTS)]  # slot 5 consumed by c1 (5 % 2)
    waited = rules(evidence(taken, [held, again]))["waited_lease"]
    assert (waited.violations, waited.total) == (1, 1)


def test_a_message_whose_cancel_was_acknowledged_is_never_delivered() -> None:
    cancelled = {"gone": (5_000.0, 9_000), "raced": (8_500.0, 9_000), "quiet": (5_000.0, 9_000)}
    arrivals = [delivered("gone", 9_000, 10), delivered("raced", 9_000, 10)]
    rule = rules(evidence(arrivals=arrivals, cancelled=cancelled))["cancelled_delivered"]
    # "raced" was cancelled 500 ms before due (it may have been in flight): not examined
    assert (rule.violations, rule.total) == (1, 2)
    assert rule.examples[0].startswith("gone: cancel acknowledged at 5000")
