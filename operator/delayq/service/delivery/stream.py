"""Stream delivery: XADD each due message to a target Redis Stream, then ack (the seed's
"forward to the real topic").

At least once: the ack follows the XADD, so a crash between the two re-adds the message after
its lease expires; stream readers dedupe by the `id` field.
"""

from __future__ import annotations

import json

import redis.asyncio

from delayq.queue.model import Message
from delayq.queue.topic import Topic


def stream_fields(topic: Topic, message: Message) -> dict[str, bytes | str | int]:
    """The entry written to the target stream (pure); the payload stays raw bytes."""
    return {
        "id": message.id,
        "topic": topic.name,
        "namespace": topic.namespace,
        "payload": message.payload,
        "headers": json.dumps(message.headers, separators=(",", ":"), sort_keys=True),
        "attempt": message.attempt,
        "dueMs": message.due_ms,
    }


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

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()
