"""One chaos run: bring the fleet up, produce, inject the seeded plan, drain, check.

Shared by the CI test (short plans) and `bench/chaos.py` (a long soak). Every wait is a
condition with a deadline; the faults are timed, the checker decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio

from delayq.coordination.splitting import routed_topic
from delayq.queue.client import AsyncQueue
from delayq.queue.topic import TopicType

from .checker import Evidence, Rule, Timing, Verdict, check
from .cluster import (
    ACK_TIMEOUT_MS,
    BACKOFF_MAX_MS,
    RESTART_BACKOFF_S,
    SESSION_TIMEOUT_MS,
    SLOTS,
    WEBHOOK_TIMEOUT_MS,
    Cluster,
)
from .faults import KINDS, Injector, Window, plan, wall_ms
from .probes import Prober, _readyz, clock_skew_s, fleet_ready
from .producer import Producer
from .puller import Puller
from .receiver import Receiver, Recipient
from .unplanned import exits, session_losses, stalls

READY_TIMEOUT_S = 120.0
SKEW_CHECK_S = 2.0  # the Date header has whole seconds
SETTLE_TIMEOUT_S = 90.0
TIMING = Timing(SESSION_TIMEOUT_MS, ACK_TIMEOUT_MS, WEBHOOK_TIMEOUT_MS, BACKOFF_MAX_MS)


@dataclass(frozen=True)
class ChaosOptions:
    seed: int
    fault_phase_s: float  # the plan fills this (every kind at least once, so maybe longer)
    rate_per_s: float = 40.0
    max_delay_ms: int = 8000  # due times spread over 0 .. this after scheduling
    kinds: tuple[str, ...] = KINDS
    moves: tuple[str, ...] = ()  # a slot move killed in each of these steps (moves.MOVE_STEPS)
    split: str = ""  # the doubling killed in this step (moves.SPLIT_STEPS); "": no doubling
    keep_logs: bool = False
    # ServiceConfig fields the serve processes run with (`DENSE`: the topic's dense layout)
    settings: dict[str, Any] = field(default_factory=dict)
    # the topic's delivery: WEBHOOK to the receiver, or PULL by the pull consumers (puller.py)
    delivery: TopicType = TopicType.WEBHOOK


#: The topic's records and waiting messages in buckets (recordBuckets, storeBuckets): the serve
#: processes publish it, so the scripts, moves and the doubling run on the dense layout. With
#: storeBucketsAfter half the delays (0 .. 8 s), a slot holds dues in `store` and in buckets
#: at once, and messages cross between the two as they are retried or given back.
DENSE: dict[str, Any] = {
    "redis_record_buckets": True,
    "redis_store_buckets": True,
    "redis_store_buckets_after_ms": 4000,
}


#: What a pull topic adds: its finished messages remembered past the run, so that the pull
#: consumers can tell an ack applied by a request whose answer was lost (puller.py, `resolve`).
PULLED: dict[str, Any] = {"outcome_retention_ms": 3_600_000}


@dataclass
class ChaosResult:
    verdict: Verdict
    report: dict[str, Any]
    workdir: Path | None = None
    evidence: Evidence | None = None


@dataclass
class Timer:
    phases: dict[str, float] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self._started, 1)
        self._started = now


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


async def run_chaos(options: ChaosOptions) -> ChaosResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"delayq-chaos-{options.seed}-"))
    rng = random.Random(options.seed)
    receiver: Recipient
    settings = dict(options.settings)
    if options.delivery is TopicType.PULL:
        receiver = Puller(rng=rng)
        settings = {**PULLED, **settings}
    else:
        receiver = await Receiver(rng=rng).start()
    cluster = Cluster(workdir, receiver.url, settings=settings, topic_type=options.delivery)
    try:
        result = await _run(options, cluster, receiver)
    finally:
        await cluster.stop()
        await receiver.stop()
    if options.keep_logs or result.verdict.failed:
        result.workdir = workdir
        with (workdir / "arrivals.jsonl").open("w") as out:  # for a post-mortem of the rules
            for arrival in receiver.arrivals:
                out.write(json.dumps(dataclasses.asdict(arrival)) + "\n")
        (workdir / "report.json").write_text(json.dumps(result.report, default=str))
        if result.evidence is not None:  # what the checker judged, for a rerun of it
            judged = {
                "accepted": result.evidence.accepted,
                "windows": [dataclasses.asdict(w) for w in result.evidence.windows],
                "unplanned": [dataclasses.asdict(w) for w in result.evidence.unplanned],
                "samples": [dataclasses.asdict(s) for s in result.evidence.samples],
                "slot_amount": result.evidence.slot_amount,
                "cancelled": result.evidence.cancelled,
            }
            (workdir / "evidence.json").write_text(json.dumps(judged))
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


async def _run(options: ChaosOptions, cluster: Cluster, receiver: Recipient) -> ChaosResult:
    timer = Timer()
    await cluster.start()
    if isinstance(receiver, Puller):
        await receiver.start(cluster.members)
    rng = random.Random(options.seed)
    specs = plan(options.seed, options.fault_phase_s, options.kinds, options.moves, options.split)
    windows: list[Window] = []
    notes: list[str] = []
    async with aiohttp.ClientSession() as session:
        await until(lambda: fleet_ready(cluster, session), READY_TIMEOUT_S, "the fleet ready")
        for member in cluster.members:
            skew_s = await clock_skew_s(session, member)
            assert abs(skew_s - member.skew_s) < SKEW_CHECK_S, f"{member.name}'s clock: {skew_s} s"
        timer.mark("start_s")
        producer = Producer(cluster.members, options.rate_per_s, options.max_delay_ms, rng)
        prober = Prober(cluster)
        stop_producing, stop_probing = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(producer.run(session, stop_producing)),
            asyncio.create_task(prober.run(session, stop_probing)),
        ]
        try:
            await Injector(cluster, receiver, windows, notes).run(specs)
            timer.mark("faults_s")
            recovery = await settle(cluster, session)
            timer.mark("settle_s")
            stop_producing.set()
            await tasks[0]
            await drain(cluster, receiver, producer.accepted, options)
            timer.mark("drain_s")
        finally:
            stop_producing.set()
            stop_probing.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        leftover = await left_in_redis(cluster)
    evidence = Evidence(
        accepted=producer.accepted,
        arrivals=list(receiver.arrivals),
        windows=windows,
        skew_ms={m.name: m.skew_s * 1000 for m in cluster.members},
        readiness=prober.violations,
        readiness_samples=prober.samples,
        samples=prober.slot_samples,
        unplanned=unplanned_faults(cluster) + stalls(receiver.arrivals, ACK_TIMEOUT_MS),
        slot_amount=SLOTS,
        cancelled=producer.cancelled,
    )
    verdict = check(evidence, TIMING)
    verdict.rules.append(recovery)
    report = {
        "seed": options.seed,
        "options": {k: v for k, v in dataclasses.asdict(options).items() if k != "kinds"},
        "timing_ms": dataclasses.asdict(TIMING),
        "phases_s": timer.phases,
        "rules": verdict.summary(),
        "failed_rules": [rule.name for rule in verdict.failed],
        **verdict.figures,
        "refused_at_schedule": producer.refused,
        "cancelled": len(producer.cancelled),
        "cancel_unknown": producer.cancel_unknown,
        "left_in_redis": leftover,
        "unexpected_exits": {
            m.name: [code for _, code in m.unexpected_exits] for m in cluster.members
        },
        "harness_notes": notes,
        "windows": [
            [w.kind, w.target, w.mode, round(w.start_ms / 1000, 2), round(w.end_ms / 1000, 2)]
            for w in sorted(windows, key=lambda w: w.start_ms)
        ],
        "unplanned": [
            [w.kind, w.target, round(w.start_ms / 1000, 2), round(w.end_ms / 1000, 2)]
            for w in sorted(evidence.unplanned, key=lambda w: w.start_ms)
        ],
    }
    return ChaosResult(verdict, report, evidence=evidence)


def unplanned_faults(cluster: Cluster) -> list[Window]:
    """The serve processes' own session losses (from their logs) and exits (`stalls` come
    from the receiver's arrivals)."""
    found: list[Window] = []
    now_ms = wall_ms()
    for member in cluster.members:
        log = member.serve.log_path
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        skew_ms = member.skew_s * 1000
        found += session_losses(lines, member.name, skew_ms, SESSION_TIMEOUT_MS, now_ms)
        exited = [at_ms for at_ms, _ in member.unexpected_exits]
        found += exits(member.name, exited, RESTART_BACKOFF_S * 1000)
    return found


async def settle(cluster: Cluster, session: aiohttp.ClientSession) -> Rule:
    """Rule `recovery`: after the last fault, every process ready and every slot owned again
    within SETTLE_TIMEOUT_S (a fleet that never comes back fails here, with its state)."""
    rule = Rule("recovery", 0, 1)
    try:
        await until(lambda: fleet_ready(cluster, session), SETTLE_TIMEOUT_S, "recovery")
    except TimeoutError:
        answers = {m.name: await _readyz(session, m) for m in cluster.members}
        owners = await asyncio.to_thread(cluster.owners)
        held = Counter(owners.values()) if owners is not None else None
        rule.add(
            f"not ready {SETTLE_TIMEOUT_S:.0f} s after the faults: readyz {answers}, "
            f"owner nodes per member {held}"
        )
    return rule


async def drain(
    cluster: Cluster, receiver: Recipient, accepted: dict[str, int], options: ChaosOptions
) -> None:
    """Wait until every accepted id got a 2xx, then until nothing is scheduled or leased (so
    late copies are seen too). Bounded: a lost message ends the wait, the checker reports it."""

    async def all_answered() -> bool:
        answered = {a.message_id for a in receiver.arrivals if 200 <= a.status < 300}
        return accepted.keys() <= answered

    async def nothing_left() -> bool:
        left = await left_in_redis(cluster)
        return left is not None and left["scheduled"] + left["prepared"] == 0

    bound_s = (options.max_delay_ms + ACK_TIMEOUT_MS + SESSION_TIMEOUT_MS) / 1000 + 60
    with contextlib.suppress(TimeoutError):
        await until(all_answered, bound_s, "every accepted message answered 2xx")
        await until(nothing_left, ACK_TIMEOUT_MS / 1000 + 30, "an empty topic")


async def left_in_redis(cluster: Cluster) -> dict[str, int] | None:
    """The topic's depth by state, read directly from each broker's redis-server for the slots
    the routing gives it (None if unreachable)."""
    routing = await asyncio.to_thread(cluster.routing)
    if routing is None:
        return None
    topic = routed_topic(cluster.members[0].serve.config.to_topic(), routing)
    left = {"scheduled": 0, "prepared": 0, "dead": 0}
    for index, broker in enumerate(cluster.brokers):
        client = redis.asyncio.Redis(port=broker.port, socket_timeout=5)
        try:
            stats = await AsyncQueue(client, topic).stats(routing.slots_of(index))
        except (redis.RedisError, OSError):
            return None
        finally:
            await client.aclose()
        left["scheduled"] += stats.scheduled
        left["prepared"] += stats.prepared
        left["dead"] += stats.dead
    return left
