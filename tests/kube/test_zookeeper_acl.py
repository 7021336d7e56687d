"""Tenant isolation in ZooKeeper, on a real ensemble: a topic's tree is its own and the operator's.

The operator (admin identity) publishes two topics; each topic's delay services log in with their
own password. Every read or write of a topic's nodes by the other topic's identity, or by a client
with no credentials, must be refused by ZooKeeper itself (NoAuthError), and no tenant may create a
topic root it does not own. Each test runs under its own chroot so the ACLs it sets on `/delayq`
never reach the other suites sharing the session's ZooKeeper.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from delayq.coordination.acl import ADMIN_USER, ZkIdentity, topic_user
from delayq.coordination.layout import ROOT, TopicPaths, namespace_root
from delayq.coordination.routing import initial_routing
from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
from delayq.kube.zk import KazooTopicStore
from delayq.local.waiting import eventually
from delayq.local.zookeeper_server import ZooKeeperServer
from tests.routing_support import read_routing

pytestmark = pytest.mark.timeout(120)

NAMESPACE = "tenants"
SLOTS = 4
ADMIN = ZkIdentity(ADMIN_USER, "admin-secret")


@dataclass(frozen=True)
class Tenant:
    topic: str
    identity: ZkIdentity

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(NAMESPACE, self.topic)


ALICE = Tenant("alice", ZkIdentity(topic_user(NAMESPACE, "alice"), "alice-secret"))
BOB = Tenant("bob", ZkIdentity(topic_user(NAMESPACE, "bob"), "bob-secret"))


@pytest.fixture
def hosts(zookeeper_server: ZooKeeperServer) -> str:
    """The session's ZooKeeper under a fresh, open chroot."""
    chroot = f"/acl-{uuid.uuid4().hex[:10]}"
    setup = KazooClient(hosts=zookeeper_server.hosts)
    setup.start(timeout=10)
    try:
        setup.create(chroot, acl=OPEN_ACL_UNSAFE)
    finally:
        setup.stop()
        setup.close()
    return f"{zookeeper_server.hosts}{chroot}"


@pytest.fixture
def client_for(hosts: str) -> Iterator[dict[str, KazooClient]]:
    """Plain clients logged in as each identity (and one with no credentials: "nobody")."""
    clients: dict[str, KazooClient] = {}
    logins = {"admin": ADMIN, "alice": ALICE.identity, "bob": BOB.identity, "nobody": None}
    for name, identity in logins.items():
        client = KazooClient(hosts=hosts, auth_data=[identity.auth_data] if identity else None)
        client.start(timeout=10)
        clients[name] = client
    yield clients
    for client in clients.values():
        client.stop()
        client.close()


@pytest.fixture
async def store(hosts: str) -> AsyncIterator[KazooTopicStore]:
    store = KazooTopicStore([hosts], admin_password=ADMIN.password)
    yield store
    await asyncio.to_thread(store.close)


async def serving(hosts: str, tenant: Tenant) -> ZkOwnership:
    """One delay service of `tenant`, logged in as the topic, holding every slot."""
    member = ZkOwnership(
        ZkSettings(
            hosts=hosts,
            namespace=NAMESPACE,
            topic=tenant.topic,
            slot_amount=SLOTS,
            member_id=f"{tenant.topic}-0",
            session_timeout_s=4.0,
            identity=tenant.identity,
            admin_acl_id=ADMIN.acl_id,
        )
    )

    async def on_change(slots: frozenset[int]) -> None:
        return None

    await member.start(on_change)
    await eventually(
        lambda: member.ready and len(member.owned) == SLOTS,
        15.0,
        f"{tenant.topic} owning every slot",
    )
    return member


async def test_another_topic_and_anonymous_clients_can_neither_read_nor_write_a_tree(
    hosts: str, store: KazooTopicStore, client_for: dict[str, KazooClient]
) -> None:
    for tenant in (ALICE, BOB):
        await store.publish(
            hosts, NAMESPACE, tenant.topic, initial_routing(SLOTS, 1), tenant.identity.password
        )
    alice = await serving(hosts, ALICE)
    try:
        paths = ALICE.paths
        nodes = [
            paths.root,
            paths.routing,
            paths.assignment,
            paths.members,
            paths.member("alice-0"),
            paths.owners,
            paths.owner(0),
        ]
        for intruder in ("bob", "nobody"):
            client = client_for[intruder]
            for node in nodes:
                assert client.exists(node) is not None  # names are not secret...
                with pytest.raises(NoAuthError):
                    client.get(node)  # ...contents are
                with pytest.raises(NoAuthError):
                    client.set(node, b"hijacked")
            for parent in (paths.members, paths.owners):
                with pytest.raises(NoAuthError):
                    client.get_children(parent)
                with pytest.raises(NoAuthError):
                    client.create(f"{parent}/intruder", b"x", ephemeral=True)
            with pytest.raises(NoAuthError):
                client.delete(paths.owner(0))  # would hand the slot to nobody in particular
            with pytest.raises(NoAuthError):  # squatting a topic root that is not one's own
                client.create(TopicPaths(NAMESPACE, "carol").root, b"")
            with pytest.raises(NoAuthError):
                client.create(namespace_root("elsewhere"), b"")
            for parent in (ROOT, namespace_root(NAMESPACE)):  # who else shares the ensemble
                with pytest.raises(NoAuthError):
                    client.get_children(parent)

        assert client_for["alice"].get(paths.routing)[0] == initial_routing(SLOTS, 1).to_json()
        assert client_for["admin"].get_children(paths.owners)  # the operator counts owners
        assert await store.owned_slots(hosts, NAMESPACE, ALICE.topic) == SLOTS
    finally:
        await alice.stop()
    await store.delete(hosts, NAMESPACE, ALICE.topic)  # the operator removes a deleted topic
    assert client_for["admin"].exists(ALICE.paths.root) is None
    assert client_for["admin"].exists(BOB.paths.root) is not None


async def test_publishing_closes_a_tree_an_older_operator_left_open(
    hosts: str, store: KazooTopicStore, client_for: dict[str, KazooClient]
) -> None:
    open_client = client_for["nobody"]
    paths = ALICE.paths
    for node in (paths.routing, paths.members, paths.owners):
        open_client.create(node, b"{}", makepath=True)  # world-writable, as before ACLs
    await store.publish(
        hosts, NAMESPACE, ALICE.topic, initial_routing(SLOTS, 1), ALICE.identity.password
    )
    for node in (ROOT, namespace_root(NAMESPACE), paths.root, paths.routing, paths.members):
        with pytest.raises(NoAuthError):
            open_client.set(node, b"hijacked")
    with pytest.raises(NoAuthError):
        open_client.get_children(namespace_root(NAMESPACE))
    assert client_for["admin"].get_children(namespace_root(NAMESPACE)) == [ALICE.topic]
    assert client_for["alice"].get(paths.routing)[0] == initial_routing(SLOTS, 1).to_json()


async def test_a_service_cannot_start_a_tree_the_operator_has_not_created(
    hosts: str, store: KazooTopicStore
) -> None:
    """The namespace node is the operator's: a service whose topic is not published yet waits
    (not ready) instead of creating a root that the operator would not own."""
    await store.publish(
        hosts, NAMESPACE, BOB.topic, initial_routing(SLOTS, 1), BOB.identity.password
    )  # the namespace node exists, locked
    member = ZkOwnership(
        ZkSettings(
            hosts=hosts,
            namespace=NAMESPACE,
            topic=ALICE.topic,
            slot_amount=SLOTS,
            member_id="alice-0",
            identity=ALICE.identity,
            admin_acl_id=ADMIN.acl_id,
        )
    )

    async def on_change(slots: frozenset[int]) -> None:
        return None

    await member.start(on_change)
    try:
        assert not member.ready
        assert member.owned == frozenset()
        await store.publish(
            hosts, NAMESPACE, ALICE.topic, initial_routing(SLOTS, 1), ALICE.identity.password
        )
        await eventually(
            lambda: member.ready and len(member.owned) == SLOTS,
            15.0,
            "alice owning every slot once the operator published her tree",
        )
    finally:
        await member.stop()


async def test_the_services_read_the_routing_as_the_topic_and_fail_closed(
    hosts: str, store: KazooTopicStore
) -> None:
    """A multi-broker service reads the operator's routing once at start: as the topic it gets
    it; refused, it must not fall back to the first routing (messages to the wrong broker)."""
    routing = initial_routing(SLOTS, 2)
    await store.publish(hosts, NAMESPACE, ALICE.topic, routing, ALICE.identity.password)
    read = await read_routing(hosts, NAMESPACE, ALICE.topic, SLOTS, ALICE.identity)
    assert read == list(routing.broker_of_slot)
    for stranger in (None, BOB.identity):
        with pytest.raises(NoAuthError):
            await read_routing(hosts, NAMESPACE, ALICE.topic, SLOTS, stranger)
