"""The operator's `/metrics` endpoint, served by every replica for the whole process.

Like the liveness endpoint (liveness.py) it runs outside kopf, which only runs on the leader: a
standby must still answer its scrape, with `delayq_operator_is_leader 0`. It has a port of its
own (`metrics_endpoint`, default 8081) so a ServiceMonitor can select it by name without also
scraping the liveness probe's port.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator

from aiohttp import web

from delayq.kube.metrics import CONTENT_TYPE, OperatorMetrics


@contextlib.asynccontextmanager
async def metrics_server(endpoint: str, metrics: OperatorMetrics) -> AsyncIterator[None]:
    """Serve GET on the endpoint's path (e.g. http://0.0.0.0:8081/metrics) until the exit."""
    url = urllib.parse.urlsplit(endpoint)

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get(url.path or "/metrics", scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 8081).start()
        yield
    finally:
        await runner.cleanup()
