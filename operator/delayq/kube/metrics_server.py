"""The operator's `/metrics` endpoint, served by every replica for the whole process.

Like the liveness endpoint (liveness.py) it runs outside kopf, which only runs on the leader: a
standby must still answer its scrape, with `delayq_operator_is_leader 0`. It has a port of its
own (`metrics_endpoint`, default 8081) so a ServiceMonitor can select it by name without also
scraping the liveness probe's port.
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from delayq.kube.endpoint import endpoint_server
from delayq.kube.metrics import CONTENT_TYPE, OperatorMetrics


def metrics_server(
    endpoint: str, metrics: OperatorMetrics
) -> contextlib.AbstractAsyncContextManager[None]:
    """Serve GET on the endpoint's path (e.g. http://0.0.0.0:8081/metrics) until the exit."""

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    return endpoint_server(endpoint, scrape, "/metrics", 8081)
