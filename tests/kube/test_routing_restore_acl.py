"""A routing restored by the health pass is the topic's to read, under ZooKeeper ACLs.

The health pass publishes the status copy again with the topic's ZooKeeper password from its
Secret (handlers/restore.py): a wrong one would put an ACL on the restored tree that locks
every delay-service pod out of its routing. The operator runs with its admin identity against
a chroot of the session's ZooKeeper (the ACLs it sets on `/delayq` stay there), overriding
the `zk_connect` and `store` fixtures that the operator context (conftest.py) is built from.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import kmock
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from delayq.coordination.acl import ADMIN_USER, ZkIdentity, topic_user
from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.credentials import operator_credentials
from delayq.kube.topics import parse_body
from delayq.kube.zk import KazooTopicStore, topic_root
from delayq.local.zookeeper_server import ZooKeeperServer
from tests.kube.conftest import ZK_TIMEOUT_S
from tests.kube.pods import NAMESPACE
from tests.kube.test_events import posted
from tests.kube.test_handlers import body, provision, put_topic
from tests.kube.test_resharding import health
from tests.routing_support import read_routing

ADMIN = ZkIdentity(ADMIN_USER, "admin-secret")


@pytest.fixture
def zk_connect(zookeeper_server: ZooKeeperServer) -> str:
    """The session's ZooKeeper under a fresh, open chroot."""
    chroot = f"/restore-{uuid.uuid4().hex[:10]}"
    setup = KazooClient(hosts=zookeeper_server.hosts)
    setup.start(timeout=10)
    try:
        setup.create(chroot, acl=OPEN_ACL_UNSAFE)
    finally:
        setup.stop()
        setup.close()
    return f"{zookeeper_server.hosts}{chroot}"


@pytest.fixture
async def store(zk_connect: str) -> AsyncIterator[KazooTopicStore]:
    """The operator's ZooKeeper writer, logged in as the operator (ACLs on)."""
    topic_store = KazooTopicStore(
        [zk_connect], timeout_s=ZK_TIMEOUT_S, admin_password=ADMIN.password
    )
    yield topic_store
    await asyncio.to_thread(topic_store.close)


@pytest.fixture
def admin(zk_connect: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_connect, auth_data=[ADMIN.auth_data])
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


async def test_the_health_pass_restores_the_routing_for_the_topic_only(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    admin: KazooClient,
    zk_connect: str,
    logger: logging.Logger,
) -> None:
    put_topic(api, brokers=1, slotAmount=4, replicasPerBroker=0)
    await provision(api, ctx, logger)
    secret = await operator_credentials(ctx, body(api), parse_body(body(api)))
    pods = ZkIdentity(topic_user(NAMESPACE, "orders"), secret[naming.SECRET_ZOOKEEPER_PASSWORD])
    before = await read_routing(zk_connect, NAMESPACE, "orders", 4, pods)
    assert before == [0, 0, 0, 0]

    admin.delete(topic_root(NAMESPACE, "orders"), recursive=True)  # the data lost
    await health(api, ctx, logger)
    assert ("Warning", "RoutingRestored") in posted(api)
    assert await read_routing(zk_connect, NAMESPACE, "orders", 4, pods) == before
    with pytest.raises(NoAuthError):
        await read_routing(zk_connect, NAMESPACE, "orders", 4, None)
