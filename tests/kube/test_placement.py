"""Placement: broker i's first master next to delay-service pod i, its replicas elsewhere.

The manifests carry the preferences; the apply order makes them effective (the Redis pods look
for a service pod that must already exist). The real scheduler's verdict is in
e2e/test_placement.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

import kmock
import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import build_all
from delayq.kube.builders.common import HOSTNAME_TOPOLOGY, POD_NAME_LABEL, Manifest, PodPlacement
from delayq.kube.builders.redis import BROKER_SPREAD_WEIGHT, SERVICE_PAIR_WEIGHT
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.reconcile import reconcile
from delayq.local.waiting import eventually
from tests.kube.conftest import DT
from tests.kube.manifests import CREDS, CTX, by_kind_name, spec_of
from tests.kube.pods import NAMESPACE, store_service_pod


def redis_affinity(broker: int, brokers: int = 3) -> Manifest:
    manifests = build_all(spec_of(brokers=brokers, replicasPerBroker=1), CTX, CREDS, 16, False)
    sts = by_kind_name(manifests)["StatefulSet", f"orders-redis-{broker}"]
    affinity: Manifest = sts["spec"]["template"]["spec"]["affinity"]
    return affinity


def only_term(affinity: Manifest, kind: str) -> Manifest:
    (term,) = affinity[kind]["preferredDuringSchedulingIgnoredDuringExecution"]
    return dict(term)


def test_each_broker_prefers_the_node_of_its_own_service_pod() -> None:
    for broker in range(3):
        term = only_term(redis_affinity(broker), "podAffinity")
        selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector == {
            naming.LABEL_TOPIC: "orders",
            naming.LABEL_COMPONENT: naming.COMPONENT_SERVICE,
            POD_NAME_LABEL: f"orders-service-{broker}",
        }
        assert term["podAffinityTerm"]["topologyKey"] == HOSTNAME_TOPOLOGY


def test_spreading_a_broker_outweighs_the_pairing() -> None:
    """Otherwise the replica would follow the master onto the service pod's node."""
    affinity = redis_affinity(1)
    near = only_term(affinity, "podAffinity")
    apart = only_term(affinity, "podAntiAffinity")
    assert near["weight"] == SERVICE_PAIR_WEIGHT < apart["weight"] == BROKER_SPREAD_WEIGHT
    assert apart["podAffinityTerm"]["labelSelector"]["matchLabels"] == naming.redis_selector(
        "orders", 1
    )
    assert apart["podAffinityTerm"]["topologyKey"] == HOSTNAME_TOPOLOGY


def test_service_pods_spread() -> None:
    manifests = build_all(spec_of(brokers=3), CTX, CREDS, 16, False)
    pod = by_kind_name(manifests)["StatefulSet", "orders-service"]["spec"]["template"]["spec"]
    apart = only_term(pod["affinity"], "podAntiAffinity")["podAffinityTerm"]
    assert apart["labelSelector"]["matchLabels"] == naming.service_selector("orders")
    assert pod["topologySpreadConstraints"]


def statefulset_order(names: list[tuple[str, str]]) -> list[str]:
    return [name for kind, name in names if kind == "StatefulSet"]


def test_bundle_lists_the_service_statefulset_before_every_redis_one() -> None:
    manifests = build_all(spec_of(brokers=3), CTX, CREDS, 16, False)
    names = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert statefulset_order(names) == [
        "orders-service",
        "orders-redis-0",
        "orders-redis-1",
        "orders-redis-2",
    ]
    assert names.index(("ConfigMap", "orders-config")) < names.index(
        ("StatefulSet", "orders-service")
    )


async def test_reconcile_creates_the_service_statefulset_first(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """The order of the real create calls, not only of the list the builders return."""
    created: list[tuple[str, str]] = []
    create = ctx.kube.create

    async def recording_create(manifest: Manifest) -> Manifest:
        created.append((manifest["kind"], manifest["metadata"]["name"]))
        return await create(manifest)

    ctx.kube.create = recording_create  # type: ignore[method-assign]
    api.objects[DT, NAMESPACE, "orders"] = {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "metadata": {"name": "orders", "namespace": NAMESPACE, "uid": "uid-o", "generation": 1},
        "spec": {"brokers": 2, "slotAmount": 4},
    }
    await reconcile(ctx, dict(api.objects[DT, NAMESPACE, "orders"].raw), logger)
    assert statefulset_order(created) == ["orders-service", "orders-redis-0", "orders-redis-1"]


def two_broker_topic(api: kmock.KubernetesEmulator) -> Manifest:
    api.objects[DT, NAMESPACE, "orders"] = {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "metadata": {"name": "orders", "namespace": NAMESPACE, "uid": "uid-o", "generation": 1},
        "spec": {"brokers": 2, "slotAmount": 4},
    }
    return dict(api.objects[DT, NAMESPACE, "orders"].raw)


def place_service_pod(api: kmock.KubernetesEmulator, broker: int) -> None:
    """Service pod `broker` as the scheduler leaves it: bound to a node."""
    store_service_pod(api, broker, spec={"nodeName": f"node-{broker}"})


class StatefulSetsAndPodLists:
    """In call order: the StatefulSets ctx.kube creates (`created <name>`) and its lists of
    pods (`listed`)."""

    def __init__(self, ctx: OperatorContext) -> None:
        self.calls: list[str] = []
        create, list_ = ctx.kube.create, ctx.kube.list

        async def recording_create(manifest: Manifest) -> Manifest:
            if manifest["kind"] == "StatefulSet":
                self.calls.append(f"created {manifest['metadata']['name']}")
            return await create(manifest)

        async def recording_list(
            api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
        ) -> list[Manifest]:
            if kind == "Pod":
                self.calls.append("listed")
            return await list_(api_version, kind, namespace, labels)

        ctx.kube.create = recording_create  # type: ignore[method-assign]
        ctx.kube.list = recording_list  # type: ignore[method-assign]

    def created(self) -> list[str]:
        return [call.split()[1] for call in self.calls if call.startswith("created")]

    def lists_after(self, call: str) -> int:
        return self.calls[self.calls.index(call) :].count("listed") if call in self.calls else 0


async def test_a_new_broker_s_redis_waits_for_its_service_pod_to_be_placed(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """A preference matches only a pod already bound: CI saw broker 2's first master on
    another node than service pod 2 when the scheduler took the Redis pod first. Broker 1's
    Redis StatefulSet is created only once service pod 1 is placed."""
    ctx.pairing_wait_s = 60.0
    calls = StatefulSetsAndPodLists(ctx)
    place_service_pod(api, 0)
    reconciling = asyncio.create_task(reconcile(ctx, two_broker_topic(api), logger))
    try:
        await eventually(
            lambda: calls.lists_after("created orders-redis-0") >= 2, 10.0, "service pods listed"
        )
        assert calls.created() == ["orders-service", "orders-redis-0"]
        place_service_pod(api, 1)
        await asyncio.wait_for(reconciling, 10.0)
    finally:
        reconciling.cancel()
    assert calls.created() == ["orders-service", "orders-redis-0", "orders-redis-1"]


async def test_service_pods_never_placed_hold_the_brokers_back_once_for_a_bound(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """Service pods that cannot be scheduled must not keep the brokers from starting: one
    reconcile waits `pairing_wait_s` in all, not once a broker (broker 0's wait spends it, and
    broker 1's creation lists no pods), then creates every Redis StatefulSet."""
    ctx.pairing_wait_s = 0.5
    calls = StatefulSetsAndPodLists(ctx)
    await asyncio.wait_for(reconcile(ctx, two_broker_topic(api), logger), 10.0)
    assert calls.created() == ["orders-service", "orders-redis-0", "orders-redis-1"]
    assert calls.calls.index("listed") < calls.calls.index("created orders-redis-0")
    assert calls.lists_after("created orders-redis-0") == 0


def test_the_operator_placement_puts_every_topic_pod_on_the_named_nodes() -> None:
    """A platform's node pool for delayq (chart `topics.nodeSelector` / `tolerations`): both
    StatefulSets carry it; without one, neither template gets the fields (no roll on upgrade)."""
    toleration = {"key": "pool", "value": "delayq", "effect": "NoSchedule"}
    placement = PodPlacement(node_selector=(("pool", "delayq"),), tolerations=(toleration,))
    spec = spec_of(brokers=2, replicasPerBroker=1)
    placed = by_kind_name(
        build_all(spec, dataclasses.replace(CTX, placement=placement), CREDS, 16, False)
    )
    plain = by_kind_name(build_all(spec, CTX, CREDS, 16, False))
    names = [
        ("StatefulSet", "orders-service"),
        ("StatefulSet", "orders-redis-0"),
        ("StatefulSet", "orders-redis-1"),
    ]
    for key in names:
        pod = placed[key]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "delayq"}, key
        assert pod["tolerations"] == [toleration], key
        assert "nodeSelector" not in plain[key]["spec"]["template"]["spec"], key
        assert "tolerations" not in plain[key]["spec"]["template"]["spec"], key


def test_a_malformed_placement_setting_stops_the_operator_with_its_name() -> None:
    with pytest.raises(ValueError, match="DELAYQ_TOPIC_NODE_SELECTOR"):
        OperatorConfig.from_env({"DELAYQ_TOPIC_NODE_SELECTOR": '{"pool": 1}'})
    with pytest.raises(ValueError, match="DELAYQ_TOPIC_TOLERATIONS"):
        OperatorConfig.from_env({"DELAYQ_TOPIC_TOLERATIONS": '{"key": "pool"}'})
