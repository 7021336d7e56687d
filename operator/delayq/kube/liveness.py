"""The operator's liveness endpoint, served by every replica (leader or standby).

kopf's own endpoint only exists while kopf runs, which is on the leader alone: a standby would
fail its probe and be restarted forever. This server runs for the whole process instead. It
answers from the event loop that also runs the election and kopf, so an answer proves the loop
is not wedged; a leader that loses its leader lease exits by itself rather than through the probe.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def liveness_server(endpoint: str) -> AsyncIterator[None]:
    """Serve GET on the endpoint's path (e.g. http://0.0.0.0:8080/healthz) until the exit."""
    url = urllib.parse.urlsplit(endpoint)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get(url.path or "/", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 8080).start()
        yield
    finally:
        await runner.cleanup()
