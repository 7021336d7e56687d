"""What a delay-service process answers while it cannot start yet (`--wait-for-brokers`).

On Kubernetes a process that exits because a broker or ZooKeeper does not answer is restarted
by the kubelet with a back-off that doubles up to five minutes: during an upgrade that rolls
the brokers after the service pods, the new pods then stay down minutes after their brokers are
back (the upgrade test measured 3 min 15 s). Waiting in the process instead, it answers
`/healthz` (alive: no restart) and `/readyz` 503 with the reason (no traffic), and starts as
soon as what it waits for answers. A hand-run `serve` keeps exiting 1 with the reason.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from delayq.service.api import healthz
from delayq.service.config import ServiceConfig

#: The first wait between two attempts to start, doubled up to the last.
START_RETRY_S = 0.5
START_RETRY_MAX_S = 5.0


class StartFailed(Exception):
    """What kept the service from starting (its cause: the error)."""


class Waiting:
    """The probes' answers while the service cannot start: on the service's own port, closed
    before the service listens there."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.reason = ""
        self._runner: web.AppRunner | None = None

    async def open(self, reason: str) -> None:
        self.reason = reason
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.port).start()

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _readyz(self, request: web.Request) -> web.Response:
        body = {"ready": False, "reason": f"not started: {self.reason}"}
        return web.json_response(body, status=503)


async def stopped_within(stop: asyncio.Event, delay_s: float) -> bool:
    """Wait `delay_s`, or less when `stop` is set; whether it is."""
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        return False
    return True
