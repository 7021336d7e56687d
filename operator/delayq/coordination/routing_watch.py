"""The topic's `routing` node, watched: how every process that routes follows slot moves.

A slot move (`delayq routing move-slot`, docs/coordination.md "Moving a slot") switches a slot's
broker in ZooKeeper while producers and delay services run, so whoever writes to a broker by
slot must follow the node, never read it once at start: the delay services
(`service/service.py`), the routed client (`routed_queue.py`) and the pipeline's writers. A
doubling of the slot amount (docs/coordination.md "Doubling the slots") writes a routing of
a newer key generation; the watch hands it on too, and its reader moves to the new slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.recipe.watchers import DataWatch

from delayq.coordination.acl import ZkIdentity
from delayq.coordination.layout import TopicPaths, decode_routing
from delayq.coordination.routing import Routing
from delayq.coordination.tls import ZkTls, kazoo_options

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0

RoutingCallback = Callable[[Routing], None]


class RoutingUnreadable(Exception):
    """A multi-broker delay service could not read (and watch) the routing when it started."""


@dataclass(frozen=True)
class ZkConnection:
    """How a client reaches the topic's ZooKeeper: hosts, the topic's digest identity (with
    ZooKeeper ACLs the routing node is readable by the topic and the operator only) and TLS.
    Plain data, so a Spark job ships it to its executors."""

    hosts: str
    identity: ZkIdentity | None = None
    tls: ZkTls | None = None


class RoutingWatch:
    """The routing node, watched (kazoo DataWatch) on a ZooKeeper session of its own: every new
    version of the node for the reader's slot amount and key generation, or for a newer
    generation, is handed to `on_change`. Logs in as the topic (`identity`)."""

    def __init__(
        self,
        hosts: str,
        namespace: str,
        topic: str,
        slot_amount: int,
        identity: ZkIdentity | None,
        tls: ZkTls | None = None,
        generation: int = 0,
    ) -> None:
        auth = [identity.auth_data] if identity else None
        self._client = KazooClient(
            hosts=hosts, timeout=CONNECT_TIMEOUT_S, auth_data=auth, **kazoo_options(tls)
        )
        self._hosts = hosts
        self._path = TopicPaths(namespace, topic).routing
        self._slot_amount = slot_amount
        self._generation = generation

    def open(self, on_change: RoutingCallback) -> Routing | None:
        """Blocking: connect, read the node and watch it; returns the routing now (None when
        the node is absent or for another slot amount of this or an older generation).
        `on_change` runs on kazoo's thread with every later version. Any failure
        (unreachable, NoAuthError) raises."""

        def changed(payload: bytes | None, _stat: object) -> None:
            routing = None if payload is None else self._decode(payload)
            if routing is not None:
                on_change(routing)

        self._client.start(timeout=CONNECT_TIMEOUT_S)
        try:
            payload: bytes | None = self._client.get(self._path)[0]
        except NoNodeError:
            payload = None
        DataWatch(self._client, self._path, changed)
        return None if payload is None else self._decode(payload)

    def _decode(self, payload: bytes) -> Routing | None:
        return decode_routing(payload, self._slot_amount, self._generation)

    def close(self) -> None:
        """Blocking: end the session (and the watch)."""
        self._client.stop()
        self._client.close()

    async def start(self, on_change: RoutingCallback) -> Routing | None:
        """`open` for the event loop, `on_change` called on it; a delay service's policy: a
        refusal (wrong or missing credentials) raises NoAuthError and an unreachable ZooKeeper
        RoutingUnreadable, never a fallback to the first routing: on a topic whose slots
        moved it sends messages to the wrong broker, stranding them, and with no watch the
        process would never learn of a later move. The service exits; its pod restarts."""
        loop = asyncio.get_running_loop()

        def changed(routing: Routing) -> None:
            loop.call_soon_threadsafe(on_change, routing)

        try:
            return await asyncio.to_thread(self.open, changed)
        except NoAuthError:
            await self.stop()
            raise
        except Exception as error:
            await self.stop()
            raise RoutingUnreadable(f"ZooKeeper {self._hosts}: {type(error).__name__}") from error

    async def current(self) -> Routing | None:
        """The node as it is now, whatever its slot amount and generation (None: absent or
        unreadable), read on this watch's session, which is closed again: what `delayq serve`
        starts from (the settings' slot amount is only the desired one once the routing
        exists). Fails as `start` does."""

        def read() -> bytes | None:
            self._client.start(timeout=CONNECT_TIMEOUT_S)
            try:
                return bytes(self._client.get(self._path)[0])
            except NoNodeError:
                return None
            finally:
                self.close()

        try:
            payload = await asyncio.to_thread(read)
        except NoAuthError:
            raise
        except Exception as error:
            raise RoutingUnreadable(f"ZooKeeper {self._hosts}: {type(error).__name__}") from error
        try:
            return None if payload is None else Routing.from_json(payload)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    async def stop(self) -> None:
        await asyncio.to_thread(self.close)
