"""In-memory stand-ins for ZooKeeper and Redis, so handler tests need only kmock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from delayq.kube.redisctl import Depths, Replication
from delayq.kube.routing import Routing


@dataclass
class FakeTopicStore:
    """TopicStore keeping published nodes in a dict; `fail` simulates an unreachable ensemble."""

    routing: dict[tuple[str, str, str], Routing] = field(default_factory=dict)
    config: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    owners: dict[tuple[str, str, str], int] = field(default_factory=dict)
    deleted: list[tuple[str, str, str]] = field(default_factory=list)
    fail: bool = False

    def _check(self) -> None:
        if self.fail:
            raise TimeoutError("zookeeper unreachable (simulated)")

    async def read_routing(self, connect: str, namespace: str, topic: str) -> Routing | None:
        self._check()
        return self.routing.get((connect, namespace, topic))

    async def publish(
        self, connect: str, namespace: str, topic: str, routing: Routing, config: bytes
    ) -> None:
        self._check()
        self.routing[connect, namespace, topic] = routing
        self.config[connect, namespace, topic] = config

    async def owned_slots(self, connect: str, namespace: str, topic: str) -> int:
        self._check()
        return self.owners.get((connect, namespace, topic), 0)

    async def delete(self, connect: str, namespace: str, topic: str) -> None:
        self._check()
        self.routing.pop((connect, namespace, topic), None)
        self.deleted.append((connect, namespace, topic))


@dataclass
class FakeRedis:
    """RedisControl over a dict of pod IP -> replication state; records every command."""

    nodes: dict[str, Replication] = field(default_factory=dict)
    commands: list[tuple[str, ...]] = field(default_factory=list)
    depth: Depths = field(default_factory=Depths)

    async def inspect(self, host: str, password: str) -> Replication | None:
        assert password, "the operator must authenticate to Redis"
        return self.nodes.get(host)

    async def promote(self, host: str, password: str) -> None:
        self.commands.append(("promote", host))
        node = self.nodes[host]
        self.nodes[host] = Replication("master", node.offset, node.keys)

    async def demote(self, host: str, password: str, master_host: str) -> None:
        self.commands.append(("demote", host, master_host))
        node = self.nodes[host]
        self.nodes[host] = Replication("slave", node.offset, node.keys)

    async def depths(
        self, host: str, password: str, namespace: str, topic: str, slots: Sequence[int]
    ) -> Depths:
        return self.depth
