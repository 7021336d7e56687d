"""Prometheus metrics of one delay-service process, on a registry of its own.

A registry per service (not the global default) lets tests run several services in one process.
Depths are refreshed at scrape time from the slots this process owns, so summing over the fleet
gives the topic's totals without double counting. The topic's namespace is the label
`topic_namespace`, as on the operator's series: `namespace` is the label Prometheus' Kubernetes
discovery puts on every target, and a series carrying its own is renamed `exported_namespace`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from delayq.coordination.ownership import SESSION_STATES, SessionHolder
from delayq.queue.codec import MAX_PRIORITY
from delayq.queue.codes import Code
from delayq.queue.consumer import ConsumerCounters
from delayq.queue.model import Outcome, TopicStats
from delayq.queue.pacing import Pacer

# Lateness: delivery start minus due time. Millisecond buckets, expressed in seconds.
LATENESS_BUCKETS_S = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Webhook POSTs and HTTP requests: 1 ms to 10 s.
DURATION_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
DEPTH_STATES = ("scheduled", "due", "prepared", "dead")
# The forecast of due load, `delayq_due_messages{within}`: (label, window in ms). Cumulative:
# a message due in 30 s counts in every window. Long enough to start receivers ahead of a
# spike (1m, 5m: a Deployment's scale-up; 1h, 1d: capacity planning).
FORECAST_WINDOWS = (("1m", 60_000), ("5m", 300_000), ("1h", 3_600_000), ("1d", 86_400_000))
# Request methods get a label of their own; any other (a client may send any token) is `other`,
# so a stranger cannot add series at will.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
TOPIC_LABELS = ("topic_namespace", "topic")
# The lateness histogram's `priority` label values: one per priority a message may carry.
PRIORITY_LABELS = tuple(str(priority) for priority in range(MAX_PRIORITY + 1))


class ServiceMetrics:
    """The metrics `/metrics` exposes; labels carry the topic so a fleet's series stay apart."""

    def __init__(self, namespace: str, topic: str) -> None:
        self.registry = CollectorRegistry()
        names = list(TOPIC_LABELS)
        self.depth = Gauge(
            "delayq_messages",
            "Messages in owned slots by state",
            [*names, "state"],
            registry=self.registry,
        )
        self.owned_slots = Gauge(
            "delayq_owned_slots", "Slots this process consumes", names, registry=self.registry
        )
        self.unconsumed_slots = Gauge(
            "delayq_unconsumed_slots",
            "Slots granted to this process that it could not take over yet, by reason: moving "
            "(frozen by a slot move or a doubling), error (the broker failed the take-over); each "
            "is retried",
            [*names, "reason"],
            registry=self.registry,
        )
        self.paused = Gauge(
            "delayq_paused",
            "1 while the topic's delivery is paused (nothing is claimed), else 0",
            names,
            registry=self.registry,
        )
        self.oldest_overdue = Gauge(
            "delayq_oldest_overdue_seconds",
            "How long the oldest due, unclaimed message of the owned slots has waited (0: none)",
            names,
            registry=self.registry,
        )
        self.fair_groups = Gauge(
            "delayq_fair_groups",
            "Fair groups with a message waiting in the owned slots, by state: due (its turn has "
            "come), held (at delivery.maxInFlightPerGroup), later (nothing due yet); summed over "
            "the slots (a group in n slots counts n times). Counts only: a group is tenant data "
            "and never a label",
            [*names, "state"],
            registry=self.registry,
        )
        self.due_forecast = Gauge(
            "delayq_due_messages",
            "Scheduled messages of the owned slots falling due within the next `within` "
            "(later than now, so not yet due; counted on the due index at most every "
            "few seconds): what receivers will have to take",
            [*names, "within"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "delayq_deliveries",
            "Delivery attempts by outcome (acked, failed, leased)",
            [*names, "outcome"],
            registry=self.registry,
        )
        self.retries = Counter(
            "delayq_retries",
            "Failed deliveries scheduled for a retry",
            names,
            registry=self.registry,
        )
        self.dead = Counter(
            "delayq_dead",
            "Failed deliveries this process gave up: to dead, or dropped per the topic",
            names,
            registry=self.registry,
        )
        self.slot_moving_waits = Counter(
            "delayq_slot_moving_waits",
            "API calls refused with SLOT_MOVING (their slot was moving) and run again",
            names,
            registry=self.registry,
        )
        self.lateness = Histogram(
            "delayq_delivery_lateness_seconds",
            "Delivery start minus due time, by the message's priority (0-9)",
            [*names, "priority"],
            buckets=LATENESS_BUCKETS_S,
            registry=self.registry,
        )
        self.webhook_latency = Histogram(
            "delayq_webhook_duration_seconds",
            "Duration of one webhook POST by status class",
            [*names, "status"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.scheduled = Counter(
            "delayq_scheduled",
            "Messages stored by the API's schedule calls, by result: created, exists (create "
            "mode, already there), updated (upsert)",
            [*names, "result"],
            registry=self.registry,
        )
        self.requests = Histogram(
            "delayq_http_request_duration_seconds",
            "HTTP requests by method, route template and status code, arrival to answer",
            [*names, "method", "route", "code"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.webhook_concurrency = Gauge(
            "delayq_webhook_concurrency",
            "Webhook POSTs this process allows in flight now: webhook.maxInFlight, halved on "
            "timeouts and 5xx answers, grown back by successes (AIMD)",
            names,
            registry=self.registry,
        )
        # the webhook POSTs allowed in flight now (the AIMD limit; None: no webhook sink)
        self.webhook_posts_allowed: int | None = None
        self._topic_labels = (namespace, topic)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # series with only the topic labels exist from the start (zero, not absent)
        for metric in (
            self.owned_slots,
            self.paused,
            self.retries,
            self.dead,
            self.slot_moving_waits,
        ):
            self._child(metric)
        # the lateness series by priority, found by the int itself: `_child`'s label-tuple key
        # cost a delivery ~1 us more than before the label (timeit, same run)
        self._lateness_by_priority: dict[int, Any] = {
            0: self._child(self.lateness, PRIORITY_LABELS[0])
        }

    def _child(self, metric: MetricWrapperBase, *extra: str) -> Any:
        """The labelled series, cached: label lookups would otherwise cost on every delivery."""
        key = (id(metric), extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*self._topic_labels, *extra)
        return child

    def set_depth(self, stats: TopicStats, paused: bool) -> None:
        for state in DEPTH_STATES:
            self._child(self.depth, state).set(getattr(stats, state))
        self._child(self.owned_slots).set(len(stats.slots))
        self._child(self.paused).set(1 if paused else 0)
        self._child(self.oldest_overdue).set(stats.oldest_overdue_ms / 1000)
        for state, count in stats.groups._asdict().items():
            self._child(self.fair_groups, state).set(count)

    def set_due_forecast(self, due_within: dict[str, int]) -> None:
        """`delayq_due_messages{within}` from counts by FORECAST_WINDOWS label."""
        for within, count in due_within.items():
            self._child(self.due_forecast, within).set(count)

    def set_unconsumed(self, moving: int, error: int) -> None:
        self._child(self.unconsumed_slots, "moving").set(moving)
        self._child(self.unconsumed_slots, "error").set(error)

    def watch_counters(self, counters: Callable[[], ConsumerCounters]) -> None:
        """Expose the delivery engine's counters, read at scrape time."""
        self.registry.register(_CountersCollector(counters, self._topic_labels))

    def watch_pacer(self, pacer: Pacer) -> None:
        """Expose the topic's pace as this process sees it, read at scrape time."""
        self.registry.register(_PacerCollector(pacer, self._topic_labels))

    def set_webhook_concurrency(self, size: int) -> None:
        self.webhook_posts_allowed = size
        self._child(self.webhook_concurrency).set(size)

    def count_slot_moving_wait(self) -> None:
        self._child(self.slot_moving_waits).inc()

    def observe_lateness(self, lateness_ms: float, priority: int = 0) -> None:
        """One delivery started (pushed or leased) `lateness_ms` after its due time. The
        priority is a label, at most ten series: a backlog's drain shows each priority's
        lateness and count (a record a raw script call gave a priority outside 0..9 counts at
        the nearest bound, so no caller adds series at will)."""
        child = self._lateness_by_priority.get(priority)
        if child is None:
            child = self._child(self.lateness, PRIORITY_LABELS[min(max(priority, 0), MAX_PRIORITY)])
            if 0 <= priority <= MAX_PRIORITY:
                self._lateness_by_priority[priority] = child
        child.observe(max(0, lateness_ms) / 1000)

    def observe_webhook(self, status: str, duration_s: float) -> None:
        self._child(self.webhook_latency, status).observe(duration_s)

    def count_scheduled(self, codes: list[Code]) -> None:
        """The stored results of one schedule call (`Code.CREATED`, `EXISTS`, `UPDATED`): one
        increment per code, not per message (a batch is up to 1000)."""
        for code, amount in collections.Counter(codes).items():
            self._child(self.scheduled, code.name.lower()).inc(amount)

    def observe_request(self, method: str, route: str, code: int, duration_s: float) -> None:
        """One answered request; `route` is the route's template, never the path (an id in
        the path would make a series per message)."""
        method = method if method in HTTP_METHODS else "other"
        self._child(self.requests, method, route, str(code)).observe(duration_s)

    def watch_unreachable(self, unreachable: Callable[[], list[bool]]) -> None:
        """Expose which brokers a pull topic's leases find down (`PullLeaser.unreachable`,
        per broker), read at scrape time: a lease waits on the others meanwhile."""
        self.registry.register(_UnreachableCollector(unreachable, self._topic_labels))

    def watch_session(self, holder: SessionHolder) -> None:
        """Expose the state of the ownership's ZooKeeper session, read at scrape time: while
        it is not connected this process claims nothing."""
        self.registry.register(_SessionCollector(holder, self._topic_labels))

    def count_delivery(self, outcome: str, amount: int = 1) -> None:
        self._child(self.deliveries, outcome).inc(amount)

    def count_nacked(self, outcomes: list[Outcome]) -> None:
        """Failed deliveries by the engine's answer to their nack: retried, or given up (dead
        or dropped); refused nacks (lease lost) count nothing here."""
        for outcome in outcomes:
            if outcome.code is Code.RETRY_SCHEDULED:
                self.count_delivery("failed")
                self._child(self.retries).inc()
            elif outcome.code in (Code.DEAD, Code.DROPPED):
                self.count_delivery("failed")
                self._child(self.dead).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def activity(self) -> Activity:
        """What this process delivered since it started, read from its own series (the
        dashboard and `delayq topic stats` turn two readings into a rate and a lateness
        quantile over the time between them)."""
        deliveries: dict[str, int] = {}
        for sample in self._samples(self.deliveries, "_total"):
            outcome = sample.labels["outcome"]
            deliveries[outcome] = deliveries.get(outcome, 0) + int(sample.value)
        buckets: dict[float, int] = {}  # every priority's together
        for sample in self._samples(self.lateness, "_bucket"):
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0) + int(sample.value)
        return Activity(
            deliveries=deliveries,
            retries=sum(int(s.value) for s in self._samples(self.retries, "_total")),
            dead=sum(int(s.value) for s in self._samples(self.dead, "_total")),
            lateness_bounds_s=tuple(sorted(buckets)),
            lateness_counts=tuple(buckets[bound] for bound in sorted(buckets)),
        )

    @staticmethod
    def _samples(metric: MetricWrapperBase, suffix: str) -> list[Sample]:
        return [s for family in metric.collect() for s in family.samples if s.name.endswith(suffix)]


@dataclass(frozen=True)
class Activity:
    """Counters of one process since its start; `lateness_counts[i]` is the cumulative count of
    deliveries at most `lateness_bounds_s[i]` late (Prometheus buckets, +Inf last)."""

    deliveries: dict[str, int]
    retries: int
    dead: int
    lateness_bounds_s: tuple[float, ...]
    lateness_counts: tuple[int, ...]


# What each engine counter means to an operator (metric `delayq_<name>_total`).
COUNTER_HELP = {
    "stalled_slots_recovered": "Owned slots found overdue with no claim and claimed again",
    "acks_lease_lost": "Acks or nacks refused because the lease had expired or moved on",
    "deliveries_skipped": (
        "Claimed messages not delivered: slot released or lease gone first, or the receiver "
        "asked for time"
    ),
    "given_back": "Claimed messages given back undelivered (no attempt counted)",
    "acks_unreplicated": "Acks or nacks done on the master but not confirmed by syncReplicas",
    "schedules_topped_up": "Recurring schedules whose next-but-one occurrence was precomputed",
}


class _CountersCollector(Collector):
    """The engine's `ConsumerCounters` as Prometheus counters, without copying them on every
    delivery: the consumer increments plain ints, the scrape reads them."""

    def __init__(self, counters: Callable[[], ConsumerCounters], labels: tuple[str, str]) -> None:
        self._counters = counters
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        values = self._counters()
        for item in fields(ConsumerCounters):
            family = CounterMetricFamily(
                f"delayq_{item.name}", COUNTER_HELP[item.name], labels=list(TOPIC_LABELS)
            )
            family.add_metric(list(self._labels), getattr(values, item.name))
            yield family


class _PacerCollector(Collector):
    """The pace's counts and rate limit (`queue/pacing.Pacer`)."""

    def __init__(self, pacer: Pacer, labels: tuple[str, str]) -> None:
        self._pacer = pacer
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        pacer, labels = self._pacer, list(self._labels)
        for name, help_text, value in (
            ("delayq_rate_limited_waits", "Claims that waited: over the rate limit or held "
             "by a receiver (the messages stayed in store)", pacer.waits),
            ("delayq_receiver_holds", "429 or 503 answers with Retry-After that held the "
             "topic's delivery (every pod; the messages given back, no attempt counted)",
             pacer.holds),
        ):  # fmt: skip
            family = CounterMetricFamily(name, help_text, labels=list(TOPIC_LABELS))
            family.add_metric(labels, value)
            yield family
        limit = GaugeMetricFamily(
            "delayq_rate_limit_per_second",
            "The topic's rate limit, every pod together (0: none)",
            labels=list(TOPIC_LABELS),
        )
        limit.add_metric(labels, pacer.per_second)
        yield limit
        for name, help_text, level in (
            ("delayq_rate_limit_burst", "The topic's rate limit's bucket: messages at once "
             "after a quiet time (0: no limit; as the last draw said)", pacer.burst),
            ("delayq_receiver_hold_seconds", "How much longer a receiver's Retry-After holds the "
             "topic's delivery, as this process knows (0: no hold)", pacer.hold_left_ms / 1000),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, help_text, labels=list(TOPIC_LABELS))
            gauge.add_metric(labels, level)
            yield gauge


class _UnreachableCollector(Collector):
    """`delayq_pull_broker_unreachable{broker}`: 1 while this process's latest claim on the
    broker failed or a pause read could not reach it (it is tried again every second)."""

    def __init__(self, unreachable: Callable[[], list[bool]], labels: tuple[str, str]) -> None:
        self._unreachable = unreachable
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "delayq_pull_broker_unreachable",
            "1 while this process's latest pull claim on the broker failed or a pause read "
            "could not reach it (its leases wait on the other brokers meanwhile)",
            labels=[*TOPIC_LABELS, "broker"],
        )
        for broker, down in enumerate(self._unreachable()):
            family.add_metric([*self._labels, str(broker)], 1 if down else 0)
        yield family


class _SessionCollector(Collector):
    """`delayq_zookeeper_session_state{state}`: 1 on the session's current state, 0 on the
    others (Prometheus' state-set shape), so an alert needs no knowledge of the states."""

    def __init__(self, holder: SessionHolder, labels: tuple[str, str]) -> None:
        self._holder = holder
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        current = self._holder.session_state
        family = GaugeMetricFamily(
            "delayq_zookeeper_session_state",
            "ZooKeeper session of this process: connected, suspended (connection lost, the "
            "session may live on; nothing is claimed) or lost (no session: expired or not yet "
            "made, its owner nodes are gone)",
            labels=[*TOPIC_LABELS, "state"],
        )
        for state in SESSION_STATES:
            family.add_metric([*self._labels, state], 1 if state == current else 0)
        yield family
