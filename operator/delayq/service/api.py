"""The HTTP API of `delayq serve` (aiohttp): app factory, middlewares, probes, metrics, OpenAPI.

Topic routes live in `routes_messages`, `routes_pull`, `routes_dead` and `routes_overview`, the
dashboard's static files in `routes_ui`; this module adds what every route shares: JSON errors
naming the field, the bearer token check, size limits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from aiohttp import web

from delayq.queue.codes import (
    SLOT_MOVING,
    ExpiresBeforeDueError,
    InvalidMessageError,
    LeaseLostError,
    NotFoundError,
    OverQuotaError,
    ReplicationTimeoutError,
    SlotMovingError,
    StaleEpochError,
    TooFarError,
    WrongStateError,
)
from delayq.service import (
    routes_dead,
    routes_messages,
    routes_overview,
    routes_pull,
    routes_schedules,
    routes_ui,
)
from delayq.service.config import ServiceConfig
from delayq.service.http_support import (
    RETRY_AFTER_S,
    SERVICE,
    UnreadableBodyError,
    error_response,
)
from delayq.service.openapi import openapi_document
from delayq.service.overview import TopicViews
from delayq.service.parsing import FieldError
from delayq.service.service import DelayService

log = logging.getLogger(__name__)
SLOT_MOVE_WAIT_S = 10.0  # a move's write pause is a fraction of this (docs/coordination.md)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})  # kubelet probes have no token
METRICS_PATH = "/metrics"
READ_METHODS = frozenset({"GET", "HEAD"})
CLIENT_GONE = 499  # the status a request is counted with when its client closed first (nginx's)


def build_app(service: DelayService) -> web.Application:
    app = web.Application(
        client_max_size=service.config.max_body_bytes,
        middlewares=[
            requests_middleware,
            errors_middleware,
            auth_middleware,
            slot_moving_middleware,
        ],
    )
    app[SERVICE] = service
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get("/openapi.json", openapi)
    routes_messages.add_routes(app.router)
    routes_pull.add_routes(app.router)
    routes_dead.add_routes(app.router)
    routes_schedules.add_routes(app.router)
    routes_overview.setup(app, TopicViews(service))
    routes_ui.add_routes(app.router)
    return app


@web.middleware
async def requests_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request into `delayq_http_request_duration_seconds`, with the status it got
    (outermost, so after the errors middleware made an exception an answer; 499 when the
    client went away first) and the route's template (`unmatched` for no route)."""
    started = time.perf_counter()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as error:  # a redirect, or what aiohttp answers itself
        code = error.status
        raise
    except asyncio.CancelledError:
        code = CLIENT_GONE
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        request.app[SERVICE].metrics.observe_request(
            request.method, route, code, time.perf_counter() - started
        )


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error is JSON: `{"error": ..., "field": ...}` with the status that fits it."""
    try:
        return await handler(request)
    except FieldError as error:
        response = error_response(error.status, str(error), error.field)
        if isinstance(error, UnreadableBodyError):
            response.force_close()
        return response
    except InvalidMessageError as error:
        return error_response(400, str(error))
    except NotFoundError as error:
        return error_response(404, str(error), "id")
    except (LeaseLostError, StaleEpochError, WrongStateError) as error:
        return error_response(409, str(error))
    except TooFarError as error:
        return error_response(400, str(error), "delayMs")
    except OverQuotaError as error:
        response = error_response(429, f"{error}: the topic's limits.maxPending is reached")
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except ExpiresBeforeDueError as error:
        return error_response(
            400, f"{error}: its expiry must come after its due time", "expireAtMs"
        )
    except SlotMovingError as error:
        response = error_response(503, str(error))
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except ReplicationTimeoutError as error:
        response = error_response(503, str(error))
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    except redis.RedisError as error:
        log.warning("redis call failed", extra={"path": request.path, "error": str(error)})
        return redis_error_response(error)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = error_response(error.status, error.reason)
        if "Allow" in error.headers:  # 405 names the methods the path has
            response.headers["Allow"] = error.headers["Allow"]
        return response


@web.middleware
async def slot_moving_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A call refused because its slot is being moved (SLOT_MOVING) is run again each time
    this process's routing changes, for up to SLOT_MOVE_WAIT_S: the move's switch sends it to
    the slot's new broker, and the client sees a move as latency, not as an error. Running a
    call again is safe: every write is idempotent or answers its own repeat. Once the slots
    doubled the refusal is answered at once: the new slots are the next service's."""
    service = request.app[SERVICE]
    deadline = asyncio.get_running_loop().time() + SLOT_MOVE_WAIT_S
    while True:
        changed = service.routing_changed
        try:
            return await handler(request)
        except SlotMovingError:
            service.metrics.count_slot_moving_wait()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or service.resharded.is_set():
                raise  # past the wait, or the slots doubled: this process serves them no more
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                raise SlotMovingError(f"{SLOT_MOVING}: the slot is still moving") from None


def redis_error_response(error: redis.RedisError) -> web.Response:
    """Nothing was stored: 429 when the broker is full (Redis out of memory: maxmemory with
    noeviction; the clients raise BrokerFullError, a redis-py OutOfMemoryError), else 503;
    both are worth retrying, so both say when (Retry-After)."""
    if isinstance(error, redis.exceptions.OutOfMemoryError):
        response = error_response(
            429, f"broker is full (redis out of memory), nothing stored: {error}"
        )
    else:
        response = error_response(503, f"redis unavailable: {type(error).__name__}")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The topic's bearer tokens, compared in constant time; probes always stay open. The
    read-only token opens reads only: a write presenting it is a 403 saying so, not a 401 that
    would send its holder looking for a typo."""
    config = request.app[SERVICE].config
    authorization = request.headers.get("Authorization", "")
    tokens = accepted_tokens(config, request.path, request.method)
    if tokens and not bearer_matches(authorization, tokens):
        if config.read_token and bearer_matches(authorization, (config.read_token,)):
            return error_response(
                403,
                "the read-only token cannot change anything: use the API token",
                "Authorization",
            )
        response = error_response(401, "missing or wrong bearer token", "Authorization")
        response.headers["WWW-Authenticate"] = 'Bearer realm="delayq"'
        return response
    return await handler(request)


def accepted_tokens(config: ServiceConfig, path: str, method: str = "GET") -> tuple[str, ...]:
    """The tokens any one of which opens `method path`; none: it is open.

    Topic routes take the API token and, while clients rotate to it, the previous one; their
    reads also take the read-only token (a dashboard for people who must not act).
    `/metrics` is open for in-namespace scraping unless it has a token of its own; then the API
    and read-only tokens open it too, so a client holding one needs no second secret, and the
    operator's own metrics token, which opens nothing else (the tenant may rotate the others:
    the operator still reads the lateness of `spec.objectives`). The
    dashboard's files (`/ui`) are open: they hold no data, and the page asks for a token
    before it reads any."""
    if path in OPEN_PATHS or routes_ui.is_ui_path(path):
        return ()
    api = tuple(token for token in (config.api_token, config.api_token_previous) if token)
    reads = (*api, config.read_token) if config.read_token and api else api
    if path == METRICS_PATH:
        own = tuple(t for t in (config.metrics_token, config.operator_metrics_token) if t)
        return (*own, *reads) if own else ()
    return reads if method in READ_METHODS else api


def bearer_matches(authorization: str, tokens: tuple[str, ...]) -> bool:
    """`Bearer <one of tokens>`: every token is compared, each in constant time, so neither the
    answer's timing nor an early exit tells which token (or how much of one) matched.

    The header's bytes are compared as sent: aiohttp decodes bytes that are not UTF-8 as
    lone surrogates (surrogateescape), which a plain `encode()` refuses with a 500."""
    scheme, _, given = authorization.partition(" ")
    presented = given.encode("utf-8", "surrogateescape")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token.encode())
    return scheme.lower() == "bearer" and matched


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the event loop answers."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: connected to Redis and holding an assignment (and not shutting down)."""
    service = request.app[SERVICE]
    ready = await service.is_ready()
    body: dict[str, Any] = {
        "ready": ready,
        "reason": service.readiness.reason,
        "ownedSlots": len(service.owned_slots),
        "consumedSlots": service.owned_slots,
        "grantedSlots": sorted(service.ownership.owned),
        # granted, not consumed, and why (a slot frozen by a move or a doubling: not unready)
        "unconsumedSlots": service.unconsumed_report(),
    }
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    try:
        await service.refresh_depth()
    except Exception:
        log.exception("depth refresh failed; exposing the last values")
    try:
        due_within, _ = await request.app[routes_overview.VIEWS].forecast.get()
        service.metrics.set_due_forecast(due_within)
    except Exception:
        log.exception("due forecast failed; exposing the last values")
    return web.Response(body=service.metrics.render(), content_type="text/plain", charset="utf-8")


async def openapi(request: web.Request) -> web.Response:
    topic = request.app[SERVICE].topic
    document = openapi_document(topic.slot_amount, topic.name)
    return web.json_response(document, dumps=lambda d: json.dumps(d, indent=2))
