"""Producer routes: schedule (one, batch), get, cancel and reschedule messages by id."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from aiohttp import web

from delayq.queue import produce_plans
from delayq.queue.client import AsyncQueue
from delayq.queue.codes import (
    Code,
    NotFoundError,
    ReplicationTimeoutError,
    TooFarError,
    raise_for_code,
)
from delayq.queue.model import (
    Mode,
    ScheduleFailure,
    ScheduleRequest,
    ScheduleResult,
    State,
    Target,
)
from delayq.queue.topic import MAX_DELAY_MS
from delayq.service.envelope import info_json
from delayq.service.http_support import (
    RETRY_AFTER_S,
    json_body,
    json_response,
    service_for,
)
from delayq.service.parsing import (
    FieldError,
    parse_batch,
    parse_message,
    parse_mode,
    parse_target,
    parse_when,
    with_request_trace,
)
from delayq.service.service import DelayService

MESSAGES = "/v1/topics/{topic}/messages"
# aiohttp's default `{id}` pattern is [^{}/]+: ids with braces would be schedulable yet answer
# 404 on every route that names them. Any id matches here (a "/" travels as %2F).
MESSAGE = MESSAGES + "/{id:[^/]+}"
Result = ScheduleResult | ScheduleFailure


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(MESSAGES, schedule)
    router.add_post(MESSAGES + "/batch", schedule_batch)
    router.add_get(MESSAGE, get)
    router.add_delete(MESSAGE, cancel)
    router.add_post(MESSAGE + "/reschedule", reschedule)


def result_json(result: Result) -> dict[str, Any]:
    if isinstance(result, ScheduleFailure):
        return failure_json(result)
    return {
        "id": result.id,
        "slot": result.slot,
        "result": result.code.name.lower(),
        "dueMs": result.due_ms,
        "state": result.state.value,
    }


def failure_json(failure: ScheduleFailure) -> dict[str, Any]:
    """`failed`: Redis answered that the item's slot call was refused, so it is not stored;
    `unknown`: the broker did not answer, so it may be. Resend both (create mode answers
    `exists` for what is stored)."""
    refused = isinstance(failure.error, redis.ResponseError)
    return {
        "id": failure.id,
        "slot": failure.slot,
        "result": "failed" if refused else "unknown",
        "error": f"{type(failure.error).__name__}: {failure.error}",
    }


async def schedule(request: web.Request) -> web.Response:
    """201 when created, 200 when it existed (create) or was replaced (upsert)."""
    service = service_for(request)
    body = await json_body(request)
    [message] = with_request_trace([parse_message(body, service.topic)], request.headers)
    [result] = await _traced_schedule(service, [message], parse_mode(body))
    assert isinstance(result, ScheduleResult)  # one message: stored, or _schedule raised
    with _too_far_named(message.at_ms):
        raise_for_code(result.code, "schedule", result.id)
    return web.json_response(
        result_json(result), status=201 if result.code is Code.CREATED else 200
    )


async def schedule_batch(request: web.Request) -> web.Response:
    """200 when every message is stored; else 207, each result saying which were: those the
    engine refused for good (`too_far`, `expires_before_due`) must be fixed, and when some
    are worth sending again — slots' chunks refused after others were stored (`failed`,
    `unknown`), or `over_quota` — Retry-After says when. Never a 200 over a message not
    stored: a client that reads only the status would lose it."""
    service = service_for(request)
    body = await json_body(request)
    messages = with_request_trace(parse_batch(body, service.topic), request.headers)
    results = await _traced_schedule(service, messages, parse_mode(body))
    answer = json_response({"results": [result_json(r) for r in results]})
    retry = [r for r in results if isinstance(r, ScheduleFailure) or r.code is Code.OVER_QUOTA]
    if retry or any(r.code.is_error for r in results if isinstance(r, ScheduleResult)):
        answer.set_status(207)
    if retry:
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
    return answer


async def _traced_schedule(
    service: DelayService, messages: list[ScheduleRequest], mode: Mode
) -> list[Result]:
    """`_schedule` in its span when tracing is on."""
    if service.tracing is None:
        return await _schedule(service, messages, mode)
    with service.tracing.schedule(service.topic.name, messages) as span:
        results = await _schedule(service, messages, mode)
        service.tracing.scheduled(span, [result.slot for result in results])
        return results


async def _schedule(
    service: DelayService, messages: list[ScheduleRequest], mode: Mode
) -> list[Result]:
    """A result per message, in order, failures included; raises the Redis error when nothing
    was stored (a plain 429 broker full / 503: resend the whole request), or the
    ReplicationTimeoutError when every message was written but unconfirmed (503)."""

    def target_of(message: ScheduleRequest) -> Target:
        return Target(message.id, message.slot_basis)

    async def call(queue: AsyncQueue, chunk: list[ScheduleRequest]) -> list[Result]:
        """Each message's own answer: one broker refusing two slots differently, or its
        replicas lagging after another broker stored, fails only the messages concerned."""
        try:
            return await queue.run(produce_plans.schedule_answers(queue.topic, chunk, mode))
        except ReplicationTimeoutError as error:
            return produce_plans.unconfirmed(error)
        except redis.RedisError as error:  # the broker's call failed as a whole
            return [ScheduleFailure(m.id, target_of(m).slot(queue.topic), error) for m in chunk]

    results = await service.brokers.each_placed(messages, target_of, call)
    service.metrics.count_scheduled(
        [r.code for r in results if isinstance(r, ScheduleResult) and not r.code.is_error]
    )
    failures = [r for r in results if isinstance(r, ScheduleFailure)]
    # the plain error only when nothing was written: an unconfirmed item is on its master, so
    # a mix of refused and unconfirmed items is answered per message (a 207), never a 429 or
    # 503 saying nothing was stored (the client would resend the whole batch)
    written = any(isinstance(f.error, ReplicationTimeoutError) for f in failures)
    unconfirmed_only = all(isinstance(f.error, ReplicationTimeoutError) for f in failures)
    if len(failures) == len(results) and (not written or unconfirmed_only):
        raise failures[0].error
    return results


@contextmanager
def _too_far_named(at_ms: int | None) -> Iterator[None]:
    """A due time too far ahead (only the script knows: it is relative to the Redis server's
    now) is a 400 naming the field the client gave, `atMs` or `delayMs`."""
    try:
        yield
    except TooFarError as error:
        field = "delayMs" if at_ms is None else "atMs"
        raise FieldError(
            field, f"{error}: {field} is more than {MAX_DELAY_MS} ms after the Redis server's now"
        ) from None


def _target(request: web.Request, service: DelayService) -> Target:
    query = request.query
    return parse_target(
        request.match_info["id"], query.get("slotBasis"), query.get("slot"), service.topic
    )


def _where(target: Target) -> str:
    """Why a 404 may be the address, not the message: a message is (slot basis, id)."""
    if target.explicit_slot is not None:
        return f"looked up in slot {target.explicit_slot}"
    if target.slot_basis is None:
        return (
            "looked up by its id alone; add ?slotBasis= (or the ?slot= that holds it) if it "
            "was scheduled with one"
        )
    return f"looked up with slotBasis {target.slot_basis!r}"


async def get(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request, service)
    queue, _ = service.brokers.place(target)
    [info] = await queue.get_many([target])
    if info.state is State.ABSENT:
        raise NotFoundError("get", target.id, _where(target))
    return web.json_response(info_json(info))


async def cancel(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request, service)
    queue, _ = service.brokers.place(target)
    [outcome] = await queue.cancel_many([target])
    raise_for_code(outcome.code, "cancel", outcome.id, _where(target))
    return web.json_response({"id": outcome.id, "result": outcome.code.name.lower()})


async def reschedule(request: web.Request) -> web.Response:
    service = service_for(request)
    target = _target(request, service)
    delay_ms, at_ms = parse_when(await json_body(request))
    queue, _ = service.brokers.place(target)
    with _too_far_named(at_ms):
        outcome = await queue.reschedule(
            target.id,
            delay_ms=delay_ms,
            at_ms=at_ms,
            slot_basis=target.slot_basis,
            slot=target.explicit_slot,
        )
    return web.json_response(
        {"id": outcome.id, "result": outcome.code.name.lower(), "dueMs": outcome.at_ms}
    )
