"""The counting checker (pure): what the receiver saw, judged against what the API accepted and
the fault windows the injector recorded.

Rules (each a `Rule` with its figure and a few examples):
- lost: every accepted id answered 2xx at least once by the end;
- early: no POST more than `EARLY_TOLERANCE_MS` before the due time the API returned;
- unexplained_duplicates: a second 2xx copy is explained only when the first one arrived in or
  near a window of a fault that can lose an ack (a crash, freeze, cut or outage), or arrived
  after its sender had given up on it (later than its signature time + the POST timeout: the
  receiver took the bytes from its socket late, after the sender timed out and retried);
- stalled: a message due outside every fault's reach (start - 1 s .. restored + session timeout
  + 2 s, or start + lease + 2 s for a fault that may strand a lease with no takeover: STRANDING)
  arrives within `LATE_LIMIT_MS`;
- after_lease: no POST arrives after its attempt's lease deadline, except from a process that
  was frozen meanwhile. The deadline is the service's header when it sends one, else the
  signature's timestamp (taken after the claim, on the Redis clock as the sender estimates it,
  so a skewed host does not shift it) plus the lease length: an upper bound, so a flagged POST
  is surely late;
- skipped_attempts: an attempt k > 1 whose attempt k - 1 never arrived means a lease ran out
  with nothing delivered; only a lossy fault may cause that (a graceful handoff must not);
- readiness: no process said ready while granted a slot it did not consume (nor reported frozen
  by a move or doubling: probes.py), for longer than the service's documented readiness
  hysteresis (a stall must last UNREADY_AFTER_S to count);
- unconsumed: no slot consumed by nobody (no grant, or its grantee answering without it) in a
  prober sample later than a fault's restore + session timeout + 2 s, nor before any fault;
- waited_lease: no message waits a lease after a takeover: once the prober saw another process
  consume the slot of an attempt's holder (TAKEOVER_CLAIM_MS before the attempt's lease ends or
  earlier), the next attempt is claimed and sent before that lease ends (the new owner's fence
  rolls the old leases back).
- cancelled_delivered: a message whose cancel was acknowledged (`cancelled`) at least
  CANCEL_MARGIN_MS before its due time is never POSTed, whatever moved or doubled its slot.
The two takeover rules know, besides the injected faults, the unplanned ones (`unplanned.py`: a
process's own session losses, exits): a fault explains their figures, not the older rules'.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from delayq.queue.topic import slot_of
from delayq.service.readiness import PROBE_INTERVAL_S, UNREADY_AFTER_S

from .faults import LOSSY, Window
from .probes import PERIOD_S, ReadinessViolation, SlotSample
from .receiver import Arrival

EARLY_TOLERANCE_MS = 5
LATE_LIMIT_MS = 1000  # lateness allowed to a message no fault could have touched
IN_FLIGHT_MS = 1000  # how long before a fault a message may still have been in flight
DUPLICATE_AFTER_MS = 2000  # an ack lost in a fault can show up as a copy this long after it
LATE_ARRIVAL_MS = 100  # lateness that counts as "stuck" for the gap figure
EXAMPLES = 5
SIGNED_SLACK_MS = 100  # the signature time is the sender's estimate of the Redis clock
RECOVERED_MS = 2000  # past the session timeout, after a fault is restored: slots consumed again
HANDOFF_MS = 1000  # a slot idle for less is being handed over, not stalled
TAKEOVER_CLAIM_MS = 1000  # a new owner claims and sends a rolled-back lease this soon
CANCEL_MARGIN_MS = 1000  # a cancel acknowledged this long before the due time: nothing in flight
# faults that may lose an ack without any takeover (the lease then runs out); the other kinds'
# stranded leases are rolled back by the takeover's fence, within the recovery bound
STRANDING = frozenset({"serve_cut_all", "redis_kill9", "redis_pause", "redis_sleep", "redis_full"})
# faults that cannot stop a process from consuming its slots: no excuse for a takeover rule
HARMLESS_TO_OWNERSHIP = frozenset({"receiver_5xx"})


@dataclass(frozen=True)
class Timing:
    """The fleet's timeouts, which the bounds are made of."""

    session_ms: int
    ack_timeout_ms: int
    webhook_timeout_ms: int
    backoff_max_ms: int


@dataclass
class Rule:
    name: str
    violations: int
    total: int = 0  # what was examined (or counted before explanations)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def add(self, example: str) -> None:
        self.violations += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(example)


@dataclass
class Evidence:
    accepted: dict[str, int]  # id -> due ms the API returned
    arrivals: list[Arrival]
    windows: list[Window]
    skew_ms: dict[str, float]  # member -> its clock's offset from the real one
    readiness: list[ReadinessViolation]
    readiness_samples: int
    samples: list[SlotSample] = field(default_factory=list)  # the prober's, in time order
    unplanned: list[Window] = field(default_factory=list)  # own session losses, exits
    slot_amount: int = 1
    cancelled: dict[str, tuple[float, int]] = field(default_factory=dict)  # id -> (ack ms, due)


@dataclass
class Verdict:
    rules: list[Rule]
    figures: dict[str, Any]

    @property
    def failed(self) -> list[Rule]:
        return [rule for rule in self.rules if not rule.ok]

    def summary(self) -> dict[str, Any]:
        return {
            rule.name: {"violations": rule.violations, "of": rule.total, "e.g.": rule.examples}
            for rule in self.rules
        }


def ok_2xx(arrival: Arrival) -> bool:
    return 200 <= arrival.status < 300


def check(evidence: Evidence, timing: Timing) -> Verdict:
    by_id: dict[str, list[Arrival]] = defaultdict(list)
    for arrival in sorted(evidence.arrivals, key=lambda a: a.at_ms):
        by_id[arrival.message_id].append(arrival)
    first = {mid: arrivals[0].at_ms for mid, arrivals in by_id.items()}
    rules = [
        _lost(evidence, by_id),
        _early(evidence),
        _duplicates(evidence, by_id, timing),
        _stalled(evidence, first, timing),
        _after_lease(evidence, timing),
        _skipped(evidence, by_id, timing),
        _readiness(evidence),
        _unconsumed(evidence, timing),
        _waited_lease(evidence, by_id, timing),
        _cancelled_delivered(evidence, by_id),
    ]
    return Verdict(rules, _figures(evidence, by_id, first, timing))


def _lost(evidence: Evidence, by_id: dict[str, list[Arrival]]) -> Rule:
    rule = Rule("lost", 0, len(evidence.accepted))
    for message_id in sorted(evidence.accepted):
        if not any(ok_2xx(a) for a in by_id.get(message_id, ())):
            seen = len(by_id.get(message_id, ()))
            rule.add(f"{message_id} due {evidence.accepted[message_id]:.0f}: {seen} POSTs, no 2xx")
    return rule


def _cancelled_delivered(evidence: Evidence, by_id: dict[str, list[Arrival]]) -> Rule:
    rule = Rule("cancelled_delivered", 0)
    for message_id, (acked_ms, due_ms) in sorted(evidence.cancelled.items()):
        if due_ms - acked_ms < CANCEL_MARGIN_MS:
            continue
        rule.total += 1
        for arrival in by_id.get(message_id, ())[:1]:
            rule.add(
                f"{message_id}: cancel acknowledged at {acked_ms:.0f}, {due_ms - acked_ms:.0f} ms "
                f"before due; POSTed by {arrival.member} a{arrival.attempt} at {arrival.at_ms:.0f}"
            )
    return rule


def _early(evidence: Evidence) -> Rule:
    rule = Rule("early", 0, len(evidence.arrivals))
    for arrival in evidence.arrivals:
        due = evidence.accepted.get(arrival.message_id, arrival.due_ms)
        if arrival.at_ms < due - EARLY_TOLERANCE_MS:
            rule.add(
                f"{arrival.message_id} attempt {arrival.attempt} by {arrival.member} "
                f"{due - arrival.at_ms:.0f} ms early"
            )
    return rule


def _near(windows: list[Window], at_ms: float, before_ms: float, after_ms: float) -> Window | None:
    for window in windows:
        if window.start_ms - before_ms <= at_ms <= window.end_ms + after_ms:
            return window
    return None


def lossy(windows: list[Window]) -> list[Window]:
    return [w for w in windows if w.kind in LOSSY]


def duplicate_cause(windows: list[Window], first_ok: Arrival, timing: Timing) -> Window | None:
    """The lossy fault that explains a second 2xx copy, judged by the first copy's arrival."""
    before = timing.webhook_timeout_ms + IN_FLIGHT_MS
    return _near(lossy(windows), first_ok.at_ms, before, DUPLICATE_AFTER_MS)


def sender_gave_up(first_ok: Arrival, timing: Timing) -> bool:
    """The first copy reached the receiver after the sender's POST timeout had run out (the
    signature time is taken right before the POST): the sender counted it failed."""
    return first_ok.at_ms - first_ok.signed_ms > timing.webhook_timeout_ms + SIGNED_SLACK_MS


def _duplicates(evidence: Evidence, by_id: dict[str, list[Arrival]], timing: Timing) -> Rule:
    rule = Rule("unexplained_duplicates", 0)
    for message_id, arrivals in by_id.items():
        answered = [a for a in arrivals if ok_2xx(a)]
        for copy in answered[1:]:
            rule.total += 1
            explained = duplicate_cause(evidence.windows, answered[0], timing) is not None
            if not explained and not sender_gave_up(answered[0], timing):
                rule.add(
                    f"{message_id}: 2xx by {answered[0].member} a{answered[0].attempt} at "
                    f"{answered[0].at_ms:.0f}, again by {copy.member} a{copy.attempt} "
                    f"{copy.at_ms - answered[0].at_ms:.0f} ms later"
                )
    return rule


def recovered_ms(window: Window, timing: Timing) -> float:
    """When the fleet must consume every slot again after a fault."""
    return window.end_ms + timing.session_ms + RECOVERED_MS


def reach(window: Window, timing: Timing) -> tuple[float, float]:
    """Due times a fault may delay: from just before it until the fleet must have recovered,
    or, for a fault that may strand a lease with no takeover, until that lease ran out."""
    until = recovered_ms(window, timing)
    if window.kind in STRANDING:
        until = max(until, window.start_ms + timing.ack_timeout_ms + 2000)
    return window.start_ms - IN_FLIGHT_MS, until


def _stalled(evidence: Evidence, first: dict[str, float], timing: Timing) -> Rule:
    reaches = [reach(w, timing) for w in evidence.windows]
    rule = Rule("stalled", 0)
    for message_id, due in evidence.accepted.items():
        if message_id not in first or any(lo <= due <= hi for lo, hi in reaches):
            continue
        rule.total += 1
        if first[message_id] - due > LATE_LIMIT_MS:
            rule.add(f"{message_id} due {due} arrived {first[message_id] - due:.0f} ms late")
    return rule


def lease_deadline(arrival: Arrival, timing: Timing) -> float:
    if arrival.lease_deadline_ms is not None:
        return float(arrival.lease_deadline_ms)
    return arrival.signed_ms + timing.ack_timeout_ms


def _after_lease(evidence: Evidence, timing: Timing) -> Rule:
    rule = Rule("after_lease", 0)
    frozen = [w for w in evidence.windows if w.kind == "serve_sigstop"]
    for arrival in evidence.arrivals:
        deadline = lease_deadline(arrival, timing)
        if arrival.at_ms <= deadline + EARLY_TOLERANCE_MS:
            continue
        rule.total += 1
        signed = deadline - timing.ack_timeout_ms
        if any(
            w.target == arrival.member and w.start_ms <= arrival.at_ms and w.end_ms >= signed
            for w in frozen
        ):
            continue
        rule.add(
            f"{arrival.message_id} a{arrival.attempt} by {arrival.member}: "
            f"{arrival.at_ms - deadline:.0f} ms after its lease"
        )
    return rule


def _skipped(evidence: Evidence, by_id: dict[str, list[Arrival]], timing: Timing) -> Rule:
    rule = Rule("skipped_attempts", 0)
    lookback = timing.ack_timeout_ms + timing.backoff_max_ms + 3000
    faults = lossy(evidence.windows)
    for message_id, arrivals in by_id.items():
        attempts = {a.attempt for a in arrivals}
        for arrival in arrivals:
            if arrival.attempt < 2 or arrival.attempt - 1 in attempts:
                continue
            attempts.add(arrival.attempt - 1)  # count each gap once
            rule.total += 1
            # a fault active at some point of the `lookback` before this attempt arrived (a new
            # owner's fence rolls a stranded lease back at the takeover, long before it ends)
            if _near(faults, arrival.at_ms, 0, lookback) is None:
                graceful = _near(
                    [w for w in evidence.windows if w.kind == "serve_sigterm"],
                    arrival.at_ms,
                    0,
                    lookback,
                )
                why = f" (graceful handoff of {graceful.target})" if graceful else ""
                rule.add(
                    f"{message_id}: attempt {arrival.attempt} by {arrival.member} but no "
                    f"attempt {arrival.attempt - 1}{why}"
                )
    return rule


def _readiness(evidence: Evidence) -> Rule:
    """Episodes of consecutive violating samples per member; one longer than the tolerance
    (the service's readiness hysteresis plus one probe and one sample period) breaks the rule."""
    rule = Rule("readiness", 0, evidence.readiness_samples)
    tolerance_ms = (UNREADY_AFTER_S + PROBE_INTERVAL_S + 2 * PERIOD_S) * 1000
    by_member: dict[str, list[ReadinessViolation]] = defaultdict(list)
    for sample in sorted(evidence.readiness, key=lambda v: v.at_ms):
        by_member[sample.member].append(sample)
    episodes: list[list[ReadinessViolation]] = []
    for samples in by_member.values():
        episodes.append([samples[0]])
        for sample in samples[1:]:
            if sample.at_ms - episodes[-1][-1].at_ms <= 2 * PERIOD_S * 1000:
                episodes[-1].append(sample)
            else:
                episodes.append([sample])
    for episode in episodes:
        length = episode[-1].at_ms - episode[0].at_ms
        if length > tolerance_ms:
            v = episode[0]
            rule.add(
                f"{v.member} ready for {length / 1000:.1f} s from {v.at_ms:.0f} with "
                f"{v.granted} slots granted, {v.consumed} consumed, not consumed: {list(v.missing)}"
            )
    return rule


def ownership_faults(evidence: Evidence, spared: str = "") -> list[Window]:
    """Every fault, injected or not, that may keep a process from consuming its slots, except
    those of `spared` (the process whose fault a takeover rule is judging)."""
    return [
        w
        for w in (*evidence.windows, *evidence.unplanned)
        if w.kind not in HARMLESS_TO_OWNERSHIP and w.target != spared
    ]


def _unconsumed(evidence: Evidence, timing: Timing) -> Rule:
    """Every (sample, slot) outside every fault's [start, restore + session + 2 s] is examined;
    a slot whose grantee did not answer is not (frozen, down or slow: unknown). A slot idle
    since less than HANDOFF_MS is being handed over (released by one process, not yet fenced by
    the next: a rebalance after a process joins), not stalled."""
    spans = [(w.start_ms, recovered_ms(w, timing)) for w in ownership_faults(evidence)]
    rule = Rule("unconsumed", 0)
    idle_since: dict[int, float] = {}
    for sample in evidence.samples:
        slots = range(sample.slot_amount or evidence.slot_amount)
        for slot in slots:
            if sample.consumer(slot) == "":
                idle_since.setdefault(slot, sample.at_ms)
            elif sample.consumer(slot) is not None:
                idle_since.pop(slot, None)
        if any(start <= sample.at_ms <= end for start, end in spans):
            continue
        idle = []
        for slot in slots:
            consumer = sample.consumer(slot)
            if consumer is not None:
                rule.total += 1
                if not consumer and sample.at_ms - idle_since[slot] >= HANDOFF_MS:
                    idle.append(slot)
        if idle:  # one violation per slot, one example per sample
            grantees = sorted({sample.granted.get(slot, "nobody") for slot in idle})
            rule.add(f"at {sample.at_ms:.0f}: slots {idle} consumed by nobody (granted {grantees})")
            rule.violations += len(idle) - 1
    return rule


def takeover_ms(
    evidence: Evidence, message_id: str, holder: str, after_ms: float, until_ms: float
) -> float | None:
    """The first sample in (after_ms, until_ms] where a process other than `holder` consumed
    the message's slot (under that sample's slot amount): its fence (which rolls `holder`'s
    leases back) came before."""
    for sample in evidence.samples:
        if not after_ms < sample.at_ms <= until_ms:
            continue
        slot = slot_of(message_id, sample.slot_amount or evidence.slot_amount)
        if sample.consumer(slot) not in (None, "", holder):
            return sample.at_ms
    return None


def _waited_lease(evidence: Evidence, by_id: dict[str, list[Arrival]], timing: Timing) -> Rule:
    """Examined: consecutive attempts k, k + 1 of a message whose slot the prober saw consumed
    by a process other than attempt k's sender, after k's claim (its lease deadline - lease:
    a heartbeat only moves the deadline later) and TAKEOVER_CLAIM_MS before that deadline.
    Broken: attempt k + 1 arrived after k's deadline, claimed no earlier than it (its deadline
    - lease, an upper bound), and no fault of another process, Redis or ZooKeeper (the new
    owner's own session loss included) reached from the takeover to that arrival."""
    rule = Rule("waited_lease", 0)
    for message_id, arrivals in by_id.items():
        first: dict[int, Arrival] = {}
        for arrival in arrivals:
            first.setdefault(arrival.attempt, arrival)
        for attempt, held in first.items():
            again = first.get(attempt + 1)
            if again is None or held.lease_deadline_ms is None:
                continue
            deadline = held.lease_deadline_ms
            taken = takeover_ms(
                evidence,
                message_id,
                held.member,
                deadline - timing.ack_timeout_ms,
                deadline - TAKEOVER_CLAIM_MS,
            )
            if taken is None:
                continue
            excuses = [
                w
                for w in ownership_faults(evidence, spared=held.member)
                if w.start_ms <= again.at_ms and recovered_ms(w, timing) >= taken
            ]
            if excuses:
                continue
            rule.total += 1
            claimed_by = lease_deadline(again, timing) - timing.ack_timeout_ms  # an upper bound
            if again.at_ms <= deadline + EARLY_TOLERANCE_MS or claimed_by < deadline:
                continue
            rule.add(
                f"{message_id}: a{attempt} by {held.member}, lease to {deadline}; "
                f"taken over by {taken:.0f}, a{attempt + 1} by {again.member} "
                f"{again.at_ms - deadline:.0f} ms after that lease"
            )
    return rule


# figures ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1)


def _figures(
    evidence: Evidence,
    by_id: dict[str, list[Arrival]],
    first: dict[str, float],
    timing: Timing,
) -> dict[str, Any]:
    lateness = [first[m] - due for m, due in evidence.accepted.items() if m in first]
    answered = [sum(1 for a in arrivals if ok_2xx(a)) for arrivals in by_id.values()]
    duplicates = sum(max(0, count - 1) for count in answered)
    return {
        "accepted": len(evidence.accepted),
        "posts": len(evidence.arrivals),
        "delivered": sum(1 for arrivals in by_id.values() if any(ok_2xx(a) for a in arrivals)),
        "duplicates": duplicates,
        "bad_signatures": sum(1 for a in evidence.arrivals if not a.signature_ok),
        "unknown_ids": sum(1 for m in by_id if m not in evidence.accepted),
        "readiness_samples_in_violation": len(evidence.readiness),  # before the tolerance
        "lateness_ms": {
            "p50": percentile(lateness, 0.5),
            "p99": percentile(lateness, 0.99),
            "max": percentile(lateness, 1.0),
        },
        "per_kind": per_kind(evidence, by_id, first, timing),
        "per_member": per_member(evidence),
    }


def per_window(
    window: Window, evidence: Evidence, first: dict[str, float]
) -> tuple[float, list[float]]:
    """(gap s, lateness of the messages due in the window): the gap is how long after the
    fault began the last message that fell due during it, and was held up, arrived."""
    lateness: list[float] = []
    gap = 0.0
    for message_id, due in evidence.accepted.items():
        if not window.start_ms <= due <= window.end_ms or message_id not in first:
            continue
        late = first[message_id] - due
        lateness.append(late)
        if late > LATE_ARRIVAL_MS:
            gap = max(gap, (first[message_id] - window.start_ms) / 1000)
    return gap, lateness


def per_kind(
    evidence: Evidence,
    by_id: dict[str, list[Arrival]],
    first: dict[str, float],
    timing: Timing,
) -> dict[str, Any]:
    duplicates: dict[str, int] = defaultdict(int)
    for arrivals in by_id.values():
        answered = [a for a in arrivals if ok_2xx(a)]
        if len(answered) > 1:
            cause = duplicate_cause(evidence.windows, answered[0], timing)
            kind = cause.kind if cause else None
            if kind is None and sender_gave_up(answered[0], timing):
                kind = "answered_after_sender_timeout"
            duplicates[kind or "unexplained"] += len(answered) - 1
    result: dict[str, Any] = {}
    for kind in sorted({w.kind for w in evidence.windows}):
        gaps: list[float] = []
        lateness: list[float] = []
        for window in (w for w in evidence.windows if w.kind == kind):
            gap, late = per_window(window, evidence, first)
            gaps.append(gap)
            lateness.extend(late)
        result[kind] = {
            "windows": len(gaps),
            "gap_s_max": round(max(gaps), 2),
            "gap_s_median": percentile(gaps, 0.5),
            "due_in_window": len(lateness),
            "lateness_p99_ms": percentile(lateness, 0.99),
            "duplicates": duplicates.get(kind, 0),
        }
    for kind in ("answered_after_sender_timeout", "unexplained"):
        if duplicates.get(kind):
            result[kind] = {"duplicates": duplicates[kind]}
    return result


def per_member(evidence: Evidence) -> dict[str, Any]:
    """Per serve process (clock skew shows here): POSTs, early ones, first attempts' lateness."""
    result: dict[str, Any] = {}
    for member in sorted({a.member for a in evidence.arrivals}):
        mine = [a for a in evidence.arrivals if a.member == member and a.attempt == 1]
        late = [a.at_ms - evidence.accepted.get(a.message_id, a.due_ms) for a in mine]
        result[member] = {
            "skew_s": evidence.skew_ms.get(member, 0.0) / 1000,
            "posts": len(mine),
            "early": sum(1 for x in late if x < -EARLY_TOLERANCE_MS),
            "lateness_p99_ms": percentile(late, 0.99),
        }
    return result
