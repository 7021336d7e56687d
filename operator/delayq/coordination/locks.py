"""The lock of whoever changes a topic's slots now: an ephemeral ZooKeeper node, checked before
every write (docs/coordination.md, "Moving a slot" and "Doubling the slots").

A slot move holds `movers/<slot>`, a doubling `movers/split`. The node's data names the holder
(`<host>-<pid>/<random>`). Compare-and-set on the recorded step alone would stop a second
process only after its Redis work (a late copy could overwrite what the first one switched
to), so every step checks, right before its Redis or routing write, that the node is still
this process's: one whose ZooKeeper session was suspended or expired (the node may be gone, or
someone else's) stops there with MoveError.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import uuid

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.retry import KazooRetry

#: How long releasing a lock retries through a connection loss; past it the node goes with
#: the session (a lock left by a live session keeps the slots refused until then).
LOCK_RELEASE_DEADLINE_S = 10.0


class MoveError(Exception):
    """A move or a doubling cannot start or go on: bad input, another one under way, a
    concurrent mover. The text is one line for the operator."""


class LockHeld(MoveError):
    """Another process holds the lock: it is at work on the same slots now. Nothing was done;
    try again once it ended."""


class NodeLock:
    """One ephemeral lock node; `subject` ("slot 5"), `activity` ("moved") and `lock_name`
    ("the slot's lock") word the errors, `held_error` is raised when another process holds it."""

    def __init__(
        self,
        zk: KazooClient,
        path: str,
        subject: str,
        activity: str,
        lock_name: str,
        held_error: type[LockHeld] = LockHeld,
    ) -> None:
        self.zk = zk
        self.path = path
        self.subject = subject
        self.activity = activity
        self.lock_name = lock_name
        self.held_error = held_error
        self._holder: bytes | None = None
        # when the node was last read as this process's, and in which ZooKeeper session
        self._read_at = -math.inf
        self._read_in: object = None

    @property
    def held(self) -> bool:
        """This process took the lock (and has not released it); `check` says if it still
        has it."""
        return self._holder is not None

    def acquire(self) -> None:
        """Take the lock (a node of this process's session); a no-op when it holds it."""
        if self._holder is not None:
            return
        holder = f"{socket.gethostname()}-{os.getpid()}/{uuid.uuid4().hex[:8]}".encode()
        sent_at = time.monotonic()
        try:
            self.zk.create(self.path, holder, ephemeral=True, makepath=True)
        except NodeExistsError:
            try:
                other = self.zk.get(self.path)[0].decode(errors="replace")
            except NoNodeError:
                other = "a mover that just ended"
            raise self.held_error(
                f"{self.subject} is being {self.activity} by {other} (lock {self.path} held): "
                "run again once it ended"
            ) from None
        self._holder = holder
        self._read_at, self._read_in = sent_at, self.zk.client_id

    def release(self) -> None:
        """Give the lock up (if held), through a connection loss for up to
        LOCK_RELEASE_DEADLINE_S; an expired session took the node with it."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        retry = KazooRetry(max_tries=-1, deadline=LOCK_RELEASE_DEADLINE_S)
        with contextlib.suppress(SessionExpiredError):  # the node went with the session
            retry(self._delete, holder)

    def _delete(self, holder: bytes) -> None:
        try:
            data, stat = self.zk.get(self.path)
            if data == holder:
                self.zk.delete(self.path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass  # gone with a session that expired, or already somebody else's

    def check(self, reread_after_s: float = 0.0) -> None:
        """Raise MoveError unless the node is this process's right now: called before every
        write, so a process whose session was suspended or lost stops there.

        With `reread_after_s` (a copy checks before each of its many pages) the node is read
        again only that long after it was last read as this process's; in between, the check
        is local: the connection up, the same session. A node read as ours stays ours for at
        least the session timeout after that read was sent: only the end of its session or
        this process deletes it (a holder deletes only its own node, `_delete`), and the server
        ends a session only after the timeout without hearing from it. With `reread_after_s`
        well below the session timeout (ZooKeeper's floor is two ticks, 4 s by default), the
        node is ours still, even if this process was paused meanwhile: a pause that long
        outlasts the interval, and the next check reads. What the interval leaves is a node
        deleted by hand, noticed within it."""
        lock = self.lock_name
        if self._holder is None:
            raise MoveError(f"{self.subject}: this mover does not hold {lock}")
        if self.zk.state != KazooState.CONNECTED:
            raise MoveError(f"{self.subject}: ZooKeeper connection {self.zk.state}; run again")
        session = self.zk.client_id
        if reread_after_s * 4 > _session_timeout_s(self.zk):
            reread_after_s = 0.0  # too close to the session timeout to lean on it
        if session == self._read_in and time.monotonic() - self._read_at < reread_after_s:
            return
        read_at = time.monotonic()
        try:
            data = self.zk.get(self.path)[0]
        except NoNodeError:
            data = None
        if data != self._holder:
            raise MoveError(f"{self.subject}: this mover lost {lock}; run again")
        self._read_at, self._read_in = read_at, session


def _session_timeout_s(zk: KazooClient) -> float:
    """The session timeout `zk` asked for (kazoo keeps it private, and not the one the server
    granted, which is the same unless the server's bounds clamp it: its default floor is 4 s);
    0 when unknown, so that `check` reads the node every time."""
    return float(getattr(zk, "_session_timeout", 0)) / 1000
