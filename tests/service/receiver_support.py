"""A scripted HTTP/1.1 receiver on a raw socket: it answers exactly the bytes a test gives,
so the webhook client meets the answers a well-behaved framework would never send (cut off,
close-delimited, interim, not HTTP at all)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from delayq.service.delivery.targets import Resolve

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def answers(*addresses: str) -> Resolve:
    """A resolver answering fixed addresses, as DNS would for a name the tenant controls."""

    async def resolve(_host: str, _port: int) -> list[str]:
        return list(addresses)

    return resolve


@dataclass
class Request:
    target: str
    headers: dict[str, str]  # lower-cased names (the last of a repeated one)
    body: bytes
    raw_head: bytes


#: Answers a request on a connection: writes to `writer` what the test wants, may close it.
Answer = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]


async def answer_ok(_request: Request, writer: asyncio.StreamWriter) -> None:
    writer.write(OK)


def answering(raw: bytes, close: bool = False) -> Answer:
    """An answer of these exact bytes, the connection closed after it when `close`."""

    async def answer(_request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        if close:
            await writer.drain()
            writer.close()

    return answer


@dataclass
class Receiver:
    answer: Answer = answer_ok
    ssl_context: ssl.SSLContext | None = None
    requests: list[Request] = field(default_factory=list)
    connections: int = 0  # accepted so far
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for handler in list(self._handlers):  # one may be waiting in a test's answer
            handler.cancel()
        await asyncio.gather(*self._handlers)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            while not writer.is_closing():
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")[:-2]
                headers = {}
                for header in fields:
                    name, _, value = header.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(line.split(" ")[1], headers, body, head)
                self.requests.append(request)
                await self.answer(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        except asyncio.CancelledError:  # the receiver stops: asyncio's streams would log it
            pass
        finally:
            self._handlers.discard(handler)
            self._writers.discard(writer)
            writer.close()
