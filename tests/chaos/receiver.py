"""The webhook receiver of the chaos suite: records every POST and answers per a behaviour.

It runs in the test process on the real clock (the Redis server's clock too: same machine), so
an arrival can be compared with the due time the API returned. Every POST is recorded when it
arrives, before the behaviour delays or fails it: a POST that arrives too early or after its
lease must be seen even if nobody ever gets an answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from delayq.local.ports import free_port
from delayq.service.delivery.signing import TIMESTAMP_HEADER

SECRET = "whsec_oyZXi8QPz9WshiOMGDRVe1g8+xOZ0N5G284Bp4OTzy4="
LEASE_DEADLINE_HEADER = "X-Delayq-Lease-Deadline"  # hook asked of the service (optional)


def signature_ok(body: bytes, headers: dict[str, str]) -> bool:
    try:
        Webhook(SECRET).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def now_ms() -> float:
    return time.time() * 1000


@dataclass
class Arrival:
    """One POST as the receiver saw it."""

    message_id: str
    attempt: int
    member: str
    at_ms: float  # arrival on the receiver's (real) clock
    signed_ms: int  # the signature's timestamp, its second's last ms (the Redis clock)
    due_ms: int  # dueMs from the body
    lease_deadline_ms: int | None  # from the service's header, when it sends one
    status: int = 0  # the answer; 0 while pending, -1 when the sender hung up first
    answered_ms: float = 0.0
    signature_ok: bool = True


@dataclass
class Behaviour:
    """How the receiver answers right now; the fault injector flips it."""

    slow_s: tuple[float, float] | None = None  # sleep uniformly in this range, then 204
    error_rate: float = 0.0  # answer 503 with this probability
    only: frozenset[str] | None = None  # the members it applies to (None: all)
    retry_after_s: int | None = None  # answer 429 with this Retry-After (the receiver's pace)


class Recipient(Protocol):
    """What takes the fleet's deliveries: this receiver (webhook topics) or the pull consumers
    (puller.py). The injector flips its behaviour; the checker judges its arrivals."""

    behaviour: Behaviour
    arrivals: list[Arrival]

    @property
    def url(self) -> str: ...

    async def stop(self) -> None: ...


@dataclass
class Receiver:
    behaviour: Behaviour = field(default_factory=Behaviour)
    arrivals: list[Arrival] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._receive)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _receive(self, request: web.Request) -> web.Response:
        at = now_ms()
        body = await request.read()
        message = json.loads(body)
        deadline = request.headers.get(LEASE_DEADLINE_HEADER)
        arrival = Arrival(
            message_id=message["id"],
            attempt=int(message["attempt"]),
            member=request.headers.get("X-Delayq-Member", "?"),
            at_ms=at,
            signed_ms=_signed_ms(request.headers.get(TIMESTAMP_HEADER, "")),
            due_ms=int(message["dueMs"]),
            lease_deadline_ms=int(deadline) if deadline else None,
            signature_ok=signature_ok(body, dict(request.headers)),
        )
        self.arrivals.append(arrival)
        status = -1
        try:
            behaviour = self.behaviour
            if behaviour.only is not None and arrival.member not in behaviour.only:
                behaviour = Behaviour()
            if behaviour.slow_s is not None:
                await asyncio.sleep(self.rng.uniform(*behaviour.slow_s))
            headers = {}
            if behaviour.retry_after_s is not None:
                status, headers = 429, {"Retry-After": str(behaviour.retry_after_s)}
            else:
                status = 503 if self.rng.random() < behaviour.error_rate else 204
            return web.Response(status=status, headers=headers)
        finally:
            arrival.status = status
            arrival.answered_ms = now_ms()


def _signed_ms(timestamp_s: str) -> int:
    """The latest ms the signature's timestamp (whole seconds, rounded down) allows: the checker
    uses it as an upper bound of the sending time, which keeps its rules conservative."""
    try:
        return int(timestamp_s) * 1000 + 999
    except ValueError:
        return 0
