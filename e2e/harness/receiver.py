"""A webhook endpoint on loopback for the locally run data plane: it records every delivery
with its arrival time, so a test can check that nothing arrived before it was due."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from delayq.local.ports import free_port

#: (arrival ms, body) of every POST, in arrival order.
Received = list[tuple[int, dict[str, Any]]]


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Webhook endpoint that records (arrival ms, body) of every POST and answers 204."""

    received: Received

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append((int(time.time() * 1000), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reports what matters."""


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, Received]]:
    """A local webhook receiver on a free loopback port: (URL, received messages)."""
    received: Received = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        thread.join(timeout=10)


def received_one(received: Received, message_id: str) -> tuple[int, dict[str, Any]] | None:
    """(arrival ms, body) of the first delivery of ``message_id``, or None."""
    return next(((t, m) for t, m in received if m.get("id") == message_id), None)
