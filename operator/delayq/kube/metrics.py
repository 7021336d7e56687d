"""The operator's Prometheus metrics, on a registry of its own (tests run several operators).

Every replica serves them (metrics_server.py): a standby reports `delayq_operator_is_leader 0`
and no topic series, so `sum(delayq_operator_is_leader) == 0` alerts on a fleet without a
leader. Per-topic series are written by the leader's health passes and dropped when the topic is
gone or the leadership ends, so a deleted topic or a former leader never exports stale figures.

Topic labels are `topic_namespace` and `topic`, not `namespace`: Prometheus' Kubernetes service
discovery sets `namespace` on every target (the operator's own), and a metric label of that name
would be renamed `exported_namespace` or overwrite it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from delayq.kube.redisctl import BrokerMemory

TopicKey = tuple[str, str]  # (namespace, name)
TOPIC_LABELS = ("topic_namespace", "topic")
# A health pass is a few API calls and Redis round trips per broker: milliseconds to seconds;
# the loop abandons one after 30 s (healthloop.PASS_TIMEOUT_S).
HEALTH_PASS_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A planned switchover pauses writes for a few milliseconds; over a second means trouble (the
# replica's catch-up is given up after redisctl.CATCH_UP_TIMEOUT_S).
SWITCHOVER_PAUSE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ERROR_KINDS = ("transient", "permanent", "unexpected")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class OperatorMetrics:
    """What `/metrics` of `delayq operator` exposes; one per process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.is_leader = Gauge(
            "delayq_operator_is_leader",
            "1 while this replica holds the leader Lease and acts, else 0",
            registry=self.registry,
        )
        self.reconciles = Counter(
            "delayq_operator_reconciles",
            "Runs of the change handler (create, update, resume) of a DelayTopic",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "delayq_operator_reconcile_errors",
            "Failed runs of the change handler, by kind (transient: retried; permanent: the "
            "spec cannot work; unexpected: a bug)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ERROR_KINDS:  # exported at 0, so rate() works from the first error on
            self.reconcile_errors.labels(kind)
        self.failovers = Counter(
            "delayq_operator_failovers",
            "Replicas promoted because a broker's master was gone",
            TOPIC_LABELS,
            registry=self.registry,
        )
        self.switchovers = Counter(
            "delayq_operator_switchovers",
            "Masters handed over to a caught-up replica before their pod stopped (planned)",
            TOPIC_LABELS,
            registry=self.registry,
        )
        self.switchover_pause_seconds = Histogram(
            "delayq_operator_switchover_pause_seconds",
            "How long a planned switchover held the old master's writes (pause to release)",
            buckets=SWITCHOVER_PAUSE_BUCKETS_S,
            registry=self.registry,
        )
        self.health_pass_seconds = Histogram(
            "delayq_operator_health_pass_duration_seconds",
            "Wall time of one topic's health pass (observe, fail over, write status)",
            buckets=HEALTH_PASS_BUCKETS_S,
            registry=self.registry,
        )
        self.used_memory_bytes = Gauge(
            "delayq_operator_broker_used_memory_bytes",
            "used_memory of the broker's master at the last health pass",
            [*TOPIC_LABELS, "broker"],
            registry=self.registry,
        )
        self.max_memory_bytes = Gauge(
            "delayq_operator_broker_max_memory_bytes",
            "maxmemory of the broker's master (0: unbounded) at the last health pass",
            [*TOPIC_LABELS, "broker"],
            registry=self.registry,
        )
        self.unowned_slots = Gauge(
            "delayq_operator_unowned_slots",
            "Slots of the topic no delay-service pod owns, at the last health pass",
            TOPIC_LABELS,
            registry=self.registry,
        )
        self.lateness_objective_seconds = Gauge(
            "delayq_operator_lateness_objective_seconds",
            "The topic's p99 lateness objective (spec.objectives.latenessP99); absent: none",
            TOPIC_LABELS,
            registry=self.registry,
        )
        self.topic_gauges = (
            self.used_memory_bytes,
            self.max_memory_bytes,
            self.unowned_slots,
            self.lateness_objective_seconds,
        )
        self.brokers_seen: dict[TopicKey, set[int]] = {}

    def observe_topic(
        self, topic: TopicKey, memory: Mapping[int, BrokerMemory], unowned_slots: int | None
    ) -> None:
        """A health pass's figures; a broker whose master did not answer loses its series
        (an old figure would look current), unknown ownership (None) keeps the last one."""
        for broker in self.brokers_seen.get(topic, set()) - set(memory):
            for gauge in (self.used_memory_bytes, self.max_memory_bytes):
                gauge.remove(*topic, str(broker))
        for broker, figures in memory.items():
            self.used_memory_bytes.labels(*topic, str(broker)).set(figures.used_memory_bytes)
            self.max_memory_bytes.labels(*topic, str(broker)).set(figures.max_memory_bytes)
        self.brokers_seen[topic] = set(memory)
        if unowned_slots is not None:
            self.unowned_slots.labels(*topic).set(unowned_slots)

    def observe_objective(self, topic: TopicKey, lateness_p99_ms: int) -> None:
        """The topic's objective, for the chart's DelayqDeliveryLate rule to join on (0: none,
        no series, and the rule holds the topic to the chart's default)."""
        if lateness_p99_ms:
            self.lateness_objective_seconds.labels(*topic).set(lateness_p99_ms / 1000)
        elif topic in {tuple(labels) for labels in _label_sets(self.lateness_objective_seconds)}:
            self.lateness_objective_seconds.remove(*topic)

    def keep_topics(self, topics: Iterable[TopicKey]) -> None:
        """Drop the series of every topic not in `topics` (deleted, or no longer led)."""
        kept = set(topics)
        for gauge in self.topic_gauges:
            for labels in _label_sets(gauge):
                if tuple(labels[:2]) not in kept:
                    gauge.remove(*labels)
        self.brokers_seen = {k: v for k, v in self.brokers_seen.items() if k in kept}

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _label_sets(gauge: Gauge) -> list[tuple[str, ...]]:
    """The label values (topic_namespace, topic[, broker]) of every series of `gauge`."""
    names = (*TOPIC_LABELS, "broker")
    return [
        tuple(sample.labels[name] for name in names if name in sample.labels)
        for family in gauge.collect()
        for sample in family.samples
    ]
