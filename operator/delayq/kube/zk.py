"""Publishing a topic's routing to ZooKeeper (docs/contracts.md §2), behind a Protocol.

The tree is `delayq.coordination.layout.TopicPaths`: the operator writes `routing` (slot ->
broker, see delayq.coordination.routing), counts `owners/`, reads which functions library
each member calls (kube/libraries.py) and removes trees of deleted topics.
The delay services read `routing`; the operator only writes it, so slot failover keeps working
while the operator is down. kazoo is synchronous, so calls run in a worker thread with a
bounded timeout.

With an admin identity (the operator's `zookeeper_admin_password`) the store logs in as
`delayq-operator` and `publish` puts the ACLs of coordination/acl.py in place: the parents are
the operator's, the topic's root and its container nodes belong to the topic and the operator
only. Publishing re-applies them, which also closes a tree an older operator left open (the
services' own ephemeral nodes follow when their pods roll with the new credentials).

The store connects only to the ensembles it was given, the platform's (kube/ensembles.py): a
connection string from anywhere else raises EnsembleNotAllowed before any socket is opened, so
the admin digest reaches no host a tenant chose, whatever a caller passes. Each ensemble has its
own lock, client and worker threads: one that never answers holds its own callers only, never
another ensemble's (a single lock around `start()` and the shared default executor made one
tenant's dead host stall every topic's reconcile).

Publishing also writes the topic's UID (its DelayTopic's metadata.uid) as the data of the
tree's root node: the garbage collector (kube/zk_gc.py) removes only a tree whose marker names
a UID no DelayTopic has any more. A tree written by an older operator has none until its
topic's next publish (every reconcile, also on the operator's start).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.security import ACL

from delayq.coordination.acl import ADMIN_USER, ZkIdentity, parent_acl, topic_user, tree_acl
from delayq.coordination.layout import (
    ROOT,
    TopicPaths,
    decode_member,
    member_library,
    namespace_root,
)
from delayq.coordination.migration import SlotMover
from delayq.coordination.quota import drop_topic_quota, ensure_node, guard_topic_tree
from delayq.coordination.routing import Routing
from delayq.coordination.splitting import SlotSplitter
from delayq.coordination.tls import ZkTls, kazoo_options
from delayq.kube.ensembles import MAX_ENSEMBLES
from delayq.queue.client import Queue

TIMEOUT_S = 10.0
# calls of one ensemble at once (reconciles, health passes, GC): more wait in its queue
WORKERS_PER_ENSEMBLE = 4
_T = TypeVar("_T")
#: The most `members/` nodes member_libraries reads: a topic's members are its service pods (at
#: most 64 brokers, twice that while they roll) and the clients a tenant runs beside them.
MAX_MEMBERS_READ = 1024
# a node older operators wrote (the ConfigMap's JSON again) and nothing ever read
_UNREAD_CONFIG_NODE = "config"


def topic_root(namespace: str, topic: str) -> str:
    return TopicPaths(namespace, topic).root


class TopicStore(Protocol):
    async def read_routing(self, connect: str, namespace: str, topic: str) -> Routing | None:
        """The published routing, or None when the topic has none yet."""

    async def publish(
        self,
        connect: str,
        namespace: str,
        topic: str,
        routing: Routing,
        topic_password: str,
        uid: str = "",
    ) -> None:
        """Write routing (its broker count: slots are moved only by a mover, RoutingChanged)
        and, with an admin identity, the tree's ACLs (idempotent); removes the unread `config`
        node an older operator left. `topic_password` is the topic's ZooKeeper password (its
        Secret's `zookeeper-password`); `uid` its DelayTopic's metadata.uid, the tree's marker
        for the garbage collector (the operator always passes it; empty writes none)."""

    async def owned_slots(self, connect: str, namespace: str, topic: str) -> int:
        """How many slots currently have an owner (ephemeral nodes under owners/)."""

    async def member_libraries(self, connect: str, namespace: str, topic: str) -> list[str]:
        """The functions library each live member calls, one entry per member ("" for a
        member naming none: one of a version before members named it). MembersUnreadable when
        `members/` holds more than MAX_MEMBERS_READ nodes: read one by one, a tenant's flood of
        them (its pods hold the tree's password) held one of the ensemble's few threads, which
        every topic on the ensemble shares, for as long as it liked."""

    async def tree_uid(self, connect: str, namespace: str, topic: str) -> str:
        """The UID marker publish wrote in the topic's tree ("" for none, or no tree)."""

    async def delete(self, connect: str, namespace: str, topic: str) -> None:
        """Remove the topic's whole tree (its DelayTopic is gone)."""

    def slot_mover(
        self, connect: str, namespace: str, topic: str, queues: Sequence[Queue]
    ) -> SlotMover:
        """A mover of the topic's slots between the brokers of `queues` (blocking: call it
        from a worker thread, as every SlotMover call)."""

    def slot_splitter(
        self, connect: str, namespace: str, topic: str, queues: Sequence[Queue]
    ) -> SlotSplitter:
        """A doubler of the topic's slots on the brokers of `queues` (blocking, as the mover)."""

    async def topic_trees(self, connect: str, namespaces: Sequence[str]) -> list[tuple[str, str]]:
        """(namespace, topic) of every tree under /delayq in `namespaces` (all when empty)."""


class EnsembleNotAllowed(ValueError):
    """A connection string the store was not given: it never connects there."""


class MembersUnreadable(Exception):
    """A topic's `members/` holds more nodes than the operator reads (MAX_MEMBERS_READ)."""


class _Ensemble:
    """One ensemble's client (None until started), the lock that serializes starting it, the
    threads its calls run in, and until when (time.monotonic) a failed start fails fast."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: KazooClient | None = None
        self.down_until = 0.0
        self.executor = ThreadPoolExecutor(WORKERS_PER_ENSEMBLE, thread_name_prefix="zk")


class KazooTopicStore:
    """TopicStore over kazoo, one started client per allowed ensemble.

    `ensembles` are the only connection strings it connects to (at most MAX_ENSEMBLES, which
    bounds its clients, sessions and threads). `timeout_s` bounds connecting, waiting for
    another call's connecting, and each call (the session timeout stays TIMEOUT_S); tests
    shorten it so an unreachable ensemble fails fast. A client that cannot connect raises the
    builtin TimeoutError (not kazoo's own timeout class, which is no KazooException), so callers
    see the same transient error whichever of the timeouts fires first.
    """

    def __init__(
        self,
        ensembles: Sequence[str],
        timeout_s: float = TIMEOUT_S,
        admin_password: str = "",
        tls: ZkTls | None = None,
    ) -> None:
        if len(set(ensembles)) > MAX_ENSEMBLES:
            raise ValueError(f"at most {MAX_ENSEMBLES} ZooKeeper ensembles")
        self.timeout_s = timeout_s
        self.admin = ZkIdentity(ADMIN_USER, admin_password) if admin_password else None
        self.tls = tls
        self._ensembles = {connect: _Ensemble() for connect in ensembles}

    def _ensemble(self, connect: str) -> _Ensemble:
        ensemble = self._ensembles.get(connect)
        if ensemble is None:
            raise EnsembleNotAllowed(f"ZooKeeper {connect!r} is no ensemble of the platform's")
        return ensemble

    def _client(self, connect: str) -> KazooClient:
        ensemble = self._ensemble(connect)
        # only this ensemble's callers wait here, and no longer than a start may take
        if not ensemble.lock.acquire(timeout=self.timeout_s):
            raise TimeoutError(f"ZooKeeper {connect} unreachable (still connecting)")
        try:
            if ensemble.client is None:
                # the callers that queued behind a failed start fail at once, not one by one
                if time.monotonic() < ensemble.down_until:
                    raise TimeoutError(f"ZooKeeper {connect} unreachable (retried shortly)")
                try:
                    ensemble.client = self._start(connect)
                except TimeoutError:
                    ensemble.down_until = time.monotonic() + self.timeout_s
                    raise
            return ensemble.client
        finally:
            ensemble.lock.release()

    def _start(self, connect: str) -> KazooClient:
        client = KazooClient(
            hosts=connect,
            timeout=TIMEOUT_S,
            auth_data=[self.admin.auth_data] if self.admin else None,
            **kazoo_options(self.tls),
        )
        # not client.start(): on a timeout it stops the client itself, which waits for the
        # unanswered read (seconds) while this ensemble's lock is held
        client.start_async().wait(timeout=self.timeout_s)
        if not client.connected:  # it keeps reconnecting in the background until stopped
            threading.Thread(target=_discard, args=(client,), daemon=True).start()
            raise TimeoutError(f"ZooKeeper {connect} unreachable")
        return client

    async def _call(self, connect: str, call: Callable[[], _T]) -> _T:
        """`call` in one of the ensemble's own threads, bounded by timeout_s."""
        executor = self._ensemble(connect).executor
        running = asyncio.get_running_loop().run_in_executor(executor, call)
        return await asyncio.wait_for(running, self.timeout_s)

    async def read_routing(self, connect: str, namespace: str, topic: str) -> Routing | None:
        def read() -> Routing | None:
            try:
                data, _ = self._client(connect).get(TopicPaths(namespace, topic).routing)
            except NoNodeError:
                return None
            return Routing.from_json(data)

        return await self._call(connect, read)

    async def publish(
        self,
        connect: str,
        namespace: str,
        topic: str,
        routing: Routing,
        topic_password: str,
        uid: str = "",
    ) -> None:
        def write() -> None:
            client = self._client(connect)
            paths = TopicPaths(namespace, topic)
            if self.admin is not None:
                identity = ZkIdentity(topic_user(namespace, topic), topic_password)
                acl = tree_acl(identity.acl_id, self.admin.acl_id)
                for parent in (ROOT, namespace_root(namespace)):
                    ensure_node(client, parent, parent_acl(self.admin.acl_id))
                for node in (paths.root, paths.members, paths.owners):
                    ensure_node(client, node, acl)
                guard_topic_tree(client, paths, self.admin.acl_id)
                _write_routing(client, paths.routing, routing, acl)
                with contextlib.suppress(NoNodeError):  # the coordinator writes it later
                    client.set_acls(paths.assignment, acl)
            else:
                _write_routing(client, paths.routing, routing, None)
            _mark(client, paths.root, uid)
            with contextlib.suppress(NoNodeError):
                client.delete(f"{paths.root}/{_UNREAD_CONFIG_NODE}")

        await self._call(connect, write)

    async def owned_slots(self, connect: str, namespace: str, topic: str) -> int:
        def count() -> int:
            try:
                owners = self._client(connect).get_children(TopicPaths(namespace, topic).owners)
                return len(owners)
            except NoNodeError:
                return 0

        return await self._call(connect, count)

    async def member_libraries(self, connect: str, namespace: str, topic: str) -> list[str]:
        def read() -> list[str]:
            client = self._client(connect)
            paths = TopicPaths(namespace, topic)
            try:
                children = client.get_children(paths.members)
            except NoNodeError:
                return []
            if len(children) > MAX_MEMBERS_READ:
                raise MembersUnreadable(
                    f"{paths.members} holds {len(children)} nodes, more than the "
                    f"{MAX_MEMBERS_READ} the operator reads"
                )
            libraries: list[str] = []
            for child in children:
                with contextlib.suppress(NoNodeError):  # it left meanwhile
                    payload, stat = client.get(paths.member(child))
                    if decode_member(child, payload, stat.ephemeralOwner) is not None:
                        libraries.append(member_library(payload))
            return libraries

        return await self._call(connect, read)

    async def tree_uid(self, connect: str, namespace: str, topic: str) -> str:
        def read() -> str:
            try:
                data, _ = self._client(connect).get(topic_root(namespace, topic))
            except NoNodeError:
                return ""
            return bytes(data or b"").decode(errors="replace")

        return await self._call(connect, read)

    async def delete(self, connect: str, namespace: str, topic: str) -> None:
        def remove() -> None:
            with contextlib.suppress(NoNodeError):  # already gone: deletion is idempotent
                self._client(connect).delete(topic_root(namespace, topic), recursive=True)
            drop_topic_quota(self._client(connect), TopicPaths(namespace, topic))

        await self._call(connect, remove)

    def slot_mover(
        self, connect: str, namespace: str, topic: str, queues: Sequence[Queue]
    ) -> SlotMover:
        return SlotMover(self._client(connect), TopicPaths(namespace, topic), queues)

    def slot_splitter(
        self, connect: str, namespace: str, topic: str, queues: Sequence[Queue]
    ) -> SlotSplitter:
        return SlotSplitter(self._client(connect), TopicPaths(namespace, topic), queues)

    async def topic_trees(self, connect: str, namespaces: Sequence[str]) -> list[tuple[str, str]]:
        def read() -> list[tuple[str, str]]:
            client = self._client(connect)
            try:
                spaces = list(namespaces) or client.get_children(ROOT)
            except NoNodeError:
                return []
            trees: list[tuple[str, str]] = []
            for namespace in spaces:
                with contextlib.suppress(NoNodeError):  # no topic of it was ever published
                    topics = client.get_children(namespace_root(namespace))
                    trees += [(namespace, topic) for topic in topics]
            return trees

        return await self._call(connect, read)

    def close(self) -> None:
        """Stop every client and thread (the store starts afresh if used again)."""
        ensembles, self._ensembles = self._ensembles, {c: _Ensemble() for c in self._ensembles}
        for ensemble in ensembles.values():
            ensemble.executor.shutdown(wait=False, cancel_futures=True)
            with ensemble.lock:
                if ensemble.client is not None:
                    ensemble.client.stop()
                    ensemble.client.close()


def _discard(client: KazooClient) -> None:
    client.stop()
    client.close()


class RoutingChanged(KazooException):  # type: ignore[misc]  # kazoo is untyped
    """A slot was moved (coordination/migration.py switched it) between the operator's read of
    the routing and its publish: the routing it planned is stale. A transient error: the
    reconcile runs again on the new routing."""


def _write_routing(
    client: KazooClient, path: str, routing: Routing, acl: list[ACL] | None
) -> None:
    """Create the routing node, or change only its broker count, with compare-and-set.

    Only a slot move may change where a slot is routed, because only it moves the slot's
    messages with it. A publish that wrote back the slots it read earlier would undo a move
    switched meanwhile (by the operator's own mover, or `delayq routing move-slot`), whose
    clean step then deletes the only copy of the slot's messages: so the slots must be the
    ones on the node, and the write is conditional on the version they were read at. The same
    holds for the old slots a doubling switched to their halves (`doubled_slots`): they are
    the node's, never those of the routing planned from an earlier read (written back, a
    switched slot would be caught up again, over what was written into its halves since).
    """
    payload = routing.to_json()
    try:
        data, stat = client.get(path)
    except NoNodeError:
        # NodeExistsError (a mover created it meanwhile) is transient: the next run reads it
        client.create(path, payload, acl=acl, makepath=acl is None)
        return
    try:
        current: Routing | None = Routing.from_json(data)
    except (ValueError, KeyError, TypeError):
        current = None  # no routing (a placeholder left by a tree written before ACLs): replaced
    if current is not None and current.broker_of_slot != routing.broker_of_slot:
        raise RoutingChanged(f"the routing of {path} changed meanwhile: a slot was moved")
    if current is not None and current.doubled_slots != routing.doubled_slots:
        payload = replace(routing, doubled_slots=current.doubled_slots).to_json()
    if data != payload:
        client.set(path, payload, version=stat.version)  # BadVersionError: transient too
    if acl is not None and list(client.get_acls(path)[0]) != acl:
        client.set_acls(path, acl)


def _mark(client: KazooClient, root: str, uid: str) -> None:
    """The topic's UID as the data of its tree's root (one read when it is there already)."""
    if uid and client.get(root)[0] != uid.encode():
        client.set(root, uid.encode())

