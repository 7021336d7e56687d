"""The operator's few Redis commands: inspect replication, promote, demote, depths, memory,
pause.

Depths are the engine's own stats (`AsyncQueue.stats`, the read-only stats script), so the
operator counts messages exactly as the delay service's metrics and API do.

Behind a Protocol; the real one uses redis.asyncio against pod IPs (the topic's NetworkPolicy
admits the operator's pods). Tests run it against local redis-servers through its test-only
`addresses` map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from delayq.kube import naming
from delayq.queue import AsyncQueue, Topic, TopicStats, acl

CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Replication:
    role: str  # "master" or "slave"
    offset: int
    keys: int


@dataclass(frozen=True)
class BrokerMemory:
    """A master's `INFO memory`: what it holds, and where it starts refusing writes."""

    used_memory_bytes: int
    max_memory_bytes: int  # 0: no maxmemory (the pod has no memory limit): never refuses

    @property
    def used_ratio(self) -> float | None:
        """used / max, or None when unbounded."""
        if self.max_memory_bytes <= 0:
            return None
        return self.used_memory_bytes / self.max_memory_bytes


class RedisControl(Protocol):
    async def inspect(self, host: str, password: str) -> Replication | None:
        """Replication role/offset and key count, or None when the pod does not answer."""

    async def promote(self, host: str, password: str) -> None:
        """REPLICAOF NO ONE: the pod becomes a master keeping its data."""

    async def demote(self, host: str, password: str, master_host: str) -> None:
        """REPLICAOF master ("host" or "host:port"): drop the data, resync from the master."""

    async def depths(
        self, host: str, password: str, topic: Topic, slots: Sequence[int]
    ) -> TopicStats:
        """The engine's stats of the given slots of `topic` on one master."""

    async def memory(self, host: str, password: str) -> BrokerMemory:
        """used_memory and maxmemory from INFO memory; raises on a Redis or network error."""

    async def pause(self, host: str, password: str, topic: Topic, paused: bool | None) -> bool:
        """Pause (True) or resume (False) the topic's delivery on one master, or (None) leave
        it; returns whether it is paused now (the engine's own `AsyncQueue.pause` key)."""


class RedisCommands:
    """RedisControl over redis.asyncio; one short-lived connection per call keeps it simple.

    `port` is the pods' Redis port; tests point it at a local redis-server.

    `addresses` is TEST-ONLY and never set by the operator: it rewrites a pod IP or a master
    Service host name to the (host, port) of a local redis-server playing that pod, both where
    the operator connects and in the REPLICAOF target it sends, because tests have no pod
    network or cluster DNS. It is read on every call, so a live mapping can follow label moves
    (a Service) or make a pod unreachable (a partition). Unmapped hosts are used as given.
    """

    def __init__(
        self,
        port: int = naming.REDIS_PORT,
        addresses: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        self.port = port
        self.addresses: Mapping[str, tuple[str, int]] = {} if addresses is None else addresses

    def _target(self, host: str, port: int | None = None) -> tuple[str, int]:
        return self.addresses.get(host) or (host, self.port if port is None else port)

    def _client(self, host: str, password: str) -> redis.asyncio.Redis:
        host, port = self._target(host)
        return redis.asyncio.Redis(
            host=host,
            port=port,
            username=acl.ADMIN_USER,
            password=password,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=CONNECT_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),  # a dead pod must not stall the health pass
        )

    async def inspect(self, host: str, password: str) -> Replication | None:
        client = self._client(host, password)
        try:
            info = await client.info("replication")
            keys = int(await client.dbsize())
        except (redis.RedisError, OSError):
            return None
        finally:
            await client.aclose()
        role = str(info.get("role", ""))
        offset_key = "master_repl_offset" if role == "master" else "slave_repl_offset"
        return Replication(role=role, offset=int(info.get(offset_key, 0)), keys=keys)

    async def promote(self, host: str, password: str) -> None:
        client = self._client(host, password)
        try:
            await client.replicaof("NO", "ONE")
        finally:
            await client.aclose()

    async def demote(self, host: str, password: str, master_host: str) -> None:
        client = self._client(host, password)
        try:
            name, _, port = master_host.partition(":")  # "host" or "host:port"
            target, target_port = self._target(name, int(port) if port else None)
            await client.replicaof(target, str(target_port))
        finally:
            await client.aclose()

    async def depths(
        self, host: str, password: str, topic: Topic, slots: Sequence[int]
    ) -> TopicStats:
        queue = AsyncQueue(self._client(host, password), topic)
        try:
            return await queue.stats(slots)
        finally:
            await queue.close()

    async def memory(self, host: str, password: str) -> BrokerMemory:
        client = self._client(host, password)
        try:
            info = await client.info("memory")
        finally:
            await client.aclose()
        return BrokerMemory(
            used_memory_bytes=int(info.get("used_memory", 0)),
            max_memory_bytes=int(info.get("maxmemory", 0)),
        )

    async def pause(self, host: str, password: str, topic: Topic, paused: bool | None) -> bool:
        queue = AsyncQueue(self._client(host, password), topic)
        try:
            if paused is True:
                await queue.pause()
            elif paused is False:
                await queue.resume()
            return await queue.is_paused()
        finally:
            await queue.close()
