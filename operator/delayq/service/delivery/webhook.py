"""Webhook delivery: POST each due message as signed JSON; 2xx acks, anything else retries.

One pooled aiohttp session per topic, a semaphore bounding concurrent POSTs (the per-topic
concurrency limit), and a total timeout per POST so a hung receiver costs a retry, not a slot.

A message may wait for the semaphore; once it has a turn, the sink asks `lease_deadline` whether
its lease is still valid and its slot still owned, and sends nothing otherwise (`LeaseGoneError`:
the consumer gives it back); the deadline travels in `X-Delayq-Lease-Deadline` (unix ms, Redis
clock) so a receiver knows how long its answer may take before the message is redelivered. The
signature's timestamp (`webhook-timestamp`, Standard Webhooks: signing.py) is taken then, on the
Redis server clock the consumer estimates (`clock_ms`), so a pod whose own clock is off never
fails receivers' checks. The topic's extra headers (an `Authorization` the receiver wants) ride
along on every POST.

SSRF guard: the session's resolver (`GuardedResolver`) drops every resolved address the topic's
`TargetPolicy` refuses, so each connection goes to an address that was checked, with no second
lookup in between (DNS rebinding cannot slip a private address past the check). aiohttp does
not resolve an IP literal, so a URL whose host is one is checked on that literal. Redirects are
not followed: a 3xx is a failed delivery like any non-2xx, so a receiver cannot send the POST on
to an address of its choosing. A refused target is a failed delivery naming the address: the
message is retried with the usual backoff, so a tenant who fixes the topic sees it recover.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from delayq.queue.consumer import LeaseGoneError
from delayq.queue.model import Message
from delayq.queue.topic import Topic
from delayq.service.delivery.signing import Signer
from delayq.service.delivery.sinks import DeliveryError
from delayq.service.delivery.targets import TargetPolicy
from delayq.service.envelope import header_id, message_body
from delayq.service.metrics import ServiceMetrics

SlotClock = Callable[[int], float]  # slot -> ms on the clock of the Redis server storing it


def wall_ms() -> int:
    return int(time.time() * 1000)


def host_clock(_slot: int) -> float:
    """This host's clock, for a sink used outside a delay service (tests, tools)."""
    return time.time() * 1000


def no_deadline(_message: Message) -> float | None:
    """For a sink used outside a delay service: no lease to honour, sent as 0."""
    return 0.0


class TargetRefusedError(OSError):
    """Every address of a webhook host is refused. An OSError, because that is what aiohttp's
    connector turns into a connection error (`ClientConnectorError.os_error`)."""


class GuardedResolver(AbstractResolver):
    """The default resolver, minus the addresses `policy` refuses: the connector only ever
    sees, and so only connects to, addresses that passed the check."""

    def __init__(self, policy: TargetPolicy, resolver: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._resolver = resolver or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._resolver.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        refusals: list[str] = []
        for result in results:
            refused = self.policy.refusal(result["host"])
            if refused is None:
                allowed.append(result)
            else:
                refusals.append(refused)
        if not allowed:
            raise TargetRefusedError(f"{host}: {refusals[0] if refusals else 'no address'}")
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


def literal_refusal(url: str, policy: TargetPolicy) -> str | None:
    """The refusal of a URL whose host is an IP literal, which aiohttp connects to without
    asking the resolver; None for a host name (the resolver checks what it resolves to).

    The C library's IPv4 forms count as literals too (`127.1`, `2130706433`, `012.0.0.1`):
    `ipaddress` rejects them, but an aiohttp that takes any digits-and-dots host for an address
    hands them to `connect`, which reads them as 127.0.0.1 and 10.0.0.1."""
    host = URL(url).host or ""  # aiohttp's own URL parser, so both read the same host
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        try:
            address = str(ipaddress.IPv4Address(socket.inet_aton(host)))
        except OSError:
            return None
    return policy.refusal(address)


class WebhookSink:
    def __init__(
        self,
        topic: Topic,
        url: str,
        signer: Signer,
        timeout_ms: int,
        concurrency: int,
        metrics: ServiceMetrics,
        member: str = "",
        clock_ms: SlotClock = host_clock,
        lease_deadline: Callable[[Message], float | None] = no_deadline,
        *,
        targets: TargetPolicy,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.topic = topic
        self.url = url
        self.signer = signer
        self.extra_headers = dict(extra_headers or {})
        self.metrics = metrics
        self.member = member
        self.clock_ms = clock_ms
        self.lease_deadline = lease_deadline
        self._limit = asyncio.Semaphore(concurrency)
        self._literal_refusal = literal_refusal(url, targets)
        # No cookie jar: a receiver's cookies must not ride along on later deliveries.
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_ms / 1000),
            connector=aiohttp.TCPConnector(limit=concurrency, resolver=GuardedResolver(targets)),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def deliver(self, message: Message) -> None:
        body = message_body(self.topic, message)
        message_id = header_id(message.id)
        headers = {
            **self.extra_headers,
            "Content-Type": "application/json",
            "X-Delayq-Id": message_id,
            "X-Delayq-Attempt": str(message.attempt),
            "X-Delayq-Member": self.member,
        }
        async with self._limit:
            deadline_ms = self.lease_deadline(message)
            if deadline_ms is None:
                raise LeaseGoneError(f"{message.id}: lease gone while waiting for a POST slot")
            headers["X-Delayq-Lease-Deadline"] = str(int(deadline_ms))
            if self.signer:
                timestamp_s = int(self.clock_ms(message.slot) // 1000)
                headers.update(self.signer.headers(message_id, timestamp_s, body))
            started = time.monotonic()
            status = await self._post(body, headers, started)
        if not 200 <= status < 300:
            raise DeliveryError(f"POST {self.url}: HTTP {status}")

    async def _post(self, body: bytes, headers: dict[str, str], started: float) -> int:
        if self._literal_refusal:
            self._observe("refused", started)
            raise DeliveryError(f"POST {self.url}: {self._literal_refusal}")
        try:
            async with self._session.post(
                self.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.read()
                status = response.status
        except aiohttp.ClientConnectorError as error:
            if isinstance(error.os_error, TargetRefusedError):
                self._observe("refused", started)
                raise DeliveryError(f"POST {self.url}: {error.os_error}") from error
            self._observe("error", started)
            raise DeliveryError(f"POST {self.url}: {type(error).__name__}: {error}") from error
        except (aiohttp.ClientError, TimeoutError) as error:
            self._observe("error", started)
            raise DeliveryError(f"POST {self.url}: {type(error).__name__}: {error}") from error
        self._observe(f"{status // 100}xx", started)
        return status

    def _observe(self, status: str, started: float) -> None:
        self.metrics.observe_webhook(status, time.monotonic() - started)

    async def close(self) -> None:
        await self._session.close()
