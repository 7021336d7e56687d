"""`ZkOwnership`: slot ownership through ZooKeeper membership, assignment and owner nodes.

Every process runs the same level-triggered loop: any watch or session event wakes it, it reads
the topic's tree (re-arming the one-shot watches it needs), and moves towards the state that
tree asks for. Level-triggered because ZooKeeper watches fire once and kazoo drops client-side
watchers on every disconnect: re-reading everything after any event cannot miss a change, and
there is no timer anywhere (no polling).

One pass:
1. register: the ephemeral `members/<id>` node exists for the current session;
2. coordinate: the member with the oldest member node (lowest czxid — the classic "oldest
   ephemeral wins" election, without an extra node) computes `assign(...)` and writes it with
   compare-and-set on the node version; a lost race just triggers another pass;
3. give up: a slot no longer assigned here is kept (still consumed) until its new assignee
   asks for it (`handoffs/<slot>`), a session timeout at most; then it leaves the consumed set
   (`on_change` awaited, so the service stopped claiming it) BEFORE its `owners/<slot>` node is
   deleted;
4. take: create `owners/<slot>` for newly assigned slots; one still held by the previous owner
   gets an exists-watch and is retried when that node disappears, and is asked for by creating
   `handoffs/<slot>` (deleted once taken); slots whose node we hold join the consumed set
   (`on_change`), and the service bumps their fencing epoch.

Why the previous owner waits for the ask: a process that comes back (after kill -9, a pause)
registers and is assigned its share at once, but may take seconds on a loaded machine before its
pass runs, reads the assignment and takes the slots over. Released at once, those slots were
consumed by nobody meanwhile (the chaos tier's `stalled` rule: messages seconds late). Asked for,
a slot's gap is one handoff: the old owner's release, then the new owner's owner node and fence.

Session loss: SUSPENDED or LOST publishes the empty set at once, before any other work. After
SUSPENDED the same session may come back (its owner nodes are still ours); after LOST every
ephemeral node is gone, so the next pass registers again and re-acquires from scratch. Anything
a stale process still sends is rejected by the fencing epoch in Redis.

kazoo's client is thread based: blocking calls run in worker threads (`asyncio.to_thread`), and
its callbacks hop onto the event loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.retry import KazooRetry
from kazoo.security import ACL

from delayq.coordination.acl import ZkIdentity, tree_acl
from delayq.coordination.assignment import Member, assign, moved
from delayq.coordination.layout import (
    AssignmentDocument,
    TopicPaths,
    decode_member,
    decode_routing,
    encode_member,
    slots_of,
)
from delayq.coordination.ownership import FleetView, OnChange
from delayq.coordination.tls import ZkTls, kazoo_options
from delayq.queue.functions import library

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_S = 10.0
RETRY_AFTER_ERROR_S = 0.5  # an unexpected ZooKeeper error: try the pass again after this


@dataclass(frozen=True)
class ZkSettings:
    """Where this process registers and what it tells the coordinator about itself."""

    hosts: str
    namespace: str
    topic: str
    slot_amount: int
    member_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # the co-located broker ("broker-1", a pod name): its trailing number indexes the routing
    preferred_broker: str = ""
    capacity: int = 1
    host: str = field(default_factory=socket.gethostname)
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    connect_timeout_s: float = 30.0
    # The topic's ZooKeeper login and the operator's ACL id (coordination/acl.py): with both,
    # every node this process creates is readable and writable by the topic and the operator
    # only. Without an admin ACL id the tree stays open (a local cluster without an operator).
    identity: ZkIdentity | None = None
    admin_acl_id: str = ""
    tls: ZkTls | None = None  # None: a plain connection (coordination/tls.py)

    def __post_init__(self) -> None:
        if self.admin_acl_id and self.identity is None:
            raise ValueError("a ZooKeeper admin ACL id needs the topic's ZooKeeper password")

    @property
    def default_acl(self) -> list[ACL] | None:
        """The ACL of the nodes this process creates (None: ZooKeeper's open default)."""
        if self.identity is None or not self.admin_acl_id:
            return None
        return tree_acl(self.identity.acl_id, self.admin_acl_id)

    @property
    def paths(self) -> TopicPaths:
        return TopicPaths(self.namespace, self.topic)


@dataclass
class _View:
    """What one pass read from ZooKeeper."""

    members: list[Member]
    coordinator: str | None
    assignment: AssignmentDocument
    assignment_version: int | None  # None: the node does not exist yet
    routing: list[int] | None
    asked: frozenset[int] = frozenset()  # slots with a `handoffs/<slot>` node: a taker waits


class ZkOwnership:
    """The `Ownership` of one delay-service process in a ZooKeeper-coordinated fleet."""

    def __init__(self, settings: ZkSettings) -> None:
        self.settings = settings
        self.paths = settings.paths
        self._client = KazooClient(
            hosts=settings.hosts,
            timeout=settings.session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
            auth_data=[settings.identity.auth_data] if settings.identity else None,
            default_acl=settings.default_acl,
            **kazoo_options(settings.tls),
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_change: OnChange | None = None
        self._wake = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._first_pass = asyncio.Event()
        self._stopping = False
        self._connected = False
        self._session_state = "lost"  # no session before start (ownership.SESSION_STATES)
        self._losses = 0  # connection losses so far: results of passes begun before one are void
        self._held: set[int] = set()  # owner nodes this session holds
        # slots whose owner node another session holds, with an exists-watch armed on it: not
        # retried until that watch fires (thousands of slots must not be re-created per pass)
        self._waiting: set[int] = set()
        self._freed: set[int] = set()  # owner watches fired while an acquire was under way
        self._asked: set[int] = set()  # `handoffs/<slot>` nodes this session created
        # slots assigned elsewhere but still held and consumed here, since (monotonic s): each
        # waits for its new assignee's ask, a session timeout at most (module docstring)
        self._leaving_since: dict[int, float] = {}
        self._keep_timer: asyncio.TimerHandle | None = None  # wakes when the first is due
        self._granted: frozenset[int] = frozenset()  # last set handed to on_change
        # on_change raised: what the service consumes is unknown, so the next publish hands
        # the set over even when it equals `_granted` (the service applies differences only)
        self._unsure = False
        self._assigned: frozenset[int] | None = None
        self._revocations: set[asyncio.Task[None]] = set()
        self._foreign_members: set[str] = set()  # nodes under members/ already logged
        self.is_coordinator = False

    # the Ownership protocol -------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self.settings.member_id

    @property
    def owned(self) -> frozenset[int]:
        return self._granted

    @property
    def session_state(self) -> str:
        """`connected`, `suspended` or `lost` (ownership.SessionHolder), as last heard."""
        return self._session_state

    @property
    def ready(self) -> bool:
        # more than assigned: slots kept until their new assignee asks for them (a handoff)
        return (
            self._connected
            and self._assigned is not None
            and self._assigned <= self._granted
            and not self._unsure
            and not self._stopping
        )

    async def holds(self, slot: int) -> bool:
        """Ask ZooKeeper (not this process's view) whether this session owns the slot now: a
        read on a session that has expired fails, so True means the owner node is ours."""
        if slot not in self._granted or not self._connected:
            return False
        try:
            stat = await asyncio.to_thread(self._client.exists, self.paths.owner(slot))
        except KazooException:
            return False
        return stat is not None and stat.ephemeralOwner == self._session_id()

    async def fleet(self, holders_of: Iterable[int] = ()) -> FleetView:
        """Every member's slots, read from the tree now (not this process's view): the
        assignment node, the owner nodes that exist, and who holds each slot of `holders_of`.
        A handful of requests whatever the slot count, plus one pipelined read per holder
        asked for; raises KazooException when ZooKeeper does not answer."""
        return await asyncio.to_thread(self._read_fleet, sorted(set(holders_of)))

    def _read_fleet(self, holders_of: list[int]) -> FleetView:
        client, paths = self._client, self.paths
        try:
            children = client.get_children(paths.members)
        except NoNodeError:
            children = []
        members = tuple(sorted(member.member_id for member in self._live_members(children)))
        try:
            assignment = AssignmentDocument.decode(client.get(paths.assignment)[0])
        except NoNodeError:
            assignment = AssignmentDocument(0, {})
        try:
            children = client.get_children(paths.owners)
            held = frozenset(int(child) for child in children if child.isdigit())
        except NoNodeError:
            held = frozenset()
        reads = {slot: client.get_async(paths.owner(slot)) for slot in holders_of if slot in held}
        holders: dict[int, str] = {}
        for slot, request in reads.items():
            with contextlib.suppress(NoNodeError):  # released since the listing
                holders[slot] = request.get()[0].decode("utf-8", "replace")
        return FleetView(members, dict(assignment.slots), held, holders)

    async def start(self, on_change: OnChange) -> None:
        """Connect, join and run the first pass (which calls `on_change`, maybe with nothing)."""
        self._loop = asyncio.get_running_loop()
        self._on_change = on_change
        self._client.add_listener(self._on_session_event)
        try:
            await asyncio.to_thread(self._client.start, self.settings.connect_timeout_s)
        except Exception:
            await asyncio.to_thread(self._close_client)
            raise
        self._connected = True
        self._session_state = "connected"
        self._task = asyncio.create_task(self._run(), name=f"zk-ownership-{self.member_id}")
        self._wake.set()
        await self._first_pass.wait()

    async def stop(self) -> None:
        """Stop claiming everything, release the owner nodes, leave, close the session."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self._publish(frozenset(), None)
        if self._connected:
            with contextlib.suppress(KazooException):
                await asyncio.to_thread(self._leave)
        await asyncio.to_thread(self._close_client)
        self._connected = False
        self._session_state = "lost"

    # session events (kazoo thread -> loop) ----------------------------------------------------

    def _on_session_event(self, state: str) -> None:
        self._call_in_loop(self._session_changed, state)

    def _on_watch(self, _event: Any) -> None:
        self._call_in_loop(self._wake.set)

    def _on_owner_watch(self, event: Any) -> None:
        if not event.path:
            # kazoo fires watches with no path on a session event: the listener handles that
            self._call_in_loop(self._wake.set)
            return
        slot = int(event.path.rsplit("/", 1)[1])
        self._call_in_loop(self._owner_changed, slot)

    def _owner_changed(self, slot: int) -> None:
        self._waiting.discard(slot)
        self._freed.add(slot)
        self._wake.set()

    def _call_in_loop(self, callback: Any, *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closing under us: nothing to tell
                self._loop.call_soon_threadsafe(callback, *args)

    def _session_changed(self, state: str) -> None:
        self._session_state = state.lower()
        if state == KazooState.CONNECTED:
            log.info("%s: connected to ZooKeeper", self.member_id)
            self._connected = True
        else:
            log.warning("%s: ZooKeeper session %s: stop claiming", self.member_id, state)
            self._connected = False
            self._losses += 1
            self._waiting.clear()  # kazoo drops its watchers on every disconnect
            if state == KazooState.LOST:
                # the server deleted every ephemeral node of the session
                self._held.clear()
                self._asked.clear()
            if not self._stopping:
                revoke = self._revoke()
                revocation = asyncio.get_running_loop().create_task(revoke)
                self._revocations.add(revocation)
                revocation.add_done_callback(self._revocations.discard)
        self._wake.set()

    async def _revoke(self) -> None:
        """Publish the empty set after a session loss; a failure is retried by the next pass
        (`_unsure`), so it is logged here instead of left as an unretrieved task exception."""
        try:
            await self._publish(frozenset(), None)
        except Exception:
            log.exception("%s: revoking the slots failed; retried on the next pass", self.member_id)

    # the loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                break
            try:
                await self._pass()
            except KazooException as error:
                # connection trouble wakes us through the session listener; anything else is
                # retried after a short pause rather than in a tight loop
                log.warning("%s: ZooKeeper pass failed: %r", self.member_id, error)
                self._retry_later()
            except Exception:
                log.exception("%s: ownership pass failed (on_change raised?)", self.member_id)
                self._retry_later()
            finally:
                self._first_pass.set()

    def _retry_later(self) -> None:
        if self._connected and not self._stopping:
            asyncio.get_running_loop().call_later(RETRY_AFTER_ERROR_S, self._wake.set)

    async def _pass(self) -> None:
        losses = self._losses
        if not self._connected:
            return
        view = await asyncio.to_thread(self._read_view)
        if losses != self._losses:
            return
        self.is_coordinator = view.coordinator == self.member_id
        if self.is_coordinator and await asyncio.to_thread(self._coordinate, view):
            return  # the assignment watch brings us back with the new version
        # never a slot past this member's amount: across a doubling a coordinator already at
        # 2N assigns to members still at N (restarting on the new slots, service.py), which
        # have no keys for those; they wait for this member's successor at 2N
        mine = frozenset(
            slot
            for slot in slots_of(view.assignment.slots, self.member_id)
            if slot < self.settings.slot_amount
        )
        self._assigned = mine if self.member_id in view.assignment.members else None
        kept = self._keep(self._held - mine, view.asked)
        # give up first: the service stops claiming before anyone else may start
        if not await self._publish(self._granted & (mine | kept), losses):
            return
        release = self._held - mine - kept
        if release:
            await asyncio.to_thread(self._release, release)
            if losses != self._losses:
                return
            self._held -= release
        self._waiting &= mine
        wanted = mine - self._held - self._waiting
        if wanted:
            self._freed.clear()
            taken, contested = await asyncio.to_thread(self._acquire, wanted)
            if losses != self._losses:
                return
            self._held |= taken
            # a watch may fire before its slot is recorded as waiting: never wait on those
            self._waiting |= contested - self._freed
        asking, done = self._waiting - self._asked, self._asked - self._waiting
        if asking or done:
            asked = await asyncio.to_thread(self._ask, asking, done)
            if losses != self._losses:
                return
            self._asked = (self._asked | asked) - done
        await self._publish(frozenset((mine | kept) & self._held), losses)

    def _keep(self, leaving: set[int], asked: frozenset[int]) -> frozenset[int]:
        """Of the held slots assigned elsewhere (`leaving`), those still consumed here: not
        asked for by a taker yet, for at most a session timeout (a taker of an older version
        never asks; a stalled one must not hold them up forever). Wakes the loop when the
        first of them is due."""
        now = time.monotonic()
        since = {slot: self._leaving_since.get(slot, now) for slot in leaving}
        self._leaving_since = since
        wait_s = self.settings.session_timeout_s
        kept = frozenset(s for s, t in since.items() if s not in asked and now - t < wait_s)
        if self._keep_timer is not None:
            self._keep_timer.cancel()
            self._keep_timer = None
        if kept:
            due_s = min(since[slot] for slot in kept) + wait_s - now
            self._keep_timer = asyncio.get_running_loop().call_later(due_s, self._wake.set)
        return kept

    async def _publish(self, slots: frozenset[int], losses: int | None) -> bool:
        """Hand `slots` to the service; False when the connection was lost again since
        `losses` were counted (a revocation, with losses None, always goes through)."""
        async with self._publish_lock:
            if losses is not None and (losses != self._losses or self._stopping):
                return False
            if (slots != self._granted or self._unsure) and self._on_change is not None:
                log.info("%s: consuming %d slots", self.member_id, len(slots))
                previous, self._granted = self._granted, slots
                try:
                    await self._on_change(slots)
                except BaseException:
                    # unknown what the service took: the caller must not release anything,
                    # and a later pass hands the set over again, equal or not
                    self._granted, self._unsure = previous, True
                    self._retry_later()
                    raise
                self._unsure = False
            return True

    # ZooKeeper calls (worker threads) ---------------------------------------------------------

    def _session_id(self) -> int | None:
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else None

    def _read_view(self) -> _View:
        self._register()
        client, paths = self._client, self.paths
        members = self._live_members(client.get_children(paths.members, watch=self._on_watch))
        assignment, version = AssignmentDocument(0, {}), None
        payload = self._get_or_watch(paths.assignment)
        if payload is not None:
            assignment, version = AssignmentDocument.decode(payload[0]), payload[1]
        routing_payload = self._get_or_watch(paths.routing)
        asked = self._children_or_watch(paths.handoffs)
        routed = (
            decode_routing(routing_payload[0], self.settings.slot_amount)
            if routing_payload is not None
            else None
        )
        # locality only: a routing of a newer generation (the slots doubled, this process
        # restarts on it, service.py) is used by nobody here
        routing = (
            list(routed.broker_of_slot)
            if routed is not None and routed.slot_amount == self.settings.slot_amount
            else None
        )
        return _View(
            members=members,
            coordinator=members[0].member_id if members else None,
            assignment=assignment,
            assignment_version=version,
            routing=routing,
            asked=frozenset(int(child) for child in asked if child.isdigit()),
        )

    def _live_members(self, children: list[str]) -> list[Member]:
        """The members among `children` of `members/` (layout.decode_member), oldest node
        first (the first coordinates); each other node is logged once and never counted."""
        reads = {child: self._client.get_async(self.paths.member(child)) for child in children}
        candidates: list[tuple[int, Member]] = []
        for child, request in reads.items():
            try:
                payload, stat = request.get()
            except NoNodeError:
                continue
            member = decode_member(child, payload, stat.ephemeralOwner)
            if member is not None:
                candidates.append((stat.czxid, member))
            elif child not in self._foreign_members:
                self._foreign_members.add(child)
                kind = "ephemeral" if stat.ephemeralOwner else "persistent"
                log.warning(
                    "%s: ignoring %s node %s: no member wrote it",
                    self.member_id, kind, self.paths.member(child),
                )  # fmt: skip
        candidates.sort(key=lambda entry: entry[0])
        return [member for _, member in candidates]

    def _get_or_watch(self, path: str) -> tuple[bytes, int] | None:
        """Data and version with a data watch, or None with an existence watch."""
        try:
            payload, stat = self._client.get(path, watch=self._on_watch)
            return payload, stat.version
        except NoNodeError:
            if self._client.exists(path, watch=self._on_watch) is not None:
                self._call_in_loop(self._wake.set)  # created in between: read it again
            return None

    def _children_or_watch(self, path: str) -> list[str]:
        """Children with a child watch, or none with an existence watch."""
        try:
            return list(self._client.get_children(path, watch=self._on_watch))
        except NoNodeError:
            if self._client.exists(path, watch=self._on_watch) is not None:
                self._call_in_loop(self._wake.set)  # created in between: read it again
            return []

    def _register(self) -> None:
        """Create our member node for this session (again after a session loss)."""
        path = self.paths.member(self.member_id)
        stat = self._client.exists(path)
        if stat is not None and stat.ephemeralOwner == self._session_id():
            return
        settings = self.settings
        payload = encode_member(
            settings.preferred_broker, settings.capacity, settings.host, library().name
        )
        try:
            self._client.create(path, payload, ephemeral=True, makepath=True)
            log.info("%s: joined %s", self.member_id, self.paths.members)
        except NodeExistsError:
            # another session holds our id: a previous incarnation whose session has not
            # expired yet (or a misconfigured twin). Wait for it to go.
            log.warning("%s: member node held by another session; waiting", self.member_id)
            if self._client.exists(path, watch=self._on_watch) is None:
                self._call_in_loop(self._wake.set)

    def _coordinate(self, view: _View) -> bool:
        """As coordinator: write the assignment if it should change. True when written."""
        target = assign(
            self.settings.slot_amount, view.members, view.assignment.slots, view.routing
        )
        alive = frozenset(member.member_id for member in view.members)
        current = view.assignment
        unchanged = (target, alive) == (current.slots, current.members)
        if unchanged and view.assignment_version is not None:
            return False
        document = AssignmentDocument(current.revision + 1, target, alive)
        payload = document.encode(self.settings.slot_amount)
        try:
            if view.assignment_version is None:
                self._client.create(self.paths.assignment, payload, makepath=True)
            else:
                self._client.set(self.paths.assignment, payload, version=view.assignment_version)
        except (BadVersionError, NodeExistsError):
            self._call_in_loop(self._wake.set)  # someone wrote first: re-read and decide again
            return True
        log.info(
            "%s: assignment revision %d for %d members (%d slots moved from live members)",
            self.member_id,
            document.revision,
            len(alive),
            len(moved(current.slots, target, set(alive))),
        )
        return True

    def _acquire(self, slots: Iterable[int]) -> tuple[set[int], set[int]]:
        """Create owner nodes; watch the ones another session still holds. Returns the slots
        now ours and the ones being watched.

        Requests are pipelined (all sent, then all awaited): thousands of slots cost a few
        round trips, not thousands."""
        client, session = self._client, self._session_id()
        creates = {
            slot: client.create_async(
                self.paths.owner(slot), self.member_id.encode(), ephemeral=True, makepath=True
            )
            for slot in sorted(slots)
        }
        taken: set[int] = set()
        contested: list[int] = []
        for slot, request in creates.items():
            try:
                request.get()
                taken.add(slot)
            except NodeExistsError:
                contested.append(slot)
        checks = {
            slot: client.exists_async(self.paths.owner(slot), watch=self._on_owner_watch)
            for slot in contested
        }
        watched: set[int] = set()
        for slot, request in checks.items():
            stat = request.get()
            if stat is None:
                self._call_in_loop(self._wake.set)  # released in between: try again
            elif stat.ephemeralOwner == session:
                taken.add(slot)
            else:
                watched.add(slot)
        return taken, watched

    def _ask(self, asking: Iterable[int], done: Iterable[int]) -> set[int]:
        """Ask the holders of `asking` to hand them over (`handoffs/<slot>`), and withdraw the
        asks of `done` (taken, or assigned elsewhere); pipelined. Returns the slots asked now
        (an ask of another session already there is left to it)."""
        client, payload = self._client, self.member_id.encode()
        creates = {
            slot: client.create_async(
                self.paths.handoff(slot), payload, ephemeral=True, makepath=True
            )
            for slot in sorted(asking)
        }
        deletes = [client.delete_async(self.paths.handoff(slot)) for slot in sorted(done)]
        asked: set[int] = set()
        for slot, request in creates.items():
            with contextlib.suppress(NodeExistsError):
                request.get()
                asked.add(slot)
        for request in deletes:
            with contextlib.suppress(NoNodeError):
                request.get()
        return asked

    def _release(self, slots: Iterable[int]) -> None:
        """Delete owner nodes this session holds (never someone else's), pipelined."""
        client, session = self._client, self._session_id()
        checks = {slot: client.exists_async(self.paths.owner(slot)) for slot in sorted(slots)}
        deletes = []
        for slot, request in checks.items():
            stat = request.get()
            if stat is not None and stat.ephemeralOwner == session:
                deletes.append(client.delete_async(self.paths.owner(slot), version=stat.version))
        for request in deletes:
            with contextlib.suppress(NoNodeError, BadVersionError):
                request.get()

    def _leave(self) -> None:
        self._release(self._held)
        self._held.clear()
        path = self.paths.member(self.member_id)
        stat = self._client.exists(path)
        if stat is not None and stat.ephemeralOwner == self._session_id():
            with contextlib.suppress(NoNodeError):
                self._client.delete(path)

    def _close_client(self) -> None:
        self._client.remove_listener(self._on_session_event)
        self._client.stop()
        self._client.close()
