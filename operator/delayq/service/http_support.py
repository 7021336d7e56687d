"""Helpers every route module shares: the app key of the service, JSON bodies and errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
from aiohttp import web

from delayq.service.parsing import Body, FieldError, require_object
from delayq.service.service import DelayService

SERVICE = web.AppKey("service", DelayService)
RETRY_AFTER_S = 5  # Redis out of memory or unreachable: long enough for deliveries to drain


class UnknownTopicError(FieldError):
    """The path names a topic this service does not serve (HTTP 404)."""

    status = 404


class BodyTimeoutError(FieldError):
    """The body did not arrive within the read timeout (HTTP 408): a stalled or hostile client
    must not hold a connection and a handler for ever."""

    status = 408


class UnreadableBodyError(FieldError):
    """The body's bytes do not follow its Content-Encoding (HTTP 400). Answered with the
    connection closed: aiohttp would otherwise read on in the broken body to keep the
    connection alive, fail on it with an unhandled error and drop the connection anyway."""


def json_response(data: Any, status: int = 200) -> web.Response:
    """`web.json_response`, encoded by orjson: the batch and lease answers carry up to 1000
    entries, which the standard library's encoder spent most of a request's Python time on.
    orjson refuses a lone surrogate, which a message's headers may hold (the engine stores
    them as JSON escapes, and a Python producer is not held to the API's `check_text`): such
    an answer is encoded by the standard library, escaped as before orjson, never a 500 that
    would lease every message of the answer to nobody."""
    try:
        body = orjson.dumps(data)
    except orjson.JSONEncodeError:
        body = json.dumps(data).encode()
    return web.Response(body=body, status=status, content_type="application/json")


def error_response(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


async def json_body(request: web.Request) -> Body:
    """The request's JSON object; 400 naming `body` when it is not one or cannot be read as
    sent (a Content-Encoding its bytes do not follow: aiohttp's RequestPayloadError, which
    would be a 500), 408 when it does not arrive within the service's read timeout."""
    timeout_ms = request.app[SERVICE].config.read_timeout_ms
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            raw = await request.read()
    except TimeoutError:
        raise BodyTimeoutError("body", f"body not received within {timeout_ms} ms") from None
    except web.RequestPayloadError as error:
        raise UnreadableBodyError("body", f"body cannot be read: {error}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = _loads_lenient(raw)
    return require_object(data)


def _loads_lenient(raw: bytes) -> Any:
    """What orjson refused (not UTF-8, NaN, integers past 64 bits, a lone surrogate escape, a
    syntax error), parsed as the standard library does, so the API accepts and refuses exactly
    what it did before orjson: valid JSON in UTF-16/32, `check_text`'s named 400 for a lone
    surrogate, one message for invalid JSON."""
    try:
        return json.loads(raw)  # bytes: UTF-8 (or -16/-32) whatever the declared charset
    except ValueError:
        raise FieldError("body", "body must be valid JSON") from None
    except RecursionError:
        raise FieldError("body", "body nests too deeply to parse") from None


def service_for(request: web.Request) -> DelayService:
    """The service, after checking the path names its topic (404 otherwise)."""
    service = request.app[SERVICE]
    topic = request.match_info.get("topic")
    if topic is not None and topic != service.topic.name:
        served = service.topic.name
        raise UnknownTopicError("topic", f"this service serves topic {served!r}, not {topic!r}")
    return service
