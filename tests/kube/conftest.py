"""Fixtures for the operator tests: kmock as the Kubernetes API, real ZooKeeper and Redis.

ZooKeeper is the session's real server (tests/conftest.py); the topics' trees are removed
before each test. Redis pods are played by a module-wide pool of real redis-servers (see
tests/kube/pods.py), reached through RedisCommands' test-only address map.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import kmock
import kopf
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from delayq.coordination.routing import Routing
from delayq.kube.builders.common import BuildContext
from delayq.kube.client import KubeClient
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.redisctl import RedisCommands
from delayq.kube.zk import KazooTopicStore, topic_root
from delayq.local.ports import free_port
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from tests.kube.pods import NAMESPACE, OPERATOR_NAMESPACE, RedisPods

DT = "delayq.io/v1alpha1/delaytopics"
TOPICS = ("orders", "bad", "gone", "quiet")  # every topic name these tests create
POOL_SIZE = 4  # the most Redis pods one test runs: 2 brokers x (master + 1 replica)
# Bounds connecting to ZooKeeper and each call: an unreachable ensemble fails this fast.
ZK_TIMEOUT_S = 2.0


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
        ("coordination.k8s.io/v1/leases", "Lease"),
        ("discovery.k8s.io/v1/endpointslices", "EndpointSlice"),
        ("batch/v1/cronjobs", "CronJob"),
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
async def kube(connection: kopf.ConnectionInfo) -> AsyncIterator[KubeClient]:
    client = KubeClient(connection)
    yield client
    await client.close()


@pytest.fixture(scope="module")
def redis_pool() -> Iterator[list[RedisServer]]:
    """Real redis-servers for one test module; no diskless-sync delay, so replicas sync at once."""
    servers: list[RedisServer] = []
    try:
        for _ in range(POOL_SIZE):
            servers.append(RedisServer(extra_config={"repl-diskless-sync-delay": "0"}).start())
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def redis_pods(api: kmock.KubernetesEmulator, redis_pool: list[RedisServer]) -> Iterator[RedisPods]:
    pods = RedisPods(api, redis_pool)
    try:
        yield pods
    finally:
        pods.reset()


@pytest.fixture
def redis_commands(redis_pods: RedisPods) -> RedisCommands:
    """The operator's real Redis client, with pod addresses mapped to the local servers."""
    return RedisCommands(addresses=redis_pods)


@pytest.fixture(scope="session")
def zk_client(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """The tests' own view of ZooKeeper, to check what the operator really wrote."""
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=30)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk(zk_client: KazooClient) -> KazooClient:
    """The ZooKeeper client, with the trees of this suite's topics removed first."""
    for topic in TOPICS:
        with contextlib.suppress(NoNodeError):
            zk_client.delete(topic_root(NAMESPACE, topic), recursive=True)
    return zk_client


@pytest.fixture
async def store(
    zk: KazooClient, zk_connect: str, dead_zookeeper: str
) -> AsyncIterator[KazooTopicStore]:
    """The operator's real ZooKeeper writer, for the ensembles `ctx` allows."""
    topic_store = KazooTopicStore((zk_connect, dead_zookeeper), timeout_s=ZK_TIMEOUT_S)
    yield topic_store
    await asyncio.to_thread(topic_store.close)


@pytest.fixture
def zk_connect(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.hosts


@pytest.fixture
def dead_zookeeper() -> str:
    """A connection string to a closed loopback port: an ensemble nobody can reach (one the
    platform allows, in `ctx` and `store`)."""
    return f"127.0.0.1:{free_port()}"


def published_routing(zk: KazooClient, topic: str = "orders") -> Routing | None:
    try:
        data, _ = zk.get(f"{topic_root(NAMESPACE, topic)}/routing")
    except NoNodeError:
        return None
    return Routing.from_json(data)


def topic_tree_exists(zk: KazooClient, topic: str = "orders") -> bool:
    return zk.exists(topic_root(NAMESPACE, topic)) is not None


def own_slots(zk: KazooClient, slots: int, topic: str = "orders") -> None:
    """Owner nodes as the delay services create them when they take over slots."""
    for slot in range(slots):
        zk.create(
            f"{topic_root(NAMESPACE, topic)}/owners/{slot}",
            b"orders-service-0",
            ephemeral=True,
            makepath=True,
        )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def ctx(
    connection: kopf.ConnectionInfo,
    store: KazooTopicStore,
    redis_commands: RedisCommands,
    zk_connect: str,
    dead_zookeeper: str,
    clock: Clock,
) -> AsyncIterator[OperatorContext]:
    secrets = iter(f"generated-{index}" for index in range(1000))
    kube = KubeClient(connection)
    build = BuildContext(
        operator_namespace=OPERATOR_NAMESPACE,
        default_zookeeper=zk_connect,
        zookeeper_allowed_ensembles=(dead_zookeeper,),
    )
    yield OperatorContext(
        OperatorConfig(build=build, failover_grace_s=30.0),
        store=store,
        redis=redis_commands,
        clock=clock,
        generate=lambda: next(secrets),
        client=kube,
        pairing_wait_s=0,  # no scheduler: no service pod is ever placed (kube/pairing.py)
    )
    await kube.close()


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger("tests.kube")
