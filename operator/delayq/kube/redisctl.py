"""The operator's few Redis commands: inspect replication, promote, demote, depths, memory,
pause, loading the engine's functions library (`load_functions`: only the admin user may) and
deleting old ones (`libraries`, `delete_library`: kube/libraries.py), the planned switchover
of a stopping master (`hand_over`, `release`), and the engine clients the slot mover works
with (`broker_queue`, resharding.py).

Depths are the engine's own stats (`AsyncQueue.stats`, the read-only stats script), so the
operator counts messages exactly as the delay service's metrics and API do.

Behind a Protocol; the real one uses redis.asyncio against pod IPs (the topic's NetworkPolicy
admits the operator's pods). Tests run it against local redis-servers through its test-only
`addresses` map.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from delayq.kube import naming
from delayq.queue import AsyncQueue, Queue, Topic, TopicStats, acl, functions
from delayq.queue.reply_cap import capped_async_client, capped_client

CONNECT_TIMEOUT_S = 2.0
# A slot move's calls: each reads or writes one page of at most 16 keys of 2,000 entries
# (queue/slot_copy.py), so this bounds a dead broker, not a large slot; it is well under the
# health pass's bound (healthloop.PASS_TIMEOUT_S), which the moves run inside.
MOVE_TIMEOUT_S = 10.0
# A switchover's CLIENT PAUSE bound: if the operator dies mid-way, the old master takes writes
# again after this. It is far above what a switchover's steps may take (CATCH_UP_TIMEOUT_S, then
# two commands of at most CONNECT_TIMEOUT_S each, checked by PROMOTE_BY_S), so the old master
# never takes a write between the offset check and its demotion.
SWITCH_PAUSE_MS = 10_000
# How long a replica may take to reach the paused master's offset before the switchover is
# given up (writes resume on the old master, nothing else changed): a linked replica is
# milliseconds behind, so waiting longer would only lengthen the writes' pause.
CATCH_UP_TIMEOUT_S = 1.0
CATCH_UP_POLL_S = 0.002
# The replica is promoted only this soon after the pause began, whatever delayed the steps
# before: the old master's demotion (<= CONNECT_TIMEOUT_S) then ends well inside the pause.
PROMOTE_BY_S = SWITCH_PAUSE_MS / 1000 - 3 * CONNECT_TIMEOUT_S


class CatchUpTimeout(Exception):
    """The replica did not reach the paused master's offset in time; nothing was switched and
    the old master takes writes again."""


@dataclass(frozen=True)
class Replication:
    role: str  # "master" or "slave"
    offset: int
    keys: int
    link_up: bool = False  # a replica whose link to its master is up
    synced: bool = False  # a replica that holds its master's data: see `_synced`


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

    async def load_functions(self, host: str, password: str) -> bool:
        """FUNCTION LOAD the engine's library of this operator's version on one master (its
        replicas get it by replication); False when the master has it already. The topic's
        users may only FCALL it, so this is what makes a new or emptied broker usable."""

    async def libraries(self, host: str, password: str) -> list[str]:
        """The delayq functions libraries (of every version) one master holds."""

    async def delete_library(self, host: str, password: str, name: str) -> None:
        """FUNCTION DELETE one library on one master (its replicas follow by replication)."""

    async def publish_settings(
        self, host: str, password: str, topic: Topic, owner: str, version: int
    ) -> list[int]:
        """Write the topic's settings record into every slot of `topic` (its slot amount and
        key generation) on one master, as the topic's owner (`queue/topic_record.py`); per
        slot, the version its record holds after the call (a newer one is kept)."""

    async def pause(self, host: str, password: str, topic: Topic, paused: bool | None) -> bool:
        """Pause (True) or resume (False) the topic's delivery on one master, or (None) leave
        it; returns whether it is paused now (the engine's own `AsyncQueue.pause` key)."""

    def broker_queue(self, host: str, password: str, topic: Topic) -> Queue:
        """A blocking engine client of `topic` on one broker's master (the master Service's
        host, which follows failovers), as the slot mover needs it; the caller closes it."""

    async def hand_over(self, master: str, replica: str, password: str) -> int:
        """Make `replica` the master of `master`'s data, losing no acknowledged write: pause
        the master's writes (CLIENT PAUSE WRITE), wait until the replica has its offset,
        REPLICAOF NO ONE on the replica, REPLICAOF replica on the old master. Returns the
        offset handed over. The old master stays paused until `release`: its clients wait
        instead of failing while the role label moves. Raises CatchUpTimeout when the
        replica lags; on that or any other failure before the old master's demotion, its
        writes resume at once (it still is the master its clients reach)."""

    async def release(self, host: str, password: str) -> None:
        """End a handed-over master's pause and close its clients' connections, so that they
        reconnect through the master Service (now the new master) at once."""


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
        return capped_async_client(  # its replies bounded: the tenant holds this login too
            host=host,
            port=port,
            username=acl.ADMIN_USER,
            password=password,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=CONNECT_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),  # a dead pod must not stall the health pass
        )

    def broker_queue(self, host: str, password: str, topic: Topic) -> Queue:
        host, port = self._target(host)
        client = capped_client(  # a move's reads fitted to its cap (queue/reply_cap.py)
            host=host,
            port=port,
            username=acl.ADMIN_USER,
            password=password,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=MOVE_TIMEOUT_S,
        )
        return Queue(client, topic)

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
        return Replication(
            role=role,
            offset=_offset(info),
            keys=keys,
            link_up=info.get("master_link_status") == "up",
            synced=_synced(info),
        )

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

    async def hand_over(self, master: str, replica: str, password: str) -> int:
        old, new = self._client(master, password), self._client(replica, password)
        try:
            await old.client_pause(SWITCH_PAUSE_MS, all=False)  # WRITE: reads go on
            paused_at = time.monotonic()
            try:
                info = await old.info("replication")
                offset = _offset(info)
                history = str(info.get("master_replid", ""))
                await _caught_up(new, history, offset, paused_at + CATCH_UP_TIMEOUT_S)
                if time.monotonic() - paused_at > PROMOTE_BY_S:
                    raise CatchUpTimeout("the switchover's steps were too slow")
                await new.replicaof("NO", "ONE")
                target, target_port = self._target(replica)
                await old.replicaof(target, str(target_port))
            except BaseException:
                # The old master was not demoted (or did not say so): it keeps the label and
                # its clients, so it takes writes again now rather than after the pause's
                # bound. A replica promoted meanwhile has no clients; the next pass demotes it.
                await old.client_unpause()
                raise
            return offset
        finally:
            await old.aclose()
            await new.aclose()

    async def release(self, host: str, password: str) -> None:
        client = self._client(host, password)
        try:
            await client.client_kill_filter(_type="normal", skipme=True)
            await client.client_unpause()
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

    async def load_functions(self, host: str, password: str) -> bool:
        client = self._client(host, password)
        try:
            return await functions.ensure_async(client)
        finally:
            await client.aclose()

    async def libraries(self, host: str, password: str) -> list[str]:
        client = self._client(host, password)
        try:
            return await functions.loaded_async(client)
        finally:
            await client.aclose()

    async def delete_library(self, host: str, password: str, name: str) -> None:
        client = self._client(host, password)
        try:
            await functions.delete_async(client, name)
        finally:
            await client.aclose()

    async def publish_settings(
        self, host: str, password: str, topic: Topic, owner: str, version: int
    ) -> list[int]:
        queue = AsyncQueue(self._client(host, password), topic)
        try:
            return await queue.publish_settings(owner, version)
        finally:
            await queue.close()

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


def _synced(info: Mapping[str, object]) -> bool:
    """Whether a replica holds its master's data up to its offset: its link is up, or went
    down after having been up since the replica started (`master_link_down_since_seconds` is
    -1 until its first sync: a replica restarted from its own files, or one that cannot
    authenticate, holds only what it had), and no full sync is half done. Only such a replica
    may replace a lost master (failover.py)."""
    if info.get("role") != "slave" or info.get("master_sync_in_progress") not in (0, "0"):
        return False
    if info.get("master_link_status") == "up":
        return True
    return int(str(info.get("master_link_down_since_seconds", -1))) >= 0


def _offset(info: Mapping[str, object]) -> int:
    """The replication offset of INFO replication: the master's, or what a replica has."""
    key = "master_repl_offset" if info.get("role") == "master" else "slave_repl_offset"
    return int(str(info.get(key, 0)))


async def _caught_up(
    replica: redis.asyncio.Redis, history: str, offset: int, deadline: float
) -> None:
    """Wait until the replica has replicated the paused master's stream (replication id
    `history`: an offset of another master's stream says nothing) up to `offset` (it stays put
    during a write pause), or raise CatchUpTimeout at `deadline` (time.monotonic)."""
    while True:
        info = await replica.info("replication")
        same = info.get("role") == "slave" and info.get("master_replid") == history
        if same and _offset(info) >= offset:
            return
        if time.monotonic() >= deadline:
            raise CatchUpTimeout(
                f"the replica is at offset {_offset(info)}, the master at {offset}"
            )
        await asyncio.sleep(CATCH_UP_POLL_S)
