"""The JSON shape of a message as it leaves the service (webhook body, pull lease, GET) (pure).

Payloads are bytes in the engine. JSON carries text, so a payload that is valid UTF-8 travels as
is (`"encoding": "utf-8"`) and anything else as base64 (`"encoding": "base64"`); receivers never
have to guess.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from urllib.parse import quote

from delayq.queue.model import Message, MessageInfo
from delayq.queue.topic import Topic

UTF8 = "utf-8"
BASE64 = "base64"
ENCODINGS = (UTF8, BASE64)
# Kept as they are in a header id: visible ASCII except "%", the escape itself (space, which a
# header parser would strip at either end, and everything else is percent-encoded)
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def encode_payload(payload: bytes) -> tuple[str, str]:
    """(text, encoding) of a payload: UTF-8 text when it is, else base64."""
    try:
        return payload.decode(UTF8), UTF8
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), BASE64


#: What `decode_payload` takes as base64 (the standard alphabet, padded), stated in OpenAPI.
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def decode_payload(text: str, encoding: str) -> bytes:
    """Bytes of a payload received as JSON text; raises ValueError for bad base64."""
    if encoding == BASE64:
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as error:
            raise ValueError(f"not valid base64: {error}") from error
    return text.encode(UTF8)


def header_id(message_id: str) -> str:
    """The id as an HTTP header value (webhook `X-Delayq-Id`): RFC 3986 percent-encoding of
    its UTF-8 bytes outside visible ASCII, and of "%" itself, so the header is ASCII and
    `urllib.parse.unquote(value)` (any RFC 3986 percent-decoder) gives the id back exactly.
    An id of visible ASCII without "%" is sent unchanged."""
    return quote(message_id, safe=_HEADER_SAFE)


def message_json(topic: Topic, message: Message) -> dict[str, Any]:
    """A due message as delivered: what a webhook receives and a pull lease returns. `group`
    only when it has one: an ungrouped message's body stays the bytes it always was (a
    receiver's signature check, dedupe or schema never sees a new `null`)."""
    payload, encoding = encode_payload(message.payload)
    body: dict[str, Any] = {
        "id": message.id,
        "topic": topic.name,
        "namespace": topic.namespace,
        "payload": payload,
        "encoding": encoding,
        "headers": message.headers,
        "attempt": message.attempt,
        "dueMs": message.due_ms,
        "priority": message.priority,
    }
    if message.group is not None:
        body["group"] = message.group
    return body


def message_body(topic: Topic, message: Message) -> bytes:
    """The exact bytes POSTed to a webhook (and signed): compact, keys sorted."""
    return json.dumps(message_json(topic, message), separators=(",", ":"), sort_keys=True).encode()


def info_json(info: MessageInfo) -> dict[str, Any]:
    """The state of a message by id (GET, dead-queue pages)."""
    payload, encoding = encode_payload(info.payload)
    body: dict[str, Any] = {
        "id": info.id,
        "slot": info.slot,
        "state": info.state.value,
        "attempts": info.attempts,
        "payload": payload,
        "encoding": encoding,
        "headers": info.headers,
        "priority": info.priority,
    }
    optional = {
        "dueMs": info.due_ms,
        "leaseDeadlineMs": info.lease_deadline_ms,
        "diedMs": info.died_ms,
        "finishedMs": info.finished_ms,
        "expireAtMs": info.expire_at_ms,
        "group": info.group,
        "deadReason": info.dead_reason or None,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return body
