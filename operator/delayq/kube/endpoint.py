"""A GET route on its own small HTTP server, for the operator's whole process.

The liveness probe (liveness.py) and `/metrics` (metrics_server.py) must answer on every replica,
leader or standby, so neither can live in kopf's server, which runs on the leader alone; each
takes an endpoint URL from the operator's settings and runs until the process exits.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def endpoint_server(
    endpoint: str, handler: Handler, default_path: str, default_port: int
) -> AsyncIterator[None]:
    """Serve GET `handler` on the endpoint (e.g. http://0.0.0.0:8081/metrics) until the exit;
    a URL without a path, host or port takes the defaults (host 0.0.0.0)."""
    url = urllib.parse.urlsplit(endpoint)
    app = web.Application()
    app.router.add_get(url.path or default_path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or default_port).start()
        yield
    finally:
        await runner.cleanup()
