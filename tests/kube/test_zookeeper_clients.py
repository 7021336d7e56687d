"""The bundled ZooKeeper admits delay-service pods only from namespaces that hold DelayTopics:
the operator keeps the chart's `<release>-zookeeper-clients` NetworkPolicy current (kmock)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kmock

from delayq.kube.context import Logger, OperatorContext
from delayq.kube.healthloop import HealthLoop
from delayq.kube.naming import COMPONENT_SERVICE, topic_labels
from delayq.kube.zookeeper_clients import NAMESPACE_NAME_LABEL, clients_ingress
from tests.kube.conftest import DT
from tests.kube.test_deletion import put_topic

POLICIES = "networking.k8s.io/v1/networkpolicies"
POLICY = "rel-delayq-zookeeper-clients"


def test_no_namespace_gives_no_rule_never_one_that_admits_everyone() -> None:
    assert clients_ingress([]) == []  # a rule with an empty `from` would admit every source
    (rule,) = clients_ingress(["shop", "billing", "shop"])
    assert rule["ports"] == [{"port": 2181, "protocol": "TCP"}]
    assert [peer["namespaceSelector"] for peer in rule["from"]] == [
        {"matchLabels": {NAMESPACE_NAME_LABEL: "billing"}},
        {"matchLabels": {NAMESPACE_NAME_LABEL: "shop"}},
    ]
    service_labels = topic_labels("any-topic", COMPONENT_SERVICE)
    for peer in rule["from"]:
        assert peer["podSelector"]["matchLabels"].items() <= service_labels.items()


def admitted(api: kmock.KubernetesEmulator, namespace: str) -> list[str]:
    policy = api.objects[POLICIES, namespace, POLICY].raw
    return [
        peer["namespaceSelector"]["matchLabels"][NAMESPACE_NAME_LABEL]
        for rule in policy["spec"].get("ingress") or []
        for peer in rule["from"]
    ]


async def test_the_health_loop_admits_exactly_the_namespaces_holding_topics(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    home = ctx.config.build.operator_namespace
    api.objects[POLICIES, home, POLICY] = {
        "metadata": {"name": POLICY, "namespace": home},
        "spec": {"podSelector": {"matchLabels": {"app": "zk"}}, "policyTypes": ["Ingress"]},
    }  # as the chart renders it: no rule, nobody admitted

    async def run_pass(topic: Mapping[str, Any], log: Logger) -> None:
        return None

    loop = HealthLoop(ctx, [], 60.0, run_pass, logger, clients_policy=POLICY)
    await loop.tick()
    assert admitted(api, home) == []
    put_topic(api, "orders", "shop")
    put_topic(api, "invoices", "billing")
    put_topic(api, "refunds", "billing")
    await loop.tick()
    assert admitted(api, home) == ["billing", "shop"]
    api.objects[DT, "shop", "orders"].delete()  # its last topic gone: shop is out
    await loop.tick()
    assert admitted(api, home) == ["billing"]
    for task in [*loop.passes.values(), *([loop.gc] if loop.gc else [])]:
        await task
