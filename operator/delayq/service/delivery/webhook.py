"""Webhook delivery: POST each due message as signed JSON; 2xx acks, anything else retries.

One pooled aiohttp session per topic, a semaphore bounding concurrent POSTs (the per-topic
concurrency limit), and a total timeout per POST so a hung receiver costs a retry, not a slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from delayq.queue.model import Message
from delayq.queue.topic import Topic
from delayq.service.delivery.signing import SIGNATURE_HEADER, sign
from delayq.service.delivery.sinks import DeliveryError
from delayq.service.envelope import message_body
from delayq.service.metrics import ServiceMetrics


def wall_ms() -> int:
    return int(time.time() * 1000)


class WebhookSink:
    def __init__(
        self,
        topic: Topic,
        url: str,
        secret: str,
        timeout_ms: int,
        concurrency: int,
        metrics: ServiceMetrics,
        member: str = "",
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.topic = topic
        self.url = url
        self.secret = secret
        self.metrics = metrics
        self.member = member
        self.clock_ms = clock_ms
        self._limit = asyncio.Semaphore(concurrency)
        # No cookie jar: a receiver's cookies must not ride along on later deliveries.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_ms / 1000),
            connector=aiohttp.TCPConnector(limit=concurrency),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def deliver(self, message: Message) -> None:
        body = message_body(self.topic, message)
        headers = {
            "Content-Type": "application/json",
            "X-Delayq-Id": message.id,
            "X-Delayq-Attempt": str(message.attempt),
            "X-Delayq-Member": self.member,
        }
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, body, self.clock_ms())
        async with self._limit:
            started = time.monotonic()
            status = await self._post(body, headers, started)
        if not 200 <= status < 300:
            raise DeliveryError(f"POST {self.url}: HTTP {status}")

    async def _post(self, body: bytes, headers: dict[str, str], started: float) -> int:
        try:
            async with self._session.post(self.url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as error:
            self._observe("error", started)
            raise DeliveryError(f"POST {self.url}: {type(error).__name__}: {error}") from error
        self._observe(f"{status // 100}xx", started)
        return status

    def _observe(self, status: str, started: float) -> None:
        self.metrics.observe_webhook(status, time.monotonic() - started)

    async def close(self) -> None:
        await self._session.close()
