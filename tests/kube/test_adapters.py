"""The operator's real ZooKeeper and Redis adapters against real local servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing, initial_routing
from delayq.kube.redisctl import RedisCommands
from delayq.kube.zk import (
    MAX_MEMBERS_READ,
    KazooTopicStore,
    MembersUnreadable,
    RoutingChanged,
    topic_root,
)
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import acl, reply_cap
from delayq.queue.functions import library
from delayq.queue.keys import Part, SlotKeys
from delayq.queue.reply_cap import ReplyTooLarge
from delayq.queue.topic import Topic

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def zk_store(zookeeper_server: ZooKeeperServer) -> AsyncIterator[KazooTopicStore]:
    store = KazooTopicStore([zookeeper_server.hosts])
    yield store
    await asyncio.to_thread(store.close)


async def test_routing_and_config_round_trip_through_zookeeper(
    zookeeper_server: ZooKeeperServer, zk_store: KazooTopicStore
) -> None:
    connect = zookeeper_server.hosts
    assert await zk_store.read_routing(connect, "kube-it", "orders") is None
    routing = initial_routing(8, 2)
    await zk_store.publish(connect, "kube-it", "orders", routing, "zk-password")
    await zk_store.publish(connect, "kube-it", "orders", routing, "zk-password")  # idem
    assert await zk_store.read_routing(connect, "kube-it", "orders") == routing

    client = zk_store._client(connect)
    root = topic_root("kube-it", "orders")
    assert client.get_children(root) == ["routing"]  # no `config` node: nothing read it
    client.create(f"{root}/config", b"{}")  # as an older operator left it
    await zk_store.publish(connect, "kube-it", "orders", routing, "zk-password")
    assert client.get_children(root) == ["routing"]
    assert await zk_store.owned_slots(connect, "kube-it", "orders") == 0
    for slot in (0, 3):
        client.create(f"{topic_root('kube-it', 'orders')}/owners/{slot}", b"pod", makepath=True)
    assert await zk_store.owned_slots(connect, "kube-it", "orders") == 2

    await zk_store.delete(connect, "kube-it", "orders")
    assert client.exists(topic_root("kube-it", "orders")) is None
    await zk_store.delete(connect, "kube-it", "orders")  # deleting twice is fine


async def test_a_flood_of_member_nodes_is_not_read_one_by_one(
    zookeeper_server: ZooKeeperServer, zk_store: KazooTopicStore
) -> None:
    """A topic's pods hold its tree's password, so its tenant can fill `members/` up to the
    tree's quota; the operator read each node in one of the few threads every topic on the
    ensemble shares, for as long as the tenant liked. Past MAX_MEMBERS_READ it reads none (the
    health pass deletes no library then) and answers at once."""
    connect = zookeeper_server.hosts
    client = zk_store._client(connect)
    members = TopicPaths("kube-it", "flood").members
    client.ensure_path(members)
    created = client.transaction()
    for index in range(MAX_MEMBERS_READ + 1):
        created.create(f"{members}/junk-{index}", b"{}")
    assert all(result is not False for result in created.commit())
    with pytest.raises(MembersUnreadable, match=f"{MAX_MEMBERS_READ + 1} nodes"):
        await zk_store.member_libraries(connect, "kube-it", "flood")
    client.delete(f"{members}/junk-0")
    assert await zk_store.member_libraries(connect, "kube-it", "flood") == []  # no live member
    await zk_store.delete(connect, "kube-it", "flood")


async def test_publishing_never_moves_a_slot_back(
    zookeeper_server: ZooKeeperServer, zk_store: KazooTopicStore
) -> None:
    """A routing planned before a slot move switched (read, move, publish) is refused rather
    than written: it would route the slot back to the broker the move's clean step empties."""
    connect = zookeeper_server.hosts
    read = initial_routing(4, 1)
    await zk_store.publish(connect, "kube-it", "sticky", read, "zk-password")
    client = zk_store._client(connect)
    path = TopicPaths("kube-it", "sticky").routing
    moved = Routing(4, 2, (0, 0, 0, 1))
    client.set(path, moved.to_json())  # what a mover's switch writes meanwhile
    with pytest.raises(RoutingChanged, match="a slot was moved"):
        await zk_store.publish(connect, "kube-it", "sticky", Routing(4, 2, (0,) * 4), "zk")
    assert await zk_store.read_routing(connect, "kube-it", "sticky") == moved
    await zk_store.publish(connect, "kube-it", "sticky", Routing(4, 3, moved.broker_of_slot), "")
    grown = await zk_store.read_routing(connect, "kube-it", "sticky")
    assert grown is not None
    assert grown.broker_count == 3
    await zk_store.delete(connect, "kube-it", "sticky")


async def test_publishing_never_undoes_a_slot_switched_by_a_doubling(
    zookeeper_server: ZooKeeperServer, zk_store: KazooTopicStore
) -> None:
    """A routing planned before a doubling switched some old slots to their halves (read,
    switch, publish with more brokers) keeps the node's switched slots: written back without
    them, a rerun of the doubling would catch those slots up again over their halves' writes."""
    connect = zookeeper_server.hosts
    read = initial_routing(4, 1)
    await zk_store.publish(connect, "kube-it", "halves", read, "zk-password")
    client = zk_store._client(connect)
    path = TopicPaths("kube-it", "halves").routing
    switched = Routing(4, 1, read.broker_of_slot, 0, frozenset({0, 1}))
    client.set(path, switched.to_json())  # what a splitter's per-slot switch writes meanwhile
    await zk_store.publish(connect, "kube-it", "halves", Routing(4, 2, read.broker_of_slot), "")
    grown = await zk_store.read_routing(connect, "kube-it", "halves")
    assert grown == Routing(4, 2, read.broker_of_slot, 0, frozenset({0, 1}))
    await zk_store.delete(connect, "kube-it", "halves")


@pytest.fixture
def replica() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


async def test_redis_commands_inspect_demote_promote_and_count(
    redis_server: RedisServer, redis_client: redis.Redis, replica: RedisServer
) -> None:
    redis_client.config_set("repl-diskless-sync-delay", 0)  # the replica syncs at once, not in 5 s
    for port in (redis_server.port, replica.port):  # the users a broker pod starts with
        admin = redis.Redis(port=port)
        admin.execute_command("ACL", "SETUSER", acl.ADMIN_USER, *acl.ADMIN_RULES, ">admin")
        admin.close()
    replica_admin = redis.Redis(port=replica.port)
    replica_admin.config_set("masteruser", acl.ADMIN_USER)
    replica_admin.config_set("masterauth", "admin")
    replica_admin.execute_command("ACL", "SETUSER", "default", "off")  # as in a pod
    replica_admin.close()
    commands = RedisCommands(port=redis_server.port)
    keys = SlotKeys("kube-it", "orders", 1)
    redis_client.zadd(keys.key(Part.STORE), {"a": 1, "b": 2})
    redis_client.zadd(keys.key(Part.DEAD), {"c": 3})
    master = await commands.inspect("127.0.0.1", "admin")
    assert master is not None
    assert master.role == "master"
    assert master.keys == 2
    topic = Topic("orders", namespace="kube-it", slot_amount=2)
    depths = await commands.depths("127.0.0.1", "admin", topic, [0, 1])  # the engine's stats
    assert (depths.scheduled, depths.prepared, depths.dead) == (2, 0, 1)

    on_replica = RedisCommands(port=replica.port)
    await on_replica.demote("127.0.0.1", "admin", f"127.0.0.1:{redis_server.port}")
    for _ in range(200):
        info = await on_replica.inspect("127.0.0.1", "admin")
        if info is not None and info.role == "slave" and info.keys == 2:
            break
        await asyncio.sleep(0.05)
    assert info is not None
    assert (info.role, info.keys) == ("slave", 2)  # fenced: it took the master's data
    await on_replica.promote("127.0.0.1", "admin")
    promoted = await on_replica.inspect("127.0.0.1", "admin")
    assert promoted is not None
    assert promoted.role == "master"
    assert promoted.keys == 2


async def test_a_library_loaded_in_place_of_delayqs_cannot_flood_the_operator(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's admin login is its tenant's too: it may load a library of delayq's name
    whose functions answer anything. The operator's calls to a broker cut a reply past
    ADMIN_REPLY_MAX_BYTES (here 1 MiB) instead of reading it whole into the process every
    topic shares, and go on answering after."""
    monkeypatch.setattr(reply_cap, "ADMIN_REPLY_MAX_BYTES", 1024 * 1024)
    redis_client.execute_command("ACL", "SETUSER", acl.ADMIN_USER, *acl.ADMIN_RULES, ">admin")
    name = library().name
    flood = "function() return string.rep('x', 3 * 1024 * 1024) end"
    redis_client.function_load(
        f"#!lua name={name}\n"
        f"redis.register_function{{function_name='{name}_stats', callback={flood}, "
        "flags={'no-writes'}}\n"
        f"redis.register_function{{function_name='{name}_version', callback={flood}, "
        "flags={'no-writes'}}\n",
        replace=True,
    )
    commands = RedisCommands(port=redis_server.port)
    topic = Topic("orders", namespace="kube-it", slot_amount=2)
    try:
        with pytest.raises(ReplyTooLarge, match="passed 1048576 bytes"):
            await commands.depths("127.0.0.1", "admin", topic, [0, 1])
        master = await commands.inspect("127.0.0.1", "admin")
        assert master is not None
        assert master.role == "master"
    finally:
        redis_client.function_delete(name)  # the session's server: the next tests load theirs


async def test_unreachable_redis_is_reported_as_none() -> None:
    assert await RedisCommands(port=1).inspect("127.0.0.1", "admin") is None
