"""A cap on the bytes one request's reply may bring into this process.

A broker's keys are its tenant's: whoever holds the broker's admin login (a topic's Secret has
it) may write a hash field, a sorted-set member or a stream entry of any size Redis takes
(512 MB), and a command that reads a page of entries answers them whole; it may also load a
library of delayq's name whose functions answer anything. The operator copies and splits
slots in its leader (`slot_copy.py`, `slot_split.py`), whose memory every tenant shares: a
page must not be sized by what a tenant wrote. Counting entries is no bound when one entry may
be huge, and Redis has no command that reads a page of a hash up to a number of bytes.

So the cap is kept where the bytes arrive: a connection of `capped_client` (or `capped`, a
twin of another client) counts what it receives after each request it sends (a command, or a
pipeline's commands sent at once) and fails the read with ReplyTooLarge as soon as the count
passes its cap. The reply is never held whole (at most the cap and one socket read), and
redis-py drops the connection, whose stream is cut mid-reply. The reader then asks for less
(`fitted`: half the entries). The operator's other calls to a broker go through an asyncio
client with one fixed cap (`capped_async_client`): they read no pages, only small answers.

Why a socket wrapper and not a parser: redis-py's parsers (hiredis, Python) are private
classes; both read through the connection's socket, which `_connect` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
from redis.connection import AbstractConnection

#: The most one read (a command, or a pipeline's commands sent at once) of a capped client may
#: bring in: entries are counted by the readers, but one entry may be of any size a tenant
#: wrote, so `fitted` makes a read past it again at half the entries.
PAGE_MAX_BYTES = 2 * 1024 * 1024
#: The most one entry read alone may hold: the largest record delayq writes (a payload of up to
#: 64 MiB, `maxPayloadBytes`, with its id, group and headers). Such a read takes the process's
#: one entry permit (`_ENTRY_PERMIT`), held to the end of the copy or split that read it
#: (`holding_entries`; the read alone outside one): a reader holds about three times the entry
#: while it is read and written, so one such copy at a time bounds the operator's memory,
#: whatever the number of moves under way.
ENTRY_MAX_BYTES = 65 * 1024 * 1024
#: How long a large read waits for the permit another copy holds (EntryPermitBusy past it:
#: the move fails and is retried, rather than one tenant's slow broker stalling the others').
ENTRY_PERMIT_WAIT_S = 30.0
_ENTRY_PERMIT = threading.Lock()
_THREAD = threading.local()  # permit: this thread holds it; scopes: `holding_entries` depth

T = TypeVar("T")
Item = TypeVar("Item")


class ReplyTooLarge(redis.RedisError):
    """A reply passed the connection's cap before it ended: nothing of it is returned."""


class EntryPermitBusy(redis.RedisError):
    """Another copy held the entry permit for ENTRY_PERMIT_WAIT_S: nothing was read."""


@contextlib.contextmanager
def holding_entries() -> Iterator[None]:
    """A copy or a split: an entry permit its reads take is held until it ends (its large
    entries are written after they are read), then given back."""
    _THREAD.scopes = getattr(_THREAD, "scopes", 0) + 1
    try:
        yield
    finally:
        _THREAD.scopes -= 1
        if not _THREAD.scopes:
            _give_back_permit()


def _take_permit() -> None:
    if getattr(_THREAD, "permit", False):
        return
    if not _ENTRY_PERMIT.acquire(timeout=ENTRY_PERMIT_WAIT_S):
        raise EntryPermitBusy(
            f"another copy held the permit to read an entry past {PAGE_MAX_BYTES} bytes for "
            f"{ENTRY_PERMIT_WAIT_S:.0f} s"
        )
    _THREAD.permit = True


def _give_back_permit() -> None:
    if getattr(_THREAD, "permit", False):
        _THREAD.permit = False
        _ENTRY_PERMIT.release()


class ReplyCap:
    """The cap of a capped client's connections: PAGE_MAX_BYTES, or ENTRY_MAX_BYTES in a
    thread inside `entry_reads` (the connections are the pool's, the reads the thread's)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def max_bytes(self) -> int:
        return ENTRY_MAX_BYTES if getattr(self._local, "entry", False) else PAGE_MAX_BYTES

    @contextlib.contextmanager
    def entry_reads(self) -> Iterator[None]:
        _take_permit()
        self._local.entry = True
        try:
            yield
        finally:
            self._local.entry = False
            if not getattr(_THREAD, "scopes", 0):
                _give_back_permit()


class _CountingSocket:
    """The connection's socket, counting what `recv` and `recv_into` return (a peek is not
    counted: it is read again)."""

    def __init__(self, sock: socket.socket, connection: _ReplyCapped) -> None:
        self._sock = sock
        self._connection = connection

    def recv(self, size: int, flags: int = 0) -> bytes:
        data = self._sock.recv(size, flags)
        if not flags & socket.MSG_PEEK:
            self._connection.received(len(data))
        return data

    def recv_into(self, buffer: Any, size: int = 0, flags: int = 0) -> int:
        count = self._sock.recv_into(buffer, size, flags)
        if not flags & socket.MSG_PEEK:
            self._connection.received(count)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _ReplyCapped(AbstractConnection):
    """Mixed into a connection class by `capped_client`; `reply_cap` is its cap."""

    def __init__(self, *args: Any, reply_cap: ReplyCap, **kwargs: Any) -> None:
        self.reply_cap = reply_cap
        self._received = 0
        super().__init__(*args, **kwargs)

    def _connect(self) -> Any:
        return _CountingSocket(super()._connect(), self)  # type: ignore[safe-super, no-untyped-call]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._received = 0
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def received(self, count: int) -> None:
        self._received += count
        if self._received > (cap := self.reply_cap.max_bytes):
            where = self._host_error()  # type: ignore[no-untyped-call]
            raise ReplyTooLarge(f"a reply from {where} passed {cap} bytes")


_CAPPED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _capped_class(base: type[AbstractConnection]) -> type[AbstractConnection]:
    if base not in _CAPPED:
        _CAPPED[base] = type(f"ReplyCapped{base.__name__}", (_ReplyCapped, base), {})
    return _CAPPED[base]


def capped_client(**client_kwargs: Any) -> redis.Redis:
    """A client (`redis.Redis`'s arguments and defaults, its retries too) whose every read
    fails with ReplyTooLarge once its reply passes the cap (`ReplyCap`): the operator's client
    of a broker's slot moves (`kube/redisctl.py`)."""
    plain = redis.Redis(**client_kwargs)
    try:
        return _capped_from(plain.connection_pool)
    finally:
        plain.close()


def _capped_from(pool: redis.ConnectionPool) -> redis.Redis:
    """A client of `pool`'s server with `pool`'s connection arguments, capped (its own pool;
    not the maintenance handler of `pool`, which is that pool's)."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    capped_pool = redis.ConnectionPool(
        connection_class=_capped_class(pool.connection_class), reply_cap=ReplyCap(), **kwargs
    )
    return redis.Redis.from_pool(capped_pool)


_TWINS: dict[int, redis.Redis] = {}
_TWINS_LOCK = threading.Lock()


def capped(client: redis.Redis) -> redis.Redis:
    """The capped twin of `client`: the same server and login, its own connections, whose
    every read fails with ReplyTooLarge once its reply passes the cap (`ReplyCap`); the
    readers of a slot take pages through `fitted`. Made once per client (a doubling copies
    slot after slot: a twin per call would open a connection each) and closed when `client`
    is collected; a client capped already is itself."""
    if is_capped(client):
        return client
    with _TWINS_LOCK:
        twin = _TWINS.get(id(client))
        if twin is None:
            twin = _capped_from(client.connection_pool)
            _TWINS[id(client)] = twin
            weakref.finalize(client, _forget, id(client))
        return twin


def _forget(client_id: int) -> None:
    # no lock: a collection may run this in a thread inside `capped` (dict.pop is atomic)
    twin = _TWINS.pop(client_id, None)
    if twin is not None:
        twin.close()


def is_capped(client: redis.Redis) -> bool:
    return "reply_cap" in client.connection_pool.connection_kwargs


def entry_reads(client: redis.Redis) -> contextlib.AbstractContextManager[None]:
    """Reads of a capped client in this thread capped at ENTRY_MAX_BYTES (one such block at a
    time in the process) instead of PAGE_MAX_BYTES."""
    cap: ReplyCap = client.connection_pool.connection_kwargs["reply_cap"]
    return cap.entry_reads()


def fitted(client: redis.Redis, read: Callable[[int], T], count: int, what: str) -> tuple[T, int]:
    """`read(count)` (a page of up to `count` entries of `what`) and the count it was made with:
    on a capped client, a reply past the cap is read again at half the entries, and a single
    entry alone with ENTRY_MAX_BYTES (ReplyTooLarge naming `what` past that). The readers
    re-read: their sources are frozen, or scanned with cursors that may be asked again."""
    while True:
        try:
            return read(count), count
        except ReplyTooLarge:
            if count > 1:
                count //= 2
                continue
        with entry_reads(client):
            try:
                return read(1), 1
            except ReplyTooLarge:
                raise ReplyTooLarge(
                    f"{what}: one entry passes {ENTRY_MAX_BYTES} bytes, more than any message "
                    "delayq writes: not copied"
                ) from None


def fitted_chunks(
    client: redis.Redis, items: Sequence[Item], read: Callable[[Sequence[Item]], T], what: str
) -> Iterator[T]:
    """`read` of consecutive chunks of `items` (reads of these names, ids, members), all at
    once first, each chunk `fitted` to the cap: past it, half as many; after a chunk that had
    to shrink, the next asks for twice its items again."""
    done, asked = 0, len(items)
    while done < len(items):

        def chunk(count: int, rest: Sequence[Item] = items[done:]) -> T:
            return read(rest[:count])

        result, used = fitted(client, chunk, asked, what)
        yield result
        done += used
        asked = min(len(items) - done, 2 * used)


def scan_pages(
    client: redis.Redis,
    scan: Callable[[int, int], tuple[int, T]],
    count: int,
    what: str,
    cursor: int = 0,
) -> Iterator[T]:
    """Every page of a SCAN-family command over `what` (`scan(cursor, count)`: HSCAN, ZSCAN,
    SSCAN of one key) from `cursor` on, each `fitted` to the cap; after a page that had to
    shrink, the next asks for twice its entries again, up to `count`. A cursor may be asked
    again with another count: every entry present throughout is still seen. A SCAN answers
    a whole bucket of the key's table, which may hold several entries, and a small key (a
    listpack) whole: one answer past ENTRY_MAX_BYTES fails (`record_buckets.hash_pages` reads
    a hash on by name then; a sorted set or a set that large holds members no engine writes:
    its copy fails naming the key)."""
    asked = count
    while True:
        (cursor, page), used = fitted(client, functools.partial(scan, cursor), asked, what)
        asked = min(count, 2 * used)
        if page:
            yield page
        if cursor == 0:
            return


#: The most one reply of the operator's other calls to a broker may bring (INFO, the stats
#: function, FUNCTION LIST: a few kB to a few MB): the broker's admin login is its tenant's
#: too, and a library loaded in place of delayq's may answer anything.
ADMIN_REPLY_MAX_BYTES = 32 * 1024 * 1024


class _CountingStream:
    """An asyncio connection's stream reader, counting what its reads return (every parser
    reads through `read`, `readline` or `readexactly`)."""

    def __init__(self, stream: asyncio.StreamReader, connection: _AsyncReplyCapped) -> None:
        self._stream = stream
        self._connection = connection

    async def read(self, size: int = -1) -> bytes:
        return self._connection.received(await self._stream.read(size))

    async def readline(self) -> bytes:
        return self._connection.received(await self._stream.readline())

    async def readexactly(self, size: int) -> bytes:
        return self._connection.received(await self._stream.readexactly(size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncReplyCapped(redis.asyncio.Connection):
    """An asyncio TCP connection whose replies fail with ReplyTooLarge past
    `reply_max_bytes`, each counted from the request that asked for it."""

    def __init__(self, *args: Any, reply_max_bytes: int, **kwargs: Any) -> None:
        self.reply_max_bytes = reply_max_bytes
        self._received = 0
        super().__init__(*args, **kwargs)

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[no-untyped-call]
        assert self._reader is not None
        self._reader = cast("asyncio.StreamReader", _CountingStream(self._reader, self))

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._received = 0
        await super().send_packed_command(command, check_health)

    def received(self, data: bytes) -> bytes:
        self._received += len(data)
        if self._received > self.reply_max_bytes:
            raise ReplyTooLarge(
                f"a reply from {self.host}:{self.port} passed {self.reply_max_bytes} bytes"
            )
        return data


def capped_async_client(**connection_kwargs: Any) -> redis.asyncio.Redis:
    """An asyncio client (TCP, `redis.asyncio.Connection`'s arguments) whose every reply fails
    with ReplyTooLarge past ADMIN_REPLY_MAX_BYTES: the operator's other calls to a broker."""
    pool = redis.asyncio.ConnectionPool(
        connection_class=_AsyncReplyCapped,
        reply_max_bytes=ADMIN_REPLY_MAX_BYTES,
        **connection_kwargs,
    )
    return redis.asyncio.Redis.from_pool(pool)
