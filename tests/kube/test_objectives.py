"""spec.objectives: the health pass reads the service pods' lateness and sets ObjectiveMet.

Each service "pod" is a real HTTP server answering /metrics with a real ServiceMetrics registry
(the delay service's own histogram) behind the metrics token, as `delayq serve` does; the test
fills the histogram with deliveries of a chosen lateness and runs health passes against kmock.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from aiohttp import web
from kazoo.client import KazooClient

from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.events import condition_events
from delayq.kube.handlers.health import refresh
from delayq.kube.objective_scrape import MAX_METRICS_BYTES, MetricsScraper, lateness_buckets
from delayq.kube.objectives import Buckets, LatenessWindow, Silence
from delayq.local.ports import free_port
from delayq.queue.settings import by_name
from delayq.service.api import METRICS_PATH, accepted_tokens, bearer_matches
from delayq.service.config import ServiceConfig
from delayq.service.metrics import LATENESS_BUCKETS_S, ServiceMetrics
from tests.kube.conftest import DT, Clock, own_slots
from tests.kube.pods import LOOPBACK, NAMESPACE, RedisPods, add_service_pods
from tests.kube.test_handlers import body, condition, provision, put_topic, write_status

SERVICE_PODS = 2


class ServicePod:
    """One delay-service pod's /metrics: a real registry behind the tokens `delayq serve`
    accepts there with `config` (the pod's environment: `pod_config`)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.metrics = ServiceMetrics(NAMESPACE, "orders")
        self.config = config
        self.port = free_port()
        self.runner: web.AppRunner | None = None

    async def answer(self, request: web.Request) -> web.Response:
        tokens = accepted_tokens(self.config, METRICS_PATH)
        if not bearer_matches(request.headers.get("Authorization", ""), tokens):
            return web.Response(status=401)
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, LOOPBACK, self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def deliver(self, count: int, lateness_ms: float) -> None:
        for _ in range(count):
            self.metrics.observe_lateness(lateness_ms)


@pytest.fixture
async def service_pods(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> AsyncIterator[list[ServicePod]]:
    """A provisioned topic with a 1 s objective over 1 minute, its broker's Redis pods and two
    ready service pods answering /metrics with the topic's metrics token."""
    put_topic(api, slotAmount=2, objectives={"latenessP99": "1s", "window": "1m"})
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)
    add_service_pods(api, SERVICE_PODS)
    own_slots(zk, 2)
    pods = [ServicePod(pod_config(api)) for _ in range(SERVICE_PODS)]
    addresses = {}
    for ordinal, pod in enumerate(pods):
        ip = f"10.2.0.{ordinal + 1}"
        api.objects["v1/pods", NAMESPACE, f"orders-service-{ordinal}"].patch(
            {"metadata": {"uid": f"service-uid-{ordinal}"}, "status": {"podIP": ip}}
        )
        addresses[ip] = (LOOPBACK, pod.port)
        await pod.start()
    ctx.scraper = MetricsScraper(addresses=addresses, timeout_s=1.0)
    yield pods
    for pod in pods:
        await pod.stop()


def decoded(value: str) -> str:
    return base64.b64decode(value).decode()


def pod_config(api: kmock.KubernetesEmulator) -> ServiceConfig:
    """The settings a service pod starting now runs with: its container's DELAYQ_* variables
    as the kubelet resolves them, from the topic's Secrets as they are now."""
    sts = api.objects["apps/v1/statefulsets", NAMESPACE, naming.service_statefulset("orders")]
    container = sts.raw["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for variable in container["env"]:
        ref: dict[str, Any] = (variable.get("valueFrom") or {}).get("secretKeyRef") or {}
        if not variable["name"].startswith("DELAYQ_") or not ref:
            continue
        data = api.objects["v1/secrets", NAMESPACE, ref["name"]].raw.get("data") or {}
        if ref["key"] in data:
            env[variable["name"]] = decoded(data[ref["key"]])
        else:
            assert ref.get("optional"), f"{variable['name']}: {ref['key']} missing"
    return ServiceConfig.from_env(env)


async def health(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> dict[str, str]:
    write_status(api, await refresh(ctx, body(api), logger))
    return condition(api, "ObjectiveMet")


async def test_objective_met_follows_the_p99_over_the_window_and_unknown_when_silent(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    clock: Clock,
    service_pods: list[ServicePod],
    logger: logging.Logger,
) -> None:
    first, second = service_pods
    first.deliver(500, 3000)  # late deliveries before the first reading: not in any window
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("Unknown", "Measuring")

    clock.now += 10
    first.deliver(300, 80)
    second.deliver(300, 150)
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("True", "LatenessWithinObjective")
    assert "at most 200ms" in met["message"]
    assert "p99 <= 1s" in met["message"]

    clock.now += 10  # 2% of the window's deliveries 4 s late: the p99 is above 1 s
    first.deliver(200, 80)
    second.deliver(12, 4000)
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("False", "LatenessAboveObjective")
    assert "up to 5s" in met["message"]

    clock.now += 61  # the late ones fall out of the window; punctual deliveries since
    first.deliver(100, 30)
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("True", "LatenessWithinObjective")
    assert "at most 50ms" in met["message"]

    await second.stop()  # a pod that does not answer: unknown, not late nor punctual
    clock.now += 10
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("Unknown", "MetricsUnavailable")
    assert "orders-service-1 (no answer)" in met["message"]

    await second.start()  # a pod that accepts no credential the operator holds: refused
    second.config = ServiceConfig(metrics_token="another")
    clock.now += 10
    met = await health(api, ctx, logger)
    assert "orders-service-1 (refused the operator's metrics token)" in met["message"]
    labels = {"topic_namespace": NAMESPACE, "topic": "orders"}
    objective = "delayq_operator_lateness_objective_seconds"
    assert ctx.metrics.registry.get_sample_value(objective, labels) == 1.0  # the alert joins it


async def test_a_metrics_token_the_tenant_rotated_leaves_the_objective_measured(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    clock: Clock,
    service_pods: list[ServicePod],
    logger: logging.Logger,
) -> None:
    """`metrics-token` is the tenant's to rotate (its ServiceMonitor presents it) and the
    operator never reads the tenant's Secret back: pods restarted with the tenant's token
    still let the operator read them, with a credential of its own they accept."""
    secret = api.objects["v1/secrets", NAMESPACE, naming.credentials_secret("orders")]
    rotated = base64.b64encode(b"the-tenants-new-token").decode()
    secret.patch({"data": {naming.SECRET_METRICS_TOKEN: rotated}})
    await provision(api, ctx, logger)  # a reconcile keeps the tenant's token
    assert secret.raw["data"][naming.SECRET_METRICS_TOKEN] == rotated
    for pod in service_pods:  # the pods restart and read the Secret as it is now
        pod.config = pod_config(api)
        assert pod.config.metrics_token == "the-tenants-new-token"
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("Unknown", "Measuring"), met["message"]
    clock.now += 10
    for pod in service_pods:
        pod.deliver(100, 20)
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("True", "LatenessWithinObjective"), met["message"]


async def test_removing_the_objective_says_so_and_reads_no_pod(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    service_pods: list[ServicePod],
    logger: logging.Logger,
) -> None:
    assert (await health(api, ctx, logger))["reason"] == "Measuring"
    for pod in service_pods:
        await pod.stop()
    api.objects[DT, NAMESPACE, "orders"].patch({"spec": {"objectives": {"latenessP99": "0s"}}})
    met = await health(api, ctx, logger)
    assert (met["status"], met["reason"]) == ("True", "NoObjective")
    assert ("shop", "orders") not in ctx.lateness_windows
    labels = {"topic_namespace": NAMESPACE, "topic": "orders"}
    objective = "delayq_operator_lateness_objective_seconds"
    assert ctx.metrics.registry.get_sample_value(objective, labels) is None


def test_a_restarted_pod_counts_from_zero_and_a_flip_is_an_event() -> None:
    """A counter that fell is a restart: the new process's buckets are its delta. (And an
    objective is one the histogram can tell: at most its largest finite bound.)"""
    assert by_name("objectives_lateness_p99_ms").high == LATENESS_BUCKETS_S[-1] * 1000
    window = LatenessWindow()
    late: Buckets = ((1.0, 0), (5.0, 100), (float("inf"), 100))
    window.record(0, 60, {"pod/a": late})
    window.record(10, 60, {"pod/a": ((1.0, 10), (5.0, 10), (float("inf"), 10))})
    measured = window.measure()
    assert measured is not None
    assert measured.p99_ms == 1000
    events = condition_events(
        [{"type": "ObjectiveMet", "status": "True", "reason": "LatenessWithinObjective"}],
        [{"type": "ObjectiveMet", "status": "False", "reason": "LatenessAboveObjective"}],
    )
    assert [(e.type, e.reason) for e in events] == [("Warning", "LatenessAboveObjective")]


async def test_the_scraper_reads_a_pod_and_calls_the_others_silent() -> None:
    """The token's pod answers its buckets (empty before any delivery); a refused token, a
    closed port, an answer beyond the size cap or not in the exposition format is silent."""
    answering = ServicePod(ServiceConfig(metrics_token="token"))
    refusing = ServicePod(ServiceConfig(metrics_token="another"))

    async def too_long(_: web.Request) -> web.Response:
        return web.Response(body=b"#" * (MAX_METRICS_BYTES + 2))

    huge = web.Application()
    huge.router.add_get("/metrics", too_long)
    huge_runner = web.AppRunner(huge)
    await huge_runner.setup()
    huge_port = free_port()
    await web.TCPSite(huge_runner, LOOPBACK, huge_port).start()
    await answering.start()
    await refusing.start()
    try:
        addresses = {
            "10.0.0.1": (LOOPBACK, answering.port),
            "10.0.0.2": (LOOPBACK, refusing.port),
            "10.0.0.3": (LOOPBACK, free_port()),
            "10.0.0.4": (LOOPBACK, huge_port),
        }
        scraper = MetricsScraper(addresses=addresses, timeout_s=1.0)
        pods = {f"pod-{n}": f"10.0.0.{n}" for n in range(1, 5)}
        read = await scraper.lateness(pods, "token", (NAMESPACE, "orders"))
        assert read["pod-1"] == tuple((b, 0) for b in (*LATENESS_BUCKETS_S, float("inf")))
        refused, unanswered = Silence.REFUSED, Silence.UNANSWERED
        assert [read[f"pod-{n}"] for n in (2, 3, 4)] == [refused, unanswered, unanswered]
        answering.deliver(3, 150)
        read = await scraper.lateness({"pod-1": "10.0.0.1"}, "token", (NAMESPACE, "other"))
        assert read["pod-1"] == ()  # another topic's series are not this one's
    finally:
        for pod in (answering, refusing):
            await pod.stop()
        await huge_runner.cleanup()
    assert lateness_buckets("delayq_delivery_lateness_seconds_bucket{le=", ("a", "b")) is None


@pytest.mark.parametrize(
    ("le", "value"),
    [("1.0", "+Inf"), ("1.0", "NaN"), ("1.0", "-1"), ("1.0", "1e300"), ("NaN", "1")],
)
def test_a_pod_telling_impossible_counts_is_silent(le: str, value: str) -> None:
    """Regression: the answer is the pod's, which a tenant controls; a count of +Inf raised
    OverflowError out of the topic's health pass (int(inf)), and counts past a float's range
    summed over pods raised it in the p99, on every pass while the pod said so."""
    text = (
        "# TYPE delayq_delivery_lateness_seconds histogram\n"
        f'delayq_delivery_lateness_seconds_bucket{{le="{le}",topic="b",topic_namespace="a"}} '
        f"{value}\n"
    )
    assert lateness_buckets(text, ("a", "b")) is None


def test_a_pod_telling_more_buckets_than_a_histogram_has_is_silent() -> None:
    """Regression: every distinct `le` a pod told was kept, a reading per pass for the whole
    window: 4 MiB of /metrics is ~49,000 buckets, ~5.7 MB a reading, ~2 GB a pod over a 1 h
    window in the operator's memory. The service's histogram has LATENESS_BUCKETS_S."""
    lines = "".join(
        f'delayq_delivery_lateness_seconds_bucket{{le="{n / 1000}",topic="b",topic_namespace="a"}}'
        " 1\n"
        for n in range(1, 1001)
    )
    text = "# TYPE delayq_delivery_lateness_seconds histogram\n" + lines
    assert lateness_buckets(text, ("a", "b")) is None
    assert len(LATENESS_BUCKETS_S) + 1 <= 64  # what the service exports fits the cap


async def test_pods_the_statefulsets_did_not_make_are_neither_read_nor_a_crash(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    service_pods: list[ServicePod],
    logger: logging.Logger,
) -> None:
    """Regression: the health pass took every pod its label selectors matched in the tenant's
    namespace, where anyone may label a pod of their own so: one named without a trailing
    number among the broker's pods raised out of the pass (its failovers included) on every
    pass, and every service-labelled pod was scraped for the objective, as many as the tenant
    made, up to 4 MiB each at once."""

    async def empty(_: web.Request) -> web.Response:
        return web.Response(text="", content_type="text/plain")  # a valid, empty exposition

    impostor = web.Application()
    impostor.router.add_get("/metrics", empty)
    runner = web.AppRunner(impostor)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, LOOPBACK, port).start()
    scraper = ctx.scraper
    assert isinstance(scraper, MetricsScraper)
    scraper.addresses = {**scraper.addresses, "10.9.0.1": (LOOPBACK, port)}
    for name, labels in (
        ("impostor", naming.redis_selector("orders", 0)),
        ("orders-service-x", naming.service_selector("orders")),
        ("collector", naming.service_selector("orders")),
    ):
        api.objects["v1/pods", NAMESPACE, name] = {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": name, "labels": labels},
            "status": {"podIP": "10.9.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    try:
        met = await health(api, ctx, logger)
        assert (met["status"], met["reason"]) == ("Unknown", "Measuring"), met
        window = ctx.lateness_windows[(NAMESPACE, "orders")]
        assert sorted(window.readings) == [f"orders-service-{n}/service-uid-{n}" for n in (0, 1)]
    finally:
        await runner.cleanup()
