"""The operator's liveness endpoint, served by every replica (leader or standby).

kopf's own endpoint only exists while kopf runs, which is on the leader alone: a standby would
fail its probe and be restarted forever. This server runs for the whole process instead. It
answers from the event loop that also runs the election and kopf, so an answer proves the loop
is not wedged; a leader that loses its leader lease exits by itself rather than through the probe.
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from delayq.kube.endpoint import endpoint_server


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def liveness_server(endpoint: str) -> contextlib.AbstractAsyncContextManager[None]:
    """Serve GET on the endpoint's path (e.g. http://0.0.0.0:8080/healthz) until the exit."""
    return endpoint_server(endpoint, _healthz, "/", 8080)
