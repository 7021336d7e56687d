"""Stream delivery: XADD each due message to a target Redis Stream, then ack (the seed's
"forward to the real topic").

At least once: the ack follows the XADD, so a crash between the two re-adds the message after
its lease expires; stream readers dedupe by the `id` field.

SSRF guard of an external target (`stream_url`, from the tenant's Secret on Kubernetes): as a
webhook's, every connection resolves the host itself, checks each address with the topic's
`TargetPolicy` and connects to a checked one (`GuardedConnection`), so neither a name nor DNS
rebinding reaches what the topic does not admit. A refused target is a failed delivery naming
the address, retried with the usual backoff.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis.asyncio
from redis.asyncio.connection import Connection, SSLConnection, parse_url

from delayq.queue.model import Message
from delayq.queue.topic import Topic
from delayq.service.delivery.targets import TargetPolicy, admitted_addresses


def stream_fields(topic: Topic, message: Message) -> dict[str, bytes | str | int]:
    """The entry written to the target stream (pure); the payload stays raw bytes. `group`
    only when the message has one (a stream field cannot be null), as in a webhook body."""
    fields: dict[str, bytes | str | int] = {
        "id": message.id,
        "topic": topic.name,
        "namespace": topic.namespace,
        "payload": message.payload,
        "headers": json.dumps(message.headers, separators=(",", ":"), sort_keys=True),
        "attempt": message.attempt,
        "dueMs": message.due_ms,
        "priority": message.priority,
    }
    if message.group is not None:
        fields["group"] = message.group
    return fields


class StreamSink:
    def __init__(
        self,
        topic: Topic,
        client: redis.asyncio.Redis,
        key: str,
        maxlen: int,
        owns_client: bool,
    ) -> None:
        self.topic = topic
        self.client = client
        self.key = key
        self.maxlen = maxlen or None
        self.owns_client = owns_client

    async def deliver(self, message: Message) -> None:
        fields = stream_fields(self.topic, message)
        await self.client.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]

    def abandon(self, slots: frozenset[int]) -> None:
        """Nothing waits here: each message is one XADD."""

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()


class GuardedConnection(Connection):
    """A Redis connection that goes only to an address its `TargetPolicy` admits: resolved
    here, checked, and connected to by that address (TLS still verifies the host name)."""

    def __init__(self, *, target_policy: TargetPolicy, **kwargs: Any) -> None:
        self.target_policy = target_policy
        self._checked_address = ""
        super().__init__(**kwargs)

    async def _connect(self) -> None:
        admitted = await admitted_addresses(self.host, self.port, self.target_policy)
        self._checked_address = admitted[0]
        await super()._connect()  # type: ignore[no-untyped-call]

    def _connection_arguments(self) -> Mapping[str, Any]:
        arguments = dict(super()._connection_arguments())
        if arguments.get("ssl") is not None:
            arguments["server_hostname"] = self.host
        arguments["host"] = self._checked_address
        return arguments


class GuardedSSLConnection(GuardedConnection, SSLConnection):
    """`rediss://`: the guard, then TLS to the host name."""


def guarded_pool_options(url: str, policy: TargetPolicy) -> dict[str, Any]:
    """`BlockingConnectionPool` arguments of a `redis://` or `rediss://` URL whose connections
    go through the guard (a `unix://` one is refused by the settings unless admitted)."""
    options: dict[str, Any] = dict(parse_url(url))
    tls = options.get("connection_class") is SSLConnection
    options["connection_class"] = GuardedSSLConnection if tls else GuardedConnection
    options["target_policy"] = policy
    return options
