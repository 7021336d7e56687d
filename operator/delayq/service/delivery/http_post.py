"""Keep-alive HTTP/1.1 POSTs to one webhook URL: the webhook sink's client.

Why not aiohttp's client, which the rest of delayq uses: a webhook topic sends a POST a message,
and `aiohttp.ClientSession` spends ~175 µs of CPU on each (its request and response objects,
header multidicts, cookie filtering, tracing hooks, the connector's bookkeeping) where this one
spends ~40 µs (docs/benchmarks.md, "A webhook POST's CPU"). At 2,000 messages/s that is a
quarter of a core the pod's claims and acks would otherwise wait for. It does only what a
webhook needs: POSTs to one origin over HTTP/1.1 keep-alive connections, TLS verified against
the system's CAs, no proxies, no redirects (a 3xx is an answer like any other), no cookies, no
compression. httptools (llhttp, Node's parser, in C) reads the answers.

SSRF guard: the host is resolved here, every address `TargetPolicy` refuses is dropped, and the
connection goes to one of the checked addresses (TLS still verifies the URL's host name), so
DNS cannot slip a private address in between (rebinding). An IP literal, including the C
library's IPv4 shorthands (`127.1`, `2130706433`), is resolved the same way: what is checked is
what `connect` gets. A host with only refused addresses raises `TargetRefusedError`; the
admitted ones are tried as aiohttp did (Happy Eyeballs, `aiohappyeyeballs`).

One POST at a time per connection; the caller bounds how many are in flight (the sink's
`AdaptiveLimit`), and a connection idle for `keep_idle_s` (`KEEP_IDLE_S`) is closed.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
from collections.abc import Mapping
from typing import NamedTuple

import aiohappyeyeballs
import httptools
from yarl import URL

from delayq import __version__
from delayq.service.delivery.targets import (
    Resolve,
    TargetPolicy,
    TargetRefusedError,
    admitted_addresses,
    system_resolve,
)

#: An idle connection is closed after this long: under the 5 s a Node.js receiver keeps one
#: open by default, so the receiver rarely closes one just as a POST goes out on it.
KEEP_IDLE_S = 4.0
#: Sent unless the caller sends the same header (a topic's extra `User-Agent` replaces delayq's).
#: `identity`: the replies are read as sent, never decompressed, so none may be compressed.
DEFAULT_HEADERS = (
    ("user-agent", f"User-Agent: delayq/{__version__}\r\n"),
    ("accept", "Accept: */*\r\n"),
    ("accept-encoding", "Accept-Encoding: identity\r\n"),
)
#: After this long without a connection, the next admitted address is tried alongside (Happy
#: Eyeballs, RFC 8305, as aiohttp did): an address that drops packets does not cost the POST.
HAPPY_EYEBALLS_DELAY_S = 0.25


class PostError(Exception):
    """The POST got no answer: the URL is unusable, the connection failed or broke, or the
    answer was not HTTP. The message names the host, never the URL (it may hold credentials)."""


class Reply(NamedTuple):
    status: int
    #: the whole body, or None when over the caller's limit, cut off, or still arriving at the
    #: timeout (the status stands: a single POST's answer is its status)
    body: bytes | None
    retry_after: str | None


class Origin(NamedTuple):
    """What a POST needs of the URL, parsed once."""

    host: str  # to resolve and, over TLS, to verify (without a trailing dot)
    port: int
    tls: bool
    head: str  # the request line and the headers every POST carries, without the final CRLF
    #: the URL's credentials as a Basic `Authorization` (in `head`), which replaces any other
    url_authorization: bool


def origin(url: str) -> Origin:
    """The URL as an `Origin`; ValueError when it cannot be POSTed to. Credentials in the URL
    become a Basic `Authorization` (Latin-1, as aiohttp's `BasicAuth`, which sent them before)."""
    parsed = URL(url)
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"scheme {parsed.scheme!r} is not http or https")
    host, port = parsed.raw_host, parsed.port
    if not host or port is None or not 0 < port < 65536:
        raise ValueError("no host or no valid port")
    lines = [
        f"POST {parsed.raw_path_qs or '/'} HTTP/1.1",
        f"Host: {parsed.host_port_subcomponent}",
    ]
    url_authorization = bool(parsed.raw_user or parsed.raw_password)
    if url_authorization:
        try:
            pair = f"{parsed.user or ''}:{parsed.password or ''}".encode("latin-1")
        except UnicodeEncodeError:  # its message would quote a character of the password
            raise ValueError("its credentials are not Latin-1") from None
        lines.append(f"Authorization: Basic {base64.b64encode(pair).decode('ascii')}")
    head = "".join(f"{line}\r\n" for line in lines)
    return Origin(host.rstrip("."), port, parsed.scheme == "https", head, url_authorization)


class PostClient:
    """POSTs to one URL, a pool of keep-alive connections."""

    def __init__(
        self,
        url: str,
        targets: TargetPolicy,
        timeout_ms: int,
        *,
        resolve: Resolve = system_resolve,
        ssl_context: ssl.SSLContext | None = None,
        keep_idle_s: float = KEEP_IDLE_S,
    ) -> None:
        self.targets = targets
        self.keep_idle_s = keep_idle_s
        self.timeout_s = timeout_ms / 1000
        self._resolve = resolve
        self._origin: Origin | None = None
        self._invalid = ""
        try:
            self._origin = origin(url)
        except ValueError as error:  # failed deliveries, retried, until the topic is fixed
            self._invalid = f"the URL cannot be used: {error}"
        self._ssl: ssl.SSLContext | None = None
        if self._origin is not None and self._origin.tls:
            self._ssl = ssl_context or ssl.create_default_context()
        self._idle: list[Connection] = []  # the most recently used last
        self._open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    async def post(self, body: bytes, headers: Mapping[str, str], reply_limit: int) -> Reply:
        """POST `body` with `headers` (besides Host, User-Agent and Content-Length). Raises
        TargetRefusedError when every address of the host is refused, TimeoutError when no
        answer came within the timeout, PostError for any other failure."""
        if self._origin is None:
            raise PostError(self._invalid)
        if self._closed:
            raise PostError("the client is closed")
        if self._origin.url_authorization:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if (
            lines.count("\n") != len(headers)
            or lines.count("\r") != len(headers)
            or ("\x00" in lines)
        ):
            raise PostError("a header holds a line break or NUL")  # never a second header
        given = {name.lower() for name in headers}
        defaults = "".join(line for name, line in DEFAULT_HEADERS if name not in given)
        request = (
            f"{self._origin.head}{defaults}{lines}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        connection: Connection | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                connection = self._reused() or await self._connect(self._origin)
                await connection.send(request, reply_limit)
        except BaseException as error:  # the answer was not read whole: never reused
            if connection is None:
                raise
            connection.close()
            if isinstance(error, TimeoutError) and connection.status is not None:
                return Reply(connection.status, None, connection.retry_after)  # status stands
            raise
        reply = connection.reply()
        if connection.reusable() and not self._closed:
            self._release(connection)
        else:
            connection.close()
        return reply

    def _reused(self) -> Connection | None:
        """The most recently used idle connection still open and idle for less than
        `keep_idle_s` (the sweep runs only every `keep_idle_s`), or None."""
        cutoff = asyncio.get_running_loop().time() - self.keep_idle_s
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable() and connection.idle_since > cutoff:
                return connection
            connection.close()
        return None

    async def _connect(self, target: Origin) -> Connection:
        """A new connection to the first checked address that accepts one."""
        try:
            allowed = await admitted_addresses(
                target.host, target.port, self.targets, self._resolve
            )
        except TargetRefusedError:
            raise
        except OSError as error:
            raise PostError(f"{target.host}: cannot resolve: {error}") from None
        loop = asyncio.get_running_loop()
        # numeric: no lookup, so no executor thread as `loop.getaddrinfo` takes; just each
        # address's socket address (an IPv6 scope too)
        infos = [
            info
            for address in allowed
            for info in socket.getaddrinfo(
                address, target.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )
        ]
        try:
            sock = await aiohappyeyeballs.start_connection(
                infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, interleave=1
            )
            _, connection = await loop.create_connection(
                lambda: Connection(self._open),
                sock=sock,
                ssl=self._ssl,
                server_hostname=target.host if self._ssl is not None else None,
            )
        except OSError as error:  # ssl.SSLError is one
            raise PostError(
                f"{target.host}:{target.port}: cannot connect to {', '.join(allowed)}: {error}"
            ) from None
        return connection

    def _release(self, connection: Connection) -> None:
        """Keep an answered connection for the next POST; the sweep closes it once idle for
        `keep_idle_s`."""
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(self.keep_idle_s, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        cutoff = asyncio.get_running_loop().time() - self.keep_idle_s
        kept = []
        for connection in self._idle:
            if connection.idle_since > cutoff and connection.reusable():
                kept.append(connection)
            else:
                connection.close()
        self._idle = kept
        if kept:
            self._sweep = asyncio.get_running_loop().call_later(self.keep_idle_s, self._expire)

    @property
    def connections(self) -> int:
        """Connections open now, in use or idle."""
        return len(self._open)

    async def close(self) -> None:
        """Close every connection, those in use too (their POSTs fail)."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        for connection in list(self._open):
            connection.close()
        self._idle.clear()


class Connection(asyncio.Protocol):
    """One connection: a request written, its answer parsed as it arrives."""

    def __init__(self, open_connections: set[Connection]) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answered: asyncio.Future[None] | None = None
        self._open = open_connections  # the client's: this one is in it while open
        self.idle_since = 0.0
        self.status: int | None = None
        self.retry_after: str | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = 0
        self._complete = False
        self._whole = False  # the body arrived whole and within the limit
        self._framed = False  # Content-Length or chunked: the end is known, not the close
        self._broken = False
        self._keep_alive = False  # the last answer lets the connection carry the next POST

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._open.add(self)

    def send(self, request: bytes, reply_limit: int) -> asyncio.Future[None]:
        """Write `request`; the future is done when its answer is (see `reply`)."""
        assert self._transport is not None
        self.status = self.retry_after = None
        self._chunks, self._size, self._limit = [], 0, reply_limit
        self._complete = self._whole = self._framed = self._keep_alive = False
        self._answered = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return self._answered

    def reply(self) -> Reply:
        assert self.status is not None
        body = b"".join(self._chunks) if self._whole else None
        return Reply(self.status, body, self.retry_after)

    def reusable(self) -> bool:
        """Open, its last answer read whole and the server keeping the connection."""
        return (
            self._transport is not None
            and not self._transport.is_closing()
            and not self._broken
            and self._whole
            and self._keep_alive
        )

    def close(self) -> None:
        self._broken = True
        if self._transport is not None:
            self._transport.close()

    def _settle(self, error: Exception | None = None) -> None:
        answered = self._answered
        if answered is None or answered.done():
            return
        if error is None:
            answered.set_result(None)
        else:
            answered.set_exception(error)

    # asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        if self._answered is None or self._complete:
            self._broken = True  # bytes nobody asked for: the stream cannot be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken = True
            self._settle(PostError(f"the answer switches protocols (HTTP {self.status})"))
        except httptools.HttpParserError as error:
            self._broken = True
            self._settle(PostError(f"the answer is not HTTP/1.1: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken = True
        self._open.discard(self)
        if self.status is not None and not self._complete and not self._framed:
            self._whole = self._size <= self._limit  # a body that ends with the connection
            self._complete = True
            self._settle()
            return
        if self.status is not None:
            self._settle()  # cut off: the status stands, the body is None
            return
        reason = f": {exc}" if exc is not None else ""
        self._settle(PostError(f"the connection closed before an answer{reason}"))

    # httptools' callbacks

    def on_message_begin(self) -> None:
        """A second answer after this POST's, in the same read (a read of its own is caught
        by `data_received`): stop parsing before it overwrites the first's status. The raise
        reaches `data_received` as an HttpParserError; the connection is closed."""
        if self._complete:
            self._broken = True
            raise PostError("bytes after the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif lowered in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.retry_after = None  # an interim answer (103 Early Hints): the real one follows
            self._framed = False
            return
        self.status = status

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._limit:
            self._chunks = []
            self._broken = True  # the rest is not read: the connection cannot be reused
            self._settle()
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self.status is None:
            return  # the end of an interim answer
        self._complete = True
        self._whole = self._size <= self._limit
        # after a 101 the bytes are another protocol's: a failed delivery, never reused
        self._keep_alive = self.status != 101 and self._parser.should_keep_alive()
        self._settle()
