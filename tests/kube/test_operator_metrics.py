"""The operator's /metrics: scraped from a running operator (kopf on kmock, real ZooKeeper and
Redis), and the counters the handlers move, read from its registry."""

from __future__ import annotations

import logging

import aiohttp
import kmock
import kopf
import pytest
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.metrics import OperatorMetrics
from delayq.kube.operator import counted_reconcile
from delayq.kube.redisctl import BrokerMemory, RedisCommands
from delayq.kube.zk import KazooTopicStore
from delayq.local.ports import free_port
from delayq.local.waiting import eventually
from tests.kube.conftest import Clock, own_slots
from tests.kube.pods import NAMESPACE, RedisPods, add_service_pods, set_pod_ready
from tests.kube.test_events import run
from tests.kube.test_handlers import body, put_topic
from tests.kube.test_operator_kopf import TOPIC_PATH, WAIT_S, operator, ready_reason, topic

ORDERS = {"topic_namespace": NAMESPACE, "topic": "orders"}


def value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The sample `name` with exactly `labels` in a Prometheus text exposition, or None."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return float(sample.value)
    return None


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await response.text()


async def test_a_running_operator_serves_its_metrics(
    api: kmock.KubernetesEmulator,
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    redis_pods: RedisPods,
    zk: KazooClient,
    zk_connect: str,
) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/metrics"
    async with operator(
        connection, store, redis_commands, zk_connect, metrics_endpoint=endpoint
    ) as ctx:
        await api.post(TOPIC_PATH, json=topic("orders", brokers=2, slotAmount=8))
        await eventually(
            lambda: "appliedSlotAmount" in (api.objects[DT_KEY].get("status") or {}),
            WAIT_S,
            "provisioned",
        )
        for broker in (0, 1):
            redis_pods.add(broker, 1)
        add_service_pods(api, 2)
        own_slots(zk, 6)
        await eventually(
            lambda: ready_reason(api, "orders") == "ServingDegraded", WAIT_S, "Ready"
        )  # degraded: 2 of 8 slots have no owner
        text = await scrape(port)
        assert value(text, "delayq_operator_is_leader") == 1
        assert (value(text, "delayq_operator_reconciles_total") or 0) >= 1
        assert value(text, "delayq_operator_reconcile_errors_total", {"kind": "transient"}) == 0
        assert (value(text, "delayq_operator_health_pass_duration_seconds_count") or 0) >= 1
        assert value(text, "delayq_operator_unowned_slots", ORDERS) == 2
        for index in ("0", "1"):
            labels = {**ORDERS, "broker": index}
            used = value(text, "delayq_operator_broker_used_memory_bytes", labels)
            assert (used or 0) > 100_000  # a real redis-server's used_memory
            # the test servers run without maxmemory
            assert value(text, "delayq_operator_broker_max_memory_bytes", labels) == 0
        assert "namespace=" not in text.replace("topic_namespace=", "")

        # The topic is deleted: its series go with it on the next pass.
        await api.delete(f"{TOPIC_PATH}/orders")
        await eventually(
            lambda: sample(ctx.metrics, "delayq_operator_unowned_slots", **ORDERS) is None,
            WAIT_S,
            "the deleted topic's series to go",
        )
    assert sample(ctx.metrics, "delayq_operator_is_leader") == 0  # stopped: no longer leads


DT_KEY = ("delayq.io/v1alpha1/delaytopics", NAMESPACE, "orders")


async def test_reconcile_outcomes_and_failovers_are_counted(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    clock: Clock,
    dead_zookeeper: str,
    zk_connect: str,
    logger: logging.Logger,
) -> None:
    put_topic(api, replicasPerBroker=1, zookeeper={"connect": dead_zookeeper})
    with pytest.raises(kopf.TemporaryError):
        await counted_reconcile(ctx, body(api), logger)
    api.objects[DT_KEY].patch({"spec": {"zookeeper": {"connect": zk_connect}}})
    await counted_reconcile(ctx, body(api), logger)
    metrics = ctx.metrics
    assert sample(metrics, "delayq_operator_reconciles_total") == 2
    assert sample(metrics, "delayq_operator_reconcile_errors_total", kind="transient") == 1
    assert sample(metrics, "delayq_operator_reconcile_errors_total", kind="permanent") == 0

    redis_pods.add(0, 2, master=0)
    add_service_pods(api, 1)
    await run(ctx, api, logger, refresh)
    assert sample(metrics, "delayq_operator_failovers_total", **ORDERS) is None  # an election
    set_pod_ready(api, "orders-redis-0-0", False)
    redis_pods.partition("orders-redis-0-0")
    await run(ctx, api, logger, refresh)
    clock.now += ctx.failover_grace_s + 1
    await run(ctx, api, logger, refresh)
    await run(ctx, api, logger, refresh)
    assert sample(metrics, "delayq_operator_failovers_total", **ORDERS) == 1
    # the figure is now the promoted master's
    assert (
        sample(metrics, "delayq_operator_broker_used_memory_bytes", **ORDERS, broker="0") or 0
    ) > 100_000


def test_series_of_gone_brokers_and_topics_are_dropped() -> None:
    metrics = OperatorMetrics()
    figures = BrokerMemory(used_memory_bytes=10, max_memory_bytes=100)
    metrics.observe_topic(("a", "t"), {0: figures, 1: figures}, 3)
    metrics.observe_topic(("b", "t"), {0: figures}, 0)
    assert (
        sample(
            metrics,
            "delayq_operator_broker_max_memory_bytes",
            topic_namespace="a",
            topic="t",
            broker="1",
        )
        == 100
    )
    metrics.observe_topic(("a", "t"), {0: figures}, None)  # broker 1's master did not answer
    assert (
        sample(
            metrics,
            "delayq_operator_broker_used_memory_bytes",
            topic_namespace="a",
            topic="t",
            broker="1",
        )
        is None
    )
    assert sample(metrics, "delayq_operator_unowned_slots", topic_namespace="a", topic="t") == 3
    metrics.keep_topics([("b", "t")])
    assert sample(metrics, "delayq_operator_unowned_slots", topic_namespace="a", topic="t") is None
    assert (
        sample(
            metrics,
            "delayq_operator_broker_used_memory_bytes",
            topic_namespace="a",
            topic="t",
            broker="0",
        )
        is None
    )
    assert sample(metrics, "delayq_operator_unowned_slots", topic_namespace="b", topic="t") == 0
