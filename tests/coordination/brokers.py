"""A topic on two real redis-servers for the tests that move or split its slots (`TwoBrokers`,
`two_brokers`): a module of its own, not conftest.py, so that the helpers built on it
(splits.py) and conftest.py's fixtures can both import it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import redis
from kazoo.client import KazooClient

from delayq.coordination.layout import TopicPaths
from delayq.coordination.routing import Routing
from delayq.local.redis_server import RedisServer
from delayq.local.zookeeper_server import ZooKeeperServer
from delayq.queue import Queue, Topic, functions
from delayq.queue.acl import service_user_rules

#: The password of the topic's restricted Redis user on both brokers.
SERVICE_PASSWORD = "engine-secret"


@dataclass
class TwoBrokers:
    """A topic on two real redis-servers, its routing in the session's ZooKeeper: the test's
    own views (a ZooKeeper session, admin clients) and each broker's client of the topic logged
    in as its restricted Redis user, the delay services' user (a move or a split needs nothing
    more)."""

    topic: Topic
    hosts: str
    servers: tuple[RedisServer, RedisServer]
    zk: KazooClient
    queues: tuple[Queue, Queue]  # logged in as the topic's restricted Redis user
    admins: tuple[redis.Redis, redis.Redis]  # the test's own view of the brokers
    _clients: list[KazooClient] = field(default_factory=list)
    _queues: list[Queue] = field(default_factory=list)

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(self.topic.namespace, self.topic.name)

    def session(self) -> KazooClient:
        """A ZooKeeper session of its own, as a fresh run of a command would have."""
        client = KazooClient(hosts=self.hosts)
        client.start(timeout=10)
        self._clients.append(client)
        return client

    def login(self, broker: int, topic: Topic) -> Queue:
        """A client of broker `broker` under `topic` (its amount and generation), logged in
        as the topic's restricted Redis user."""
        queue = _login(self.servers[broker], topic)
        self._queues.append(queue)
        return queue

    def routing(self) -> Routing:
        return Routing.from_json(self.zk.get(self.paths.routing)[0])

    def routing_argv(self, *args: str) -> list[str]:
        """The arguments of `delayq routing <args>` for this topic, its brokers and ZooKeeper,
        as an operator types them: what the tests of the command pass to `delayq.cli.main`."""
        return [
            "routing",
            *args,
            "--topic",
            self.topic.name,
            "--namespace",
            self.topic.namespace,
            "--slot-amount",
            str(self.topic.slot_amount),
            "--redis-url",
            self.servers[0].url,
            "--broker-urls",
            ",".join(server.url for server in self.servers),
            "--zookeeper-connect",
            self.hosts,
        ]

    def close(self) -> None:
        for client in [*self._clients, self.zk]:
            client.stop()
            client.close()
        for queue in [*self.queues, *self._queues]:
            queue.close()
        for admin in self.admins:
            admin.close()


Brokers = TypeVar("Brokers", bound=TwoBrokers)


def _login(server: RedisServer, topic: Topic) -> Queue:
    user = f"{topic.namespace}.{topic.name}"
    return Queue.from_url(server.url, topic, username=user, password=SERVICE_PASSWORD)


@contextlib.contextmanager
def two_brokers(
    kind: type[Brokers],
    servers: tuple[RedisServer, RedisServer],
    zookeeper: ZooKeeperServer,
    namespace: str,
    prefix: str,
    routing: tuple[int, ...],
) -> Iterator[Brokers]:
    """A fresh topic `<prefix>-<hex>` of `len(routing)` slots routed by `routing` over
    `servers`, as `kind`; closed afterwards. Its lifecycle journal is on (capped at 100),
    outcomes are kept 10 minutes and a message is not retried (max_retries 0), so the tests
    fill every part a move or a split carries in a few calls."""
    topic = Topic(
        f"{prefix}-{uuid.uuid4().hex[:8]}",
        namespace=namespace,
        slot_amount=len(routing),
        journal_max_len=100,
        outcome_retention_ms=600_000,
        max_retries=0,
    )
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    paths = TopicPaths(namespace, topic.name)
    zk.create(paths.routing, Routing(len(routing), 2, routing).to_json(), makepath=True)
    admins = (redis.Redis.from_url(servers[0].url), redis.Redis.from_url(servers[1].url))
    user = f"{namespace}.{topic.name}"
    for admin in admins:
        admin.execute_command(
            "ACL", "SETUSER", user, *service_user_rules(topic), f">{SERVICE_PASSWORD}"
        )
        functions.load(admin)  # the operator's part on Kubernetes: the service user may not
    queues = (_login(servers[0], topic), _login(servers[1], topic))
    built = kind(topic, zookeeper.hosts, servers, zk, queues, admins)
    try:
        yield built
    finally:
        built.close()
