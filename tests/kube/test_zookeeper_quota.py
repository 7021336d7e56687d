"""The ensemble's own limits, on a real ZooKeeper 3.8 run with `enforceQuota=true` as the bundled
one is (coordination/quota.py): a closed root, quotas no tenant can lift, and a hard quota per
topic tree that stops a tenant filling the ensemble yet fits a topic at the largest slot amount.

The server is this module's own, without a chroot: publishing closes its `/`, which would lock
the other suites out of the session's ZooKeeper.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, QuotaExceededError
from kazoo.security import ACL, Id, Permissions

from delayq.coordination.acl import ADMIN_USER, ZkIdentity, topic_user
from delayq.coordination.layout import ROOT, AssignmentDocument, TopicPaths, namespace_root
from delayq.coordination.quota import (
    LIMITS_NODE,
    QUOTA_ROOT,
    TOPIC_QUOTA,
    TreeQuota,
    guard_topic_tree,
    quota_path,
)
from delayq.coordination.routing import initial_routing
from delayq.kube.zk import EnsembleNotAllowed, KazooTopicStore
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue.topic import MAX_SLOT_AMOUNT

pytestmark = pytest.mark.timeout(120)

NAMESPACE = "tenants"
ADMIN = ZkIdentity(ADMIN_USER, "admin-secret")
ALICE = ZkIdentity(topic_user(NAMESPACE, "alice"), "alice-secret")
BOB = ZkIdentity(topic_user(NAMESPACE, "bob"), "bob-secret")
CAROL = ZkIdentity(topic_user(NAMESPACE, "carol"), "carol-secret")
BATCH = 1024  # creates per transaction, well under the 1 MB request limit
CHUNK_BYTES = 900_000  # under the 1 MB request limit (jute.maxbuffer)


@pytest.fixture(scope="module")
def ensemble() -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="module")
def clients(ensemble: ZooKeeperServer) -> Iterator[dict[str, KazooClient]]:
    logins = {"admin": ADMIN, "alice": ALICE, "bob": BOB, "carol": CAROL, "nobody": None}
    clients = {
        name: KazooClient(hosts=ensemble.hosts, auth_data=[login.auth_data] if login else None)
        for name, login in logins.items()
    }
    for client in clients.values():
        client.start(timeout=10)
    yield clients
    for client in clients.values():
        client.stop()
        client.close()


@pytest.fixture
async def published(ensemble: ZooKeeperServer) -> AsyncIterator[KazooTopicStore]:
    """The operator's store, after publishing alice and bob."""
    store = KazooTopicStore([ensemble.hosts], admin_password=ADMIN.password)
    for topic, identity in (("alice", ALICE), ("bob", BOB)):
        routing = initial_routing(16, 1)
        await store.publish(ensemble.hosts, NAMESPACE, topic, routing, identity.password)
    yield store
    await asyncio.to_thread(store.close)


async def test_strangers_can_neither_list_the_tenants_nor_write_the_root_or_a_quota(
    ensemble: ZooKeeperServer, published: KazooTopicStore, clients: dict[str, KazooClient]
) -> None:
    alice_quota = f"{quota_path(TopicPaths(NAMESPACE, 'alice'))}/{LIMITS_NODE}"
    for name in ("nobody", "bob", "alice"):
        client = clients[name]
        for parent in (ROOT, namespace_root(NAMESPACE)):
            with pytest.raises(NoAuthError):  # the victims of issue 27 were found this way
                client.get_children(parent)
        with pytest.raises(NoAuthError):
            client.create("/squat", b"")
        with pytest.raises(NoAuthError):  # lifting a quota, one's own or another's
            client.set(alice_quota, b"count=-1,bytes=-1")
        with pytest.raises(NoAuthError):
            client.delete(quota_path(TopicPaths(NAMESPACE, "alice")), recursive=True)
        with pytest.raises(NoAuthError):
            client.create(f"{QUOTA_ROOT}/squat", b"")
        assert client.get_children("/zookeeper")  # the server's own nodes stay as they were
    trees = await published.topic_trees(ensemble.hosts, [])  # the operator's GC still lists
    assert sorted(trees) == [(NAMESPACE, "alice"), (NAMESPACE, "bob")]
    await published.delete(ensemble.hosts, NAMESPACE, "bob")  # a deleted topic: quota gone too
    assert clients["admin"].exists(quota_path(TopicPaths(NAMESPACE, "bob"))) is None


async def test_a_chroot_into_a_victims_tree_changes_none_of_its_acls(
    ensemble: ZooKeeperServer, published: KazooTopicStore, clients: dict[str, KazooClient]
) -> None:
    """Issue 27, attack 2: a connection rooted at a victim's `members/` must not make the
    operator close that root: the victim's services could no longer register. The store
    refuses such a connection (not an ensemble it was given); even where a platform listed one,
    the guard leaves the chroot node alone."""
    victim = TopicPaths(NAMESPACE, "alice")
    before = clients["admin"].get_acls(victim.members)[0]
    routing = initial_routing(16, 1)
    chrooted = f"{ensemble.hosts}{victim.members}"
    with pytest.raises(EnsembleNotAllowed):
        await published.publish(chrooted, "evil", "x", routing, "pw")
    listed = KazooTopicStore([chrooted], admin_password=ADMIN.password)
    try:
        await listed.publish(chrooted, "evil", "x", routing, "pw")
    finally:
        await asyncio.to_thread(listed.close)
    assert clients["admin"].get_acls(victim.members)[0] == before
    clients["alice"].create(victim.member("alice-9"), b"{}", ephemeral=True)  # still hers


async def test_a_topic_writing_past_its_quota_is_refused(
    published: KazooTopicStore, clients: dict[str, KazooClient]
) -> None:
    alice = clients["alice"]
    root = TopicPaths(NAMESPACE, "alice").root
    written = 0
    refused = None
    for i in range(TOPIC_QUOTA.size_bytes // CHUNK_BYTES + 2):
        try:
            alice.create(f"{root}/junk-{i}", b"x" * CHUNK_BYTES)
        except QuotaExceededError as error:
            refused = error
            break
        written += CHUNK_BYTES
    assert refused is not None
    assert TOPIC_QUOTA.size_bytes - CHUNK_BYTES < written <= TOPIC_QUOTA.size_bytes
    # the count is as hard: a tree guarded with a small quota takes no node past it
    admin = clients["admin"]
    paths = TopicPaths(NAMESPACE, "counted")
    admin.create(paths.root, b"", makepath=True)
    await asyncio.to_thread(guard_topic_tree, admin, paths, ADMIN.acl_id, TreeQuota(count=5))
    for i in range(4):  # the root is the first of the five
        admin.create(f"{paths.root}/n{i}")
    with pytest.raises(QuotaExceededError):
        admin.create(f"{paths.root}/n4")


async def test_a_topic_at_the_largest_slot_amount_fits_its_quota(
    ensemble: ZooKeeperServer, published: KazooTopicStore, clients: dict[str, KazooClient]
) -> None:
    """Every per-slot node a topic can have at once at 16,384 slots, with realistic payloads,
    plus its assignment and routing: all accepted, with room left."""
    routing = initial_routing(MAX_SLOT_AMOUNT, 64)
    await published.publish(ensemble.hosts, NAMESPACE, "carol", routing, CAROL.password)
    carol = clients["carol"]
    paths = TopicPaths(NAMESPACE, "carol")
    member_id = "orders-delay-service-7d9f8b6c5d-x2x4z-12345"  # a pod name and a pid
    migration = json.dumps({"slot": 0, "source": 0, "target": 1, "step": "copy"}).ljust(200)
    started = time.monotonic()
    for parent in (paths.migrations, paths.movers):
        carol.create(parent, b"")
    per_slot = ((paths.owner, member_id), (paths.migration, migration), (paths.mover, ""))
    for node, payload in per_slot:
        for first in range(0, MAX_SLOT_AMOUNT, BATCH):  # one transaction per batch: quick
            batch = carol.transaction()
            for slot in range(first, first + BATCH):
                batch.create(node(slot), payload.encode())
            assert not [r for r in batch.commit() if isinstance(r, Exception)]
    owners = {slot: member_id for slot in range(MAX_SLOT_AMOUNT)}
    document = AssignmentDocument(1, owners, frozenset({member_id}))
    carol.create(paths.assignment, document.encode(MAX_SLOT_AMOUNT))
    assert len(carol.get_children(paths.owners)) == MAX_SLOT_AMOUNT
    used = clients["admin"].get(f"{quota_path(paths)}/zookeeper_stats")[0].decode()
    count, size = (int(field.split("=")[1]) for field in used.split(",")[:2])
    print(f"16,384-slot tree: {count} nodes, {size} bytes, {time.monotonic() - started:.1f}s")
    assert count < TOPIC_QUOTA.count
    assert size < TOPIC_QUOTA.size_bytes


async def test_a_root_the_operator_may_not_change_is_left_as_it_is(
    ensemble: ZooKeeperServer,
    published: KazooTopicStore,
    clients: dict[str, KazooClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ensemble whose `/` its owner restricted: publishing still works, logged once. Last in
    the module: nobody may change this `/` afterwards."""
    everything_but_admin = Permissions.ALL & ~Permissions.ADMIN
    restricted = [
        ACL(everything_but_admin, Id("digest", ADMIN.acl_id)),
        ACL(Permissions.READ, Id("world", "anyone")),
    ]
    clients["admin"].set_acls("/", restricted)
    for _ in range(2):
        routing = initial_routing(16, 1)
        await published.publish(ensemble.hosts, NAMESPACE, "dave", routing, "dave-secret")
    # unchanged (without the ADMIN permission the server masks the digest's hash: `user:x`)
    acl = clients["admin"].get_acls("/")[0]
    assert [(entry.perms, entry.id.id.split(":")[0]) for entry in acl] == [
        (everything_but_admin, ADMIN_USER),
        (Permissions.READ, "anyone"),
    ]
    assert clients["admin"].exists(quota_path(TopicPaths(NAMESPACE, "dave"))) is not None
    assert caplog.text.count("ZooKeeper root /: the operator may not set its ACL") == 1
