"""Fixtures for the operator tests: kmock as the Kubernetes API, fake ZooKeeper and Redis."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import kmock
import kopf
import pytest

from delayq.kube.builders.common import BuildContext
from delayq.kube.client import KubeClient
from delayq.kube.handlers.deps import Deps
from tests.kube.fakes import FakeRedis, FakeTopicStore

DT = "delayq.io/v1alpha1/delaytopics"
NAMESPACE = "shop"


class Clock:
    """A settable clock: failover grace periods pass instantly in tests."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def declare_resources(api: kmock.KubernetesEmulator) -> None:
    """What the emulated API server serves (discovery), as a real cluster with our CRD would."""
    api.resources[DT] = kmock.ResourceInfo(
        kind="DelayTopic",
        namespaced=True,
        singular="delaytopic",
        shortnames={"dt"},
        categories={"delayq"},
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    )
    for key, kind in (
        ("v1/pods", "Pod"),
        ("v1/secrets", "Secret"),
        ("v1/configmaps", "ConfigMap"),
        ("v1/services", "Service"),
        ("v1/persistentvolumeclaims", "PersistentVolumeClaim"),
        ("v1/events", "Event"),
        ("apps/v1/statefulsets", "StatefulSet"),
        ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
        ("networking.k8s.io/v1/networkpolicies", "NetworkPolicy"),
    ):
        api.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs={"list"})
    # kopf's own backbone: it waits for these before it starts watching anything.
    for key, kind in (
        ("v1/namespaces", "Namespace"),
        ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition"),
    ):
        api.resources[key] = kmock.ResourceInfo(
            kind=kind, namespaced=False, verbs={"list", "watch"}
        )


@pytest.fixture
async def api(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    declare_resources(kmock)
    return kmock


@pytest.fixture
def connection(api: kmock.KubernetesEmulator) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=str(api.url).rstrip("/"))


@pytest.fixture
def store() -> FakeTopicStore:
    return FakeTopicStore()


@pytest.fixture
def redis_fake() -> FakeRedis:
    return FakeRedis()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def deps(
    connection: kopf.ConnectionInfo, store: FakeTopicStore, redis_fake: FakeRedis, clock: Clock
) -> AsyncIterator[Deps]:
    secrets = iter(f"generated-{index}" for index in range(1000))
    kube = KubeClient(connection)
    yield Deps(
        kube=kube,
        store=store,
        redis=redis_fake,
        ctx=BuildContext(operator_namespace="delayq-system", default_zookeeper="zk:2181"),
        failover_grace_s=30.0,
        clock=clock,
        generate=lambda: next(secrets),
    )
    await kube.close()


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger("tests.kube")
