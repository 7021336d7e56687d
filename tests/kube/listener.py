"""A TCP listener that never answers: a hostile or a hung ZooKeeper for the tests (issue 27)."""

from __future__ import annotations

import selectors
import socket
import threading


class SilentListener:
    """A loopback TCP listener that accepts, records every byte it is sent and never answers:
    the ZooKeeper a tenant runs to catch the operator's digest, or an ensemble that hangs."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.setblocking(False)
        self.connections = 0
        self.received = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self._server.getsockname()[1]}"

    def _serve(self) -> None:
        peers: list[socket.socket] = []
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.05):
                    if key.fileobj is self._server:
                        peer, _ = self._server.accept()
                        peers.append(peer)
                        self.connections += 1
                        selector.register(peer, selectors.EVENT_READ)
                        continue
                    assert isinstance(key.fileobj, socket.socket)
                    data = key.fileobj.recv(65536)
                    if data:
                        self.received += data
                    else:
                        selector.unregister(key.fileobj)
        for peer in peers:
            peer.close()
        self._server.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
