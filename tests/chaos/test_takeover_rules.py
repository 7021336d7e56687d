"""The takeover rules on synthetic evidence (pure, no processes): each catches what it is about,
and a process's own session loss, recorded from its log, explains what it would cause."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from delayq.queue.topic import slot_of

from .checker import Evidence, Rule, Timing, check
from .cluster import ACK_TIMEOUT_MS, SESSION_TIMEOUT_MS
from .faults import ISOLATED, LOADED, LOADED_S, QUIET_S, Window, plan
from .probes import ReadyAnswer, SlotSample, not_consumed
from .receiver import Arrival
from .test_chaos import FAULT_PHASE_S, SEEDS
from .unplanned import SESSION_LOSS, STALL, session_losses, stalls

TIMING = Timing(
    session_ms=4000, ack_timeout_ms=10_000, webhook_timeout_ms=2000, backoff_max_ms=2000
)
SLOTS = 4
KILL = Window("serve_kill9", "c0", 10_000, 11_000)  # recovered by 17 s


def rules(evidence: Evidence) -> dict[str, Rule]:
    return {rule.name: rule for rule in check(evidence, TIMING).rules}


def evidence(
    samples: list[SlotSample], arrivals: Sequence[Arrival] = (), unplanned: Sequence[Window] = ()
) -> Evidence:
    accepted = {a.message_id: a.due_ms for a in arrivals}
    return Evidence(accepted, list(arrivals), [KILL], {}, [], 0, samples, list(unplanned), SLOTS)


def everyone(at_ms: float, **overrides: tuple[int, ...] | None) -> SlotSample:
    """Slot n granted to c(n % 2) and consumed, but for the members overridden."""
    granted = {slot: f"c{slot % 2}" for slot in range(SLOTS)}
    consumed: dict[str, tuple[int, ...] | None] = {
        member: tuple(s for s, owner in granted.items() if owner == member)
        for member in ("c0", "c1")
    }
    consumed.update(overrides)
    return SlotSample(at_ms, granted, consumed)


@pytest.mark.parametrize("seed", [*SEEDS, 1, 2, 3])
def test_a_plan_ends_with_each_isolated_takeover_alone_and_loaded(seed: int) -> None:
    specs = plan(seed, FAULT_PHASE_S)
    alone = specs[-len(ISOLATED) :]
    assert [spec.kind for spec in alone] == list(ISOLATED)
    assert all(spec.mode == LOADED for spec in alone)
    for index, spec in enumerate(alone):
        low, high = ISOLATED[spec.kind]
        assert low <= spec.duration_s <= high
        for earlier in specs[: len(specs) - len(alone) + index]:
            end = earlier.at_s + earlier.duration_s + (LOADED_S if earlier.mode == LOADED else 0)
            assert spec.at_s >= end + QUIET_S - 0.01  # start rounded to 10 ms
    stop = next(spec for spec in alone if spec.kind == "serve_sigstop")
    assert SESSION_TIMEOUT_MS / 1000 < stop.duration_s < ACK_TIMEOUT_MS / 1000  # a takeover


def test_a_slot_consumed_by_nobody_past_the_recovery_bound_is_flagged() -> None:
    samples = [
        everyone(5_000),  # before any fault: examined, fine
        everyone(16_000, c1=(3,)),  # slot 1 idle within the kill's bound: not examined
        everyone(18_000, c1=(3,)),  # slot 1 idle past it: broken
        everyone(19_000, c1=None),  # c1 does not answer: its slots unknown
    ]
    rule = rules(evidence(samples))["unconsumed"]
    assert (rule.violations, rule.total) == (1, 4 + 4 + 2)
    assert "slots [1]" in rule.examples[0]
    unowned = [SlotSample(at_ms, {0: "c0"}, {"c0": (0,), "c1": ()}) for at_ms in (20_000, 21_000)]
    assert rules(evidence(unowned))["unconsumed"].violations == 3  # no grant at all, for 1 s


def test_a_slot_idle_in_one_sample_outside_any_fault_is_a_handoff() -> None:
    """Released by one process, not yet fenced by the next (a rebalance): idle less than
    HANDOFF_MS is not a stall."""
    samples = [everyone(20_000), everyone(20_500, c1=(3,)), everyone(21_000)]
    assert rules(evidence(samples))["unconsumed"].ok


@pytest.mark.parametrize("kind", [SESSION_LOSS, STALL])
def test_an_idle_slot_of_a_process_with_an_unplanned_fault_is_not_flagged(kind: str) -> None:
    samples = [everyone(16_000, c1=(3,)), everyone(18_000, c1=(3,))]
    assert not rules(evidence(samples))["unconsumed"].ok
    lost = Window(kind, "c1", 14_000, 16_500)  # recovered by 22.5 s
    assert rules(evidence(samples, unplanned=[lost]))["unconsumed"].ok


def message_of_slot(slot: int) -> str:
    return next(f"m{n}" for n in range(1000) if slot_of(f"m{n}", SLOTS) == slot)


def attempts(second_at_ms: float) -> list[Arrival]:
    """Attempt 1 sent by c0 (killed at 10 s), its lease to 19.9 s; attempt 2 by c1."""
    message = message_of_slot(0)
    held = Arrival(message, 1, "c0", 9_950, 9_999, 9_900, 19_900, -1, 10_000)
    deadline = int(second_at_ms) + 10_000
    again = Arrival(message, 2, "c1", second_at_ms, int(second_at_ms), 9_900, deadline, 204)
    return [held, again]


def taken_over() -> list[SlotSample]:
    """c0 down; c1 consumes slot 0 from 15 s on (its fence rolled c0's leases back)."""
    before = SlotSample(12_000, {1: "c1", 3: "c1"}, {"c0": None, "c1": (1, 3)})
    after = SlotSample(
        15_000, {0: "c1", 1: "c1", 2: "c1", 3: "c1"}, {"c0": None, "c1": (0, 1, 2, 3)}
    )
    return [before, after]


def test_a_message_that_waited_its_lease_after_a_takeover_is_flagged() -> None:
    waited = rules(evidence(taken_over(), attempts(20_100)))["waited_lease"]
    assert (waited.violations, waited.total) == (1, 1)
    assert "taken over by 15000" in waited.examples[0]
    rolled_back = rules(evidence(taken_over(), attempts(15_200)))["waited_lease"]
    assert (rolled_back.violations, rolled_back.total) == (0, 1)


def test_a_new_owner_losing_its_own_session_explains_a_wait() -> None:
    """c1 fenced the slot in time, then lost its session (no fault injected into it) and sent
    attempt 2 only after c0's lease had ended: its recorded session loss explains it; the kill
    of c0, the holder, never does."""
    lost = Window(SESSION_LOSS, "c1", 15_500, 19_000)
    waited = rules(evidence(taken_over(), attempts(20_100), [lost]))["waited_lease"]
    assert (waited.violations, waited.total) == (0, 0)


def test_a_process_own_session_losses_come_from_its_log_on_the_real_clock() -> None:
    def line(ts: str, msg: str) -> str:
        return json.dumps({"ts": ts, "level": "INFO", "msg": msg})

    lines = [
        line("2026-01-01T00:00:05.000Z", "c1: connected to ZooKeeper"),
        line("2026-01-01T00:00:15.000Z", "c1: ZooKeeper session SUSPENDED: stop claiming"),
        "Traceback (most recent call last):",
        line("2026-01-01T00:00:16.000Z", "c1: ZooKeeper session LOST: stop claiming"),
        line("2026-01-01T00:00:18.500Z", "c1: connected to ZooKeeper"),
        line("2026-01-01T00:00:30.000Z", "c1: ZooKeeper session SUSPENDED: stop claiming"),
    ]
    zero = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
    found = session_losses(lines, "c1", 5_000, 4_000, zero + 40_000)
    assert found == [
        Window(SESSION_LOSS, "c1", zero + 6_000, zero + 13_500),  # 15 s - skew 5 s - session
        Window(SESSION_LOSS, "c1", zero + 21_000, zero + 40_000),  # not back by the end
    ]


def test_a_sender_holding_claimed_messages_over_a_second_is_a_stall() -> None:
    def sent(member: str, claimed_ms: int, at_ms: float) -> Arrival:
        return Arrival("m", 1, member, at_ms, int(at_ms), 0, claimed_ms + 10_000, 204)

    arrivals = [
        sent("c2", 50_000, 53_400),
        sent("c2", 50_300, 53_450),
        sent("c2", 60_000, 60_050),  # sent at once
        sent("c0", 50_000, 50_020),
    ]
    assert stalls(arrivals, 10_000) == [Window(STALL, "c2", 50_000, 53_450)]


def test_a_slot_reported_frozen_by_a_move_is_no_readiness_violation_but_a_dropped_one_is() -> None:
    granted = {0, 1, 2}
    frozen = ReadyAnswer(ready=True, consumed=frozenset({1, 2}), frozen=frozenset({0}))
    dropped = ReadyAnswer(ready=True, consumed=frozenset({1, 2}), frozen=frozenset())
    assert not_consumed(granted, frozen) == ()
    assert not_consumed(granted, dropped) == (0,)
