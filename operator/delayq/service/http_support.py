"""Helpers every route module shares: the app key of the service, JSON bodies and errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from delayq.queue.model import Target
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


def slot_of_target(service: DelayService, target: Target) -> int:
    """The slot a message lives in, by the engine's own routing (`Target.slot`)."""
    return target.slot(service.topic)


def error_response(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


async def json_body(request: web.Request) -> Body:
    """The request's JSON object; 400 naming `body` when it is not one, 408 when it does not
    arrive within the service's read timeout."""
    timeout_ms = request.app[SERVICE].config.read_timeout_ms
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            raw = await request.read()
    except TimeoutError:
        raise BodyTimeoutError("body", f"body not received within {timeout_ms} ms") from None
    try:
        data = json.loads(raw)  # bytes: UTF-8 (or -16/-32) whatever the declared charset
    except ValueError:
        raise FieldError("body", "body must be valid JSON") from None
    except RecursionError:
        raise FieldError("body", "body nests too deeply to parse") from None
    return require_object(data)


def service_for(request: web.Request) -> DelayService:
    """The service, after checking the path names its topic (404 otherwise)."""
    service = request.app[SERVICE]
    topic = request.match_info.get("topic")
    if topic is not None and topic != service.topic.name:
        served = service.topic.name
        raise UnknownTopicError("topic", f"this service serves topic {served!r}, not {topic!r}")
    return service
