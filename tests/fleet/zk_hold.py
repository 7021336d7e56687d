"""A TCP proxy between one ZooKeeper client and the server that stops passing the client's
requests on after a chosen write: the test's way to hold a real process right after it recorded
a step in ZooKeeper, without a hook in the product.

ZooKeeper's wire protocol frames every packet with a 4-byte big-endian length. A client's first
frame is its connect request; every later one starts with xid and op type (int32 each), and a
setData (type 5) or a create (1, or create2: 15) continues with the path and the data (each an
int32 length and its bytes). The proxy reads the client's frames, passes each on, and after the
first of `ops` (setData unless told) for which `hold_after(path, data)` is true passes nothing
more of that client (its replies still come back); or, with `hold_before`, holds the first
request that arrives once it is true (checked before each): what the client did since its
previous request (a write to Redis) is done, what comes after waits. The held client waits for
answers that never come: a test then kills it, or `release`s it (within the client's read
timeout, two thirds of its session timeout) and it goes on.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

CREATE, SET_DATA, CREATE2 = 1, 5, 15


class ZkHold:
    def __init__(
        self,
        upstream: tuple[str, int],
        hold_after: Callable[[str, bytes], bool],
        hold_before: Callable[[], bool] | None = None,
        ops: tuple[int, ...] = (SET_DATA,),
    ):
        self.upstream = upstream
        self.hold_after = hold_after
        self.hold_before = hold_before
        self.ops = ops
        self.held = threading.Event()  # set once a client's requests stopped passing
        self.released = threading.Event()  # set: every request passes again, none is held
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="zk-hold").start()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def release(self) -> None:
        """Pass the held requests on, and every later one."""
        self.released.set()

    def close(self) -> None:
        self.release()  # the waiting threads end on their closed sockets
        for sock in [self._listener, *self._sockets]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=_pipe, args=(server, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        """Pass the client's frames on; once the one to hold after has passed, the next ones
        wait for `release`."""
        try:
            server.sendall(_frame(client))  # the connect request
            while True:
                if self.held.is_set():
                    self.released.wait()
                frame = _frame(client)
                if self._holds_before():
                    self.held.set()
                    self.released.wait()
                server.sendall(frame)
                if not self.released.is_set() and self._holds_after(frame[4:]):
                    self.held.set()
        except OSError:
            return  # a side closed

    def _holds_before(self) -> bool:
        return (
            not self.released.is_set() and self.hold_before is not None and self.hold_before()
        )

    def _holds_after(self, body: bytes) -> bool:
        _xid, op = struct.unpack_from(">ii", body)
        if op not in self.ops:
            return False
        (length,) = struct.unpack_from(">i", body, 8)
        path = body[12 : 12 + length].decode()
        (size,) = struct.unpack_from(">i", body, 12 + length)
        data = body[16 + length : 16 + length + size]
        return self.hold_after(path, data)


def _frame(sock: socket.socket) -> bytes:
    """One length-prefixed frame, its length included."""
    head = _exactly(sock, 4)
    (length,) = struct.unpack(">i", head)
    return head + _exactly(sock, length)


def _exactly(sock: socket.socket, count: int) -> bytes:
    chunks = b""
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            raise ConnectionError("closed")
        chunks += chunk
    return chunks


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        return
