"""Each topic's ServiceMonitor: labelled for the cluster's Prometheus, its interval, an off switch.

From the operator's environment (what the chart sets) to the rendered manifest, and to what a
reconcile creates in the API (kmock) when the ServiceMonitor CRD is served.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import kmock
import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import render
from delayq.kube.builders.common import ServiceMonitorSettings
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.reconcile import reconcile
from tests.kube.manifests import CREDS, CTX, OWNER, by_kind_name, spec_of
from tests.kube.test_handlers import body, get, put_topic, write_status

MONITORS = "monitoring.coreos.com/v1/servicemonitors"
PROMETHEUS = ServiceMonitorSettings(labels=(("release", "prom"),), interval="15s")


def monitor_of(settings: ServiceMonitorSettings) -> dict[str, Any] | None:
    ctx = dataclasses.replace(CTX, service_monitor=settings)
    spec = spec_of()
    manifests = by_kind_name(render(OWNER, spec, ctx, CREDS, spec.slot_amount, True))
    return manifests.get(("ServiceMonitor", "orders-api"))


def test_the_operator_settings_label_the_monitor_and_set_its_interval() -> None:
    monitor = monitor_of(PROMETHEUS)
    assert monitor is not None
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    # a clash never takes the topic's own labels (the operator finds its children by them)
    clash = monitor_of(ServiceMonitorSettings(labels=((naming.LABEL_TOPIC, "other"),)))
    assert clash is not None
    assert clash["metadata"]["labels"][naming.LABEL_TOPIC] == "orders"
    assert monitor_of(ServiceMonitorSettings(enabled=False)) is None


def test_the_settings_come_from_the_environment_the_chart_sets() -> None:
    default = OperatorConfig.from_env({}).build.service_monitor
    assert default == ServiceMonitorSettings()  # on when the CRD exists, as before
    config = OperatorConfig.from_env(
        {
            "DELAYQ_SERVICE_MONITOR": "false",
            "DELAYQ_SERVICE_MONITOR_LABELS": '{"release": "prom", "team": "ops"}',
            "DELAYQ_SERVICE_MONITOR_INTERVAL": "1m",
        }
    )
    assert config.build.service_monitor == ServiceMonitorSettings(
        enabled=False, labels=(("release", "prom"), ("team", "ops")), interval="1m"
    )
    with pytest.raises(ValueError, match="JSON object of strings"):
        OperatorConfig.from_env({"DELAYQ_SERVICE_MONITOR_LABELS": '{"release": 1}'})


@pytest.mark.parametrize("settings", [PROMETHEUS, ServiceMonitorSettings(enabled=False)])
async def test_a_reconcile_creates_the_configured_monitor_or_none(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    settings: ServiceMonitorSettings,
) -> None:
    api.resources[MONITORS] = kmock.ResourceInfo(
        kind="ServiceMonitor", namespaced=True, verbs={"list"}
    )
    build = dataclasses.replace(ctx.config.build, service_monitor=settings)
    ctx.config = dataclasses.replace(ctx.config, build=build)
    put_topic(api)
    write_status(api, await reconcile(ctx, body(api), logger))
    monitor = get(api, MONITORS, "orders-api")
    if not settings.enabled:
        assert monitor is None
        assert get(api, "apps/v1/statefulsets", "orders-service") is not None
        return
    assert monitor is not None
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
